"""The FATE-style HE split network: the encrypted interactive layer against plain arithmetic, training against
a plaintext split network, what the guest sends, and a real process run that passes the audit.

Small keys (1024 bits) and few batches keep it fast; the default 2048-bit runs are in the benchmark.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedhet.algorithms import he_split
from fedhet.crypto import ckks
from fedhet.parties import codec
from fedhet.parties.ops import presets
from fedhet.parties.api import Party
from fedhet.parties.audit import audit
from fedhet.parties.declare import check_record
from fedhet.parties.declare import index as decl_index
from fedhet.parties.federation import load
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.ops.launcher import launch
from fedhet.protocols import he_interactive as hei

from he_link import run_pair  # a helper module of tests/

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

KEY = 1024
FRAC_A, FRAC_W = hei.LayerSpec.a_frac_bits, hei.LayerSpec.w_frac_bits


def _ints_to_float(a) -> np.ndarray:
    a = np.asarray(a, dtype=object)
    return np.array([float(int(v)) for v in a.ravel()]).reshape(a.shape)


def _exact(rows) -> np.ndarray:
    return np.array([[int(v) for v in r] for r in rows], dtype=object)


def run_layer(spec: hei.LayerSpec, A, W_g, eps, delta=None, steps: int = 1):
    """Both sides of one link in memory, the host holding W_g and the guest eps (true weight W_g + eps)."""
    return run_pair(spec, spec, A, W_g, eps, delta, steps)


# ------------------------------------------------------------------------------------------ the layer
@pytest.mark.federation
@pytest.mark.parametrize("scheme", ["paillier", "naive"])
def test_int_layer_forward_backward_exact(scheme):
    """Forward = round(A) @ (W_g + eps) exactly; input gradient = delta W^T exactly; W moves by -step(G)."""
    rng = np.random.default_rng(3)
    b, d, K = (20, 5, 3) if scheme == "paillier" else (6, 3, 2)
    A = rng.normal(size=(b, d))
    W0 = rng.normal(size=(d, K)) * 0.5
    spec = hei.LayerSpec(scheme=scheme, key_bits=KEY, batch_size=32, lr=0.3, pool=False)
    eps = hei.uniform_ints((d, K), 60)  # a large accumulated noise, as after training
    delta = rng.normal(size=(b, K)) * 0.7
    W_int = hei.quantize(W0, FRAC_W)  # the true weight on the grid, before any update
    box = run_layer(spec, A, W_int - eps, eps, delta, steps=2)  # host's masked copy W_g = W - eps
    h, g = box["h"], box["g"]
    Aq = hei.quantize(A, FRAC_A)
    want = _ints_to_float(hei.int_dot(Aq, W_int)) * 2.0 ** -(FRAC_A + FRAC_W)
    np.testing.assert_array_equal(box["Z"][0], want)
    # and within the fixed-point bound of the float product
    W_true = _ints_to_float(W_int) * 2.0 ** -FRAC_W
    bound = 2.0 ** -(FRAC_A + 1) * np.abs(W_true).sum(axis=0) + 1e-9
    assert np.all(np.abs(box["Z"][0] - A @ W_true) <= bound)
    dq = hei.quantize_delta(delta, spec)
    np.testing.assert_allclose(box["grad"][0] * b * 2.0 ** (spec.d_frac_bits + FRAC_W),  # (/b: one rounding)
                               _ints_to_float(hei.int_dot(dq, W_int.T)), rtol=1e-15, atol=0)
    # two plaintext SGD steps on the grid: W - step(A^T delta) each, to one grid unit per step
    W_ref = W_int.copy()
    for _ in range(2):
        W_ref = W_ref - hei.weight_step(hei.int_dot(dq.T, Aq), b, spec).T
    diff = (h.W + g.eps) - W_ref
    assert max(abs(int(v)) for v in diff.ravel()) <= 2
    # the forward of the second step used the updated weight
    W1 = W_int - hei.weight_step(hei.int_dot(dq.T, Aq), b, spec).T
    got = box["Z"][1] * 2.0 ** (FRAC_A + FRAC_W)
    slack = _ints_to_float(np.abs(Aq)).sum(axis=1)[None, :].T  # one grid unit of W per row entry
    assert np.all(np.abs(got - _ints_to_float(hei.int_dot(Aq, W1))) <= slack + 0.5)
    # the host's copy alone is far from the true weight: eps masks it
    assert np.min(np.abs(_ints_to_float(h.W) * 2.0 ** -FRAC_W - W_true)) > 1.0
    assert h.stats.min_mask_sigma >= spec.mask_bits


@pytest.mark.federation
def test_ckks_layer_within_stated_precision():
    rng = np.random.default_rng(4)
    b, d, K = 64, 6, 5
    A = np.abs(rng.normal(size=(b, d)))
    W0 = rng.normal(size=(d, K))
    eps = rng.normal(size=(d, K)) * 3
    delta = rng.normal(size=(b, K))
    spec = hei.LayerSpec(scheme="ckks", lr=0.2)
    box = run_layer(spec, A, W0 - eps, eps, delta, steps=1)
    W = W0
    slot_mag = np.abs(A) @ np.abs(W0 - eps) + spec.ckks_mask
    tol = d * (ckks.ABS_TOL_FRESH + ckks.REL_TOL_MUL * slot_mag)
    assert np.all(np.abs(box["Z"][0] - A @ W) <= tol)
    ig_tol = K * (ckks.ABS_TOL_FRESH + ckks.REL_TOL_MUL * (np.abs(delta) @ np.abs(W).T)) / b
    assert np.all(np.abs(box["grad"][0] - delta @ W.T / b) <= ig_tol + 1e-9)
    W_new = hei.true_weight(box["h"], box["g"])
    G_tol = spec.lr / b * b * (ckks.ABS_TOL_FRESH + ckks.REL_TOL_MUL * (np.abs(A).T @ np.abs(delta) + spec.ckks_mask))
    assert np.all(np.abs(W_new - (W - spec.lr / b * A.T @ delta)) <= G_tol)


def test_layer_refuses_oversized_activations():
    spec = hei.LayerSpec(key_bits=KEY, pool=False)
    with pytest.raises(ValueError, match="a_int_bits"):
        hei.quantize_acts(np.array([[2.0 ** spec.a_int_bits]]), spec)
    with pytest.raises(ValueError, match="slot_bits"):
        hei.LayerSpec(slot_bits=40)
    with pytest.raises(ValueError, match="scheme"):
        hei.LayerSpec(scheme="rsa")


def test_masked_integer_wire_roundtrip():
    vals = np.array([[0, -1, 2 ** 150, -(2 ** 159)], [12345, -67890, 1, 2 ** 159 - 1]], dtype=object)
    w = hei.masked_bytes(160)
    enc = hei.encode_masked(vals, w)
    assert enc.dtype == np.uint8 and enc.shape == (2, 4, w)
    assert (hei.decode_masked(enc, w) == vals).all()
    with pytest.raises(OverflowError):
        hei.encode_masked(np.array([1 << (8 * w)], dtype=object), w)


# ------------------------------------------------------------------------------------------ training
def _cfg(**kw):
    c = dict(dataset="breast_sklearn", he="paillier", key_bits=KEY, slot_bits=128, mask_bits=32, pool=False,
             lr=0.05, interactive_lr=0.5, epochs=2, return_params=True)
    c.update(kw)
    return c


@pytest.fixture(scope="module")
def paillier_run():
    """Two epochs of packed-Paillier training in memory, recording every payload the parties send."""
    sent = []
    orig = Party.send

    def spy(self, to, kind, payload):
        sent.append((self.role, kind, codec.describe(payload)))
        return orig(self, to, kind, payload)

    Party.send = spy
    try:
        cfg = _cfg()
        models: dict = {}
        res = run_inmemory(he_split, [("host", "host"), ("guest1", "guest")], cfg=cfg, seed=0, models=models)
    finally:
        Party.send = orig
    return cfg, res, sent, models


@pytest.mark.federation
def test_he_training_matches_plaintext_split(paillier_run):
    cfg, res, _, _ = paillier_run
    ref = he_split.run_reference(he_split.ALGORITHM.parse({k: v for k, v in cfg.items() if k != "return_params"}))
    h, g = res["host"], res["guest1"]
    assert h["batches"] == ref["batches"] == 4 and h["n_common"] == ref["n_common"] == 341
    np.testing.assert_allclose(h["losses"], ref["losses"], atol=1e-3)
    sd = ref["model"].state_dict()
    for k, v in h["params"].items():
        np.testing.assert_allclose(np.array(v), sd[k].numpy(), atol=2e-3, err_msg=k)
    gsd = ref["guest_models"][0].state_dict()
    for k, v in g["params"].items():
        np.testing.assert_allclose(np.array(v), gsd[k].numpy(), atol=2e-3, err_msg=k)
    W = _ints_to_float(_exact(h["W_share"]["guest1"]) + _exact(g["eps"])) * 2.0 ** -FRAC_W
    np.testing.assert_allclose(W, ref["W"][0], atol=1e-3)
    assert np.max(np.abs(_ints_to_float(_exact(h["W_share"]["guest1"])))) * 2.0 ** -FRAC_W > 1e3


@pytest.mark.federation   # paillier_run starts the parties for whichever of its tests runs first
def test_he_training_learns(paillier_run):
    _, res, _, _ = paillier_run
    h = res["host"]
    assert h["epochs"] == 2 and h["test_accuracy"] > 0.85
    assert h["losses"][-1] < h["losses"][0]
    for key in ("train_s", "s_per_epoch", "bytes", "n_common", "he", "key_bits"):
        assert key in h
    assert h["he"] == "paillier" and h["key_bits"] == KEY and h["bytes"]["sent"] > 0


@pytest.mark.federation   # paillier_run starts the parties for whichever of its tests runs first
def test_guest_sends_only_ciphertexts_masks_and_psi(paillier_run):
    cfg, _, sent, _ = paillier_run
    declared = decl_index(he_split.declarations(he_split.ALGORITHM.parse(cfg)))
    guest_kinds = set()
    for role, kind, arrays in sent:
        d = declared[kind]
        assert role in d.sender, (role, kind)
        assert check_record(d, arrays) is None, (kind, arrays, check_record(d, arrays))
        if role == "guest":
            guest_kinds.add(kind)
            for dt, shape in arrays:
                assert dt == "|u1", (kind, dt, shape)  # no float array ever leaves the guest
                if kind.startswith("hei/") and kind != "hei/pubkey":
                    assert shape[-1] in (KEY // 4, hei.masked_bytes(cfg["slot_bits"])), (kind, shape)
    assert guest_kinds == {"psi/size", "psi/blind_f", "psi/double_l", "hes/width", "hei/pubkey", "hei/acts",
                           "hei/noise_ct", "hei/fwd_masked", "hei/grad_masked"}
    # a raw activation array would be refused by the declarations
    bad = [("<f8", (128, 8))]
    assert check_record(declared["hei/fwd_masked"], bad) is not None
    assert check_record(declared["hei/acts"], bad) is not None


@pytest.mark.federation   # paillier_run starts the parties for whichever of its tests runs first
def test_each_part_holds_its_own_share_and_the_host_scores_with_the_guests_outputs(paillier_run):
    """The guest's part: its bottom model and eps; the host's: its network and W_g; neither holds W = W_g + eps.
    The host's part scores nothing without the guest's interactive output: given A_g W, computed here from
    the guest's part on the same rows and both shares (what the exchange computes), it gives the
    probabilities it recorded."""
    from fedhet.algorithms.scoring import check_part
    from fedhet.algorithms.he_split import model as hm
    from fedhet.algorithms.he_split.data import guest_data, host_data
    from fedhet.algorithms.toolkit import align_host_rows, sorted_intersection

    cfg, res, _, models = paillier_run
    host, guest = models["host"], models["guest1"]
    load_model = he_split.ALGORITHM.load_model
    assert [k for k in host.tensors if k.startswith("share")] == host.meta["random_tensors"] == ["share.guest1.digits"]
    assert [k for k in guest.tensors if k.startswith("share")] == guest.meta["random_tensors"] == ["share.digits"]
    W_g, eps = hm.share(host.tensors, "share.guest1"), hm.share(guest.tensors)
    assert (W_g == _exact(res["host"]["W_share"]["guest1"])).all() and (eps == _exact(res["guest1"]["eps"])).all()
    W = _ints_to_float(W_g + eps) * 2.0 ** -FRAC_W
    assert np.abs(W).max() < 10 < np.abs(_ints_to_float(W_g)).max() * 2.0 ** -FRAC_W
    g_mod, h_mod = load_model(guest.meta, guest.tensors), load_model(host.meta, host.tensors)
    assert check_part(g_mod, guest.meta) is None and check_part(h_mod, host.meta) is None
    assert [i["name"] for i in host.meta["inputs"]] == ["x", "z.guest1"] and len(host.meta["feature_names"]) == 10

    s = he_split.ALGORITHM.parse(cfg)
    hdat, gdat = host_data(s), guest_data(s, 0, 1)
    _, (rh, rg) = sorted_intersection(np.concatenate([hdat.ids_train, hdat.ids_test]).tolist(), gdat.ids.tolist())
    hd = align_host_rows(rh, hdat.x_train_raw, hdat.y_train, hdat.x_test_raw, hdat.y_test, order="common")
    x_host, x_guest = hd.x_test[:8], gdat.x[rg[hd.pos_test[:8]]]
    np.testing.assert_array_equal(np.asarray(host.meta["check"]["inputs"]["x"], np.float32), x_host)
    np.testing.assert_array_equal(np.asarray(guest.meta["check"]["inputs"]["x"], np.float32), gdat.x[rg[:8]])
    with torch.no_grad():
        A = g_mod(torch.as_tensor(x_guest)).double().numpy()
        z = torch.as_tensor(A @ W, dtype=torch.float32)
        np.testing.assert_allclose(z.numpy(), host.meta["check"]["inputs"]["z.guest1"], atol=1e-3)
        probs = h_mod(torch.as_tensor(x_host), z).numpy()
    np.testing.assert_allclose(probs, host.meta["check"]["outputs"], atol=1e-3)


@pytest.mark.federation
@pytest.mark.parametrize("scheme", ["naive", "ckks"])
def test_naive_and_ckks_variants_train(scheme):
    kw = dict(he=scheme, max_batches=1, batch_size=16 if scheme == "naive" else 64, guest_bottom_width=3,
              interactive_width=2, test_frac=0.05, seed=1)
    res = run_inmemory(he_split, [("host", "host"), ("guest1", "guest")], cfg=_cfg(**kw))
    ref = he_split.run_reference(he_split.ALGORITHM.parse({k: v for k, v in _cfg(**kw).items() if k != "return_params"}))
    h = res["host"]
    assert h["he"] == scheme and h["batches"] == 1
    np.testing.assert_allclose(h["losses"], ref["losses"], atol=1e-3)
    assert h["test_accuracy"] == pytest.approx(ref["test_accuracy"], abs=0.05)
    st = res["guest1"]["layer_stats"]
    assert st["encrypted"] > 0 and st["decrypted"] > 0


def test_config_errors_are_named():
    with pytest.raises(ValueError, match="dataset must be one of"):
        he_split.ALGORITHM.parse({"dataset": "mnist"})
    with pytest.raises(ValueError, match="unknown setting.*'epoch'"):
        he_split.ALGORITHM.parse({"epoch": 3})
    with pytest.raises(ValueError, match="he must be one of"):
        he_split.ALGORITHM.parse({"he": "rsa"})


# ------------------------------------------------------------------------------------------ processes
@pytest.mark.processes
@pytest.mark.smoke   # make test's process run of this family
def test_process_run_passes_audit(tmp_path):
    fed = load(presets.path("he_split"))
    run_dir = tmp_path / "run"
    launch(fed, run_dir, progress=False, timeout=300,
           overrides={"key_bits": KEY, "max_batches": 2, "batch_size": 32, "slot_bits": 128, "mask_bits": 32})
    rep = audit(run_dir)
    assert rep.ok, rep.problems
    host = json.loads((run_dir / "parties" / "host" / "result.json").read_text())["result"]
    assert host["batches"] == 2 and host["n_common"] == 341 and 0.0 <= host["test_accuracy"] <= 1.0
    guest_sent = {r["kind"] for r in rep.table if r["party"] == "guest1" and r["sent"]}
    assert guest_sent <= {"psi/size", "psi/blind_f", "psi/double_l", "hes/width", "hei/pubkey", "hei/acts",
                          "hei/noise_ct", "hei/fwd_masked", "hei/grad_masked", "_bye"}
    assert "hei/fwd_masked" in guest_sent
