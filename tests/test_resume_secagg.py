"""A resumed secure-aggregation round uses fresh keys and masks (issue 29, item 2, security).

A party is killed right after a checkpoint while the others go on into the next round as far as the
protocol lets them; the run is then resumed from the newest checkpoint every party holds, and that
round runs again.  Every secure-aggregation message either run sends is recorded off the in-memory
transport and decoded.  No public key, seed commitment, sealed share, masked input or unmasking share
that a client sends in the re-run round may equal one sent for that round before the kill: a client
that re-used its round keys, self-mask seed or masks would hand the server two maskings of inputs
under one mask (their difference in the clear), or the same shares twice.  The final aggregate is
still bit-identical to an uninterrupted run's (the masks cancel whatever they are).

The second test shows the check can fail: with each client's round randomness made a function of
(client, round), as a resume that "replays" its randomness for bit-identity would make it, the
re-run round repeats what was sent before the kill and the check names it.
"""
from __future__ import annotations

import hashlib
import itertools
import threading
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedhet.algorithms import registry
from fedhet.crypto import keys as ck
from fedhet.parties import codec
from fedhet.parties.federation import load
from fedhet.parties.inmemory import FederationFailed, InMemoryParty, run_inmemory
from fedhet.protocols import aggregation, secagg_client
from fedhet.protocols.secagg_messages import Kind

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

ALGORITHMS = Path(__file__).resolve().parents[1] / "algorithms"
RUN_ID = "resume-secagg"
# (algorithm, its smoke federation, victim, the step after whose checkpoint it is killed, the kinds the others
# must have sent for the re-run round before the kill for the check to mean something)
CASES = {
    # secagg_bench: c02 dies after round 0; the server runs round 1 without it (a dropout) up to the masked
    # inputs and unmasking shares of c00 and c01, then waits for c02's report forever: round 1 is re-run
    "secagg_bench": ("secagg_job", "c02", 1, {Kind.KEYS, Kind.SHARES, Kind.MASKED, Kind.UNMASK}),
    # FedAvg: client2 dies after its round-1 submission; the others train and advertise their round-2 keys
    # while the server waits for client2's evaluation: round 2 is re-run
    "fedavg_logreg": ("fedavg_logreg", "client2", 2, {Kind.KEYS}),
}


def secrets_sent(payload: dict, kind: str) -> list[bytes]:
    """What a client's secure-aggregation message carries that must be fresh in every run of a round."""
    if kind == Kind.KEYS:
        return [bytes(payload["c_pk"]), bytes(payload["s_pk"]), bytes(payload["commit"])]
    if kind == Kind.SHARES:
        return [bytes(c) for c in payload["ct"].values()]
    if kind == Kind.MASKED:
        return [np.asarray(payload["y"]).tobytes()]
    if kind == Kind.UNMASK:
        return [row.tobytes() for row in np.asarray(payload["shares"])]
    return []


class Recorder:
    """Every client -> server secure-aggregation message sent on the in-memory transport, decoded:
    (run label, round r, kind, sender) -> its secret-bearing values; and the server's aggregate of
    every round: (run label, round) -> the mean's bytes."""

    def __init__(self, monkeypatch):
        self.run = ""
        self.sent: dict[tuple[str, int, str, str], list[bytes]] = {}
        self.means: dict[tuple[str, int], bytes] = {}
        real = InMemoryParty._transport_send
        real_aggregate = aggregation.SecureAggregator.aggregate
        lock = threading.Lock()

        def aggregate(agg, party, clients, round=0, length=None):
            res = real_aggregate(agg, party, clients, round, length)
            self.means[(self.run, int(round))] = np.asarray(res.mean, dtype=np.float64).tobytes()
            return res
        monkeypatch.setattr(aggregation.SecureAggregator, "aggregate", aggregate)

        def send(party, to, frames):
            env = codec.decode([bytes(f) for f in frames])
            if env.kind in (Kind.KEYS, Kind.SHARES, Kind.MASKED, Kind.UNMASK):
                with lock:
                    self.sent.setdefault((self.run, int(env.payload["r"]), env.kind, env.frm), []).extend(
                        secrets_sent(env.payload, env.kind))
            return real(party, to, frames)
        monkeypatch.setattr(InMemoryParty, "_transport_send", send)

    def of(self, run: str, r: int) -> dict[tuple[str, str], list[bytes]]:
        return {(k, frm): v for (label, rr, k, frm), v in self.sent.items() if label == run and rr == r}

    def rounds(self, run: str) -> set[int]:
        return {r for (label, r, _, _) in self.sent if label == run}


def kill_and_resume(name: str, tmp_path: Path, monkeypatch) -> tuple[Recorder, dict, dict, dict, dict]:
    """The uninterrupted run, the run killed after ``victim``'s checkpoint, its resume; with every
    secure-aggregation message recorded and the server's aggregate of every round."""
    folder, victim, step, _ = CASES[name]
    fed = load(ALGORITHMS / folder / "smoke.toml")
    algo = registry.get_algorithm(name)
    parties, cfg = [(p.name, p.role) for p in fed.parties], fed.algorithm_cfg()
    rec = Recorder(monkeypatch)
    rec.run = "reference"
    ref = run_inmemory(algo, parties, cfg, seed=fed.seed, run_id=RUN_ID, timeout=60, clock="virtual")
    rec.run = "killed"
    with pytest.raises(FederationFailed) as killed:
        run_inmemory(algo, parties, cfg, seed=fed.seed, run_id=RUN_ID, timeout=60, clock="virtual",
                     checkpoint_dir=tmp_path, kill={victim: step})
    assert type(killed.value.failures.get(victim)).__name__ == "Killed", killed.value
    rec.run = "resumed"
    resumed: dict = {}
    got = run_inmemory(algo, parties, cfg, seed=fed.seed, run_id=RUN_ID, timeout=60, clock="virtual",
                       checkpoint_dir=tmp_path, resume=True, resumed=resumed)
    return rec, ref, got, resumed, {"victim": victim, "step": step}


def reused(rec: Recorder) -> tuple[set[int], list[str]]:
    """The rounds run both before the kill and after the resume, and every value sent in one of them
    after the resume that was already sent for it before the kill (where, which kind, by whom)."""
    again = rec.rounds("killed") & rec.rounds("resumed")
    out = []
    for r in sorted(again):
        before = {v: (k, frm) for (k, frm), vs in rec.of("killed", r).items() for v in vs}
        for (k, frm), vs in rec.of("resumed", r).items():
            out += [f"round {r}: {k} from {frm} repeats {before[v][0]} from {before[v][1]} sent before the kill"
                    for v in vs if v in before]
    return again, out


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_resumed_secure_aggregation_round_uses_fresh_keys_and_masks(name, tmp_path, monkeypatch):
    rec, ref, got, resumed, where = kill_and_resume(name, tmp_path, monkeypatch)
    again, repeats = reused(rec)
    assert again, f"{name}: no secure-aggregation round ran both before the kill and after the resume ({where})"
    r = max(again)
    assert {r} == set(resumed.values()), (r, resumed)   # the round after the newest common checkpoint
    kinds = {k for k, _ in rec.of("killed", r)}
    assert CASES[name][3] <= kinds, f"{name}: before the kill round {r} only got as far as {sorted(kinds)}"
    assert not repeats, "\n".join(repeats)
    # ... and every aggregate of the resumed run, the final one included, is the uninterrupted run's, bit for bit
    after = {rr: m for (label, rr), m in rec.means.items() if label == "resumed"}
    assert after and max(after) == max(rr for label, rr in rec.means if label == "reference")
    assert after == {rr: m for (label, rr), m in rec.means.items() if label == "reference" and rr in after}
    if name == "fedavg_logreg":   # and so is the model; the job reports timings beside its errors
        assert got == ref
    else:
        assert [(x["max_err"], x["bound"], x["contributors"]) for x in got["server"]] == \
            [(x["max_err"], x["bound"], x["contributors"]) for x in ref["server"]]


def test_repeated_round_randomness_would_be_caught(tmp_path, monkeypatch):
    """Each client's round key pairs and self-mask seed made a function of (client, round): the re-run
    round then repeats its public keys and seed commitment (its masked input, too, wherever the round's
    client set is the same as before the kill), and the check names every client that did."""
    local = threading.local()
    real_advertise, real_x25519, real_seed = (secagg_client.advertise_keys, ck.generate_x25519,
                                              secagg_client.random_seed)

    def advertise(st, ident_sk):
        local.stream = (hashlib.sha256(f"{st.me}/{st.r}/{i}".encode()).digest() for i in itertools.count())
        try:
            return real_advertise(st, ident_sk)
        finally:
            local.stream = None

    def repeating(real, make=bytes):   # inside advertise_keys: the next value of the (client, round) stream
        return lambda: real() if getattr(local, "stream", None) is None else make(next(local.stream))

    monkeypatch.setattr(secagg_client, "advertise_keys", advertise)
    monkeypatch.setattr(ck, "generate_x25519", repeating(real_x25519, X25519PrivateKey.from_private_bytes))
    monkeypatch.setattr(secagg_client, "random_seed", repeating(real_seed))
    rec, *_ = kill_and_resume("secagg_bench", tmp_path, monkeypatch)
    again, repeats = reused(rec)
    assert again and repeats
    said = "\n".join(repeats)
    for client in ("c00", "c01"):   # c02 was killed before round 1: it advertises its keys once
        assert f"{Kind.KEYS} from {client} repeats {Kind.KEYS} from {client}" in said, said
