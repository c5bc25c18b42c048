"""Blame only on evidence (fedhet.parties.failure): the rules of the verdict, and the in-memory runner
applying them to forged aborts, refused messages and silence."""
from __future__ import annotations

import types

import pytest

from fedhet.parties import failure
from fedhet.parties.api import PartyAborted, PeerFault, PeerTimeout
from fedhet.parties.inmemory import FederationFailed, run_inmemory

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def rec(exc, name, role="client"):
    return failure.record(exc, name, role)


def test_an_abort_notice_names_only_its_sender():
    # client3 forges aborts that say "client1 failed": the records name client3, and client3 left no
    # record of its own, so its own notice is what names it.
    recs = {"client1": rec(PartyAborted("party 'client3' announced its own failure: client1 failed", "client3"),
                           "client1"),
            "client2": rec(PartyAborted("party 'client3' announced its own failure: client1 failed", "client3"),
                           "client2"),
            "client3": None, "server": None}
    v = failure.verdict(recs)
    assert v["party"] == "client3" and v["proven"] and v["cause"] == "peer_abort"


def test_a_notice_sender_with_its_own_record_is_judged_by_that_record():
    # client1 refused the attacker's key; the server only saw client1's notice: the attacker is named
    recs = {"server": rec(PartyAborted("party 'client1' announced its own failure", "client1"), "server", "server"),
            "client1": rec(PeerFault("client1", "client3", "secagg/keys", "identity key of 31 bytes"), "client1"),
            "client3": None}
    v = failure.verdict(recs)
    assert v["party"] == "client3" and v["cause"] == "peer_fault"
    assert "identity key of 31 bytes" in v["reason"]


def test_proof_outranks_a_failure_of_ones_own_and_that_outranks_a_notice():
    own = rec(ValueError("cuda is not available on this host"), "client2")
    fault = rec(PeerFault("server", "client1", "k", "contains NaN"), "server", "server")
    assert failure.verdict({"client2": own, "server": fault})["party"] == "client1"
    notice = rec(PartyAborted("x", "client4"), "server", "server")
    assert failure.verdict({"client2": own, "server": notice, "client4": None})["party"] == "client2"


def test_silence_proves_nothing():
    recs = {"server": rec(PeerTimeout("server", "client1", "k", 60.0, "'client1' sent nothing"), "server", "server"),
            "client1": rec(PeerTimeout("client1", "server", "j", 60.0, "'server' sent nothing"), "client1")}
    v = failure.verdict(recs)
    assert v["party"] is None and not v["proven"] and v["reason"].startswith("unknown")
    assert "waited 60s for a 'k' message from 'client1'" in v["reason"]


def test_a_killed_process_outranks_an_earlier_record_and_stopped_parties_are_not_evidence():
    killed = failure.exit_record("client2", "client", -9)
    own = rec(RuntimeError("boom"), "client1")
    stopped = failure.record(KeyboardInterrupt(), "server", "server", stopped=True)
    v = failure.verdict({"client1": own, "client2": killed, "server": stopped})
    assert v["party"] == "client2" and "SIGKILL" in v["reason"]
    assert failure.verdict({"server": stopped})["party"] is None


def _algo(roles):
    return types.SimpleNamespace(NAME="blame-test", ROLES=roles, load_data=lambda *a: None)


@pytest.mark.federation
def test_a_forged_abort_in_memory_names_the_forger_not_the_party_it_mentions():
    def honest(party, c, d):
        return party.recv("server", "go", timeout=30)

    def forger(party, c, d):
        for p in ("client1", "client2"):
            party.send(p, "_abort", {"reason": "client1: RuntimeError: client1 crashed"})
        return party.recv("server", "go", timeout=30)   # then plays along until it is stopped too

    def server(party, c, d):
        return party.recv("client1", "never", timeout=30)

    parties = [("server", "server"), ("client1", "client"), ("client2", "client"), ("client3", "forger")]
    with pytest.raises(FederationFailed) as e:
        run_inmemory(_algo({"server": server, "client": honest, "forger": forger}), parties, clock="virtual")
    v = e.value.verdict
    assert v["party"] == "client3", v
    assert e.value.records["client3"]["cause"] in ("peer_abort", "timeout")
    assert e.value.records["client1"]["culprit"] == "client3"


@pytest.mark.federation
def test_a_refused_message_names_its_sender_with_its_sequence_number_and_digest():
    def victim(party, c, d):
        x = party.recv("bad", "v", timeout=30)
        if x != x:  # NaN: the protocol step that needs a finite value names the sender
            raise PeerFault(party.name, "bad", "v", "value is NaN")
        return x

    def bad(party, c, d):
        party.send("victim", "v", 1.0)
        party.send("victim", "v", float("nan"))
        return None

    def twice(party, c, d):
        victim(party, c, d)
        return victim(party, c, d)

    with pytest.raises(FederationFailed) as e:
        run_inmemory(_algo({"v": twice, "b": bad}), [("victim", "v"), ("bad", "b")], clock="virtual")
    r = e.value.records["victim"]
    assert r["cause"] == "peer_fault" and r["culprit"] == "bad"
    assert r["evidence"]["seq"] == 1 and len(r["evidence"]["sha256"]) == 64
    assert e.value.verdict["party"] == "bad"


def test_a_notice_from_a_party_that_was_itself_only_stopped_names_it():
    # client3 forged notices, then was stopped by the notice of the server (which timed out waiting):
    # its own record (stopped by a notice) cannot explain the notices it sent before.
    recs = {"client1": rec(PartyAborted("n", "client3"), "client1"),
            "client3": rec(PartyAborted("n", "server"), "client3"),
            "server": rec(PeerTimeout("server", "client1", "k", 20.0), "server", "server")}
    v = failure.verdict(recs)
    assert v["party"] == "client3" and v["cause"] == "peer_abort"


def _secagg_blame_run(wrap: dict):
    """Secure aggregation among four clients in memory, parties named in ``wrap`` seen through a wrapper."""
    import numpy as np

    from fedhet.protocols.secagg import DECLARATIONS, SecAggClient, SecAggConfig, SecAggServer

    cfg = SecAggConfig(clip=4.0, max_weight=10.0, timeout=5)
    clients = ["c00", "c01", "c02", "c03"]

    def server(party, c, d):
        return SecAggServer(cfg).aggregate(wrap.get(party.name, lambda p: p)(party), clients, 0)

    def client(party, c, d):
        return SecAggClient(cfg).submit(wrap.get(party.name, lambda p: p)(party), "server", np.ones(8), 1.0, 0)

    algo = types.SimpleNamespace(NAME="blame-test", ROLES={"server": server, "client": client},
                                 load_data=lambda *a: None, DECLARATIONS=DECLARATIONS)
    return run_inmemory(algo, [("server", "server")] + [(u, "client") for u in clients], clock="virtual")


class _Through:
    """A party whose outgoing payloads of one kind pass through ``change``."""

    def __init__(self, party, kind, change):
        self.party, self.kind, self.change = party, kind, change

    def __getattr__(self, name):
        return getattr(self.party, name)

    def send(self, to, kind, payload):
        self.party.send(to, kind, self.change(to, payload) if kind == self.kind else payload)


@pytest.mark.federation
def test_keys_signed_with_another_key_are_refused_by_the_server_naming_their_sender():
    """A client's advertised keys must carry its signature by the sign_key the federation pins: the server
    checks it on receipt, drops that client and names it; the others' sum goes on."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedhet.protocols.secagg import Kind

    impostor = Ed25519PrivateKey.generate()
    out = _secagg_blame_run({"c02": lambda p: _Through(p, Kind.KEYS, lambda to, x: {**x, "sig": impostor.sign(b"x")})})
    res = out["server"]
    assert "c02" in res.rejected and "pinned sign_key" in res.rejected["c02"]
    assert res.contributors == ["c00", "c01", "c03"] and float(res.weight) == pytest.approx(3.0)


@pytest.mark.federation
def test_a_server_that_swaps_a_clients_keys_is_named_by_the_clients():
    """The server relays every client's signed keys; one it replaced (its own keys, the client's old
    signature) no longer verifies under the client's pinned sign_key, and the receivers name the server."""
    from fedhet.crypto import keys as ck
    from fedhet.protocols.secagg import Kind

    forged = ck.public_bytes(ck.generate_x25519())

    def swap(to, p):
        if "keys" not in p or to == "c00":
            return p
        return {**p, "keys": {v: ([forged] + list(e[1:]) if v == "c00" else e) for v, e in p["keys"].items()}}

    with pytest.raises(FederationFailed) as e:
        _secagg_blame_run({"server": lambda p: _Through(p, Kind.KEYLIST, swap)})
    victims = [n for n, r in e.value.records.items() if r["cause"] == "peer_fault"]
    assert victims and all(e.value.records[n]["culprit"] == "server" for n in victims)
    assert "pinned sign_key" in e.value.records[victims[0]]["error"]
    assert e.value.verdict["party"] == "server"
