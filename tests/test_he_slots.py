"""Auto-sized slots of the HE interactive layer: the bounds they rest on, training with them against
160-bit slots, overflow past the plan, and the declarations' exact masked width.

Small keys (1024 bits) keep it fast.
"""
from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from fedhet.algorithms import he_split
from fedhet.parties import codec
from fedhet.parties.api import Party, PartyError
from fedhet.parties.declare import check_record
from fedhet.parties.declare import index as decl_index
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.protocols import he_encoding as hen
from fedhet.protocols import he_interactive as hei
from fedhet.protocols import he_paillier_layer

from he_link import run_pair  # a helper module of tests/

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

KEY = 1024


@pytest.fixture
def seeded_masks(monkeypatch):
    """Every party draws its masks from its own seeded stream per bit width (instead of the OS CSPRNG), so
    two runs that differ only in their slot width get the same guest noise nu."""
    streams: dict = {}
    lock = threading.Lock()

    def ints(shape, bits):
        key = (threading.current_thread().name, bits)
        with lock:
            rng = streams.setdefault(key, random.Random(f"{key}"))
            count = int(np.prod(shape)) if len(shape) else 1
            vals = [rng.getrandbits(bits + 1) - (1 << bits) for _ in range(count)]
        return np.array(vals, dtype=object).reshape(shape)

    monkeypatch.setattr(he_paillier_layer, "uniform_ints", ints)
    return streams.clear  # call between runs: each run starts the streams afresh


def _max_abs(a) -> int:
    return max(abs(int(v)) for v in np.asarray(a, dtype=object).ravel())


# ------------------------------------------------------------------------------------------ the budget
@pytest.mark.unit
@pytest.mark.parametrize("lr,mask_bits,batch", [(0.3, 40, 128), (0.1, 32, 32), (2.5, 40, 7)])
def test_step_bounds_hold_for_every_batch_size(lr, mask_bits, batch):
    """|step(nu)| <= s and |step(G + nu) - step(nu)| <= s_G at the extremes of nu and G, for every row count."""
    spec = hei.LayerSpec(lr=lr, mask_bits=mask_bits, batch_size=batch)
    b = hei.slot_budget(spec, 8, 8)
    for rows in sorted({1, 2, 3, batch // 2 + 1, batch - 1, batch} - {0}):
        nu_bits = spec.mask_bits + spec.grad_bits(rows)
        nus = np.array([-(1 << nu_bits), (1 << nu_bits) - 1, 0, 12345], dtype=object)
        g_max = rows * ((1 << spec.a_bound_bits) - 1) * ((1 << (spec.d_int_bits + spec.d_frac_bits)) - 1)
        for G in (-g_max, g_max, 0):
            step_nu = hei.weight_step(nus, rows, spec)
            assert _max_abs(step_nu) <= b.step
            assert _max_abs(hei.weight_step(nus + G, rows, spec) - step_nu) <= b.true_step


@pytest.mark.unit
@pytest.mark.parametrize("d,K,steps,mask_bits", [(8, 8, 300, 40), (8, 8, 1 << 20, 40), (3, 2, 1, 32),
                                                  (20, 4, 5000, 48), (2, 64, 100, 40)])
def test_auto_width_is_the_least_that_passes_the_planned_worst_case(d, K, steps, mask_bits):
    spec = hei.LayerSpec(max_steps=steps, mask_bits=mask_bits)
    b = hei.slot_budget(spec, d, K)
    width = spec.resolve(d, K).slot_bits
    assert width == b.slot_bits and spec.resolve(d, K).resolve(d, K).slot_bits == width
    # forward at the worst planned weights: every |W_g| entry at w_max
    W = np.full((d, K), b.w_max, dtype=object)
    need = hen.int_bound(spec.a_bound_bits, W).bit_length() + mask_bits + 2
    assert need == b.forward_bits == width  # the forward binds here: one bit less fails its margin check
    # weight gradient at a full batch of extreme deltas
    delta = np.full((spec.batch_size, K), (1 << (spec.d_int_bits + spec.d_frac_bits)) - 1, dtype=object)
    assert hen.int_bound(spec.a_bound_bits, delta).bit_length() + mask_bits + 2 <= b.gradient_bits <= width
    assert width == max(b.forward_bits, b.gradient_bits, b.input_grad_bits, mask_bits + 8)
    # the walk bound grows like sqrt(steps): 4x the steps, about one more bit
    b4 = hei.slot_budget(hei.LayerSpec(max_steps=4 * steps, mask_bits=mask_bits), d, K)
    assert b.walk < b4.walk <= 2 * b.walk + 2


@pytest.mark.unit
def test_eps_random_walk_stays_inside_its_bound():
    """A simulated eps (the guest's real noise and weight_step) over 2000 steps of random batch sizes stays
    well within the budget's walk (which holds with probability 1 - 2**-40)."""
    spec = hei.LayerSpec(max_steps=2000, batch_size=32, lr=0.3)
    b = hei.slot_budget(spec, 3, 2)
    rng = np.random.default_rng(0)
    eps = np.zeros((3, 2), dtype=object)
    peak = 0
    for _ in range(spec.max_steps):
        rows = int(rng.integers(1, spec.batch_size + 1))
        eps = eps + hei.weight_step(hei.uniform_ints((3, 2), spec.mask_bits + spec.grad_bits(rows)), rows, spec)
        peak = max(peak, _max_abs(eps))
    assert b.step * 4 < peak <= b.drift * spec.max_steps + b.walk


@pytest.mark.unit
def test_auto_is_narrower_than_160_bits_for_he_split_defaults():
    c = he_split.ALGORITHM.parse({"dataset": "cancer"})
    spec = c.layer.resolve(c.guest_bottom_width, c.interactive_width)
    assert spec.slot_bits < 160 and (2048 - 2) // spec.slot_bits > (2048 - 2) // 160
    assert c.max_steps == c.epochs * (he_split.MAX_ROWS_PLANNED // c.batch_size)
    assert he_split.ALGORITHM.parse({"max_batches": 7}).layer.max_steps == 7


@pytest.mark.unit
def test_spec_and_settings_refuse_bad_widths():
    with pytest.raises(ValueError, match="slot_bits"):
        hei.LayerSpec(slot_bits="wide")
    with pytest.raises(ValueError, match="max_steps"):
        hei.LayerSpec(max_steps=0)
    with pytest.raises(ValueError, match="resolve"):
        _ = hei.LayerSpec().masked_bytes
    with pytest.raises(ValueError, match="auto slot width"):
        hei.LayerSpec(key_bits=128, mask_bits=40).resolve(8, 8)
    from fedhet.parties.settings import SettingsError, parse_settings
    assert parse_settings(he_split.Settings, {"slot_bits": "auto"}, "he_split").slot_bits == "auto"
    assert parse_settings(he_split.Settings, {"slot_bits": 160}, "he_split").slot_bits == 160
    with pytest.raises(SettingsError, match="slot_bits"):
        parse_settings(he_split.Settings, {"slot_bits": "wide"}, "he_split")
    with pytest.raises(SettingsError, match="he_max_steps"):
        parse_settings(he_split.Settings, {"he_max_steps": 0}, "he_split")


# ------------------------------------------------------------------------------------------ the layer
def test_auto_slots_train_the_layer_like_160_bit_slots(seeded_masks):
    """Same inputs and guest noise: auto-sized and 160-bit slots give bit-identical outputs, input gradients
    and weights over three training steps, with fewer ciphertexts."""
    rng = np.random.default_rng(5)
    b, d, K = 28, 5, 3  # 28 rows: 5 ciphertexts of 6 160-bit slots per feature, 4 of 7 auto slots
    A = rng.normal(size=(b, d))
    W0 = hei.quantize(rng.uniform(-1, 1, size=(d, K)), hei.LayerSpec.w_frac_bits)
    delta = rng.normal(size=(b, K)) * 0.7
    eps0 = np.zeros((d, K), dtype=object)
    runs = {}
    for name, width in (("fixed", 160), ("auto", "auto")):
        seeded_masks()
        spec = hei.LayerSpec(key_bits=KEY, slot_bits=width, batch_size=32, lr=0.3, pool=False, max_steps=50)
        runs[name] = run_pair(spec, spec, A, W0, eps0, delta, steps=3)
    f, a = runs["fixed"], runs["auto"]
    assert a["h"].spec.slot_bits == a["g"].spec.slot_bits < 160
    for zf, za in zip(f["Z"], a["Z"], strict=True):
        np.testing.assert_array_equal(zf, za)
    for gf, ga in zip(f["grad"], a["grad"], strict=True):
        np.testing.assert_array_equal(gf, ga)
    assert (f["h"].W == a["h"].W).all() and (f["g"].eps == a["g"].eps).all()
    assert _max_abs(a["g"].eps) > 1 << 40  # the noise did grow: the slots held real values
    # and the outputs are the layer's exact integer product with the true weight of each step
    Aq = hei.quantize(A, hei.LayerSpec.a_frac_bits)
    want = hei.int_dot(Aq, W0).astype(np.float64) * 2.0 ** -(hei.LayerSpec.a_frac_bits + hei.LayerSpec.w_frac_bits)
    np.testing.assert_array_equal(a["Z"][0], want)
    assert a["g"].stats.encrypted < f["g"].stats.encrypted
    assert a["h"].stats.min_mask_sigma >= a["h"].spec.mask_bits


def test_weights_past_the_plan_fail_naming_what_to_raise():
    """eps far beyond what max_steps planned for: the host's forward margin check stops the run."""
    rng = np.random.default_rng(6)
    b, d, K = 8, 3, 2
    spec = hei.LayerSpec(key_bits=KEY, batch_size=16, lr=0.3, pool=False, max_steps=1)
    w_max = hei.slot_budget(spec, d, K).w_max
    eps = np.full((d, K), w_max * 4, dtype=object)
    with pytest.raises(FederationFailed) as ei:
        run_pair(spec, spec, rng.normal(size=(b, d)), -eps, eps, rng.normal(size=(b, K)), steps=1)
    err = ei.value.failures["h"]
    assert isinstance(err, hei.SlotOverflowError) and isinstance(err, PartyError)
    msg = str(err)
    assert "forward" in msg and "max_steps=1" in msg and "slot_bits >=" in msg and "mask_bits=40" in msg


def test_tiny_slots_fail_once_training_grows_the_weights():
    """64-bit slots fit the initial weights; the first step's noise eps outgrows them: the second forward fails."""
    rng = np.random.default_rng(7)
    b, d, K = 20, 5, 3
    spec = hei.LayerSpec(key_bits=KEY, slot_bits=64, mask_bits=20, batch_size=32, lr=0.3, pool=False)
    W0 = hei.quantize(rng.uniform(-1, 1, size=(d, K)), spec.w_frac_bits)
    box: dict = {}
    with pytest.raises(FederationFailed) as ei:
        run_pair(spec, spec, rng.normal(size=(b, d)), W0, np.zeros((d, K), dtype=object), rng.normal(size=(b, K)),
                 steps=3, box=box)
    err = ei.value.failures["h"]
    assert isinstance(err, hei.SlotOverflowError), ei.value.failures
    assert "forward" in str(err) and "64-bit slots" in str(err) and "raise max_steps" in str(err)
    assert len(box["Z"]) == 1 and len(box["grad"]) == 1  # the first step went through


def test_a_guest_packing_another_width_is_refused():
    rng = np.random.default_rng(8)
    host_spec = hei.LayerSpec(key_bits=KEY, batch_size=16, pool=False)
    guest_spec = hei.LayerSpec(key_bits=KEY, batch_size=16, pool=False, slot_bits=160)
    with pytest.raises(FederationFailed) as ei:
        run_pair(host_spec, guest_spec, rng.normal(size=(4, 3)), np.zeros((3, 2), dtype=object),
                 np.zeros((3, 2), dtype=object))
    err = ei.value.failures["h"]
    assert isinstance(err, PartyError) and "160-bit slots, expected" in str(err)


# ------------------------------------------------------------------------------------------ the split network
def _cfg(**kw):
    c = dict(dataset="breast_sklearn", he="paillier", key_bits=KEY, pool=False, lr=0.05, interactive_lr=0.5,
             epochs=1, batch_size=32, max_batches=2, guest_bottom_width=4, interactive_width=3, evaluate=False,
             seed=2)
    c.update(kw)
    return c


def test_split_network_with_auto_slots_and_declarations_of_the_exact_width():
    """A short he_split run with auto slots matches the plaintext network; every message it sends passes the
    declarations for its own settings, and its masked integers fail them under 160-bit or other auto settings."""
    sent = []
    orig = Party.send

    def spy(self, to, kind, payload):
        sent.append((self.role, kind, codec.describe(payload)))
        return orig(self, to, kind, payload)

    cfg = _cfg()
    Party.send = spy
    try:
        res = run_inmemory(he_split, [("host", "host"), ("guest1", "guest")], cfg=cfg)
    finally:
        Party.send = orig
    h = res["host"]
    ref = he_split.run_reference(he_split.ALGORITHM.parse(cfg))
    np.testing.assert_allclose(h["losses"], ref["losses"], atol=1e-3)
    assert h["slot_bits_setting"] == "auto" and h["he_max_steps"] == 2 and h["slot_bits"] < 160
    declared = decl_index(he_split.declarations(he_split.ALGORITHM.parse(cfg)))
    masked = [(kind, arrays) for _, kind, arrays in sent if kind in ("hei/fwd_masked", "hei/grad_masked")]
    assert masked
    for _, kind, arrays in sent:
        d = declared[kind]
        assert check_record(d, arrays, cfg) is None, (kind, arrays, check_record(d, arrays, cfg))
    assert {arrays[0][1][-1] for _, arrays in masked} == {hei.masked_bytes(h["slot_bits"])}
    # (other settings whose auto width rounds to the same bytes would pass: the wire carries whole bytes)
    for other in (dict(cfg, slot_bits=160), dict(cfg, max_batches=None, epochs=100)):
        declared_other = decl_index(he_split.declarations(he_split.ALGORITHM.parse(other)))
        for kind, arrays in masked:
            assert "matches no declared array" in (check_record(declared_other[kind], arrays, other) or ""), (other, kind)


def test_host_refuses_more_batches_than_he_max_steps():
    with pytest.raises(FederationFailed) as ei:
        run_inmemory(he_split, [("host", "host"), ("guest1", "guest")], cfg=_cfg(max_batches=None, he_max_steps=3))
    assert "he_max_steps=3" in str(ei.value.failures["host"])
