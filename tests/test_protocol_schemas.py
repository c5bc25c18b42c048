"""Payload schemas of the protocols' message kinds (secure/plain aggregation, Shamir sharing, HE layer).

Honest runs record every payload sent and check each against its kind's schema (receipt is
strict too, so the run itself fails on a mismatch); tampered payloads (wrong dtype, extra field,
oversize list) fail, naming the field, and one fails a receiver in a real run.
"""
from __future__ import annotations

import numpy as np
import pytest

from fedhet.algorithms import fedavg_logreg
from fedhet.parties.contract import Algorithm
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.parties.schema import SchemaError
from fedhet.protocols import aggregation, he_interactive, secagg_messages, shamir_share
from fedhet.protocols.aggregation_settings import AggregationSettings

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

FED = [("server", "server"), ("client1", "client"), ("client2", "client"), ("client3", "client")]
VECS = {"client1": np.array([1.0, -2.0, 0.5]), "client2": np.array([0.25, 4.0, -1.0]),
        "client3": np.array([-3.0, 0.0, 2.0])}


def _decls(s):
    return (aggregation.declarations()
            + shamir_share.declarations(owner="client", holder="holder", coordinator="server"))


def _recording(party, sent: list):
    """Wrap ``party.send`` so every (kind, payload) sent is kept."""
    send = party.send

    def rec(to, kind, payload):
        sent.append((kind, payload))
        return send(to, kind, payload)
    party.send = rec


def _algo(server, client, **more):
    return Algorithm(name="schema_probe", summary="", roles={"server": server, "client": client, **more},
                     load_data=lambda s, ctx: None, declarations=_decls,
                     settings=fedavg_logreg.Settings, sizes=fedavg_logreg.sizes)


def _check_all(sent):
    by_kind = {d.kind: d for d in _decls(None)}
    for kind, payload in sent:
        spec = by_kind[kind].payload
        assert spec is not None, f"{kind} has no payload schema"
        spec.validate(payload, "", {})


@pytest.mark.parametrize("method", ["secure", "plain"])
def test_an_honest_aggregation_run_sends_only_payloads_matching_their_schemas(method):
    sent: list = []

    def client(party, s, data):
        _recording(party, sent)
        agg = aggregation.make_aggregator(AggregationSettings(aggregation=method))
        return {"status": agg.submit(party, "server", VECS[party.name], 1.0, round=0).status}

    def server(party, s, data):
        _recording(party, sent)
        agg = aggregation.make_aggregator(AggregationSettings(aggregation=method))
        res = agg.aggregate(party, sorted(VECS), round=0, length=3)
        return {"sum": res.sum.tolist(), "bound": res.sum_error_bound}

    out = run_inmemory(_algo(server, client), FED, {"aggregation": method}, timeout=60)
    want = sum(VECS.values())
    assert np.allclose(out["server"]["sum"], want, atol=out["server"]["bound"] + 1e-12)
    kinds = {k for k, _ in sent}
    if method == "secure":
        assert {secagg_messages.Kind.KEYS, secagg_messages.Kind.KEYLIST, secagg_messages.Kind.SHARES,
                secagg_messages.Kind.RELAY, secagg_messages.Kind.MASKED, secagg_messages.Kind.UNMASK_REQUEST,
                secagg_messages.Kind.UNMASK} <= kinds
    else:
        assert kinds == {aggregation.Kind.PLAIN}
    _check_all(sent)


def test_an_honest_shamir_run_sends_only_payloads_matching_their_schemas():
    sent: list = []
    holders = ["h1", "h2", "h3"]
    owners = sorted(VECS)

    def client(party, s, data):
        _recording(party, sent)
        shamir_share.share_to_holders(party, VECS[party.name], holders, t=2)
        return {}

    def holder(party, s, data):
        _recording(party, sent)
        got = shamir_share.receive_shares(party, owners, t=2)
        shamir_share.send_to_coordinator(party, "server", shamir_share.sum_shares([got[o] for o in owners]))
        return {}

    def server(party, s, data):
        _recording(party, sent)
        return {"value": shamir_share.reconstruct_at_coordinator(party, holders, t=2).value.tolist()}

    out = run_inmemory(_algo(server, client, holder=holder), FED + [(h, "holder") for h in holders], {},
                       timeout=60)
    assert np.allclose(out["server"]["value"], sum(VECS.values()), atol=1e-6)
    assert {k for k, _ in sent} == {"shamir/share", "shamir/result"}
    _check_all(sent)


def _fails_at(spec, payload, field):
    with pytest.raises(SchemaError) as e:
        spec.validate(payload, "", {})
    assert e.value.path == field, e.value


@pytest.mark.unit
def test_tampered_secagg_payloads_fail_naming_the_field():
    s = secagg_messages.SCHEMAS
    y = np.zeros(4, dtype=np.uint32)
    s[secagg_messages.Kind.MASKED].validate({"r": 0, "y": y}, "", {})
    _fails_at(s[secagg_messages.Kind.MASKED], {"r": 0, "y": y.astype(np.float64)}, "y")
    _fails_at(s[secagg_messages.Kind.MASKED], {"r": 0, "y": y, "extra": 1}, "extra")
    names = [f"c{i}" for i in range(secagg_messages.MAX_CLIENTS + 1)]
    spec = s[secagg_messages.Kind.UNMASK_REQUEST]
    # OneOf (request | dropped | abort) reports at the payload level; the honest option's reason names the size.
    with pytest.raises(SchemaError, match="10001 items, at most 10000"):
        spec.validate({"r": 0, "u3": names}, "", {})
    _fails_at(s[secagg_messages.Kind.KEYS], {"r": 0, "c_pk": b"x" * 31, "s_pk": b"x" * 32, "commit": b"x" * 32,
                                             "sig": b"x" * 64}, "c_pk")


@pytest.mark.unit
def test_tampered_shamir_and_he_payloads_fail_naming_the_field():
    spec = shamir_share.share_schema()
    ok = {"v": 1, "tag": "", "x": 1, "t": 2, "p": (1 << 61) - 1, "frac_bits": 16, "bound": 10, "err": 0.0,
          "shares": np.zeros(3, dtype=np.uint64)}
    spec.validate(ok, "", {})
    _fails_at(spec, {**ok, "shares": np.zeros(3, dtype=np.int64)}, "shares")
    _fails_at(spec, {**ok, "secret": 1}, "secret")
    _fails_at(spec, {**ok, "x": 0}, "x")
    masked = he_interactive.MASKED
    masked.validate(np.zeros((2, 3, 22), dtype=np.uint8), "", {})
    masked.validate(np.zeros((3, 2)), "", {})
    _fails_at(masked, np.zeros((3, 2), dtype=np.float32), "")
    ct = he_interactive.PAILLIER_CT
    good = {"meta": {"shape": [2, 3]}, "ct": np.zeros((6, 512), dtype=np.uint8)}
    ct.validate(good, "", {})
    _fails_at(ct, {**good, "plain": np.zeros(3)}, "plain")
    _fails_at(he_interactive.CKKS_CT, [np.zeros(4, dtype=np.uint8)] * (he_interactive.MAX_CIPHERTEXTS + 1), "")


def test_a_tampered_plain_update_fails_the_receiver_naming_sender_kind_and_field():
    def client(party, s, data):
        party.send("server", aggregation.Kind.PLAIN, {"r": 0, "x": VECS[party.name].astype(np.int64),
                                                      "w": 1.0, "amax": 0.0})
        return {}

    def server(party, s, data):
        agg = aggregation.make_aggregator(AggregationSettings(aggregation="plain"))
        agg.aggregate(party, ["client1"], round=0, length=3)
        return {}

    with pytest.raises(FederationFailed) as e:
        run_inmemory(_algo(server, client), FED[:2], {"aggregation": "plain"}, timeout=20)
    msg = str(e.value)
    assert "'client1'" in msg and "'agg/plain'" in msg and "field 'x'" in msg
