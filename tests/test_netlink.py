"""Link profiles (issue 48): the delivery schedule of a simulated link, on supplied times; the
``[federation] network`` key; and two live ZmqParty objects over loopback under a 20 ms profile.

Only the lower bounds the schedule guarantees are asserted on a real clock (a loaded machine makes a
round trip slower, never faster)."""
from __future__ import annotations

import logging
import math
import time

import numpy as np
import pytest
import zmq

from fedhet.parties.federation import FederationError, from_dict
from fedhet.parties.netlink import LinkProfile, LinkSchedule, parse_network
from fedhet.parties.zmq_transport import ZmqParty

from net_tools import loopback_endpoints  # a helper module of tests/

WAN = LinkProfile("wan", 0.050, 100e6)


@pytest.mark.unit
def test_named_and_numeric_profiles_parse():
    assert parse_network("loopback") is None
    lan, wan = parse_network("lan"), parse_network("WAN ")
    assert (lan.rtt_s, lan.bits_per_s) == (0.0005, 1e9)
    assert (wan.rtt_s, wan.bits_per_s, wan.one_way_s) == (0.05, 1e8, 0.025)
    p = parse_network("20,100")
    assert math.isclose(p.rtt_s, 0.020) and p.bits_per_s == 1e8 and p.name == "20,100"
    assert math.isclose(p.transfer_s(1_250_000), 0.1)
    for bad in ("fast", "20", "20,0", "-1,100", "20,100,3", "nan,100", "20,inf"):
        with pytest.raises(ValueError, match="network"):
            parse_network(bad)


@pytest.mark.unit
def test_a_bad_network_key_names_the_file_and_the_key():
    fed = {"federation": {"network": "20ms"}, "algorithm": {"name": "fedavg_logreg"},
           "party": [{"name": "s", "role": "server", "endpoint": "tcp://127.0.0.1:5000"},
                     {"name": "c", "role": "client", "endpoint": "tcp://127.0.0.1:5001"}]}
    with pytest.raises(FederationError) as e:
        from_dict(fed, source="fed.toml")
    msg = str(e.value)
    assert "fed.toml" in msg and "[federation]" in msg and "network" in msg and "'20ms'" in msg
    ok = from_dict({**fed, "federation": {"network": "wan"}}, source="fed.toml")
    assert ok.network == "wan" and ok.to_dict()["federation"]["network"] == "wan"
    assert "network" not in from_dict({**fed, "federation": {}}, source="fed.toml").to_dict()["federation"]


@pytest.mark.unit
def test_no_message_is_delivered_before_its_link_could_carry_it():
    s = LinkSchedule(WAN)
    rng = np.random.default_rng(3)
    t = 0.0
    for _ in range(200):
        t += float(rng.exponential(0.01))
        n = int(rng.integers(0, 2_000_000))
        arrived = t + float(rng.uniform(0, 0.005))
        due = s.due("p", n, t, arrived)
        assert due >= t + WAN.one_way_s + n * 8 / WAN.bits_per_s - 1e-12
        assert due >= arrived


@pytest.mark.unit
def test_messages_on_one_link_are_serialised_and_keep_their_order():
    s = LinkSchedule(WAN)
    big, small = 1_250_000, 125          # 0.1 s and 10 us on the link
    d1 = s.due("p", big, 0.0, 0.0)
    d2 = s.due("p", small, 0.0, 0.0)    # sent at once after it: waits for the big one's last bit
    assert math.isclose(d1, 0.1 + 0.025)
    assert math.isclose(d2, 0.1 + 1e-5 + 0.025)
    assert d2 > d1                      # the small message never overtakes
    # another sender's link is free: its message is not queued behind p's
    assert math.isclose(s.due("q", small, 0.0, 0.0), 1e-5 + 0.025)
    # once the link went idle, a message starts when it is sent
    assert math.isclose(s.due("p", small, 5.0, 5.0), 5.0 + 1e-5 + 0.025)
    # order kept even if the local sockets handed the later message over late (due never decreases)
    s2 = LinkSchedule(LinkProfile("x", 0.0, 1e9))
    a = s2.due("p", 0, 0.0, 3.0)
    b = s2.due("p", 0, 1.0, 1.0)
    assert b >= a


@pytest.mark.federation
def test_a_ping_pong_under_a_20ms_profile_takes_at_least_20ms_a_round_trip():
    roles = {"a": "server", "b": "client"}
    keys = {n: zmq.curve_keypair() for n in roles}
    eps = loopback_endpoints(roles)
    pub = {n: k[0] for n, k in keys.items()}
    quiet = logging.getLogger("fedhet.test.netlink")
    prof = parse_network("20,100")
    a, b = (ZmqParty(n, roles, eps, public_keys=pub, secret_key=keys[n][1], run_id="netlink", timeout=60,
                     logger=quiet, network=prof) for n in roles)
    try:
        rounds, payload = 5, np.arange(12_500, dtype=np.float64)   # 100 kB: 8 ms on a 100 Mbit/s link
        a.send("b", "ping", payload)   # the first round trip also makes the connections
        assert np.array_equal(b.recv("a", "ping"), payload)
        b.send("a", "pong", 0)
        a.recv("b", "pong")
        t0 = time.monotonic()
        for i in range(rounds):
            a.send("b", "ping", payload)
            got = b.recv("a", "ping")
            b.send("a", "pong", i)
            assert a.recv("b", "pong") == i
        elapsed = time.monotonic() - t0
        # each round trip: two one-way latencies (20 ms) plus the ping's 100 kB at 100 Mbit/s
        assert elapsed >= rounds * (prof.rtt_s + prof.transfer_s(payload.nbytes))
        assert np.array_equal(got, payload)
        link = a.traffic()["link"]
        assert link["network"] == "20,100" and link["messages"] == rounds + 1
        assert b.traffic()["link"]["held_s"] >= (rounds + 1) * prof.one_way_s
    finally:
        for p in (a, b):
            p._transport_close(linger_s=0)


@pytest.mark.unit
def test_fedhet_run_refuses_a_bad_network_before_starting_anything(tmp_path, capsys):
    from fedhet.parties.ops.cli import main

    assert main(["run", "demo", "--network", "20ms", "--out", str(tmp_path / "run")]) == 2
    assert "--network" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()
    assert main(["run", "--resume", str(tmp_path / "r"), "--network", "wan"]) == 2
