"""Shamir-shared arrays between parties: plain-computation equality, any t of m, t - 1 learn nothing, audit."""
from __future__ import annotations

import dataclasses
import time
import types

import numpy as np
import pytest
from scipy import stats

from fedhet.algorithms import shamir_job
from fedhet.crypto.field import F61, PrimeField
from fedhet.crypto.prg import PRG
from fedhet.parties import codec
from fedhet.parties import declare as decl
from fedhet.parties.api import PeerFault
from fedhet.parties.inmemory import FederationFailed, InMemoryHub, run_inmemory
from fedhet.protocols import shamir_share as ss
from fedhet.protocols import shared_array

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

ALPHA = 1e-4
SLACK = 1e-9  # relative: float64 rounding of the plain reference computation


def prg(i: int) -> PRG:
    return PRG(i.to_bytes(32, "little"))


def within(got, plain, err) -> bool:
    plain = np.asarray(plain, dtype=np.float64)
    return bool(np.all(np.abs(got - plain) <= err + SLACK * (1 + np.abs(plain))))


def run(roles: dict, parties: list[tuple[str, str]], data=None, cfg=None, timeout: float = 20.0):
    algo = types.SimpleNamespace(NAME="shamir_test", ROLES=roles, load_data=lambda *a: None)
    data = {n: (data or {}).get(n) for n, _ in parties}
    return run_inmemory(algo, parties, cfg=cfg or {}, data=data, timeout=timeout)


def fed(n_owners: int, m: int) -> list[tuple[str, str]]:
    return ([(f"o{i}", "owner") for i in range(n_owners)] + [(f"h{j}", "holder") for j in range(1, m + 1)]
            + [("c", "coordinator")])




# ------------------------------------------------------- local operations
rng0 = np.random.default_rng(0)
X = rng0.uniform(-3, 3, (5, 4))
Y = rng0.uniform(-2, 2, (5, 4))
M = rng0.normal(size=(4, 3))
L = rng0.normal(size=(2, 5))
Mi = rng0.integers(-5, 6, (4, 3))
B3 = rng0.uniform(-3, 3, (6, 3, 4))   # a batch of 6 samples, 3 owners, 4 features each
A3 = rng0.random((3, 3)) / 3          # graph aggregation over the owner axis

# name -> (function of two shared/plain operands, the plain reference, inputs)
OPS = {
    "add": (lambda a, b: ss.add(a, b), lambda a, b: a + b, (X, Y)),
    "sub": (lambda a, b: ss.sub(a, b), lambda a, b: a - b, (X, Y)),
    "neg": (lambda a, b: ss.neg(a), lambda a, b: -a, (X, Y)),
    "sum over owners": (lambda a, b: ss.sum_shares([a, b, a]), lambda a, b: 2 * a + b, (X, Y)),
    "scale float": (lambda a, b: ss.scale(a, -0.3712), lambda a, b: -0.3712 * a, (X, Y)),
    "scale int": (lambda a, b: ss.scale(a, -7), lambda a, b: -7 * a, (X, Y)),
    "scale elementwise": (lambda a, b: ss.scale(a, M[:, 0]), lambda a, b: a * M[:, 0], (X, Y)),
    "add public": (lambda a, b: ss.add_public(a, 0.123), lambda a, b: a + 0.123, (X, Y)),
    "add public int": (lambda a, b: ss.add_public(a, np.arange(4)), lambda a, b: a + np.arange(4), (X, Y)),
    "matmul float": (lambda a, b: ss.matmul(a, M), lambda a, b: a @ M, (X, Y)),
    "matmul int": (lambda a, b: ss.matmul(a, Mi), lambda a, b: a @ Mi, (X, Y)),
    "matmul vector": (lambda a, b: ss.matmul(a, M[:, 1]), lambda a, b: a @ M[:, 1], (X, Y)),
    "lmatmul float": (lambda a, b: ss.lmatmul(L, a), lambda a, b: L @ a, (X, Y)),
    "lmatmul vector": (lambda a, b: ss.lmatmul(L[0], a), lambda a, b: L[0] @ a, (X, Y)),
    "lmatmul on 1-d": (lambda a, b: ss.lmatmul(M.T, a[0]), lambda a, b: M.T @ a[0], (X, Y)),
    "mixed scales": (lambda a, b: ss.add(ss.matmul(a, M), ss.matmul(b, Mi)), lambda a, b: a @ M + b @ Mi, (X, Y)),
    "stack + owner-axis graph": (
        lambda a, b: ss.matmul(ss.lmatmul(A3, ss.stack([a[:, 0], a[:, 1], a[:, 2]], axis=1), frac_bits=12), M,
                               frac_bits=12),
        lambda a, b: A3 @ np.stack([a[:, 0], a[:, 1], a[:, 2]], axis=1) @ M, (B3, Y)),
    "concatenate + views": (lambda a, b: ss.concatenate([a.T, b[1:3].reshape(4, 2)], axis=1)[::-1],
                            lambda a, b: np.concatenate([a.T, b[1:3].reshape(4, 2)], axis=1)[::-1], (X, Y)),
    "operators": (lambda a, b: L @ (2 * a - b + 1.5) @ M - a[:2, :1],
                  lambda a, b: L @ (2 * a - b + 1.5) @ M - a[:2, :1], (X, Y)),
}


@pytest.mark.unit
@pytest.mark.parametrize("op", OPS)
def test_linear_operations_on_shares_match_plain_within_the_tracked_bound(op):
    fn, plain_fn, (a, b) = OPS[op]
    m, t = 5, 3
    fb = 12 if op.startswith("stack") else 16
    sa = ss.share_array(a, m, t, frac_bits=fb, max_abs=4.0, prg=prg(1))
    sb = ss.share_array(b, m, t, frac_bits=fb, max_abs=4.0, prg=prg(2))
    outs = [fn(x, y) for x, y in zip(sa, sb)]
    plain = plain_fn(a, b)
    assert outs[0].shape == np.shape(plain)
    err = outs[0].err
    assert 0 < err < 1e-2  # a real, and useful, bound
    for subset in [(0, 1, 2), (4, 2, 0), (1, 3, 4), (0, 1, 2, 3, 4)]:
        got = ss.reconstruct_shares([outs[i] for i in subset])
        assert got.shape == np.shape(plain)
        assert within(got, plain, err), (op, np.max(np.abs(got - plain)), err)
    assert np.max(np.abs(plain)) <= outs[0].max_abs


@pytest.mark.unit
def test_integer_data_with_integer_matrices_is_exact():
    rng = np.random.default_rng(1)
    xs = [rng.integers(-1000, 1000, (6, 3)) for _ in range(3)]
    ps = [rng.integers(-9, 10, (3, 2)) for _ in range(3)]
    parts = [ss.share_array(x, 4, 2, frac_bits=0, max_abs=1000) for x in xs]
    outs = [ss.sum_shares([ss.matmul(parts[i][k], ps[i]) for i in range(3)]) for k in range(4)]
    assert outs[0].err == 0.0 and outs[0].frac_bits == 0
    got = ss.reconstruct_shares(outs[2:])
    assert np.array_equal(got, sum(x @ p for x, p in zip(xs, ps)).astype(np.float64))


@pytest.mark.unit
@pytest.mark.parametrize("top", [1, 3, 2**20, 2**40, 2**52])
@pytest.mark.parametrize("p", [F61.p, 4294967291, 11])
def test_public_matmul_equals_the_generic_field_product(top, p):
    # the limb/BLAS shortcut for public matrices, in every regime: 2-4 limbs, K blocks, generic fallback
    fld = PrimeField(p)
    rng = np.random.default_rng(top % 1000 + p % 1000)
    for K, shape in [(1, (1, 1)), (37, (3, 37)), (700, (2, 4, 700))]:
        a = fld.random(shape, prg(K))
        a[..., :1] = p - 1
        for ms in (rng.integers(-top, top + 1, (K, 3)), rng.integers(-top, top + 1, K), np.full((K, 2), -top)):
            pub = shared_array.PublicOperand(fld.from_int(ms), ms.astype(np.int64), ms.astype(np.float64), 0)
            assert np.array_equal(shared_array.public_matmul(a, pub, fld), fld.matmul(a, pub.enc)), (K, ms.shape)


@pytest.mark.unit
def test_fixedpoint_products_add_fractional_bits():
    parts = ss.share_array(X, 3, 2, frac_bits=10, max_abs=4.0)
    one = ss.matmul(parts[0], M, frac_bits=7)
    assert one.frac_bits == 17
    assert ss.matmul(one, np.eye(3, dtype=np.int64)).frac_bits == 17  # integer matrices add none
    assert ss.lmatmul(L, ss.matmul(parts[0], M), frac_bits=5).frac_bits == 31
    assert ss.add(parts[0][:, :3], one).frac_bits == 17  # lifted to the finer scale
    with pytest.raises(ValueError, match="truncation"):
        ss.lift(one, 10)


@pytest.mark.unit
def test_overflow_is_refused_before_it_can_wrap():
    parts = ss.share_array(X, 3, 2, frac_bits=16, max_abs=4.0)
    y = ss.matmul(ss.matmul(parts[0], M), M.T)       # 48 fractional bits: still fits
    with pytest.raises(ss.ShareRangeError, match="wrap around"):
        ss.matmul(y, M)                               # 64 would not
    big = ss.share_array(X, 3, 2, frac_bits=16, max_abs=2.0**40)
    with pytest.raises(ss.ShareRangeError, match="wrap around"):
        ss.scale(big[0], 1e5)
    with pytest.raises(ss.ShareRangeError, match="wrap around"):
        ss.sum_shares([big[0]] * 20000)
    with pytest.raises(ss.ShareRangeError, match="range"):
        ss.share_array([1e18], 3, 2)
    with pytest.raises(ss.ShareRangeError, match="wrap around"):
        ss.share_array([1.0], 3, 2, max_abs=2.0**50)
    # the same bound logic in a small field
    small = ss.share_array(np.array([3, -4]), 3, 2, frac_bits=0, max_abs=5, field=PrimeField(11))
    with pytest.raises(ss.ShareRangeError, match="PrimeField\\(11\\)"):
        ss.scale(small[0], 2)


@pytest.mark.unit
def test_max_abs_is_public_and_checked():
    with pytest.raises(ValueError, match="max_abs"):
        ss.share_array(X, 3, 2, max_abs=1.0)
    # left out, the bound is the power of two above the data: two arrays in one octave look the same
    a = ss.share_array(np.array([0.3, -2.6]), 3, 2)[0]
    b = ss.share_array(np.array([-3.9, 1.0]), 3, 2)[0]
    assert a.bound == b.bound == 1 << 18 and a.max_abs == 4.0


@pytest.mark.unit
def test_combining_different_sharings_is_refused():
    a = ss.share_array(X, 3, 2)
    b = ss.share_array(X, 4, 3)
    with pytest.raises(ValueError, match="different sharings"):
        ss.add(a[0], a[1])
    with pytest.raises(ValueError, match="different sharings"):
        ss.add(a[0], b[0])
    with pytest.raises(TypeError, match="interactive"):
        ss.matmul(a[0], a[0].T)
    with pytest.raises(TypeError):
        a[0] * a[0]
    with pytest.raises(ValueError, match="shape mismatch"):
        ss.matmul(a[0], M.T)
    with pytest.raises(ss.ShamirError, match="t=2"):
        ss.reconstruct_shares(a[:1])
    with pytest.raises(ValueError, match="t must be in 1..3"):
        ss.share_array(X, 3, 4)
    with pytest.raises(ValueError, match="NaN"):
        ss.share_array([np.nan], 3, 2)


# ------------------------------------------------------------ protocol
def _f3_owner(party, cfg, h):
    ss.share_to_holders(party, h, cfg["holders"], cfg["t"], frac_bits=12, max_abs=2.0, tag="h")
    return {}


def _f3_holder(party, cfg, data):
    owners = party.peers_with_role("owner")
    sh = ss.receive_shares(party, owners, t=cfg["t"], tag="h")
    aligned = [ss.matmul(sh[o], cfg["P"][i].T, frac_bits=10) for i, o in enumerate(owners)]
    H = ss.stack(aligned, axis=1)                                   # (batch, n, d)
    Z = ss.matmul(ss.lmatmul(cfg["A"], H, frac_bits=10), cfg["W"], frac_bits=10)
    ss.send_to_coordinator(party, "c", Z, tag="pre-activation")
    ss.send_to_coordinator(party, "c", ss.sum_shares(aligned), tag="sum")
    return {"frac_bits": Z.frac_bits}


def _f3_coord(party, cfg, data):
    hs = party.peers_with_role("holder")
    return {"Z": ss.reconstruct_at_coordinator(party, hs, cfg["t"], tag="pre-activation"),
            "S": ss.reconstruct_at_coordinator(party, hs, cfg["t"], tag="sum")}


def test_f3_fusion_on_shares_matches_plain_in_memory():
    rng = np.random.default_rng(5)
    n, m, t, batch, d = 3, 4, 3, 7, 5
    hs = [rng.uniform(-2, 2, (batch, 3 + i)) for i in range(n)]             # owners' representations h^i
    P = [rng.normal(size=(d, 3 + i)) / 2 for i in range(n)]                  # alignment matrices P_i
    A = rng.random((n, n))
    A = A / A.sum(axis=1, keepdims=True)
    W = rng.normal(size=(d, 2))
    parties = fed(n, m)
    cfg = {"holders": [f"h{j}" for j in range(1, m + 1)], "t": t, "P": P, "A": A, "W": W}
    res = run({"owner": _f3_owner, "holder": _f3_holder, "coordinator": _f3_coord}, parties,
              data={f"o{i}": hs[i] for i in range(n)}, cfg=cfg)
    aligned = [h @ p.T for h, p in zip(hs, P)]
    Z, S = res["c"]["Z"], res["c"]["S"]
    assert Z.value.shape == (batch, n, 2) and Z.frac_bits == 12 + 3 * 10 and Z.used == cfg["holders"]
    assert within(Z.value, A @ np.stack(aligned, axis=1) @ W, Z.err) and Z.err < 0.05
    assert within(S.value, sum(aligned), S.err) and S.err < 0.02


JOB_FED = [("owner1", "owner"), ("owner2", "owner"), ("h1", "holder"), ("h2", "holder"), ("h3", "holder"),
           ("h4", "holder"), ("c", "coordinator")]


@pytest.mark.parametrize("drop", [(), ("h1",), ("h4",), ("h2", "h3"), ("h1", "h4")])
def test_any_t_of_m_holders_reconstruct(drop):
    cfg = {"t": 2, "rows": 12, "d_in": 3, "drop": list(drop), "wait": 0.3 if drop else None, "seed": 4}
    res = run_inmemory(shamir_job, JOB_FED, cfg=cfg, timeout=20)
    c = res["c"]
    assert c["correct"] and c["max_err"] <= c["err_bound"] < 1e-3
    assert c["missing"] == list(drop)
    assert c["used"] == [h for h in ("h1", "h2", "h3", "h4") if h not in drop]


def test_fewer_than_t_holders_give_a_clear_error():
    cfg = {"t": 3, "rows": 4, "drop": ["h2", "h4"], "wait": 0.3}
    with pytest.raises(FederationFailed, match=r"from 2 of 4 holders.*t=3 are needed.*\['h2', 'h4'\]") as e:
        run_inmemory(shamir_job, JOB_FED, cfg=cfg, timeout=20)
    assert isinstance(e.value.failures["c"], ss.ShamirError)


def _late_holder(party, cfg, data):
    sh = ss.receive_shares(party, party.peers_with_role("owner"))
    y = ss.sum_shares(sh.values())
    if party.name == "h3":
        # speaks only after the coordinator has its first result: waiting for everyone would deadlock
        party.recv("c", "test/go", timeout=10)
    ss.send_to_coordinator(party, "c", y, tag="a")
    ss.send_to_coordinator(party, "c", ss.scale(y, 2), tag="b")
    return {}


def _quorum_coord(party, cfg, data):
    hs = ["h1", "h2", "h3"]
    first = ss.reconstruct_at_coordinator(party, hs, 2, tag="a", quorum=2, timeout=60)
    party.send("h3", "test/go", None)
    second = ss.reconstruct_at_coordinator(party, hs, 2, tag="b")  # h3's late "a" comes first: discarded
    return {"a": first, "b": second}


def test_quorum_stops_at_t_and_late_answers_are_discarded():
    xs = {f"o{i}": np.linspace(-1, 1, 9) * (i + 1) for i in range(2)}
    res = run({"owner": lambda p, c, x: ss.share_to_holders(p, x, ["h1", "h2", "h3"], 2),
               "holder": _late_holder, "coordinator": _quorum_coord}, fed(2, 3), data=xs)
    a, b = res["c"]["a"], res["c"]["b"]
    assert a.used == ["h1", "h2"] and a.missing == ["h3"]
    assert b.used == ["h1", "h2", "h3"] and b.missing == []
    plain = xs["o0"] + xs["o1"]
    assert within(a.value, plain, a.err) and within(b.value, 2 * plain, b.err)


def _h1_silent_holder(party, cfg, data):
    sh = ss.receive_shares(party, party.peers_with_role("owner"))
    if party.name != "h1":          # not asked: never answers
        ss.send_to_coordinator(party, "c", ss.sum_shares(sh.values()), tag="s")
    return {}


def test_asked_holders_reconstruct_at_their_own_points_without_waiting_for_the_others():
    """Only h2 and h3 are asked (not a prefix of the sorted holders): their points stay 2 and 3, and the
    coordinator does not wait out its timeout on the silent h1."""
    xs = {f"o{i}": np.linspace(-1, 1, 9) * (i + 1) for i in range(2)}
    coord = lambda p, c, d: ss.reconstruct_at_coordinator(p, ["h1", "h2", "h3"], 2, tag="s", asked=["h3", "h2"],
                                                           timeout=30)
    t0 = time.monotonic()
    res = run({"owner": lambda p, c, x: ss.share_to_holders(p, x, ["h1", "h2", "h3"], 2),
               "holder": _h1_silent_holder, "coordinator": coord}, fed(2, 3), data=xs)
    r = res["c"]
    assert r.used == ["h2", "h3"] and r.missing == []
    assert within(r.value, xs["o0"] + xs["o1"], r.err)
    assert time.monotonic() - t0 < 20


def _corrupt_holder(party, cfg, data):
    sh = ss.receive_shares(party, party.peers_with_role("owner"))
    y = ss.sum_shares(sh.values())
    if party.name == "h2":
        y = dataclasses.replace(y, values=F61.add(y.values, 1))
    ss.send_to_coordinator(party, "c", y)
    return {}


def test_an_inconsistent_share_is_detected():
    xs = {"o0": X, "o1": Y}
    with pytest.raises(FederationFailed, match=r"inconsistent shares.*'h2'|inconsistent shares.*'h3'"):
        run({"owner": lambda p, c, x: ss.share_to_holders(p, x, ["h1", "h2", "h3"], 2),
             "holder": _corrupt_holder,
             "coordinator": lambda p, c, d: ss.reconstruct_at_coordinator(p, ["h1", "h2", "h3"], 2)},
            fed(2, 3), data=xs)


def test_owners_must_agree_on_holders_and_threshold():
    def owner(p, cfg, x):
        hs = ["h1", "h2", "h3"] if p.name == "o0" else ["h2", "h3", "h4"]  # o1 numbers the holders differently
        return ss.share_to_holders(p, x, hs, 2)

    def holder(p, cfg, d):
        if p.name in ("h2", "h3"):
            ss.receive_shares(p, ["o0", "o1"])
        return {}

    with pytest.raises(FederationFailed, match="disagree on this holder's point"):
        run({"owner": owner, "holder": holder, "coordinator": lambda *a: {}}, fed(2, 4),
            data={"o0": X, "o1": X}, timeout=5)
    with pytest.raises(FederationFailed, match="threshold t=2, expected 3"):
        run({"owner": lambda p, c, x: ss.share_to_holders(p, x, ["h1", "h2"], 2),
             "holder": lambda p, c, d: ss.receive_shares(p, ["o0"], t=3),
             "coordinator": lambda *a: {}}, fed(1, 2), data={"o0": X}, timeout=5)


def test_bad_arguments_and_malformed_messages_are_named():
    hub = InMemoryHub({"o": "owner", "h1": "holder", "h2": "holder", "c": "coordinator"})
    o, h1 = hub.party("o", timeout=1.0), hub.party("h1", timeout=1.0)
    c = hub.party("c", timeout=1.0, declarations=ss.DECLARATIONS)
    with pytest.raises(ValueError, match="not peers"):
        ss.share_to_holders(o, X, ["h1", "nobody"], 2)
    with pytest.raises(ValueError, match="distinct"):
        ss.share_to_holders(o, X, ["h1", "h1"], 1)
    with pytest.raises(ValueError, match="t must be in 1..2"):
        ss.share_to_holders(o, X, ["h1", "h2"], 3)
    with pytest.raises(ValueError, match="kind_prefix"):
        ss.share_to_holders(o, X, ["h1", "h2"], 2, "bad prefix/")
    with pytest.raises(TypeError, match="list of party names"):
        ss.reconstruct_at_coordinator(c, "h1", 1)
    with pytest.raises(ValueError, match="quorum"):
        ss.reconstruct_at_coordinator(c, ["h1", "h2"], 2, quorum=1)
    with pytest.raises(ValueError, match="asked must be distinct holders"):
        ss.reconstruct_at_coordinator(c, ["h1", "h2"], 1, asked=["h1", "nobody"])
    with pytest.raises(ValueError, match="asked must be distinct holders"):
        ss.reconstruct_at_coordinator(c, ["h1", "h2"], 1, asked=["h2", "h2"])
    with pytest.raises(ValueError, match="quorum"):
        ss.reconstruct_at_coordinator(c, ["h1", "h2"], 2, asked=["h2"])
    h1.send("c", "shamir/result", {"v": 1, "tag": "", "x": 1, "t": 1, "p": F61.p, "frac_bits": 0, "bound": 1,
                                   "err": 0.0, "shares": np.zeros(3)})
    with pytest.raises(PeerFault, match="'shares'.*<f8 where <u8"):  # the schema refuses it on receipt
        ss.reconstruct_at_coordinator(c, ["h1", "h2"], 1, timeout=1.0)
    h1.send("c", "shamir/result", {"v": 1, "tag": "", "x": 1, "t": 1, "p": F61.p, "frac_bits": 0, "bound": 1,
                                   "err": 0.0, "shares": np.full(3, F61.p, dtype=np.uint64)})
    with pytest.raises(ss.ShamirError, match="not a field element"):
        ss.reconstruct_at_coordinator(c, ["h1", "h2"], 1, timeout=1.0)


# --------------------------------------------------------- what t - 1 see
def _leak_owner(party, cfg, secret):
    ss.share_to_holders(party, secret, cfg["holders"], cfg["t"], frac_bits=0, max_abs=5, field=PrimeField(11),
                        prg=prg(cfg["prg_seed"]))
    return {}


def _leak_holder(party, cfg, data):
    a = ss.receive_shares(party, ["o0"], field=PrimeField(11))["o0"]
    return {"values": a.values, "meta": (a.x, a.t, a.frac_bits, a.bound, a.err, a.shape)}


def _views(secret_value: int, prg_seed: int, count: int = 20_000):
    holders = ["h1", "h2", "h3", "h4"]
    res = run({"owner": _leak_owner, "holder": _leak_holder, "coordinator": lambda *a: {}}, fed(1, 4),
              data={"o0": np.full(count, secret_value)}, cfg={"holders": holders, "t": 3, "prg_seed": prg_seed})
    return {h: res[h] for h in holders}


def _joint_histogram(views, coalition):
    code = np.zeros_like(views[coalition[0]]["values"], dtype=np.int64)
    for h in coalition:
        code = code * 11 + views[h]["values"].astype(np.int64)
    return np.bincount(code, minlength=11 ** len(coalition))


def test_t_minus_1_holders_see_the_same_distribution_whatever_the_secret():
    # GF(11), 3-of-4: the coalition {h2, h4} sees uniform share pairs, for secret 0 and secret 3 alike,
    # and identical public metadata; three holders (= t) do tell the two secrets apart.
    v0, v3 = _views(0, 10), _views(3, 11)
    for coalition in [("h2", "h4"), ("h1", "h3")]:
        h0, h3 = _joint_histogram(v0, coalition), _joint_histogram(v3, coalition)
        assert stats.chisquare(h0).pvalue > ALPHA and stats.chisquare(h3).pvalue > ALPHA
        assert stats.chi2_contingency(np.stack([h0, h3])).pvalue > ALPHA
        assert [v0[h]["meta"] for h in coalition] == [v3[h]["meta"] for h in coalition]
    # control: the same statistic on t holders detects the secret
    h0, h3 = _joint_histogram(v0, ("h1", "h2", "h3")), _joint_histogram(v3, ("h1", "h2", "h3"))
    assert stats.chi2_contingency(np.stack([h0 + 1, h3 + 1])).pvalue < ALPHA


# ------------------------------------------------------------ declarations
def test_every_message_matches_the_declarations(wire):
    cfg = {"t": 2, "rows": 10, "d_in": 3, "d_out": 2, "seed": 1}
    res = run_inmemory(shamir_job, JOB_FED, cfg=cfg, timeout=20)
    assert res["c"]["correct"]
    roles = dict(JOB_FED)
    declared = shamir_job.ALGORITHM.declared(shamir_job.ALGORITHM.parse(cfg))
    seen = set()
    for _, _, fr in wire:
        e = codec.decode(fr)
        d = declared[e.kind]
        assert decl.role_ok(roles[e.frm], d.sender) and decl.role_ok(roles[e.to], d.receiver), e.kind
        assert decl.check_record(d, e.arrays) is None, (e.kind, e.arrays)
        d.payload.validate(e.payload)
        seen.add(e.kind)
    assert seen == {"shamir/share", "shamir/result"}
    share, result = declared["shamir/share"], declared["shamir/result"]
    assert decl.check_record(share, [("shares", "<u8", (10, 5))]) is None
    assert decl.check_record(result, [("shares", "<u8", (10, 2))]) is None
    for bad in ([("<f8", (10, 2))], [("<u8", (10, 3))], [("<u8", (10,))], [("x", "<u8", (10, 2))]):
        assert decl.check_record(result, bad) is not None, bad
    assert decl.check_record(share, [("<u8", (11, 5))]) is not None
    # the role names and prefix can be those of the algorithm using the protocol
    ds = ss.declarations("f3/h", "client", "server", "server")
    assert {d.kind for d in ds} == {"f3/h/share", "f3/h/result"}


def test_shamir_job_default_config_in_memory():
    res = run_inmemory(shamir_job, [(n, r) for n, r in JOB_FED if n != "h4"], cfg={}, timeout=20)
    assert res["c"]["correct"] and res["c"]["shape"] == [64, 4] and res["c"]["frac_bits"] == 32
    assert res["owner2"]["shape"] == [64, 9]


@pytest.mark.processes
@pytest.mark.smoke   # make test's process run of this family
def test_shamir_preset_runs_as_processes_and_passes_the_audit(tmp_path):
    from fedhet.parties.ops import presets
    from fedhet.parties.audit import audit
    from fedhet.parties.federation import load
    from fedhet.parties.ops.launcher import launch

    fed_ = load(presets.path("shamir"))
    summary = launch(fed_, run_dir=tmp_path / "run", progress=False, timeout=120)
    assert summary["ok"]
    results = {name: p["result"] for name, p in summary["parties"].items()}
    c = results["coordinator"]
    assert c["correct"] and c["used"] == ["holder1", "holder2", "holder3"] and c["max_err"] <= c["err_bound"]
    rep = audit(tmp_path / "run")
    assert rep.ok, rep.problems
    kinds = {(row["party"], row["kind"]) for row in rep.table if row["sent"]}
    assert {("owner1", "shamir/share"), ("holder2", "shamir/result")} <= kinds
    assert not any(k == "shamir/share" for p, k in kinds if p.startswith("holder"))


@pytest.mark.unit
def test_public_encoding_and_fixed_point_decoding_equal_ldexp():
    """encode_public and decode_fixed scale by multiplying with 2**±f; that must equal np.ldexp bit for bit."""
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.standard_normal(5000) * 10.0 ** rng.integers(-12, 6, 5000), [0.0, -0.0, 0.5, -2.5]])
    for f in (0, 1, 14, 18, 30):
        pub = shared_array.encode_public(x, f, F61, "test")
        exact = np.ldexp(x, f)
        assert np.array_equal(pub.signed, np.rint(exact).astype(np.int64))
        assert np.array_equal(pub.rounding, np.ldexp(np.abs(np.rint(exact) - exact), -f))
        raw = F61.from_int(pub.signed)
        assert np.array_equal(shared_array.decode_fixed(raw, f, F61), np.ldexp(pub.signed.astype(np.float64), -f))
