"""FATE's homomorphically encrypted interactive layer (hetero NN), between a label owner and one feature party.

Naming: STFL's — the **host** owns the labels and trains the top of the network, the **guest** is the
passive feature party.  FATE uses the reverse words (its label owner is the "guest", its passive party
the "host"); FATE's ``HEInteractiveLayerGuest`` runs here on the host, ``...Host`` on the guest.

The layer computes ``z = A_h @ W_h + b + A_g @ W`` where ``A_g`` (b x d) is the guest's bottom-model
output and ``W`` (d x K) the guest part of the interactive weights.  Nobody holds ``W``: the host
holds ``W_h``, ``b`` and a masked copy ``W_g``, the guest an accumulated noise ``eps`` with
``W = W_g + eps`` (``eps`` starts at zero, so the host knows the initial weights, as in FATE).
Every ciphertext is under the **guest's** key; the host only ever computes on them.

Per training batch (``[[x]]`` = encrypted under the guest's key; messages in brackets)::

  guest  A_g = bottom(x_g) -> [[A_g]]                                   [hei/acts]
         [[eps]]                                                        [hei/noise_ct]
  host   [[A_g W_g + e_B]]   e_B: host's fresh mask; rerandomized       [hei/fwd_ct]
  guest  decrypt, add A_g eps:  A_g W + e_B                             [hei/fwd_masked]
  host   remove e_B: A_g W; z = A_h W_h + b + A_g W; activation, top, loss; delta = dL/dz
  host   [[G + e_W]] = [[A_g]]^T delta + e_W   (weight gradient)        [hei/grad_ct]
  guest  decrypt, add its fresh mask nu:  G + e_W + nu                  [hei/grad_masked]
  host   [[delta (W_g + eps)^T]] = delta W_g^T + delta [[eps]]^T        [hei/ingrad_ct]
  guest  decrypt: delta W^T, the gradient for its bottom model
  host   W_g -= step(G + nu)        guest   eps += step(nu)      =>  W_g + eps = W - step(G)

(FATE adds ``noise/lr`` to the gradient and ``noise`` to its accumulator; ``step`` is the same
update written in exact integers, see :mod:`~fedhet.protocols.he_encoding`.)  Prediction runs the
forward half only.

What each side learns (semi-honest).  The host: ``A_g W`` per batch (the layer's output, which it
needs), ``G + nu`` and the ciphertexts.  It never sees ``A_g``, ``W`` or ``G``; knowing ``W`` would
let it solve ``A_g`` from ``A_g W`` when ``K >= d``, which is why ``eps`` masks it.  The guest: its own
``A_g``, ``delta W^T`` (its input gradient, as in any split network), ``A_g W_g + e_B`` and
``G + e_W``; ``e_B`` and ``e_W`` hide ``W_g`` (hence ``W``) and ``G`` (hence ``delta``).  Results
computed on the guest's ciphertexts are rerandomized before they go back to it (otherwise the key
owner could recover the combined randomness and, from it, the host's small integer scalars).

Numbers.  Schemes "paillier" and "naive" compute on exact integers: activations, weights and
gradients on fixed-point grids, ``step`` in exact integer arithmetic, statistical integer masks
(:mod:`fedhet.protocols.he_encoding` states the grids, the masks and their sizes).  Scheme "ckks"
computes on approximate floats with float masks (:mod:`fedhet.protocols.he_ckks_layer`).

Modules, one idea each; this one is the public entry and re-exports what callers use:

* :mod:`~fedhet.protocols.he_encoding`: ``LayerSpec`` (both sides' settings) and the integer
  encodings (quantization, weight steps, masks, masked bytes, big-integer digits);
* :mod:`~fedhet.protocols.he_link`: the message kinds, ``LayerStats``, receive helpers;
* :mod:`~fedhet.protocols.he_paillier_layer`: "paillier" (packed, batched Paillier, ``slot_bits``-bit
  slots, ``[[A_g]]`` sent in both packings, background obfuscator pools) and "naive" (``phe``, one
  value per ciphertext: the same integers and masks, to show what packing and batching buy);
* :mod:`~fedhet.protocols.he_ckks_layer`: "ckks" (TenSEAL CKKS, no Galois keys; not statistical
  hiding, see there);
* here: :func:`guest_layer` / :func:`host_layer` (pick the scheme's side), :func:`true_weight`,
  :func:`declarations` (the eight message kinds with their payload checks; masked integers must have
  the byte width of the slots resolved from the run's public settings).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from fedhet.crypto.fixedpoint import dequantize
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare

from .he_ckks_layer import CKKSGuest, CKKSHost
from .he_encoding import (
    SCHEMES,
    LayerSpec,
    SlotOverflowError,
    decode_masked,
    encode_masked,
    int_dot,
    masked_bytes,
    quantize,
    quantize_acts,
    quantize_delta,
    slot_budget,
    uniform_ints,
    weight_step,
)
from .he_link import (
    K_ACTS,
    K_FWD_CT,
    K_FWD_MASKED,
    K_GRAD_CT,
    K_GRAD_MASKED,
    K_INGRAD_CT,
    K_NOISE,
    K_PUBKEY,
    LayerStats,
)
from .he_paillier_layer import IntegerGuest, IntegerHost

__all__ = [
    "SCHEMES", "LayerSpec", "LayerStats", "SlotOverflowError", "slot_budget", "guest_layer", "host_layer", "true_weight", "declarations",
    "DECLARATIONS", "K_PUBKEY", "K_ACTS", "K_NOISE", "K_FWD_CT", "K_FWD_MASKED", "K_GRAD_CT", "K_GRAD_MASKED",
    "K_INGRAD_CT", "masked_bytes", "encode_masked", "decode_masked", "quantize", "quantize_acts",
    "quantize_delta", "weight_step", "int_dot", "uniform_ints",
]


def guest_layer(party, host: str, spec: LayerSpec, d: int, width: int):
    """The guest (passive party, key owner) side of one link; call ``setup()`` first."""
    cls = CKKSGuest if spec.scheme == "ckks" else IntegerGuest
    return cls(party, host, spec, d, width)


def host_layer(party, guest: str, spec: LayerSpec, W_init: np.ndarray):
    """The host (label owner) side of one link, holding the masked copy of ``W_init`` (d x K)."""
    cls = CKKSHost if spec.scheme == "ckks" else IntegerHost
    return cls(party, guest, spec, W_init)


def true_weight(host_side, guest_side) -> np.ndarray:
    """W = W_g + eps as floats (test helper: needs both parties' private state)."""
    if isinstance(host_side, CKKSHost):
        return host_side.W + guest_side.eps
    s = host_side.spec
    W = host_side.W + guest_side.eps
    return dequantize(W, s.w_frac_bits)


# ------------------------------------------------------------------------------------------ declarations
_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(LayerSpec) if f.name != "scheme")


MAX_CIPHERTEXTS = 1 << 20  # bound on the CKKS vectors of one message
_PACKED_META = sch.Fields({"shape": sch.ListOf(sch.Int(lo=0), max_len=8), "frac_bits": sch.Int(lo=0),
                           "bound": sch.Str(max_len=4096), "spec": sch.ListOf(sch.Int(lo=0), length=3),
                           "key_bits": sch.Int(lo=1)})
_NAIVE_META = sch.Fields({"shape": sch.ListOf(sch.Int(lo=0), max_len=8)})
# Paillier (packed or naive): fixed-width ciphertexts, one per row; CKKS: a list of serialised vectors.
PAILLIER_CT = sch.Fields({"meta": sch.OneOf((_PACKED_META, _NAIVE_META)), "ct": sch.Arr("|u1", (None, None))})
CKKS_CT = sch.ListOf(sch.Arr("|u1", (None,)), max_len=MAX_CIPHERTEXTS)
CIPHERTEXTS = sch.OneOf((PAILLIER_CT, CKKS_CT))
MASKED = sch.OneOf((sch.Arr("|u1", (None, None, None)), sch.Arr("<f8", (None, None))))
PUBKEY = sch.Fields({"scheme": sch.Str(max_len=32), "key": sch.Arr("|u1", (None,))})
ACTS = sch.OneOf((
    sch.Fields({"rows": sch.Int(lo=0), "fwd": PAILLIER_CT, "grad": PAILLIER_CT}, optional=("grad",)),
    sch.Fields({"rows": sch.Int(lo=0), "all": PAILLIER_CT}),
    sch.Fields({"rows": sch.Int(lo=0), "ckks": CKKS_CT})))


def declarations(host: str = "host", guest: str = "guest", *, scheme_key: str = "he",
                 width_key: str = "interactive_width", in_width_key: str = "in_width", defaults: dict | None = None,
                 spec_of: Callable[[dict], tuple[LayerSpec, int, int]] | None = None) -> list[MessageDecl]:
    """The layer's message kinds with checks on dtypes and shapes.

    The checks read the layer's settings from the run's config: ``spec_of(cfg)`` gives ``(LayerSpec, d, K)``
    (the guest's width and the interactive width); by default the scheme is ``cfg[scheme_key]``, ``d`` and
    ``K`` are ``cfg[in_width_key]`` and ``cfg[width_key]``, and every other ``LayerSpec`` field is read
    by its own name (``defaults`` fill what the config lacks).  Masked integers must have exactly the
    width of the slots both sides resolve from those public settings (``LayerSpec.resolve``)."""
    dflt = {scheme_key: "paillier", width_key: 16, in_width_key: 16}
    dflt.update(defaults or {})

    def default_spec(cfg) -> tuple[LayerSpec, int, int]:
        c = dict(dflt)
        c.update({k: cfg[k] for k in cfg})
        kw = {k: c[k] for k in _SPEC_FIELDS if k in c}
        return LayerSpec(scheme=c[scheme_key], **kw), int(c[in_width_key]), int(c[width_key])

    def params(cfg) -> tuple[str, int, int, int]:
        spec, d, K = (spec_of or default_spec)(cfg)
        return spec.scheme, int(spec.key_bits), int(spec.resolve(d, K).slot_bits), int(K)

    def ct_check(arrays, cfg):
        try:
            scheme, key_bits, _, _ = params(cfg)
        except ValueError as e:
            return f"the layer's settings do not parse: {e}"
        if not arrays:
            return "expected ciphertexts, got no arrays"
        for dt, shape in arrays:
            if scheme == "ckks":
                if dt != "|u1" or len(shape) != 1:
                    return f"CKKS ciphertexts must be 1-D uint8 (serialised vectors), got {dt}{list(shape)}"
            elif dt != "|u1" or len(shape) != 2 or shape[1] != key_bits // 4:
                return f"Paillier ciphertexts must be uint8 (n, {key_bits // 4}), got {dt}{list(shape)}"
        return None

    def masked_check(arrays, cfg):
        try:
            scheme, _, slot_bits, K = params(cfg)
        except ValueError as e:
            return f"the layer's settings do not parse: {e}"
        if len(arrays) != 1:
            return f"expected one masked array, got {len(arrays)}"
        dt, shape = arrays[0]
        if scheme == "ckks":
            if dt != "<f8" or len(shape) != 2 or K not in shape:
                return f"CKKS masked values must be float64 with one axis of width {K}, got {dt}{list(shape)}"
            return None
        w = masked_bytes(slot_bits)
        if dt != "|u1" or len(shape) != 3 or shape[0] != K or shape[2] != w:
            return (f"masked integers must be uint8 ({K}, n, {w}) (K rows of {w}-byte two's complement "
                    f"values for {slot_bits}-bit slots), got {dt}{list(shape)}")
        return None

    def key_check(arrays, cfg):
        try:
            scheme, key_bits, _, _ = params(cfg)
        except ValueError as e:
            return f"the layer's settings do not parse: {e}"
        if len(arrays) != 1 or arrays[0][0] != "|u1" or len(arrays[0][1]) != 1:
            return f"expected one 1-D uint8 public key, got {arrays}"
        if scheme != "ckks" and arrays[0][1][0] != key_bits // 8:
            return f"a {key_bits}-bit Paillier public key is {key_bits // 8} bytes, got {arrays[0][1][0]}"
        return None

    ct = ("; Paillier (packed or naive): uint8 (n_ciphertexts, key_bits/4), one fixed-width big-endian ciphertext "
          "mod n**2 per row (512 bytes for 2048-bit keys), plus shape metadata; CKKS: 1-D uint8 serialised vectors")
    masked = ("; Paillier (packed or naive): uint8 ({dims}, masked_bytes) two's complement integers, masked_bytes = "
              "(slot_bits + 16) // 8 of the slot width both sides resolve from the settings (19 for 140-bit slots); "
              "CKKS: float64 {ck}")
    return [
        declare(K_PUBKEY, guest, host, "guest's public key: Paillier n as uint8 (key_bits/8,), or a TenSEAL "
                "context without the secret key as 1-D uint8", key_check, payload=PUBKEY),
        declare(K_ACTS, guest, host, "guest's bottom-model output encrypted under its own key, packed along "
                "the batch and (training) along the features" + ct, ct_check, payload=ACTS),
        declare(K_NOISE, guest, host, "guest's accumulated weight noise eps, encrypted under its own key" + ct,
                ct_check, payload=CIPHERTEXTS),
        declare(K_FWD_CT, host, guest, "[[A_g W_g + e_B]]: host's product on the guest's ciphertexts plus "
                "the host's mask, rerandomized" + ct, ct_check, payload=CIPHERTEXTS),
        declare(K_FWD_MASKED, guest, host, "A_g W + e_B: the layer output still masked by the host's noise"
                + masked.format(dims="K, rows", ck="(rows, K)"), masked_check, payload=MASKED),
        declare(K_GRAD_CT, host, guest, "[[A_g^T delta + e_W]]: weight gradient masked by the host, "
                "rerandomized" + ct, ct_check, payload=CIPHERTEXTS),
        declare(K_GRAD_MASKED, guest, host, "G + e_W + nu: weight gradient masked by both parties' noise"
                + masked.format(dims="K, d", ck="(K, d)"), masked_check, payload=MASKED),
        declare(K_INGRAD_CT, host, guest, "[[delta (W_g + eps)^T]]: the guest's input gradient, encrypted, "
                "rerandomized" + ct, ct_check, payload=CIPHERTEXTS),
    ]


DECLARATIONS = declarations()
