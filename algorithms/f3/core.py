"""F³'s first layer on Shamir shares (f3.txt, Eq. (8), Algorithm 1 lines 5-10): the maths, no parties.

Eq. (8), first layer Â H W_0        -> :func:`holder_forward` (one holder, on its shares)
its gradients (backward pass)        -> :func:`holder_backward`
the coordinator's autograd node      -> :class:`SharedFirstLayer` (``rows -> (A -> Â H W_0)``) over any
                                        :class:`HolderSteps`: the federation's ``roles.HolderLink`` or
                                        :class:`InProcessHolders` (every holder in this process)

What runs on shares.  With C_i = P_iᵀ W_0ᵀ (d_i x hidden, public: the coordinator's parameters) the
first layer is U_b = Â_b G_b with G_b[i] = h_b^i C_i (``f3/op`` forward: rows, Â, C_i).  In the backward
pass the coordinator knows δ = dL/dU (it computed everything after U), E = Âᵀδ, and asks for
(``f3/op`` backward)
  * dC_i = Σ_b h_b^iᵀ E_b[i]  (d_i x hidden): gives dP_i = W_0ᵀ dC_iᵀ and dW_0 = (Σ_i P_i dC_i)ᵀ; with
    ``align`` "tied" or "none" only Σ_i dC_i is reconstructed (all the gradient needs);
  * dÂ_b = δ_b G_bᵀ (n x n per sample), only for the learned (ICDF) graph, and only from t holders (the
    others get no δ): Â_b is symmetric, so the gradient of θ depends on dÂ_b only through its symmetric
    part, and each of those holders sends the upper triangle of dÂ_b + dÂ_bᵀ (n(n+1)/2 per sample).
    The per-sample Â_b goes to the holders as its upper triangle too (float32); both halve the bytes
    of the largest messages and the coordinator learns nothing it could not form from U_b and Â_b.
Each is a linear function of the shared h with public coefficients, computed by every asked holder on
its shares (no messages between holders) and reconstructed by the coordinator from any t holders
(``f3/pre/result``, ``f3/grad/result``, ``f3/adj/result``).  Setting ``ask``: by default each step asks
t holders, in turn ("t"); "all" asks all m and checks the extra shares for consistency (detects, without
identifying, a holder that sends a wrong share) at (m - t) / t more holder work.  Public operands are encoded with
``public_frac_bits`` (forward) and ``grad_frac_bits`` (backward; δ is scaled by the batch size
first); every reconstruction carries the error bound the shares propagate (``max_fixed_point_err``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from fedhet.crypto.prg import PRG
from fedhet.protocols import shamir_share as ss

if TYPE_CHECKING:
    from fedhet.algorithms.f3.settings import Settings


class HolderSteps(Protocol):
    """The holders as the coordinator's first layer sees them: one forward and one backward step at a time."""

    step: int
    max_err: float

    def forward(self, rows: np.ndarray, A: np.ndarray, C: list[np.ndarray], keep: bool) -> np.ndarray: ...
    def backward(self, E: np.ndarray, dU: np.ndarray | None, summed: bool) -> tuple: ...
    def stop(self) -> None: ...


class OwnerShares(list):
    """One holder's shares of the owners' representations, in owner order; with ``stacked`` (n, N, d), the same
    shares stacked once, when all owners have the same width (the batched products gather rows from it
    instead of stacking n arrays at every step)."""

    def __init__(self, shares):
        super().__init__(shares)
        same = len(self) >= 2 and len({sh.shape[1] for sh in self}) == 1
        self.stacked = ss.stack(list(self), axis=0) if same else None


def _same_width_rows(shares: list, rows: np.ndarray):
    """Shares of every owner's rows stacked (n, R, d) when all owners have the same width, else None."""
    if isinstance(shares, OwnerShares):
        return None if shares.stacked is None else shares.stacked[:, rows]
    if len({sh.shape[1] for sh in shares}) != 1 or len(shares) < 2:
        return None
    return ss.stack([sh[rows] for sh in shares], axis=0)   # a plain list: only the batch's rows


def holder_forward(shares: list, rows: np.ndarray, A: np.ndarray, C: list, s: Settings) -> tuple:
    """Shares of U = Â (stack_i h^i[rows] C_i) and of G (kept for the backward pass)."""
    H = _same_width_rows(shares, rows)
    if H is not None:   # all owners as one batched product: (C_iᵀ h^i[rows]ᵀ)ᵀ
        Ct = np.stack([np.asarray(c).T for c in C])
        G = ss.batched_lmatmul(Ct, H.transpose(0, 2, 1), frac_bits=s.public_frac_bits).transpose(2, 0, 1)
    else:
        G = ss.stack([ss.matmul(sh[rows], c, frac_bits=s.public_frac_bits) for sh, c in zip(shares, C)], axis=1)
    if A.ndim == 2:
        U = ss.lmatmul(A, G, frac_bits=s.public_frac_bits)
    else:
        U = ss.batched_lmatmul(A, G, frac_bits=s.public_frac_bits)
    return U, G


def holder_backward(shares: list, rows: np.ndarray, G, E: np.ndarray, dU: np.ndarray | None, summed: bool,
                    s: Settings) -> tuple:
    """Shares of dC (Σ_b h_bᵀ E_b[i] per owner, flattened and concatenated, or summed over owners) and of
    dÂ_b + dÂ_bᵀ, upper triangle per sample (:func:`unpack_symmetric` turns it into the symmetric part of dÂ)."""
    H = _same_width_rows(shares, rows)
    if H is not None:   # (n, D, R) @ (n, R, d) -> (n, d, D): every owner's Σ_b h_bᵀ E_b[i] in one call
        allC = ss.batched_lmatmul(np.ascontiguousarray(E.transpose(1, 2, 0)), H,
                                  frac_bits=s.grad_frac_bits).transpose(0, 2, 1)
        parts = [allC[i] for i in range(len(shares))]
        dC = ss.sum_shares(parts).reshape(-1) if summed else allC.reshape(-1)
    else:
        parts = [ss.matmul(sh[rows].T, E[:, i], frac_bits=s.grad_frac_bits) for i, sh in enumerate(shares)]
        dC = ss.sum_shares(parts).reshape(-1) if summed else ss.concatenate([p.reshape(-1) for p in parts])
    dA = None
    if dU is not None:
        full = ss.batched_lmatmul(dU, G.transpose(0, 2, 1), frac_bits=s.grad_frac_bits)
        iu = np.triu_indices(full.shape[-1])
        dA = ss.add(full[:, iu[0], iu[1]], full[:, iu[1], iu[0]])   # upper triangle of full + fullᵀ
    return dC, dA


def pack_symmetric(a: np.ndarray) -> np.ndarray:
    """(..., n, n) -> (..., n(n+1)/2): the upper triangle, row by row."""
    iu = np.triu_indices(a.shape[-1])
    return np.ascontiguousarray(a[..., iu[0], iu[1]])


def unpack_symmetric(packed: np.ndarray, n: int) -> np.ndarray:
    """(..., n(n+1)/2) -> the symmetric (..., n, n) with that upper triangle."""
    iu = np.triu_indices(n)
    out = np.empty(packed.shape[:-1] + (n, n), dtype=packed.dtype)
    out[..., iu[0], iu[1]] = packed
    out[..., iu[1], iu[0]] = packed
    return out


class InProcessHolders:
    """:class:`HolderLink`'s arithmetic without parties: shares made here, every holder's step run on its own
    shares, any t reconstructed.  For tests and the leakage benchmark (same functions as the federation)."""

    def __init__(self, reps: list[np.ndarray], s: Settings, m: int = 3, seed: int = 0):
        self.s, self.m = s, m
        prg = PRG(seed.to_bytes(32, "little"))
        made = [ss.share_array(h, m, s.t, frac_bits=s.frac_bits, max_abs=1.0, prg=prg) for h in reps]
        self.shares = [OwnerShares([made[i][j] for i in range(len(reps))]) for j in range(m)]   # holder j -> owners
        self.step, self.max_err, self.wait_s = 0, 0.0, 0.0
        self._g: list = []
        self._rows = np.zeros(0, dtype=np.int64)

    def _open(self, parts) -> np.ndarray:
        self.max_err = max(self.max_err, float(parts[0].err))
        return ss.reconstruct_shares(parts[:self.s.t])

    def forward(self, rows, A, C, keep):
        self.step += 1
        self._rows = np.asarray(rows, dtype=np.int64)
        outs = [holder_forward(sh, self._rows, np.asarray(A, dtype=np.float64), C, self.s) for sh in self.shares]
        self._g = [g for _, g in outs] if keep else []
        return self._open([u for u, _ in outs])

    def backward(self, E, dU, summed):
        outs = [holder_backward(sh, self._rows, g, E, dU if j < self.s.t else None, summed, self.s)
                for j, (sh, g) in enumerate(zip(self.shares, self._g or [None] * self.m))]
        dC = self._open([c for c, _ in outs])
        if dU is None:
            return dC, None
        return dC, unpack_symmetric(self._open([a for _, a in outs]), E.shape[1]) * 0.5

    def stop(self):
        pass


def first_layer_grads(layer, dC: np.ndarray, W, Ps, summed: bool) -> tuple:
    """(dW_0, [dP_i]) from dC (every owner's Σ_b h_bᵀ E_b[i], flattened and concatenated, or their sum):
    with C_i = P_iᵀ Wᵀ (W = W_0.weight, hidden x d),  dP_i = Wᵀ dC_iᵀ  and  dW = (Σ_i P_i dC_i)ᵀ."""
    hidden = W.shape[0]
    dev, dt = W.device, W.dtype
    if summed:
        dCs = [torch.as_tensor(dC, dtype=dt, device=dev).reshape(-1, hidden)]
    else:
        cuts = np.cumsum([0] + [w * hidden for w in layer.widths])
        dCs = [torch.as_tensor(dC[a:b], dtype=dt, device=dev).reshape(-1, hidden)
               for a, b in zip(cuts[:-1], cuts[1:])]
    if layer.align == "none":
        return dCs[0].T, []
    if layer.align == "tied":
        return (Ps[0] @ dCs[0]).T, [W.T @ dCs[0].T]
    return sum(P @ c for P, c in zip(Ps, dCs)).T, [W.T @ c.T for c in dCs]


class _OnShares(torch.autograd.Function):
    """U = Â H W_0 from the holders; its backward asks them for dC (-> dW_0, dP_i) and dÂ (module docstring)."""

    @staticmethod
    def forward(ctx, layer, rows, A, W, *Ps):
        C = layer.publics(W, Ps)
        # a per-sample Â travels as its upper triangle (HolderLink.forward); normalise_adj makes Â exactly
        # symmetric (models.normalise_adj), so the holders' mirrored Â is the coordinator's
        A32 = A.detach().float().cpu().numpy()
        U = layer.link.forward(rows, A32, [c.detach().double().cpu().numpy() for c in C],
                               keep=bool(A.requires_grad))
        ctx.layer = layer
        ctx.save_for_backward(A, W, *Ps)
        return torch.as_tensor(U, dtype=W.dtype, device=W.device)

    @staticmethod
    def backward(ctx, dU):
        layer = ctx.layer
        A, W, *Ps = ctx.saved_tensors
        B = dU.shape[0]
        E = (A.transpose(-1, -2).float() @ dU.float())
        need_A = ctx.needs_input_grad[2]
        summed = layer.align in ("none", "tied")
        scale = float(B)        # δ of a batch-mean loss is O(1/B): scaled so its fixed point keeps precision
        dC, dA = layer.link.backward((E * scale).double().cpu().numpy(),
                                     (dU * scale).double().cpu().numpy() if need_A else None, summed)
        dW, dPs = first_layer_grads(layer, dC / scale, W, Ps, summed)
        gA = None
        if need_A:
            gA = torch.as_tensor(dA / scale, dtype=A.dtype, device=A.device)
        return (None, None, gA, dW, *dPs)


class LayerOnShares:
    """What the coordinator's layers computed on shares have alike: the model, the owners' widths, the public
    C_i = P_iᵀ W_0ᵀ (:class:`SharedFirstLayer`, :class:`fedhet.algorithms.f3.mpc.SharedLogits`)."""

    def __init__(self, model, widths: list[int]):
        self.model, self.widths = model, widths
        self.align, self.n = model.align, model.n

    def alignments(self) -> list:
        """The P_i the first layer uses: none, the one tied P, or every owner's."""
        model = self.model
        return [] if self.align == "none" else ([model.P] if self.align == "tied" else model.alignments())

    def publics(self, W, Ps):
        if self.align == "none":
            return [W.T] * self.n
        if self.align == "tied":
            return [Ps[0].T @ W.T] * self.n
        return [P.T @ W.T for P in Ps]


class SharedFirstLayer(LayerOnShares):
    """``rows -> (A -> Â H W_0)`` computed by the share holders (:func:`fedhet.algorithms.f3.training.train_global`)."""

    def __init__(self, model, link: HolderSteps, widths: list[int]):
        super().__init__(model, widths)
        self.link = link

    def __call__(self, rows: np.ndarray):
        def first(A):
            return _OnShares.apply(self, np.asarray(rows), A, self.model.W0.weight, *self.alignments())
        return first
