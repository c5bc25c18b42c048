"""The HE split network's prediction job (``fedhet predict``): the forward half of the run's encrypted layer.

Vertical (:class:`fedhet.algorithms.predict.Vertical`, with an :class:`~fedhet.algorithms.predict.Exchange`):
the host (label owner) and the guests align their new rows by PSI; each guest runs its bottom model on
its common rows (``A_g``), and per batch of at most ``batch_size`` rows the pair runs exactly the
forward half of :mod:`fedhet.protocols.he_interactive` (the test pass of training): the guest sends
``[[A_g]]`` under a FRESH key (``hei/pubkey``, ``hei/acts``), the host returns ``[[A_g W_g + e_B]]``
(``hei/fwd_ct``), the guest adds ``A_g eps`` and returns ``A_g W + e_B`` (``hei/fwd_masked``).  Each
side uses its own share from its part (``W_g`` at the host, ``eps`` at the guest; nobody holds ``W``);
the host removes its mask and runs its part on its own rows and every guest's ``A_g W``: the class
probabilities stay at the host.  What each side learns is training's test pass, no more: the host
``A_g W`` of the common rows, the guest ``A_g W_g + e_B`` (masked).  No weight gradient, no noise
message: nothing is trained.

Integer schemes ("paillier", "naive") give ``A_g W`` exactly on the grid ``2**-(a_frac_bits +
w_frac_bits)``: :func:`layer_output` computes the same numbers in the clear from both parts (tests and
benchmarks); "ckks" is approximate.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedhet.algorithms.scoring import score
from fedhet.algorithms.predict import Exchange, PartData, Rows, Vertical
from fedhet.crypto.fixedpoint import dequantize
from fedhet.parties.api import PartyError
from fedhet.parties.contract import PartyLike
from fedhet.parties.declare import MessageDecl
from fedhet.protocols import he_interactive as hei

from .data import GUEST, HOST
from .model import share
from .settings import Settings


def _part(data: PartData) -> tuple[Any, Mapping[str, Any], Mapping[str, np.ndarray]]:
    if data.part is None:
        raise PartyError("he_split: no trained part loaded")
    return data.module, data.part.meta, data.part.tensors


def _batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def guest_exchange(party: PartyLike, s: Settings, data: PartData, rows: Rows, host: str) -> None:
    """The guest's side: its bottom model's output, through the layer's forward half, batch by batch."""
    module, meta, tensors = _part(data)
    A = score(module, meta, rows).astype(np.float64)
    layer = hei.guest_layer(party, host, s.layer, s.guest_bottom_width, s.interactive_width)
    layer.eps = share(tensors, "share")
    layer.setup()
    try:
        for b in _batches(len(A), s.batch_size):
            layer.forward(A[b], train=False)
    finally:
        layer.close()


def host_exchange(party: PartyLike, s: Settings, data: PartData, rows: Rows,
                  guests: list[str]) -> dict[str, np.ndarray]:
    """The host's side: per guest (its share ``W_g`` from the part), ``A_g W`` of every common row."""
    _, meta, tensors = _part(data)
    if sorted(guests) != sorted(meta.get("guests") or []):
        raise PartyError(f"he_split: the host's part holds shares for guests {meta.get('guests')}, the federation "
                         f"has {guests}")
    n = len(next(iter(rows.values())))
    out = {}
    for g in guests:
        layer = hei.host_layer(party, g, s.layer, np.zeros((s.guest_bottom_width, s.interactive_width)))
        layer.W = share(tensors, f"share.{g}")
        layer.setup()
        try:
            zs = []
            for b in _batches(n, s.batch_size):
                layer.recv_acts()
                layer.send_forward()
                zs.append(layer.recv_forward())
        finally:
            layer.close()
        out[g] = np.concatenate(zs) if zs else np.zeros((0, s.interactive_width))
    return out


def probabilities(module: Any, meta: Mapping[str, Any], rows: Rows, outputs: dict[str, np.ndarray]) -> np.ndarray:
    """The host's part on its rows and every guest's ``A_g W``: class probabilities."""
    return score(module, meta, {**rows, **{f"z.{g}": z for g, z in outputs.items()}}).astype(np.float64)


def layer_output(s: Settings, A: np.ndarray, host_share: np.ndarray, guest_share: np.ndarray) -> np.ndarray:
    """``A W`` (W = W_g + eps) as the integer schemes compute it: ``A`` rounded to ``a_frac_bits``, the
    product exact, one rounding to float64 (the plaintext reference of the exchange)."""
    spec = s.layer
    W = np.asarray(host_share, dtype=object) + np.asarray(guest_share, dtype=object)
    return dequantize(hei.int_dot(hei.quantize_acts(np.asarray(A, dtype=np.float64), spec), W),
                      spec.a_frac_bits + spec.w_frac_bits)


def declarations(s: Settings) -> list[MessageDecl]:
    return hei.declarations(s.layer, s.guest_bottom_width, s.interactive_width, HOST, GUEST)


LAYOUT = Vertical(label_role=HOST, feature_roles=(GUEST,), combine=probabilities,
                  exchange=Exchange(label=host_exchange, feature=guest_exchange, declarations=declarations))
