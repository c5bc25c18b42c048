"""Differential privacy (issue 47): the ledger against dp-accounting, the Skellam noise against its exact
distribution, distributed noise under secure aggregation (with dropouts), DP-SGD's clipping and noise, and
FedAvg trained with DP."""
from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

pytest.importorskip("dp_accounting", reason="the dp extra (pip install 'fedhet[dp]') is not installed")
import dp_accounting as dpa  # noqa: E402
from dp_accounting import rdp  # noqa: E402
from scipy import stats  # noqa: E402
from scipy.special import logsumexp  # noqa: E402

from fedhet.algorithms.dp_sgd import DPStep, dp_sgd_step, per_sample_clipped_sum  # noqa: E402
from fedhet.algorithms.fedavg_logreg import ALGORITHM as FEDAVG  # noqa: E402
from fedhet.algorithms.fedavg_logreg.settings import Settings as FedAvgSettings  # noqa: E402
from fedhet.parties.inmemory import run_inmemory  # noqa: E402
from fedhet.parties.settings import parse_settings  # noqa: E402
from fedhet.protocols import he_interactive as hei  # noqa: E402
from fedhet.protocols import secagg  # noqa: E402
from fedhet.protocols.aggregation_settings import AggregationSettings  # noqa: E402
from fedhet.protocols.dp_aggregation import make_dp_aggregator  # noqa: E402
from fedhet.protocols.dp_ledger import ORDERS, Ledger, Mechanism, PrivacyBudgetExceeded, calibrate, epsilon  # noqa: E402
from fedhet.protocols.dp_noise import RingNoise, sensitivity, skellam, skellam_zcdp  # noqa: E402
from fedhet.protocols.dp_settings import DPSettings, plan  # noqa: E402
from fedhet.protocols.secagg import Quantizer  # noqa: E402

pytestmark = pytest.mark.unit


def library_epsilon(event, delta):
    return rdp.RdpAccountant(list(ORDERS)).compose(event).get_epsilon(delta)


@pytest.mark.parametrize("q,z,steps", [(0.01, 1.1, 1000), (0.2, 0.8, 60), (1.0, 2.0, 25)])
def test_ledger_epsilon_is_dp_accountings_for_dp_sgd(q, z, steps):
    m = Mechanism("dp-sgd", "record", z, sampling_rate=q, steps_per_round=steps // 5)
    want = library_epsilon(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps), 1e-5)
    assert epsilon(m, steps, 1e-5) == pytest.approx(want, abs=1e-6)
    led = Ledger(m, 1e-5)
    for r in range(5):
        led.charge(r)
    assert led.steps == steps and led.spent == pytest.approx(want, abs=1e-6)
    assert [x["steps"] for x in led.rounds] == list(range(steps // 5, steps + 1, steps // 5))
    assert all(a["epsilon"] < b["epsilon"] for a, b in zip(led.rounds, led.rounds[1:]))


def test_ledger_epsilon_is_dp_accountings_for_gaussian_and_skellam():
    g = Mechanism("gaussian", "client", 1.3)
    assert epsilon(g, 40, 1e-5) == pytest.approx(
        library_epsilon(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.3), 40), 1e-5), abs=1e-6)
    d2, d1 = sensitivity(1.0, 16, 31)
    z = 1.3
    xi, rho = skellam_zcdp((z * d2) ** 2, d2, d1)
    sk = Mechanism("skellam", "client", z, d1_over_d2=d1 / d2 ** 2)
    assert epsilon(sk, 40, 1e-5) == pytest.approx(
        library_epsilon(dpa.SelfComposedDpEvent(dpa.ZCDpEvent(xi=xi, rho=rho), 40), 1e-5), abs=1e-6)
    # Skellam costs a little more than the Gaussian of the same variance (the xi term), never less
    assert epsilon(g, 40, 1e-5) < epsilon(sk, 40, 1e-5) < epsilon(g, 40, 1e-5) * 1.001


def test_ledger_matches_opacus_rdp_accountant_on_its_orders():
    from opacus.accountants import RDPAccountant

    m = Mechanism("dp-sgd", "record", 1.0, sampling_rate=0.05)
    acc = RDPAccountant()
    acc.history = [(1.0, 0.05, 300)]
    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    ours = rdp.RdpAccountant(orders).compose(
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(1.0)), 300)).get_epsilon(1e-5)
    assert ours == pytest.approx(acc.get_epsilon(1e-5), rel=1e-3)   # two libraries, two RDP implementations
    # ours, over integer orders only, can only be a little more conservative than over Opacus's orders
    assert ours - 1e-9 <= epsilon(m, 300, 1e-5) <= ours * 1.02


@pytest.mark.parametrize("target", [1.0, 3.0, 8.0])
def test_calibration_meets_the_target_for_the_planned_steps(target):
    m = calibrate(Mechanism("dp-sgd", "record", 1.0, sampling_rate=0.25, steps_per_round=5), 100, target, 1e-5)
    eps = epsilon(m, 100, 1e-5)
    assert eps <= target and eps == pytest.approx(target, rel=1e-4)
    # a little less noise would pass the target: the calibration is tight
    assert epsilon(m.with_noise(m.noise * 0.999), 100, 1e-5) > target


def test_ledger_stops_before_the_budget_and_records_nothing_of_the_refused_round():
    led = Ledger(Mechanism("gaussian", "client", 6.0), 1e-5, budget=2.0, who="client1")
    eps = [led.charge(r) for r in range(3)]
    stop = next(r for r in range(3, 200) if epsilon(led.mechanism, r + 1, 1e-5) > 2.0)
    for r in range(3, stop):
        led.charge(r)
    before = (led.steps, list(led.rounds))
    with pytest.raises(PrivacyBudgetExceeded, match=f"client1: round {stop} would spend epsilon"):
        led.charge(stop)
    assert (led.steps, led.rounds) == before and led.spent <= 2.0 and eps[0] < eps[2]
    assert led.as_dict()["epsilon"] == led.spent and led.as_dict()["unit"] == "client"


def test_plan_needs_a_target_or_a_noise_multiplier():
    with pytest.raises(ValueError, match="needs dp_epsilon"):
        plan(DPSettings(dp="record"), Mechanism("gaussian", "client", 1.0), 10)
    led = plan(DPSettings(dp="client", noise_multiplier=1.5), Mechanism("gaussian", "client", 1.0), 10)
    assert led.mechanism.noise == 1.5 and led.budget is None and led.planned_steps == 10


# ------------------------------------------------------------------ Skellam noise

@pytest.mark.parametrize("mu,seed", [(0.5, 1), (4.0, 2), (100.0, 3), (1e4, 4)])
def test_skellam_samples_match_the_exact_pmf(mu, seed):
    z = skellam(mu, 200_000, np.random.default_rng(seed))
    assert z.dtype == np.int64
    lo, hi = int(np.floor(-6 * math.sqrt(mu))) - 2, int(np.ceil(6 * math.sqrt(mu))) + 2
    edges = np.unique(np.quantile(np.arange(lo, hi + 1), np.linspace(0, 1, min(hi - lo, 60) + 1)).astype(int))
    # bins [e_i, e_{i+1}) plus both tails; expected counts from the exact PMF (scipy)
    cdf = stats.skellam.cdf(edges - 1, mu / 2, mu / 2)
    probs = np.diff(np.r_[0.0, cdf, 1.0])
    counts = np.bincount(np.searchsorted(edges, z, side="right"), minlength=len(probs))
    keep = probs * len(z) >= 5
    exp = probs[keep] * len(z)
    obs = counts[keep].astype(float)
    obs, exp = np.r_[obs, counts[~keep].sum()], np.r_[exp, probs[~keep].sum() * len(z)]
    nz = exp > 0
    chi2 = float(((obs[nz] - exp[nz]) ** 2 / exp[nz]).sum())
    assert stats.chi2.sf(chi2, int(nz.sum()) - 1) > 1e-3
    assert z.var() == pytest.approx(mu, rel=0.02)


@pytest.mark.parametrize("mu", [4.0, 50.0, 1000.0])
@pytest.mark.parametrize("d", [1, 3, 10])
def test_skellam_rdp_bound_covers_the_exact_divergence(mu, d):
    """The (xi, rho) the ledger hands dp-accounting bound the exact Renyi divergence of Sk(mu) + d vs Sk(mu)."""
    k = np.arange(-int(60 * math.sqrt(mu)) - d - 50, int(60 * math.sqrt(mu)) + d + 50)
    lp, lq = stats.skellam.logpmf(k, mu / 2, mu / 2), stats.skellam.logpmf(k - d, mu / 2, mu / 2)
    ok = np.isfinite(lp) & np.isfinite(lq)
    xi, rho = skellam_zcdp(mu, float(d), float(d))
    for a in (1.5, 2, 4, 8, 32, 128):
        exact = logsumexp(a * lq[ok] + (1 - a) * lp[ok]) / (a - 1)
        assert exact <= xi + rho * a + 1e-9


@pytest.mark.parametrize("k,t", [(10, 6), (50, 26)])
def test_the_sum_of_the_clients_shares_has_the_ledgers_variance(k, t):
    """K clients each add Sk(mu/t) on a 32-bit ring; the wrapped sum, read signed, has variance K mu / t."""
    q = Quantizer(32, 1.0, 1.0, k, frac_bits=10)
    mu, m = 3.0e4, 20_000
    acc = np.zeros(m + 1, dtype=q.dtype)
    for c in range(k):
        y = np.zeros(m + 1, dtype=q.dtype)
        RingNoise(mu, t, np.random.default_rng(100 + c))(y, m, q)
        acc += y
    s = acc.view(q.sdtype).astype(np.float64)
    assert s[m] == 0                                     # the weight coordinate carries no noise
    assert s[:m].var() == pytest.approx(k * mu / t, rel=0.03)
    assert s[:m].var() >= mu * 0.97                      # at least the accounted variance with >= t contributors


# ------------------------------------------------------------------ distributed noise in secure aggregation

CLIENTS = [f"c{i}" for i in range(6)]


def dp_federation(dp, xs, faults=None, agg=None):
    agg = agg or AggregationSettings(aggregation="secure")

    def server(party, c, d):
        a = make_dp_aggregator(agg, None, dp, len(CLIENTS), len(xs["c0"]), 1, "server",
                               rng=np.random.default_rng(7))
        return {"res": a.aggregate(party, CLIENTS, 0), "ledger": a.ledger}

    def client(party, c, d):
        a = make_dp_aggregator(agg, None, dp, len(CLIENTS), len(xs["c0"]), 1, party.name,
                               rng=np.random.default_rng(int(party.name[1:])),
                               faults=(faults or {}).get(party.name))
        a.submit(party, "server", xs[party.name], 1.0, 0)
        return {"ledger": a.ledger}

    algo = types.SimpleNamespace(NAME="dp-test", ROLES={"server": server, "client": client}, load_data=lambda *a: None)
    return run_inmemory(algo, [("server", "server")] + [(c, "client") for c in CLIENTS], timeout=30,
                        clock="virtual")


@pytest.mark.federation
@pytest.mark.parametrize("drop", [None, "c2"])
def test_distributed_skellam_under_secure_aggregation(drop):
    """The server's sum = the clipped inputs' sum + noise with the variance the ledger accounts; a client that
    drops takes its share out, and the server's ledger accounts the noise of those that contributed."""
    m = 6000
    rng = np.random.default_rng(0)
    xs = {c: rng.normal(0, 1, m) for c in CLIENTS}
    dp = DPSettings(dp="client", noise_multiplier=0.02, dp_clip=50.0)
    faults = {drop: secagg.Faults(stop_after="share")} if drop else None
    out = dp_federation(dp, xs, faults)
    res, sled = out["server"]["res"], out["server"]["ledger"]
    got = [c for c in CLIENTS if c != drop]
    assert res.contributors == got and res.weight == len(got)
    clipped = sum(xs[c] * min(1.0, 50.0 / np.linalg.norm(xs[c])) for c in got)
    f = res.details["frac_bits"]
    d2, _ = sensitivity(50.0, f, m)
    t = secagg.SecAggConfig().t(len(CLIENTS))
    err = (res.sum - clipped) * 2.0 ** f                 # in grid units: the noise and the rounding
    var = (0.02 * d2) ** 2 * len(got) / t                # mu per t clients, len(got) contributed
    assert err.var() == pytest.approx(var + len(got) / 12, rel=0.06)
    # the std the result states: the noise's, in the sum's units (the grid's sensitivity D2 over clip 50)
    assert res.details["dp_noise_std_sum"] * 2.0 ** f == pytest.approx(math.sqrt(var), rel=1e-9)
    # the server's ledger: the noise multiplier it accounts is that of the noise actually in the sum
    assert sled.rounds[0]["noise_multiplier"] == pytest.approx(0.02 * math.sqrt(len(got) / t))
    assert sled.spent < out["c0"]["ledger"].spent        # more noise than planned, never less


@pytest.mark.federation
def test_fedavg_with_dp_learns_and_writes_its_ledger():
    parties = [("server", "server")] + [(f"client{i}", "client") for i in range(3)]
    out = run_inmemory(FEDAVG, parties, {"rounds": 5, "dp": "record", "dp_epsilon": 8.0, "dp_sample_rate": 0.5,
                                         "local_epochs": 2}, timeout=120)
    for i in range(3):
        p = out[f"client{i}"]["privacy"]
        assert p["mechanism"] == "dp-sgd" and p["unit"] == "record" and p["steps"] == 10
        assert p["epsilon"] <= 8.0 and p["epsilon"] == pytest.approx(8.0, rel=1e-3)
        assert [r["round"] for r in p["rounds"]] == list(range(5))
    assert out["server"]["test_accuracy"] >= 0.9


@pytest.mark.federation
def test_fedavg_stops_before_its_budget():
    parties = [("server", "server")] + [(f"client{i}", "client") for i in range(2)]
    with pytest.raises(Exception, match="past the budget dp_epsilon"):
        run_inmemory(FEDAVG, parties, {"rounds": 30, "dp": "client", "noise_multiplier": 1.0, "dp_epsilon": 3.0,
                                       "aggregation": "plain"}, timeout=60, clock="virtual")


def test_declarations_say_what_a_message_reveals_under_dp():
    s = parse_settings(FedAvgSettings, {"dp": "client", "noise_multiplier": 1.2}, "fedavg_logreg")
    whats = {d.kind: d.what for d in FEDAVG.declarations(s)}
    assert "with DP noise (client level, noise multiplier z = 1.2" in whats["secagg/masked"]
    plain = {d.kind: d.what for d in FEDAVG.declarations(parse_settings(FedAvgSettings, {}, "fedavg_logreg"))}
    assert "DP noise" not in plain["secagg/masked"]


# ------------------------------------------------------------------ DP-SGD

def test_per_sample_clipping_bounds_every_row():
    torch.manual_seed(0)
    x, y = torch.randn(64, 5, dtype=torch.float64) * 3, (torch.rand(64) > 0.5).double()
    w = torch.randn(6, dtype=torch.float64)

    def loss(p, xi, yi):
        return torch.nn.functional.binary_cross_entropy_with_logits(xi @ p[:-1] + p[-1], yi)

    full = torch.stack([torch.autograd.functional.jacobian(lambda p: loss(p, x[i], y[i]), w) for i in range(64)])
    for i in range(64):
        one, norms = per_sample_clipped_sum(loss, w, x[i:i + 1], y[i:i + 1], 0.5)
        assert float(one.norm()) <= 0.5 + 1e-12
        assert float(norms[0]) == pytest.approx(float(full[i].norm()))
        if float(full[i].norm()) <= 0.5:
            assert torch.allclose(one, full[i])
        else:
            assert torch.allclose(one, full[i] * 0.5 / full[i].norm())
    total, _ = per_sample_clipped_sum(loss, w, x, y, 0.5)
    assert torch.allclose(total, sum(full[i] * min(1.0, 0.5 / float(full[i].norm())) for i in range(64)))


def test_dp_sgd_noise_has_the_stated_std():
    """With a loss of zero gradient the step is pure noise: std z C / (q n) * lr per coordinate."""
    def loss(p, xi, yi):
        return (p * 0).sum() + (xi * 0).sum()

    p = torch.zeros(50_000, dtype=torch.float64)
    x, y = torch.zeros(200, 3, dtype=torch.float64), torch.zeros(200, dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    new = dp_sgd_step(loss, p, x, y, lr=2.0, step=DPStep(clip=1.5, noise_multiplier=0.7, sampling_rate=0.25),
                      generator=g)
    want = 2.0 * 0.7 * 1.5 / (0.25 * 200)
    assert float(new.std()) == pytest.approx(want, rel=0.02)


# ------------------------------------------------------------------ STFL: DP latents

def test_released_rows_are_clipped_then_noised_with_the_ledgers_noise():
    from fedhet.protocols.dp_noise import clip_rows_l2
    from fedhet.protocols.dp_settings import ReleaseDPSettings, release_rows

    x = np.random.default_rng(1).normal(0, 2, (4000, 12))
    c = clip_rows_l2(x, 1.5)
    assert np.all(np.linalg.norm(c, axis=1) <= 1.5 + 1e-12)
    short = np.linalg.norm(x, axis=1) <= 1.5
    assert np.array_equal(c[short], x[short])
    s = ReleaseDPSettings(row_dp_epsilon=4.0, row_dp_clip=1.5)
    out, led = release_rows(s, x, "guest", rng=np.random.default_rng(5))
    assert led.mechanism.unit == "row" and led.steps == 1
    assert led.spent <= 4.0 and led.spent == pytest.approx(4.0, rel=1e-4)
    assert led.spent == pytest.approx(library_epsilon(
        dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(led.mechanism.noise), 1), 1e-5), abs=1e-6)
    assert float((out - c).std()) == pytest.approx(led.mechanism.noise * 1.5, rel=0.02)


@pytest.mark.federation
def test_stfl_guest_sends_noised_latents_and_writes_its_ledger():
    from fedhet.algorithms.stfl import ALGORITHM as STFL
    from fedhet.algorithms.stfl.settings import Settings as STFLSettings

    out = run_inmemory(STFL, [("host", "host"), ("guest", "guest")], {"row_dp_epsilon": 4.0, "epochs": 2},
                       timeout=120)
    p = out["guest"]["privacy"]
    assert (p["mechanism"], p["unit"], p["steps"]) == ("gaussian", "row", 1)
    assert p["epsilon"] == pytest.approx(4.0, rel=1e-4) and p["epsilon"] <= 4.0
    decl = {d.kind: d.what for d in STFL.declarations(parse_settings(STFLSettings, {"row_dp_epsilon": 4.0},
                                                                     "stfl"))}
    assert "with DP noise (row level, noise calibrated to epsilon = 4" in decl["stfl/latent"]


def test_module_per_sample_gradients_are_clipped_jointly_over_all_parameters():
    from fedhet.algorithms.dp_sgd import module_clipped_grads

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x, y = torch.randn(16, 5) * 4, torch.randint(0, 3, (16,))
    loss = torch.nn.functional.cross_entropy
    want = {k: torch.zeros_like(p) for k, p in m.named_parameters()}
    for i in range(16):
        m.zero_grad()
        loss(m(x[i:i + 1]), y[i:i + 1]).backward()
        g = {k: p.grad.clone() for k, p in m.named_parameters()}
        norm = torch.sqrt(sum((v ** 2).sum() for v in g.values()))
        one = module_clipped_grads(m, loss, x[i:i + 1], y[i:i + 1], 0.3)
        assert float(torch.sqrt(sum((v ** 2).sum() for v in one.values()))) <= 0.3 + 1e-6
        for k in g:
            want[k] += g[k] * min(1.0, 0.3 / float(norm))
            assert torch.allclose(one[k], g[k] * min(1.0, 0.3 / float(norm)), atol=1e-6)
    got = module_clipped_grads(m, loss, x, y, 0.3)
    assert all(torch.allclose(got[k], want[k], atol=1e-5) for k in want)


# ------------------------------------------------------------------ CHFL: DP-SGD of the common column

@pytest.mark.federation
def test_chfl_record_level_dp_accounts_every_step_of_the_common_column():
    from fedhet.algorithms.chfl import ALGORITHM as CHFL
    from fedhet.algorithms.chfl.settings import Settings as CHFLSettings

    cfg = {"dataset": "digits", "hidden": [32, 16], "local_epochs": 1, "rounds": 2, "dp": "record",
           "dp_epsilon": 8.0}
    out = run_inmemory(CHFL, [("server", "server")] + [(f"c{i}", "client") for i in range(2)], cfg=cfg, timeout=300)
    for i in range(2):
        r = out[f"c{i}"]
        p = r["privacy"]
        assert p["mechanism"] == "dp-sgd" and p["sampling_rate"] == pytest.approx(64 / r["n_train"])
        assert p["steps"] == 2 * math.ceil(r["n_train"] / 64) and len(p["rounds"]) == 2
        assert p["epsilon"] <= 8.0 and p["epsilon"] == pytest.approx(8.0, rel=1e-3)
    s = parse_settings(CHFLSettings, cfg, "chfl")
    assert "with DP noise (record level" in {d.kind: d.what for d in CHFL.declarations(s)}["secagg/masked"]
    with pytest.raises(Exception, match="dp = 'record' with method 'local'"):
        parse_settings(CHFLSettings, {**cfg, "method": "local"}, "chfl").validate()


@pytest.mark.federation
def test_chfl_client_level_dp_moves_the_global_column_by_the_mean_clipped_update():
    """dp = "client": each client's update of the common column, clipped to dp_clip, weight 1; the server
    adds the noised mean.  With almost no noise the global column moves by exactly the mean of the
    clipped updates: within dp_clip of where it was, and (clip out of reach) to the clients' plain mean."""
    from fedhet.algorithms.chfl import ALGORITHM as CHFL
    from fedhet.algorithms.chfl.models import init_common_flat
    from fedhet.algorithms.chfl.settings import Settings as CHFLSettings
    from fedhet.algorithms.toolkit import derive_seed

    parties = [("server", "server")] + [(f"c{i}", "client") for i in range(2)]
    base = {"dataset": "digits", "hidden": [16], "local_epochs": 1, "rounds": 1, "aggregation": "plain",
            "return_weights": True, "mu": 0.5}
    s = parse_settings(CHFLSettings, base, "chfl")
    theta0 = init_common_flat(s.n_common, s.class_count, s.hidden, derive_seed(s.seed, "theta0")).astype(np.float64)
    moved = {}
    for clip in (0.05, 100.0):   # noise std: 1e-12 * clip
        cfg = {**base, "dp": "client", "dp_noise": "central", "noise_multiplier": 1e-12, "dp_clip": clip}
        out = run_inmemory(CHFL, parties, cfg=cfg, timeout=300)
        moved[clip] = np.asarray(out["server"]["theta"][0]) - theta0
        for n in ("server", "c0", "c1"):
            p = out[n]["privacy"]
            assert p["unit"] == "client" and p["steps"] == 1 and p["noise_multiplier"] == 1e-12
    assert np.linalg.norm(moved[0.05]) <= 0.05 * (1 + 1e-5)
    # no clip in reach: the unweighted mean of the clients' own columns; the plain run's mean weighs them
    # by their row counts (nearly equal: the digits split), so the two agree closely, not exactly
    plain = run_inmemory(CHFL, parties, cfg=base, timeout=300)
    step = np.asarray(plain["server"]["theta"][0]) - theta0
    assert np.linalg.norm(moved[100.0]) > 0.05
    assert np.allclose(moved[100.0], step, rtol=0.01, atol=0.005 * np.abs(step).max())


@pytest.mark.federation
def test_chfl_client_level_dp_under_secure_aggregation_is_distributed_and_accounted_per_column():
    from fedhet.algorithms.chfl import ALGORITHM as CHFL
    from fedhet.algorithms.chfl.settings import Settings as CHFLSettings

    cfg = {"dataset": "digits", "hidden": [16], "local_epochs": 1, "rounds": 2, "lr": [1e-3, 3e-3],
           "dp": "client", "dp_epsilon": 3.0}
    parties = [("server", "server")] + [(f"c{i}", "client") for i in range(3)]
    out = run_inmemory(CHFL, parties, cfg=cfg, timeout=300)
    for n in ("c0", "c1", "c2", "server"):
        p = out[n]["privacy"]
        assert p["mechanism"] == "skellam" and p["unit"] == "client"
        assert p["steps"] == 2 * 2 and len(p["rounds"]) == 4   # rounds x G columns
        assert p["epsilon"] <= 3.0 and (n == "server" or p["epsilon"] == pytest.approx(3.0, rel=1e-4))
    s = parse_settings(CHFLSettings, cfg, "chfl")
    assert "with DP noise (client level" in {d.kind: d.what for d in CHFL.declarations(s)}["secagg/masked"]


# ------------------------------------------------------------------ as processes: result.json, audit, report view

@pytest.mark.processes
def test_fedavg_with_distributed_dp_as_processes_writes_ledgers_passes_the_audit_and_shows_epsilon(tmp_path):
    from dataclasses import replace

    from fedhet.parties import federation
    from fedhet.parties.audit import audit
    from fedhet.parties.ops import presets
    from fedhet.parties.ops.launcher import launch
    from fedhet.parties.ops.runview import view

    fed = replace(federation.load(presets.path("demo")), hosts=1)
    summary = launch(fed, run_dir=tmp_path / "run", progress=False,
                     overrides={"dp": "client", "dp_epsilon": 3.0, "rounds": 4})
    assert summary["ok"]
    res = {n: p["result"] for n, p in summary["parties"].items()}
    for n, r in res.items():
        p = r["privacy"]
        assert p["mechanism"] == "skellam" and p["unit"] == "client" and p["steps"] == 4
        # clients: calibrated to the target; the server: the noise the 3 contributors (t = 2) actually added
        assert p["epsilon"] <= 3.0 and (n == "server" or p["epsilon"] == pytest.approx(3.0, rel=1e-4))
    assert res["server"]["privacy"]["epsilon"] < res["client1"]["privacy"]["epsilon"]
    rep = audit(tmp_path / "run", trust_folder_keys=True)
    assert rep.ok, rep.problems
    shown = {p["name"]: p["headline"].get("privacy.epsilon") for p in view(tmp_path / "run")["parties"]}
    assert shown == {n: r["privacy"]["epsilon"] for n, r in res.items()}


@pytest.mark.federation
def test_a_killed_and_resumed_dp_run_goes_on_with_its_ledger(tmp_path):
    """The ledger is in each party's checkpoint: after a kill and a resume the rounds before the kill stay
    charged (not charged twice, not forgotten) and the run ends at the planned epsilon."""
    from fedhet.parties.inmemory import FederationFailed

    parties = [("server", "server")] + [(f"client{i}", "client") for i in range(2)]
    cfg = {"rounds": 5, "dp": "client", "dp_epsilon": 3.0, "aggregation": "plain"}
    with pytest.raises(FederationFailed):
        run_inmemory(FEDAVG, parties, cfg, run_id="dp-resume", timeout=60, clock="virtual",
                     checkpoint_dir=tmp_path, kill={"client1": 3})
    resumed: dict = {}
    out = run_inmemory(FEDAVG, parties, cfg, run_id="dp-resume", timeout=60, checkpoint_dir=tmp_path, resume=True,
                       resumed=resumed)
    assert min(resumed.values()) >= 2
    for name in ("client0", "client1", "server"):
        p = out[name]["privacy"]
        assert [r["round"] for r in p["rounds"]] == list(range(5)) and p["steps"] == 5
        assert p["epsilon"] == pytest.approx(3.0, rel=1e-4) and p["epsilon"] <= 3.0


# ------------------------------------------------------------------ HyFEM: DP-SGD of every local step

@pytest.mark.federation
def test_hyfem_record_level_dp_accounts_every_local_step():
    from importlib import resources

    from fedhet.algorithms.hyfem import ALGORITHM as HYFEM
    from fedhet.algorithms.hyfem.settings import Settings as HyFEMSettings
    from fedhet.parties.federation import load

    fed = load(resources.files("fedhet.algorithms.hyfem") / "smoke.toml")
    cfg = {**fed.algorithm_cfg(), "dp": "record", "dp_epsilon": 8.0, "max_rows": 200}
    out = run_inmemory(HYFEM, [(p.name, p.role) for p in fed.parties], cfg, seed=fed.seed, timeout=300)
    clients = [p.name for p in fed.parties if p.role == "client"]
    for c in clients:
        p = out[c]["privacy"]
        assert p["mechanism"] == "dp-sgd" and p["steps"] == cfg["rounds"] * cfg["local_steps"]
        assert p["sampling_rate"] == pytest.approx(min(32, out[c]["n_train"]) / out[c]["n_train"])
        assert p["epsilon"] <= 8.0 and p["epsilon"] == pytest.approx(8.0, rel=1e-3)
    whats = {d.kind: d.what for d in HYFEM.declarations(parse_settings(HyFEMSettings, cfg, "hyfem"))}
    assert "with DP noise (record level" in whats["hyfem/inference"]


# ------------------------------------------------------------------ HE split: DP on the guest's activations

def test_row_releases_clip_charge_the_worst_row_and_stop_before_the_plan_is_passed():
    from fedhet.protocols.dp_settings import ReleaseDPSettings, RowReleases

    s = ReleaseDPSettings(row_dp_epsilon=4.0, row_dp_clip=2.0)
    rel = RowReleases(s, n_rows=10, passes=3, who="guest1")
    z = rel.ledger.mechanism.noise
    # three releases of one Gaussian mechanism: the calibrated noise spends exactly the budget
    assert library_epsilon(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 3), 1e-5) == pytest.approx(4.0, rel=1e-3)
    factor, std = rel.prepare([0, 1, 2], [1.0, 4.0, 0.0])
    assert np.allclose(factor, [1.0, 0.5, 1.0]) and std == pytest.approx(z * 2.0)
    assert rel.ledger.steps == 1
    rel.prepare([3, 4], [1.0, 1.0])   # other rows: the worst row is still released once
    assert rel.ledger.steps == 1 and rel.ledger.spent == pytest.approx(
        library_epsilon(dpa.GaussianDpEvent(z), 1e-5), rel=1e-6)
    rel.prepare([0, 0], [1.0, 1.0])   # row 0 twice more: three releases
    assert rel.ledger.steps == 3 and rel.ledger.spent == pytest.approx(4.0, rel=1e-3)
    before = rel.state()
    with pytest.raises(PrivacyBudgetExceeded, match="row 1 would be released 4 times, the plan allows 3"):
        rel.prepare([1, 1, 1], [1.0] * 3)   # row 1 has one release: three more pass the plan
    assert np.array_equal(rel.counts, before["counts"]) and rel.ledger.steps == 3   # nothing charged
    again = RowReleases(s, n_rows=10, passes=3)
    again.load(rel.state())
    assert np.array_equal(again.counts, rel.counts) and again.ledger.spent == rel.ledger.spent


@pytest.mark.federation
def test_he_split_guest_noises_its_activations_and_accounts_each_row():
    """row_dp_epsilon in the HE split network: the guest's bottom output is clipped and noised per row before
    it is encrypted; with noise out of reach the run is the plain one; with a budget each guest writes the
    worst row's ledger and the declarations say what the activations reveal."""
    from fedhet.algorithms import he_split

    base = dict(dataset="breast_sklearn", he="paillier", key_bits=1024, slot_bits=128, mask_bits=32, pool=False,
                lr=0.05, interactive_lr=0.5, epochs=2, max_batches=3, batch_size=64, guest_bottom_width=3,
                interactive_width=2, seed=1)
    parties = [("host", "host"), ("guest1", "guest")]
    plain = run_inmemory(he_split, parties, cfg=base)
    quiet = run_inmemory(he_split, parties, cfg={**base, "row_noise": 1e-12, "row_dp_clip": 1e6})
    np.testing.assert_allclose(quiet["host"]["losses"], plain["host"]["losses"], atol=1e-6)
    assert quiet["guest1"]["privacy"]["noise_multiplier"] == 1e-12
    out = run_inmemory(he_split, parties, cfg={**base, "row_dp_epsilon": 4.0})
    p = out["guest1"]["privacy"]
    # 3 batches of 64 rows from one epoch, then the test pass: every row released once
    assert p["unit"] == "row" and p["steps"] == 1 and p["epsilon"] < 4.0
    assert out["host"]["test_accuracy"] is not None
    s = he_split.ALGORITHM.parse({**base, "row_dp_epsilon": 4.0})
    whats = {d.kind: d.what for d in he_split.declarations(s)}
    assert "with DP noise (row level" in whats[hei.Kind.ACTS]


@pytest.mark.federation
def test_progress_shows_the_epsilon_spent_so_far_for_any_algorithm():
    """The board shows each party's status metrics while a run goes on: a party that recorded a dp_epsilon
    metric shows the last one with every progress report, whatever its algorithm passes to progress."""
    from fedhet.parties.inmemory import InMemoryHub

    shown: list[dict] = []
    party = InMemoryHub({"a": "x", "b": "x"}, "run").party("a", seed=0, device="cpu", timeout=5.0,
                                                          status_cb=shown.append)
    party.progress(1, 3, val=0.5)
    assert "dp_epsilon" not in shown[-1]["metrics"]   # no DP: nothing claimed
    party.metric(dp_epsilon=1.23456)
    party.progress(3, 3, val=0.7)
    assert shown[-1]["metrics"] == {"val": 0.7, "dp_epsilon": 1.2346}
    party.progress(3, 3, dp_epsilon=2.0)   # an algorithm's own figure stands
    assert shown[-1]["metrics"] == {"dp_epsilon": 2.0}
