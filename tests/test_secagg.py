"""Secure aggregation (protocols/secagg.py): sums against the plain computation, dropouts, the server's view."""
from __future__ import annotations

import types

import numpy as np
import pytest
from scipy import stats

from fedhet.crypto.shamir import reconstruct, share
from fedhet.crypto.field import F61
from fedhet.parties import declare as decl
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.protocols import secagg
from fedhet.protocols.secagg import Faults, Kind, SecAggClient, SecAggConfig, SecAggError, SecAggServer, neighbours
from fedhet.protocols import aggregation
from fedhet.protocols.aggregation_settings import AggregationSettings

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)


def names(k):
    return [f"c{i:02d}" for i in range(k)]


def run(cfg, xs, ws, rounds=(0,), faults=None, observer=None, seed=0, barrier=False, sends=None):
    """One server and len(xs) clients in memory; returns (server results per round, client results).

    ``xs[name]`` is a vector or a list of vectors (one per round); ``faults[name]``
    is ``{round: Faults(...)}``; a client that stops takes part in no later round.  ``barrier``: the server starts a round
    only when every client finished the last one (as a training loop's model
    broadcast would make it).  ``sends``: a list that gets every (to, kind, payload) the server sends.
    """
    faults = faults or {}

    def server(party, c, d):
        if sends is not None:
            send = party.send

            def spy(to, kind, payload=None, **kw):
                sends.append((to, kind, payload))
                return send(to, kind, payload, **kw)
            party.send = spy
        srv = SecAggServer(cfg, observer)
        out = []
        for i, r in enumerate(rounds):
            if barrier and i:
                party.gather("test/ready", frm=sorted(xs))
            out.append(srv.aggregate(party, sorted(xs), r))
        return out

    def client(party, c, d):
        cl = SecAggClient(cfg, faults.get(party.name))
        out = []
        for i, r in enumerate(rounds):
            x = xs[party.name][i] if isinstance(xs[party.name], list) else xs[party.name]
            if barrier and i:
                party.send("server", "test/ready", None)
            res = cl.submit(party, "server", x, ws[party.name], r)
            out.append(res)
            if res.status == "stopped":
                break
        return out

    algo = types.SimpleNamespace(NAME="secagg-test", ROLES={"server": server, "client": client},
                                 load_data=lambda *a: None)
    # Virtual time: the protocol's timeouts (0.5 s here) fire only when every party waits, so an
    # honest client is never dropped because the machine is busy, nor a stopped one kept.
    out = run_inmemory(algo, [("server", "server")] + [(n, "client") for n in sorted(xs)], seed=seed, timeout=30,
                       clock="virtual")
    return out.pop("server"), out


def plain(cfg, xs, ws, who):
    s = sum(ws[u] * np.clip(xs[u], -cfg.clip, cfg.clip) for u in who)
    w = sum(ws[u] for u in who)
    return s, w, s / w


def assert_close(res, cfg, xs, ws, who):
    s, w, mean = plain(cfg, xs, ws, who)
    assert res.contributors == sorted(who)
    assert np.max(np.abs(res.sum - s)) <= res.sum_error_bound
    assert abs(res.weight - w) <= res.sum_error_bound  # e_w <= e_sum when clip >= 1
    assert np.max(np.abs(res.mean - mean)) <= res.mean_error_bound
    # the bound is a real one: far below the data's scale, and not met by chance
    assert res.mean_error_bound < 1e-3 * cfg.clip


@pytest.mark.parametrize("k,graph,ring", [(3, "complete", 32), (7, "complete", 64), (12, "harary", 32),
                                          (25, "complete", 32), (50, "harary", 32)])
def test_secure_sum_equals_plain_sum_within_the_stated_bound(k, graph, ring):
    rng = np.random.default_rng(k)
    cfg = SecAggConfig(graph=graph, ring_bits=ring, clip=4.0, max_weight=100.0, timeout=20)
    m = int(rng.integers(50, 400))
    # some coordinates outside the clip range: the sum is of the clipped values
    xs = {u: rng.normal(0, 2.0, m) for u in names(k)}
    ws = {u: float(rng.uniform(0.5, 100.0)) for u in names(k)}
    (res,), clients = run(cfg, xs, ws)
    assert_close(res, cfg, xs, ws, names(k))
    assert res.graph == graph and res.ring_bits == ring and res.dropped == []
    assert all(c[0].status == "ok" for c in clients.values())
    if graph == "harary":
        assert res.degree < k - 1 and res.threshold_local < res.threshold


def test_the_error_bound_is_tight_to_the_quantisation_step():
    # Values half-way between grid points: every rounding error is 2**-(f+1).
    k, m = 4, 64
    cfg = SecAggConfig(clip=8.0, max_weight=1.0, frac_bits=10)
    xs = {u: np.full(m, 2.0 ** -11) for u in names(k)}
    ws = {u: 1.0 for u in names(k)}
    (res,), _ = run(cfg, xs, ws)
    s, _, _ = plain(cfg, xs, ws, names(k))
    err = np.max(np.abs(res.sum - s))
    assert err <= res.sum_error_bound
    assert err >= 0.5 * res.sum_error_bound  # round-half-to-even: 2**-11 -> 0, all errors add up


@pytest.mark.parametrize("step", ["start", "advertise", "share", "masked"])
@pytest.mark.parametrize("graph", ["complete", "harary"])
def test_dropouts_at_each_step_still_give_the_right_sum(step, graph):
    k = 6 if graph == "complete" else 14
    rng = np.random.default_rng(1)
    cfg = SecAggConfig(graph=graph, clip=4.0, max_weight=10.0, timeout=0.5, degree=4)
    xs = {u: rng.uniform(-4, 4, 100) for u in names(k)}
    ws = {u: float(rng.uniform(1, 10)) for u in names(k)}
    gone = names(k)[1:3]
    faults = {u: {0: Faults(stop_after=step)} for u in gone}
    (res,), clients = run(cfg, xs, ws, faults=faults)
    # after sending its masked input a client's input counts even if it vanishes
    who = names(k) if step == "masked" else [u for u in names(k) if u not in gone]
    assert_close(res, cfg, xs, ws, who)
    assert res.dropped == ([] if step == "masked" else sorted(gone))


def test_dropouts_at_every_step_in_one_round():
    k = 9  # t = 5
    rng = np.random.default_rng(2)
    cfg = SecAggConfig(clip=4.0, max_weight=10.0, timeout=0.5)
    xs = {u: rng.uniform(-4, 4, 300) for u in names(k)}
    ws = {u: float(rng.uniform(1, 10)) for u in names(k)}
    faults = {"c01": {0: Faults(stop_after="advertise")}, "c03": {0: Faults(stop_after="share")},
              "c05": {0: Faults(stop_after="masked")}, "c07": {0: Faults(stop_after="share")}}
    (res,), _ = run(cfg, xs, ws, faults=faults)
    assert res.threshold == 5
    assert_close(res, cfg, xs, ws, [u for u in names(k) if u not in ("c01", "c03", "c07")])


@pytest.mark.parametrize("step,where", [("start", "only 2 of 5 clients advertised keys"),
                                        ("advertise", "only 2 of 5 clients shared keys"),
                                        ("share", "only 2 of 5 masked inputs"),
                                        ("masked", "only 2 of 5 clients sent unmasking shares")])
def test_fewer_than_t_clients_fail_cleanly(step, where):
    k = 5  # t = 3
    cfg = SecAggConfig(clip=4.0, timeout=0.5)
    xs = {u: np.ones(20) for u in names(k)}
    ws = {u: 1.0 for u in names(k)}
    faults = {u: {0: Faults(stop_after=step)} for u in names(k)[:3]}
    with pytest.raises(FederationFailed) as e:
        run(cfg, xs, ws, faults=faults)
    err = e.value.failures["server"]
    assert isinstance(err, SecAggError)
    assert "below the threshold t=3" in str(err) and "no sum is released" in str(err)
    assert where in str(err)
    # the clients still waiting are told and fail with the same reason, not a timeout
    for u in names(k)[3:]:
        if u in e.value.failures:
            assert isinstance(e.value.failures[u], SecAggError)


def test_a_late_client_is_ignored_and_cannot_corrupt_the_next_round():
    k = 4  # t = 3
    rng = np.random.default_rng(3)
    cfg = SecAggConfig(clip=4.0, max_weight=10.0, timeout=0.4)
    xs = {u: [rng.uniform(-4, 4, 200), rng.uniform(-4, 4, 200)] for u in names(k)}
    ws = {u: float(rng.uniform(1, 10)) for u in names(k)}
    faults = {"c02": {0: Faults(delay=("masked", 1.2))}}
    (r0, r1), clients = run(cfg, xs, ws, rounds=(0, 1), faults=faults, barrier=True)
    assert clients["c02"][0].status == "dropped"
    assert r0.dropped == ["c02"] and r1.dropped == []
    round0 = {u: xs[u][0] for u in names(k)}
    round1 = {u: xs[u][1] for u in names(k)}
    assert_close(r0, cfg, round0, ws, ["c00", "c01", "c03"])
    assert_close(r1, cfg, round1, ws, names(k))


def test_the_servers_view_of_a_masked_vector_is_uniform():
    k, m, rounds = 3, 2048, 24
    cfg = SecAggConfig(clip=4.0, max_weight=1.0)
    # client c00's input is the same extreme pattern every round
    pattern = np.where(np.arange(m) % 2 == 0, 4.0, -4.0)
    xs = {u: pattern for u in names(k)}
    ws = {u: 1.0 for u in names(k)}
    seen = []

    def observer(kind, u, p):
        if kind == Kind.MASKED and u == "c00":
            seen.append(p["y"].copy())

    run(cfg, xs, ws, rounds=tuple(range(rounds)), observer=observer)
    y = np.stack(seen)  # (rounds, m)
    assert y.shape == (rounds, m + 1)
    v = y[:, :m].reshape(-1)
    # 1. top byte uniform over its 256 values (chi-square)
    counts = np.bincount((v >> np.uint32(24)).astype(np.int64), minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-6
    # 2. every bit is a fair coin
    bits = (v[:, None] >> np.arange(32, dtype=np.uint32)) & np.uint32(1)
    freq = bits.mean(0)
    assert np.all(np.abs(freq - 0.5) < 6 * 0.5 / np.sqrt(v.size))
    # 3. coordinates holding +4 and -4 look alike (unmasked they would sit at +-2**f * 4)
    plus, minus = y[:, :m:2].reshape(-1), y[:, 1:m:2].reshape(-1)
    assert stats.ks_2samp(plus.astype(np.float64), minus.astype(np.float64)).pvalue > 1e-6
    # 4. fresh masks every round: the same input never gives the same vector twice
    assert len({row.tobytes() for row in y}) == rounds


def test_the_server_never_gets_both_secrets_of_one_client():
    k = 7
    cfg = SecAggConfig(clip=4.0, timeout=0.5)
    xs = {u: np.zeros(10) for u in names(k)}
    ws = {u: 1.0 for u in names(k)}
    got = {}

    def observer(kind, u, p):
        if kind == Kind.UNMASK:
            for v in p["b_of"]:
                got.setdefault(v, set()).add("b")
            for v in p["s_of"]:
                got.setdefault(v, set()).add("s")

    faults = {"c02": {0: Faults(stop_after="share")}, "c04": {0: Faults(stop_after="masked")}}
    (res,), _ = run(cfg, xs, ws, faults=faults, observer=observer)
    assert got["c02"] == {"s"}       # dropped before its input: only its mask key is opened
    assert got["c04"] == {"b"}       # its input counts: only its self-mask is opened
    assert all(len(kinds) == 1 for kinds in got.values())
    assert set(got) == set(names(k))


@pytest.mark.unit
def test_fewer_than_t_shares_do_not_reconstruct():
    rng = np.random.default_rng(4)
    seed = bytes(rng.integers(0, 256, 32, dtype=np.uint8))
    n, t = 7, 4
    sh = share(F61.bytes_to_elements(seed), n, t)
    pts = [1, 3, 5, 6]
    rows = [sh[x - 1] for x in pts]
    assert secagg.reconstruct_secret(rows, pts, t, "seed") == seed
    with pytest.raises(SecAggError, match="threshold is t=4"):
        secagg.reconstruct_secret(rows[:3], pts[:3], t, "seed")
    # interpolating t - 1 shares anyway gives something else
    wrong = reconstruct(np.stack(rows[:3]), pts[:3])
    assert not np.array_equal(wrong, F61.bytes_to_elements(seed))


def test_tampered_keys_or_shares_are_detected_by_the_clients():
    cfg = SecAggConfig(clip=4.0, timeout=2)
    xs = {u: np.zeros(10) for u in names(4)}
    ws = {u: 1.0 for u in names(4)}

    def swap_key(kind, u, p):  # a server substituting a client's mask key
        if kind == Kind.KEYS and u == "c01":
            p["s_pk"] = bytes(32 - len(b"x")) + b"x"

    with pytest.raises(FederationFailed) as e:
        run(cfg, xs, ws, observer=swap_key)
    assert any("does not verify" in str(err) for err in e.value.failures.values())

    def flip_share(kind, u, p):
        if kind == Kind.SHARES and u == "c01":
            v = sorted(p["ct"])[0]
            c = bytearray(p["ct"][v])
            c[-1] ^= 1
            p["ct"][v] = bytes(c)

    with pytest.raises(FederationFailed) as e:
        run(cfg, xs, ws, observer=flip_share)
    assert any("fail authentication" in str(err) for err in e.value.failures.values())


@pytest.mark.unit
def test_harary_graph_is_symmetric_sparse_and_agreed():
    cfg = SecAggConfig(graph="harary")
    u = [f"p{i}" for i in range(50)]
    g = neighbours(u, cfg, seed=7, run_id="run", r=3)
    k = cfg.k(50)
    assert k == 28 and all(len(g[a]) == k for a in u)  # the documented default for n = 50
    assert all(a in g[b] for a in u for b in g[a])
    assert g == neighbours(list(u), cfg, seed=7, run_id="run", r=3)
    assert g != neighbours(u, cfg, seed=7, run_id="run", r=4)  # a fresh placement each round
    assert cfg.t(50) == 26 and cfg.t_local(50) == 6
    # the degree grows far slower than n
    assert cfg.k(1000) == 170 and cfg.k(5000) < 250
    # small federations fall back to the complete graph
    assert all(len(s) == 4 for s in neighbours(u[:5], cfg, 0, "r", 0).values())
    # an explicit degree keeps the earlier local threshold, t scaled to the neighbourhood
    old = SecAggConfig(graph="harary", degree=12)
    assert (old.k(50), old.t_local(50)) == (12, 7)  # ceil(26 * 13 / 50)
    assert SecAggConfig(graph="harary", degree=12, local_threshold=4).t_local(50) == 4
    with pytest.raises(SecAggError, match="local_threshold=14 exceeds the 13 share holders"):
        SecAggConfig(graph="harary", degree=12, local_threshold=14).t_local(50)


@pytest.mark.unit
def test_bad_inputs_and_settings_are_named():
    with pytest.raises(ValueError, match="graph"):
        SecAggConfig(graph="ring")
    with pytest.raises(ValueError, match="ring_bits"):
        SecAggConfig(ring_bits=16)
    with pytest.raises(ValueError, match="threshold"):
        SecAggConfig(threshold=1.5)
    with pytest.raises(ValueError, match="frac_bits=30"):
        SecAggConfig(frac_bits=30, clip=8.0, max_weight=100.0).quantizer(10)
    with pytest.raises(ValueError, match="weight"):
        secagg.check_input(np.zeros(3), 5.0, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        secagg.check_input(np.array([0.0, np.nan]), 1.0, 1.0)
    with pytest.raises(ValueError, match="1-D"):
        secagg.check_input(np.zeros((2, 2)), 1.0, 1.0)
    with pytest.raises(SecAggError, match="exceeds"):
        SecAggConfig(threshold=9).t(5)
    cfg = aggregation.secagg_config(AggregationSettings(secagg_graph="harary", secagg_clip=2, secagg_threshold=0.6,
                                                        aggregation_timeout=4))
    assert (cfg.graph, cfg.clip, cfg.threshold, cfg.timeout) == ("harary", 2.0, 0.6, 4.0)


def test_round_numbers_must_increase():
    secagg.check_round(None, 0)
    secagg.check_round(2, 3)
    with pytest.raises(ValueError, match="round 3 is not after"):
        secagg.check_round(3, 3)
    with pytest.raises(ValueError, match="non-negative"):
        secagg.check_round(None, -1)
    # the client and the server both refuse to run a round number twice
    xs = {u: np.zeros(4) for u in names(3)}
    with pytest.raises(FederationFailed) as e:
        run(SecAggConfig(), xs, {u: 1.0 for u in xs}, rounds=(1, 1))
    assert any("round 1 is not after the previous round 1" in str(err) for err in e.value.failures.values())


@pytest.mark.unit
def test_declarations_accept_ring_vectors_only():
    masked = {d.kind: d for d in secagg.declarations(31, 31, 32)}[Kind.MASKED]
    assert decl.check_record(masked, [("y", "<u4", (32,))]) is None
    assert "dtype <f8 where <u4" in decl.check_record(masked, [("y", "<f8", (32,))])
    assert "32" in decl.check_record(masked, [("y", "<u4", (31,))])  # 31 + 1 (the weight)
    assert decl.check_record(masked, [("y", "<u8", (32,))]) is not None
    wide = {d.kind: d for d in secagg.declarations(31, 31, 64)}[Kind.MASKED]
    assert decl.check_record(wide, [("y", "<u8", (32,))]) is None


def test_a_secagg_plus_client_hears_of_its_neighbours_only_once_it_holds_the_client_list():
    """Issue 45, item 4: after the first round a SecAgg+ client's key list names the client list by its
    digest, the relay sends the size of U2 and the unmask request the client's holders in U3: what it
    receives grows with its k neighbours, not with the n clients (and the sums stay exact)."""
    cfg = SecAggConfig(graph="harary", timeout=0.5, collusion=0.05)
    us = names(40)
    k = cfg.k(len(us))
    assert k < len(us) - 1
    rng = np.random.default_rng(4)
    xs = {u: [rng.normal(size=6), rng.normal(size=6)] for u in us}
    ws = {u: 1.0 for u in us}
    sends: list = []
    srv, _ = run(cfg, xs, ws, rounds=(0, 1), sends=sends, barrier=True)
    for i, res in enumerate(srv):
        assert_close(res, cfg, {u: xs[u][i] for u in us}, ws, us)
    by = {}
    for to, kind, p in sends:
        by.setdefault((p["r"], kind, to), p)
    digests = {by[(r, Kind.KEYLIST, u)]["digest"] for r in (0, 1) for u in us}
    assert len(digests) == 1
    for u in us:
        assert by[(0, Kind.KEYLIST, u)]["universe"] == us          # the first round: the whole list
        assert by[(1, Kind.KEYLIST, u)]["universe"] == []          # then its digest alone
        for r in (0, 1):
            relay, req = by[(r, Kind.RELAY, u)], by[(r, Kind.UNMASK_REQUEST, u)]
            assert relay["n2"] == len(us) and "u2" not in relay and len(relay["ct"]) == k
            assert req["n3"] == len(us) and u in req["u3"] and set(req["u3"]) <= set(relay["ct"]) | {u}
            heard = set(by[(r, Kind.KEYLIST, u)]["keys"]) | set(relay["ct"]) | set(req["u3"])
            assert len(heard) == k + 1   # itself and its k neighbours


@pytest.mark.unit
def test_a_server_naming_a_list_the_client_lacks_or_relaying_a_stranger_is_named():
    """The checks that replace the lists sent in full: each names the server that broke them."""
    from fedhet.protocols.secagg_client import ClientRound, advertise_keys, masked_input, share_keys
    from fedhet.protocols.secagg_config import SecAggFault, SecAggRoundFailed
    from fedhet.protocols.secagg_messages import round_context, universe_digest

    cfg = SecAggConfig(graph="complete")
    us = names(4)

    def fresh(known=None):
        st = ClientRound(cfg, "c00", "run", 0, 0, np.zeros(3), 1.0, round_context(cfg.tag, "run", 0),
                         server="server", known=known)
        advertise_keys(st, lambda label, msg: b"s" * 64)
        return st

    q = cfg.quantizer(len(us))
    roles = {u: "client" for u in us}
    st = fresh()
    keys = {"c00": [st.c_pk, st.s_pk, st.commit, b"s" * 64]}
    base = {"r": 0, "frac_bits": q.frac_bits, "ring_bits": q.ring_bits, "keys": keys}
    with pytest.raises(SecAggFault, match="digest this client did not report holding") as e:
        share_keys(st, {**base, "universe": [], "digest": universe_digest(cfg.tag, us)}, roles, "client",
                   lambda *a: True)
    assert e.value.peer == "server"
    with pytest.raises(SecAggFault, match="does not match its digest") as e:
        share_keys(fresh(), {**base, "universe": us, "digest": b"d" * 32}, roles, "client", lambda *a: True)
    assert e.value.peer == "server"
    st = fresh(known=(universe_digest(cfg.tag, us), us))   # held from an earlier round: the digest suffices
    keys = {"c00": [st.c_pk, st.s_pk, st.commit, b"s" * 64]}
    with pytest.raises(SecAggRoundFailed, match="share holders"):   # got past the list: too few keys
        share_keys(st, {**base, "keys": keys, "universe": [], "digest": universe_digest(cfg.tag, us)}, roles,
                   "client", lambda *a: True)
    st.peer_keys = {"c00": (st.c_pk, st.s_pk, st.commit)}
    st.nbrs = frozenset(us[1:])
    for relay, why in [({"r": 0, "n2": 4, "ct": {"c09": b""}}, "not neighbours"),
                       ({"r": 0, "n2": 9, "ct": {}}, "malformed relay")]:
        with pytest.raises(SecAggFault, match=why) as e:
            masked_input(st, relay)
        assert e.value.peer == "server"
