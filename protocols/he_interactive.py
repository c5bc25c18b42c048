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
* :mod:`~fedhet.protocols.he_link`: the message kinds (``Kind``), ``LayerStats``, receive helpers;
* :mod:`~fedhet.protocols.he_paillier_layer`: "paillier" (packed, batched Paillier, ``slot_bits``-bit
  slots, ``[[A_g]]`` sent in both packings, background obfuscator pools) and "naive" (``phe``, one
  value per ciphertext: the same integers and masks, to show what packing and batching buy);
* :mod:`~fedhet.protocols.he_ckks_layer`: "ckks" (TenSEAL CKKS, no Galois keys; not statistical
  hiding, see there);
* here: :func:`guest_layer` / :func:`host_layer` (pick the scheme's side), :func:`true_weight`,
  :func:`declarations` (the eight message kinds with the payload schemas of one link's settings: the
  scheme's ciphertext layout, ``key_bits / 4``-byte Paillier ciphertexts, at most ``batch_size`` rows,
  masked integers of exactly the byte width of the slots resolved from the public settings).
"""
from __future__ import annotations

import numpy as np

from fedhet.crypto.fixedpoint import dequantize
from fedhet.parties import schema as sch
from fedhet.parties.contract import PartyLike
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
from .he_link import Kind, LayerStats
from .he_paillier_layer import IntegerGuest, IntegerHost

__all__ = [
    "SCHEMES", "Kind", "LayerSpec", "LayerStats", "SlotOverflowError", "slot_budget", "guest_layer", "host_layer",
    "true_weight", "declarations", "paillier_ct", "masked_bytes", "encode_masked", "decode_masked", "quantize",
    "quantize_acts", "quantize_delta", "weight_step", "int_dot", "uniform_ints",
]


def guest_layer(party: PartyLike, host: str, spec: LayerSpec, d: int, width: int) -> IntegerGuest | CKKSGuest:
    """The guest (passive party, key owner) side of one link; call ``setup()`` first."""
    cls = CKKSGuest if spec.scheme == "ckks" else IntegerGuest
    return cls(party, host, spec, d, width)


def host_layer(party: PartyLike, guest: str, spec: LayerSpec, W_init: np.ndarray) -> IntegerHost | CKKSHost:
    """The host (label owner) side of one link, holding the masked copy of ``W_init`` (d x K)."""
    cls = CKKSHost if spec.scheme == "ckks" else IntegerHost
    return cls(party, guest, spec, W_init)


def true_weight(host_side: IntegerHost | CKKSHost, guest_side: IntegerGuest | CKKSGuest) -> np.ndarray:
    """W = W_g + eps as floats (test helper: needs both parties' private state)."""
    if isinstance(host_side, CKKSHost):
        return host_side.W + guest_side.eps
    s = host_side.spec
    W = host_side.W + guest_side.eps
    return dequantize(W, s.w_frac_bits)


# ------------------------------------------------------------------------------------------ declarations
MAX_CIPHERTEXTS = 1 << 20  # bound on the CKKS vectors of one message
_PACKED_META = sch.Fields({"shape": sch.ListOf(sch.Int(lo=0), max_len=8), "frac_bits": sch.Int(lo=0),
                           "bound": sch.Str(max_len=4096), "spec": sch.ListOf(sch.Int(lo=0), length=3),
                           "key_bits": sch.Int(lo=1)})
_NAIVE_META = sch.Fields({"shape": sch.ListOf(sch.Int(lo=0), max_len=8)})
# CKKS: a list of serialised vectors.
CKKS_CT = sch.ListOf(sch.Arr("|u1", (None,)), max_len=MAX_CIPHERTEXTS)


def paillier_ct(scheme: str | None = None, key_bits: int | None = None) -> sch.Fields:
    """Paillier ciphertexts: uint8 (n_ciphertexts, key_bits/4), one fixed-width big-endian ciphertext mod
    n**2 per row, with the metadata of ``scheme`` ("paillier": the packing; "naive": the shape; None: either)."""
    meta = {"paillier": _PACKED_META, "naive": _NAIVE_META}.get(scheme or "", sch.OneOf((_PACKED_META, _NAIVE_META)))
    return sch.Fields({"meta": meta, "ct": sch.Arr("|u1", (None, None if key_bits is None else key_bits // 4))})


# Any settings' forms: Paillier ciphertexts of any key, masked values of any width.
PAILLIER_CT = paillier_ct()
MASKED = sch.OneOf((sch.Arr("|u1", (None, None, None)), sch.Arr("<f8", (None, None))))


def declarations(spec: LayerSpec, d: int, K: int, host: str = "host", guest: str = "guest") -> list[MessageDecl]:
    """The eight message kinds of one link of guest width ``d`` and interactive width ``K`` under ``spec``,
    with their payload schemas: only ``spec.scheme``'s layout; Paillier ciphertexts of ``spec.key_bits``;
    at most ``batch_size`` rows of activations; masked integers of exactly the byte width of the slots
    both sides resolve from these public settings (``LayerSpec.resolve``), masked CKKS floats (rows, K)
    and (K, d)."""
    rows = sch.Int(lo=1, hi=spec.batch_size)
    if spec.scheme == "ckks":
        ct: sch.Spec = CKKS_CT
        key = sch.Arr("|u1", (None,))
        acts = sch.Fields({"rows": rows, "ckks": CKKS_CT})
        fwd_masked, grad_masked = sch.Arr("<f8", (None, K)), sch.Arr("<f8", (K, d))
        ct_text, masked_text = "1-D uint8 serialised CKKS vectors", "float64 {ck}"
    else:
        w = spec.resolve(d, K).masked_bytes
        ct = paillier_ct(spec.scheme, spec.key_bits)
        key = sch.Arr("|u1", (spec.key_bits // 8,))
        acts = (sch.Fields({"rows": rows, "fwd": ct, "grad": ct}, optional=("grad",)) if spec.scheme == "paillier"
                else sch.Fields({"rows": rows, "all": ct}))
        fwd_masked, grad_masked = sch.Arr("|u1", (K, None, w)), sch.Arr("|u1", (K, d, w))
        ct_text = (f"uint8 (n_ciphertexts, {spec.key_bits // 4}), one fixed-width big-endian ciphertext mod n**2 "
                   "per row, plus shape metadata")
        masked_text = (f"uint8 ({{dims}}, {w}) two's complement integers ({w} = (slot_bits + 16) // 8 bytes for "
                       "the slot width both sides resolve from the settings)")
    # The ciphertext kinds are the scheme's ("naive" is Paillier too, one value per ciphertext).
    he = "ckks" if spec.scheme == "ckks" else "paillier"
    ct_what = "; " + ct_text
    masked_what = "; " + masked_text
    return [
        declare(Kind.PUBKEY, guest, host, "guest's public key: Paillier n as uint8 (key_bits/8,), or a TenSEAL "
                "context without the secret key as 1-D uint8",
                payload=sch.Fields({"scheme": sch.Str(max_len=32), "key": key}), protects="control"),
        declare(Kind.ACTS, guest, host, "guest's bottom-model output encrypted under its own key, packed along "
                "the batch and (training) along the features" + ct_what, payload=acts, protects=he),
        declare(Kind.NOISE, guest, host, "guest's accumulated weight noise eps, encrypted under its own key"
                + ct_what, payload=ct, protects=he),
        declare(Kind.FWD_CT, host, guest, "[[A_g W_g + e_B]]: host's product on the guest's ciphertexts plus "
                "the host's mask, rerandomized" + ct_what, payload=ct, protects=he),
        declare(Kind.FWD_MASKED, guest, host, "A_g W + e_B: the layer output still masked by the host's noise"
                + masked_what.format(dims="K, rows", ck="(rows, K)"), payload=fwd_masked,
                # The host removes its own e_B: it learns A_g W, the layer output the protocol declares it learns.
                protects="derived"),
        declare(Kind.GRAD_CT, host, guest, "[[A_g^T delta + e_W]]: weight gradient masked by the host, "
                "rerandomized" + ct_what, payload=ct, protects=he),
        declare(Kind.GRAD_MASKED, guest, host, "G + e_W + nu: weight gradient masked by both parties' noise"
                + masked_what.format(dims="K, d", ck="(K, d)"), payload=grad_masked,
                # The host removes its own e_W: G + nu stays hidden by the guest's mask nu.
                protects="masked"),
        declare(Kind.INGRAD_CT, host, guest, "[[delta (W_g + eps)^T]]: the guest's input gradient, encrypted, "
                "rerandomized" + ct_what, payload=ct, protects=he),
    ]
