"""A hostile *listed* party (issue 27, items 2, 4, 6, 7, 8, 14, 15), reproduced in memory.

Each attack comes from a party whose keys the federation trusts; each test asserts who is named
(a :class:`~fedhet.parties.api.PeerFault` naming the sender, or "cannot name a sender" with the
evidence) and, for floods, the bound on what the victim holds.

* Item 2: wrong secure-aggregation unmasking shares (right shape, x and field) fail the round
  naming their sender, wherever it sorts; with no redundant share, or where one dealer could be
  to blame, the round fails saying it cannot name a sender (before: the server blamed a seed's
  owner, or ignored the shares).
* Item 4: a Paillier ciphertext in (0, n**2) but not a unit (c = n) is refused on receipt naming
  the guest (before: the host crashed with ZeroDivisionError).
* Item 6: NaN latents in STFL fail the host naming the guest (before: "latents[0] contains NaN").
* Item 7: a weight of inf, under the declared schema, is dropped and named like NaN, a huge
  weight, a short vector or float32 (before: the whole run failed).
* Item 8: far-future-round floods of the largest schema-valid message of every client kind hold
  at most one message per kind in the round inbox and name the sender; a masked input longer
  than the settings allow is refused on receipt (before: every future message was held).
* Items 14, 15: the audit reports a message deleted from both ends (a sequence gap), and is
  "unverified" (exit 1) when the signing keys come from the run folder itself.
"""
from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedhet.crypto import paillier as pl
from fedhet.crypto.field import F61
from fedhet.parties import api, codec, contract
from fedhet.parties.ops import cli
from fedhet.parties import schema as sch
from fedhet.parties.api import PeerFault
from fedhet.parties.audit import audit
from fedhet.parties.declare import declare, index
from transcript_tools import public_hex, resign
from fedhet.parties.inmemory import FederationFailed, InMemoryHub, run_inmemory
from fedhet.parties.transcript import Transcript
from fedhet.protocols import he_interactive as hei
from fedhet.protocols import secagg
from fedhet.protocols.secagg_messages import MAX_CLIENTS, SEALED_BYTES
from fedhet.protocols.aggregation import Kind as AggKind, SecureAggregator, make_aggregator
from fedhet.protocols.aggregation import declarations as agg_declarations
from fedhet.protocols.secagg import Faults, SecAggError
from fedhet.protocols.aggregation_settings import AggregationSettings

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

M = 12


class Tamper:
    """A party as its role code sees it, whose outgoing ``kind`` payloads pass through ``edit`` first:
    the honest protocol code, with one message changed as an attacker would."""

    def __init__(self, party, kind: str, edit):
        self._party, self._kind, self._edit = party, kind, edit

    def __getattr__(self, name):
        return getattr(self._party, name)

    def send(self, to, kind, payload):
        if kind == self._kind:
            payload = self._edit(payload)
        return self._party.send(to, kind, payload)


def agg_federation(clients, cfg, attacker=None, attack=None, faults=None, timeout=30):
    """The server aggregates once; clients submit through the aggregator, under the declared schemas
    (strict, as the process runtime).  ``attack(party)`` replaces the attacker's honest submit;
    ``faults``: client -> secagg Faults."""
    def server(party, s, d):
        return make_aggregator(AggregationSettings(**cfg)).aggregate(party, clients, 0, length=M)

    def client(party, s, d):
        if party.name == attacker and attack is not None:
            return attack(party)
        agg = make_aggregator(AggregationSettings(**cfg))
        if faults and party.name in faults:
            agg = SecureAggregator(agg.config, faults=faults[party.name])
        x = np.linspace(-1, 1, M) * (1 + clients.index(party.name))
        return agg.submit(party, "server", x, 1.0, 0)

    algo = types.SimpleNamespace(NAME="hostile-agg", ROLES={"server": server, "client": client},
                                 load_data=lambda *a: None, DECLARATIONS=agg_declarations(None, M))
    return run_inmemory(algo, [("server", "server")] + [(c, "client") for c in clients], timeout=timeout)


def wrong_shares(only_owner=None):
    """An attack: the honest client, whose unmasking shares (all, or those of ``only_owner``'s seed) are
    off by one, still field elements at the right x."""
    def attack(party):
        def edit(p):
            a = p["shares"].copy()
            rows = range(len(a)) if only_owner is None else [p["b_of"].index(only_owner)]
            for i in rows:
                a[i, 0] = (int(a[i, 0]) + 1) % F61.p
            return {**p, "shares": a}
        x = np.linspace(-1, 1, M)
        return make_aggregator(AggregationSettings(**SECURE)).submit(Tamper(party, secagg.Kind.UNMASK, edit), "server", x, 1.0, 0)
    return attack


SECURE = {"aggregation": "secure", "aggregation_timeout": 5.0}


# ------------------------------------------------------------------ item 2: unmasking shares
@pytest.mark.parametrize("n,attacker", [(4, "c0"), (4, "c3"), (5, "c0"), (5, "c4")])
def test_wrong_unmasking_shares_fail_the_round_naming_their_sender(n, attacker):
    """n = 4: t = 3 of 4 holders (one redundant share, the commitment places the wrong one); n = 5:
    t = 3 of 5 (two redundant, the syndromes place it).  c0 sorts among the shares used to
    reconstruct (before: the server blamed a seed's owner), c3/c4 after them (before: ignored)."""
    clients = [f"c{i}" for i in range(n)]
    with pytest.raises(FederationFailed) as e:
        agg_federation(clients, SECURE, attacker, wrong_shares())
    err = e.value.failures["server"]
    assert isinstance(err, PeerFault), err
    assert err.peer == attacker and err.kind == secagg.Kind.UNMASK
    assert "wrong unmasking shares" in str(err) and "no sum is released" in str(err)
    assert set(e.value.failures) == {"server"}  # no honest client is blamed


def test_one_wrong_share_of_another_dealers_seed_names_nobody_but_says_who_could_be_at_fault():
    """Off only for c1's seed: c0 sent a wrong share, or c1 dealt it one: not proven either way."""
    clients = ["c0", "c1", "c2", "c3"]
    with pytest.raises(FederationFailed) as e:
        agg_federation(clients, SECURE, "c0", wrong_shares(only_owner="c1"))
    err = e.value.failures["server"]
    assert isinstance(err, SecAggError) and not isinstance(err, PeerFault), err
    assert "sender unknown" in str(err) and "'c0' sent a wrong share or 'c1' dealt it one" in str(err)


def test_wrong_share_without_a_redundant_one_cannot_name_a_sender():
    """t = 3 shares exactly (c3 vanished after its masked input): the seeds do not match their
    commitment, and nothing tells whose share is wrong."""
    clients = ["c0", "c1", "c2", "c3"]
    with pytest.raises(FederationFailed) as e:
        agg_federation(clients, SECURE, "c0", wrong_shares(), faults={"c3": Faults(stop_after="masked")})
    err = e.value.failures["server"]
    assert isinstance(err, SecAggError) and not isinstance(err, PeerFault), err
    assert "cannot name a sender" in str(err) and "no sum is released" in str(err)


@pytest.mark.unit
def test_redundant_share_checks_detect_and_locate_one_wrong_share():
    from fedhet.crypto.shamir import interpolate, locate_error, parity_check, share, syndromes
    sh = share(F61.random((secagg.SECRET_ELEMS,)), 9, 4)
    xs = list(range(1, 10))
    assert not np.any(syndromes(sh, xs, 4)) and not np.any(F61.sum(F61.mul(sh, parity_check(xs, 4)[:, None]), 0))
    assert np.array_equal(interpolate(sh[:4], xs[:4], xs[4:]), sh[4:])
    bad = sh.copy()
    bad[6, 2] = (int(bad[6, 2]) + 1) % F61.p
    assert np.any(F61.sum(F61.mul(bad, parity_check(xs, 4)[:, None]), 0))
    assert locate_error(bad, xs, 4) == 6
    assert locate_error(bad[[0, 1, 2, 3, 6]], [1, 2, 3, 4, 7], 4) is None  # t + 1: detected, not placed
    bad[1, 0] = (int(bad[1, 0]) + 1) % F61.p
    assert locate_error(bad, xs, 4) is None  # two wrong: no single share explains it


def test_consistent_redundant_shares_still_give_the_exact_sum():
    res = agg_federation(["c0", "c1", "c2", "c3", "c4"], SECURE)["server"]
    want = sum(np.linspace(-1, 1, M) * (1 + i) for i in range(5)) / 5
    assert res.contributors == ["c0", "c1", "c2", "c3", "c4"]
    assert np.max(np.abs(res.mean - want)) <= res.mean_error_bound


# ------------------------------------------------------------------ item 7: inputs under the schema
def raw(x, w):
    def attack(party):
        party.send("server", AggKind.PLAIN, {"r": 0, "x": x, "w": w, "amax": 0.0})
        return "sent"
    return attack


PLAIN = {"aggregation": "plain", "secagg_max_weight": 100.0, "aggregation_timeout": 5.0}


@pytest.mark.parametrize("what,x,w,why", [
    ("inf_weight", np.ones(M), float("inf"), "weight must be a number"),
    ("nan_weight", np.ones(M), float("nan"), "weight must be a number"),
    ("nan", np.r_[np.ones(M - 1), np.nan], 1.0, "NaN or inf"),
    ("huge_weight", np.ones(M), 1e12, "weight must be a number"),
    ("short", np.ones(M - 2), 1.0, f"has {M - 2} elements"),
    ("f32", np.ones(M, np.float32), 1.0, "1-D float64 vector"),
    ("string_weight", np.ones(M), "1", "expected a number"),  # refused by the schema on receipt
])
def test_a_bad_plain_update_is_dropped_and_named_and_the_round_goes_on(what, x, w, why):
    clients = ["c0", "c1", "c2"]
    res = agg_federation(clients, PLAIN, "c1", raw(x, w))["server"]
    assert set(res.rejected) == {"c1"} and why in res.rejected["c1"], (what, res.rejected)
    assert res.contributors == ["c0", "c2"]


def test_a_secagg_message_against_its_schema_is_dropped_and_named_and_the_round_goes_on():
    def bad_sig(party):
        party.send("server", secagg.Kind.KEYS, {"r": 0, "c_pk": b"a" * 32, "s_pk": b"b" * 32,
                                                 "commit": b"c" * 32, "sig": b"short", "have": b""})
        return "sent"
    res = agg_federation(["c0", "c1", "c2", "c3"], SECURE, "c1", bad_sig)["server"]
    assert set(res.rejected) == {"c1"} and "field 'sig': 5 bytes, 64 declared" in res.rejected["c1"]
    assert res.contributors == ["c0", "c2", "c3"]


# ------------------------------------------------------------------ item 8: future-round floods
def largest(kind: str, r: int, max_length: int) -> dict:
    """The largest payload of ``kind`` its schema accepts (with the vector length ``max_length``)."""
    n = MAX_CLIENTS
    if kind == secagg.Kind.KEYS:
        return {"r": r, "c_pk": b"a" * 32, "s_pk": b"b" * 32, "commit": b"c" * 32, "sig": b"s" * 64,
                "have": b"h" * 32}
    if kind == secagg.Kind.SHARES:  # bytes travel in the header, whose size the codec bounds first
        n = min(n, (codec.MAX_HEADER_BYTES - 4096) // (SEALED_BYTES + 16))
        return {"r": r, "ct": {f"c{i:05d}": b"x" * SEALED_BYTES for i in range(n)}}
    if kind == secagg.Kind.MASKED:
        return {"r": r, "y": np.zeros(max_length + 1, np.uint64)}
    if kind == secagg.Kind.UNMASK:
        return {"r": r, "b_of": [], "s_of": [], "shares": np.zeros((n, secagg.SECRET_ELEMS), np.uint64)}
    raise AssertionError(kind)


FLOOD_KINDS = [secagg.Kind.KEYS, secagg.Kind.SHARES, secagg.Kind.MASKED, secagg.Kind.UNMASK]


@pytest.mark.parametrize("kind", FLOOD_KINDS)
def test_future_round_flood_holds_one_message_per_kind_and_names_the_sender(kind):
    """The attacker sends the largest schema-valid message of ``kind`` for rounds 5, 6, ... while the
    server reads round 0: the inbox keeps the first (one later round, once per kind) and refuses
    the next, naming the sender, who stays out; the mailbox holds the rest within its per-sender,
    per-kind bound.  Held bytes are counted, not measured through RSS."""
    max_length = 1 << 16
    decls = index(agg_declarations(None, max_length))
    hub = InMemoryHub({"server": "server", "mallory": "client"})
    server = hub.party("server", declarations=decls, timeout=5)
    mallory = hub.party("mallory", declarations=decls, timeout=5)
    flood = 6
    one = secagg.payload_bytes(largest(kind, 5, max_length))
    for r in range(5, 5 + flood):
        mallory.send("server", kind, largest(kind, r, max_length))
    inbox = secagg.RoundInbox(server.log)
    with pytest.raises(PeerFault) as e:
        inbox.recv(server, "mallory", kind, 0, deadline=0.0)
    assert e.value.peer == "mallory" and "at most one later round" in e.value.reason
    # What the victim holds for the sender: at most one message per kind in the inbox (here none: the
    # sender is out), the unread rest in the party API's queue, within its per-sender, per-kind bound;
    # even the largest schema-valid message of the kind fits that bound.
    assert inbox.held_bytes() == 0 and inbox.held_bytes("mallory") <= one
    assert one <= api.QUEUE_MAX_BYTES
    with pytest.raises(PeerFault):  # and it stays out, whatever it sends next
        inbox.recv(server, "mallory", secagg.Kind.KEYS, 0, deadline=0.0)


def test_one_later_round_per_sender_is_held_for_its_round():
    """An honest sender one round ahead (dropped from round 0) is served in round 1 from the inbox."""
    decls = index(agg_declarations(None, M))
    hub = InMemoryHub({"server": "server", "c0": "client"})
    server = hub.party("server", declarations=decls, timeout=5)
    c0 = hub.party("c0", declarations=decls, timeout=5)
    c0.send("server", secagg.Kind.KEYS, largest(secagg.Kind.KEYS, 1, M))
    c0.send("server", secagg.Kind.MASKED, largest(secagg.Kind.MASKED, 1, M))
    inbox = secagg.RoundInbox(server.log)
    assert inbox.recv(server, "c0", secagg.Kind.KEYS, 0, deadline=0.0) is None  # round 1 kept
    assert inbox.recv(server, "c0", secagg.Kind.MASKED, 0, deadline=0.0) is None
    assert inbox.held_bytes("c0") == secagg.payload_bytes(largest(secagg.Kind.KEYS, 1, M)) + 8 * (M + 1) + 8
    assert inbox.recv(server, "c0", secagg.Kind.KEYS, 1, deadline=0.0)["r"] == 1
    assert inbox.recv(server, "c0", secagg.Kind.MASKED, 1, deadline=0.0)["r"] == 1
    assert inbox.held_bytes() == 0


def test_a_masked_input_longer_than_the_settings_allow_is_refused_on_receipt():
    decls = index(agg_declarations(None, M))
    hub = InMemoryHub({"server": "server", "mallory": "client"})
    server = hub.party("server", declarations=decls, timeout=5)
    mallory = hub.party("mallory", declarations=decls, timeout=5)
    mallory.send("server", secagg.Kind.MASKED, {"r": 0, "y": np.zeros(M + 1, np.uint32)})  # exactly allowed
    assert server.recv("mallory", secagg.Kind.MASKED, timeout=1)["y"].size == M + 1
    mallory.send("server", secagg.Kind.MASKED, {"r": 0, "y": np.zeros(M + 2, np.uint32)})
    with pytest.raises(api.MessageRejected) as e:
        server.recv("mallory", secagg.Kind.MASKED, timeout=1)
    assert e.value.peer == "mallory" and f"at most {M + 1} declared" in str(e.value)


# ------------------------------------------------------------------ item 4: Paillier ciphertexts
@pytest.mark.unit
def test_a_ciphertext_that_is_no_unit_is_refused_by_the_decoder():
    pk, _ = pl.generate_keypair(512)
    n = int(pk.n)
    width = (2 * 512) // 8
    good = pl.ciphertexts_to_bytes([pk.encrypt(3).ciphertext(be_secure=False)], pk)
    assert len(pl.ciphertexts_from_bytes(good, pk)) == 1
    for c in (n, 2 * n, n * (n - 1)):
        bad = np.frombuffer(c.to_bytes(width, "big"), np.uint8).reshape(1, width)
        with pytest.raises(ValueError, match="ciphertext 0 is not a unit mod n"):
            pl.ciphertexts_from_bytes(np.concatenate([good, bad])[::-1].copy(), pk)


@pytest.mark.parametrize("scheme", ["paillier", "naive"])
def test_he_guest_sending_c_equal_n_is_named_by_the_host(scheme):
    d, K, b = 3, 2, 4
    spec = hei.LayerSpec(scheme=scheme, key_bits=1024, batch_size=8, pool=False)
    W = -np.ones((d, K)) * 0.25  # negative weights: the host inverts every ciphertext

    def host(party, cfg, data):
        h = hei.host_layer(party, "g", spec, W)
        h.setup()
        h.recv_acts()
        h.send_forward()
        return {}

    def guest(party, cfg, data):
        g = hei.guest_layer(party, "h", spec, d, K)

        def edit(p):
            part = "fwd" if "fwd" in p else "all"
            ct = p[part]["ct"].copy()
            n = int(g.ops.pk.n)
            ct[0] = np.frombuffer(n.to_bytes(ct.shape[1], "big"), np.uint8)
            return {**p, part: {**p[part], "ct": ct}}
        g.party = Tamper(party, hei.Kind.ACTS, edit)
        g.setup()
        g.forward(np.ones((b, d)), False)
        return {}

    mod = types.SimpleNamespace(NAME="hei-hostile", ROLES={"host": host, "guest": guest}, load_data=None,
                                DECLARATIONS=hei.declarations(spec, d, K))
    with pytest.raises(FederationFailed) as e:
        run_inmemory(mod, [("h", "host"), ("g", "guest")], data={"h": None, "g": None}, timeout=30)
    err = e.value.failures["h"]
    assert isinstance(err, PeerFault), err
    assert err.peer == "g" and err.kind == hei.Kind.ACTS and "not a unit mod n**2" in err.reason


# ------------------------------------------------------------------ item 6: STFL NaN latents
def test_stfl_nan_latents_fail_the_host_naming_the_guest(monkeypatch):
    from fedhet.algorithms import stfl as S

    real = S.encode

    def nan_encode(encoder, x):
        z = real(encoder, x).copy()
        z[0, 0] = np.nan
        return z

    monkeypatch.setattr(S.roles, "encode", nan_encode)
    cfg = {"epochs": 2, "vae_epochs": 2, "lr": 1e-2, "vae_lr": 1e-2, "n_guests": 1}
    with pytest.raises(FederationFailed) as e:
        run_inmemory(S, [("host", "host"), ("guest1", "guest")], cfg=cfg, seed=3, timeout=60)
    err = e.value.failures["host"]
    assert isinstance(err, PeerFault), err
    assert err.peer == "guest1" and err.kind == S.Kind.LATENT and "field 'z': contains NaN or inf" in str(err)


@pytest.mark.unit
def test_schema_arrays_must_be_finite_unless_declared_otherwise():
    a = np.array([[1.0, np.inf]], np.float32)
    with pytest.raises(sch.SchemaError, match=r"field 'z': contains NaN or inf \(first at index \[0, 1\]: inf\)"):
        sch.Arr("<f4", (None, None)).validate(a, "z")
    sch.Arr("<f4", (None, None), finite=False).validate(a, "z")
    sch.Arr("<u4", (None,)).validate(np.zeros(3, np.uint32), "z")


# ------------------------------------------------------------------ items 14 and 15: the audit
PING = "t/ping"
ALGO = contract.Algorithm(
    name="hostile-audit", summary="pings", roles={"a": lambda *a: {}, "b": lambda *a: {}}, load_data=lambda *a: None,
    declarations=lambda s: [declare(PING, "a", "b", "a counter", payload=sch.Fields({"i": sch.Int()}))])


@pytest.fixture
def ping_run(tmp_path) -> tuple[Path, dict]:
    """A real two-party run folder: 'a' sends 'b' five pings, both close; signed transcripts."""
    run = tmp_path / "run"
    keys = {p: Ed25519PrivateKey.generate() for p in ("a", "b")}
    hub = InMemoryHub({"a": "a", "b": "b"})
    decls = ALGO.declared({})
    parties = {}
    for p in ("a", "b"):
        (run / "parties" / p).mkdir(parents=True)
        tr = Transcript(run / "parties" / p / "transcript.jsonl", p, hub.run_id, keys[p])
        parties[p] = hub.party(p, declarations=decls, transcript=tr, timeout=5)
    for i in range(5):
        parties["a"].send("b", PING, {"i": i})
    assert [parties["b"].recv("a", PING)["i"] for _ in range(5)] == list(range(5))
    import threading
    t = threading.Thread(target=parties["b"].close)
    t.start()
    parties["a"].close()
    t.join()
    for p in parties.values():
        p.transcript.close()
    cfg = {"run_id": hub.run_id, "algorithm": {"name": ALGO.name}, "algorithm_cfg": {},
           "party": [{"name": p, "role": p, "sign_key": public_hex(keys[p])} for p in ("a", "b")]}
    (run / "config.json").write_text(json.dumps(cfg))
    return run, keys


def drop(which):
    def edit(recs):
        recs[:] = [r for r in recs if not which(r)]
    return edit


def lookup(name):
    return ALGO


def test_audit_reports_a_message_deleted_from_both_transcripts(ping_run):
    run, keys = ping_run
    assert audit(run, lookup).ok
    # the colluders: 'a' drops its send of seq 2, 'b' its receipt of it, each re-signing with its OWN key
    resign(run, "a", key=keys["a"], edit=drop(lambda r: r["dir"] == "send" and r["peer"] == "b" and r["seq"] == 2))
    resign(run, "b", key=keys["b"], edit=drop(lambda r: r["dir"] == "recv" and r["peer"] == "a" and r["seq"] == 2))
    rep = audit(run, lookup)
    assert not rep.ok
    assert rep.problems == ["a -> b: sequence number(s) 2 of 0..5 missing from both ends' transcripts: "
                            "message(s) deleted from both"], rep.problems


def test_audit_with_the_folders_own_keys_is_unverified_unless_accepted(ping_run, monkeypatch, capsys):
    run, keys = ping_run
    resign(run, "b", key=Ed25519PrivateKey.generate())  # a forged key, written into config.json
    rep = audit(run, lookup)
    assert rep.ok and rep.unverified and rep.exit_code == 1  # self-consistent, but proves nothing
    monkeypatch.setattr(cli, "_registry", lambda: types.SimpleNamespace(get_algorithm=lookup))
    capsys.readouterr()
    assert cli.main(["audit", str(run)]) == 1
    assert "unverified: the signing keys come from the run folder itself" in capsys.readouterr().out
    assert cli.main(["audit", str(run), "--trust-folder-keys"]) == 0
