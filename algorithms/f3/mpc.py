"""F³ with ``fusion = "mpc"`` (f3.txt, eq. (8)): the first layer, ReLU and the pooling on shares; the coordinator
receives only pooled vectors and batch-summed gradients.

The owners' representations are 2-of-3 replicated shares over Z_2^64 held by exactly three holders
(:mod:`fedhet.protocols.replicated`), fixed point with ``H_BITS`` fractional bits (|h| < 1: an LSTM state).
Public operands (Â, C_i = P_iᵀW_0ᵀ, a = (1/n) Âᵀ1, the backward's dL/dZ) are encoded by the holders from what
the coordinator sends.  Per sample b (n owners, ``hidden`` units):

  eq. (8) first layer  G_b[i] = h_b^i C_i,  U_b = Â G_b                -> :func:`forward` (local, public x shared)
  ReLU                 Z_b = ReLU(U_b), s_b = [U_b >= 0]                 -> replicated.relu (11 rounds, exact)
  pooling              p_b = (1/n) 1ᵀ Â Z_b = a Z_b  (hidden,)           -> local; OPENED to the coordinator
  head                 softmax(W_1 p_b), the loss, g_b = dL/dp_b         -> the coordinator (W_1 is its own)
  backward             δ_b = (a ⊗ g_b) ⊙ s_b,  E_b = Âᵀ δ_b              -> :func:`backward` (g shared by the
                                                                          coordinator: one product)
                       dC_i = Σ_b h_b^iᵀ E_b[i]  (d_i x hidden)          -> one product per output element,
                                                                          reshared once, OPENED (summed over the
                                                                          batch; over owners too with align
                                                                          "tied" / "none")
                       dP_i = W_0ᵀ dC_iᵀ, dW_0 = (Σ_i P_i dC_i)ᵀ          -> the coordinator
                       (:func:`fedhet.algorithms.f3.core.first_layer_grads`)

What the coordinator receives, and nothing else (the declared kinds ``f3/mpc/pooled`` and ``f3/mpc/grad``; the audit
checks them): p_b, a vector pooled over all owners after the non-linearity, for every sample of every training,
validation and test step; dC, summed over the batch.  The holders receive the public operands and uniform words;
any one of them learns nothing of h.  The learned ICDF graph is not offered: its gradient needs the per-sample
dÂ_b weighted by per-sample public coefficients on shares, whose fixed point does not fit 64 bits without a
truncation per sample and owner pair (n² per sample); graph "given" and "none" have a public Â.

Fixed point (no truncation needed: one multiplicative layer).  U has H_BITS + C_BITS + A_BITS = 40 fractional
bits, p has 52 and dC has DC_BASE = 36 plus g's bits (:func:`grad_bits`, at most 12, fewer when the bound needs
room); :func:`check_room` bounds |U| and |p| from the public operands (|h| < 1) and refuses a step whose values
could leave the ring (a model whose weights grew that far).
"""
from __future__ import annotations

import time
from typing import Protocol

import numpy as np
import torch

from fedhet.algorithms.f3.core import LayerOnShares, first_layer_grads
from fedhet.protocols import replicated as rs

H_BITS, C_BITS, A_BITS, NA_BITS, G_BITS_MAX = 14, 14, 12, 10, 12
U_BITS = H_BITS + C_BITS + A_BITS        # 40
P_BITS = U_BITS + A_BITS                 # 52: the opened pooled vectors
DC_BASE = H_BITS + NA_BITS + A_BITS      # 36: the opened gradients have DC_BASE + g's bits (grad_bits)
ROOM = 2.0 ** 62


class MpcShares(list):
    """One holder's pairs of the owners' h (owner order), with ``stacked`` (n, N, d) when all widths agree."""

    def __init__(self, pairs):
        super().__init__(pairs)
        same = len(self) >= 2 and len({p.shape[1] for p in self}) == 1
        self.stacked = rs.Rss(np.stack([p.a for p in self]), np.stack([p.b for p in self])) if same else None

    def rows(self, rows: np.ndarray):
        """(n, B, d) pairs of the batch rows, or a list of (B, d_i) pairs."""
        if self.stacked is not None:
            return self.stacked[:, rows]
        return [p[rows] for p in self]


def _tt(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def pooling_weights(A: np.ndarray) -> np.ndarray:
    """a = (1/n) Âᵀ 1: the pooling of eq. (8) as weights over the owners (GlobalGCN.fuse's ``A.mean(-2)``)."""
    return np.asarray(A, dtype=np.float64).mean(-2)


def check_room(A: np.ndarray, C: list[np.ndarray]) -> None:
    """Refuse operands whose results could overflow the ring: |U| <= max_i Σ_j |Â_ij| · max_j Σ_k |C_j[k, .]|
    (|h| < 1) and |p| <= Σ_k |a_k| |U|max."""
    A = np.asarray(A, dtype=np.float64)
    colsum = max(float(np.abs(c).sum(0).max()) for c in C) + 1.0
    u = float(np.abs(A).sum(-1).max()) * colsum
    pmax = float(np.abs(pooling_weights(A)).sum()) * u
    if pmax * 2.0 ** P_BITS >= ROOM:
        raise ValueError(f"f3 mpc: the pooled vectors could reach {pmax:.3g}, beyond the 2^{62 - P_BITS} the "
                         f"fixed point of {P_BITS} fractional bits leaves (the first layer's weights grew too large)")


def grad_bits(A: np.ndarray, g: np.ndarray, summed: bool) -> int:
    """The fractional bits of the shared g (at most G_BITS_MAX): as many as leave n dC below 2^62, where
    |E_b[i]| <= Σ_k |Â_ki| |n a_k| max|g| and |n dC_i| <= B max|E| (|h| < 1), times n summed over the owners."""
    A = np.asarray(A, dtype=np.float64)
    na = np.abs(pooling_weights(A)) * A.shape[-1]
    e = float((np.abs(A) * na[:, None]).sum(0).max()) * max(float(np.abs(g).max()), 2.0 ** -G_BITS_MAX)
    dmax = e * g.shape[0] * (A.shape[-1] if summed else 1)
    bits = min(G_BITS_MAX, int(np.floor(np.log2(ROOM / dmax))) - DC_BASE - 1)
    if bits < 4:
        raise ValueError(f"f3 mpc: the summed gradients could reach {dmax:.3g}: too large for the 64-bit fixed point")
    return bits


def _first(shares: MpcShares, rows: np.ndarray, C: list[np.ndarray]) -> rs.Rss:
    """G_b[i] = h_b^i C_i for the batch, (B, n, hidden)."""
    Ce = [rs.encode(c, C_BITS, "C_i") for c in C]
    X = shares.rows(rows)
    colsum = max(float(np.abs(c).sum(0).max()) for c in Ce)
    if isinstance(X, rs.Rss):
        G = rs.lin_public(X, np.stack(Ce), lambda m, t: torch.bmm(t, m), colsum)    # (n, B, hidden)
        return rs.Rss(np.ascontiguousarray(G.a.transpose(1, 0, 2)), np.ascontiguousarray(G.b.transpose(1, 0, 2)))
    parts = [rs.lin_public(x, c, lambda m, t: t @ m, colsum) for x, c in zip(X, Ce)]
    return rs.Rss(np.stack([p.a for p in parts], 1), np.stack([p.b for p in parts], 1))


def forward(h: rs.Holder, shares: MpcShares, rows: np.ndarray, A: np.ndarray, C: list[np.ndarray]) -> tuple:
    """One holder's forward step: its pair of the pooled p (B, hidden; P_BITS) and what the backward keeps."""
    Ae = rs.encode(A, A_BITS, "Â")
    ae = _tt(rs.encode(pooling_weights(A), A_BITS, "a"))
    G = _first(shares, rows, C)
    U = rs.lin_public(G, Ae, torch.matmul, float(np.abs(Ae).sum(1).max()))
    Z, pos = rs.relu(h, U)
    p = rs.lin(Z, lambda t: torch.matmul(ae, t))
    return p, {"rows": rows, "pos": pos}


def backward(h: rs.Holder, shares: MpcShares, kept: dict, g: rs.Rss, A: np.ndarray, summed: bool) -> rs.Rss:
    """One holder's backward step from its pair of g = dL/dp (B, hidden, scaled by the batch; shared by the
    coordinator, so that the holders do not see its per-sample gradients): its pair of n dC (scaled by the
    number of owners n, :func:`decode_grad`), every owner's Σ_b h_bᵀ E_b[i] flattened and concatenated (or summed
    over the owners).  δ = (n a ⊗ g) ⊙ [U >= 0] is one product (one round)."""
    # n a = Âᵀ1 is O(1): dL/dZ scaled by n keeps its bits of precision at any number of owners
    na = rs.encode(pooling_weights(A) * A.shape[-1], NA_BITS, "n a").view(np.uint64)[None, :, None]
    dz = rs.Rss(g.a[:, None, :] * na, g.b[:, None, :] * na)       # (B, n, hidden): public x shared, local
    delta = rs.mul(h, dz, kept["pos"])
    AeT = np.ascontiguousarray(rs.encode(A, A_BITS, "Â").T)
    E = rs.lin_public(delta, AeT, torch.matmul, float(np.abs(AeT).sum(1).max()))   # (B, n, hidden)
    X = shares.rows(kept["rows"])
    Et = rs.Rss(np.ascontiguousarray(E.a.transpose(1, 0, 2)), np.ascontiguousarray(E.b.transpose(1, 0, 2)))
    if isinstance(X, rs.Rss):
        t = rs.cross(X, Et, lambda x, e: torch.bmm(x.transpose(1, 2), e))       # (n, d, hidden)
        t = np.asarray(t.sum(0, dtype=np.uint64) if summed else t.reshape(-1))
    else:
        terms = [rs.cross(x, Et[i], lambda x_, e: x_.T @ e) for i, x in enumerate(X)]
        t = np.asarray(np.sum(terms, axis=0, dtype=np.uint64) if summed
                       else np.concatenate([v.reshape(-1) for v in terms]))
    return h.reshare(np.ascontiguousarray(t).reshape(-1))


def decode_grad(words: np.ndarray, n: int, g_bits: int) -> np.ndarray:
    """dC (scaled by the batch only) from the opened words of :func:`backward` (g shared with ``g_bits``)."""
    return rs.decode(words, DC_BASE + g_bits) / n


def share_g(g: np.ndarray, bits: int) -> list[tuple]:
    """The coordinator's 2-of-3 sharing of g for the holders (:func:`fedhet.protocols.replicated.share`)."""
    return rs.share(rs.encode(g, bits, "dL/dp").view(np.uint64))


class MpcSteps(Protocol):
    """The holders as the coordinator's pooled layer sees them."""

    step: int

    def forward(self, rows: np.ndarray, A: np.ndarray, C: list[np.ndarray], keep: bool) -> np.ndarray: ...
    def backward(self, g: np.ndarray, summed: bool) -> np.ndarray: ...
    def stop(self) -> None: ...


class InProcessMpc:
    """The three holders in this process (threads; the same functions as the federation's holders), for tests
    and the leakage benchmark: ``seen`` records what the coordinator received, step by step, when asked."""

    def __init__(self, reps: list[np.ndarray], record: bool = False):
        holders = rs.in_process_holders()
        parts = [rs.share(rs.encode(r, H_BITS, "h").view(np.uint64)) for r in reps]
        self.shares = [MpcShares([rs.Rss(rs.expand(p[i][0], r.shape), rs.expand(p[i][1], r.shape))
                                  for p, r in zip(parts, reps)]) for i in range(3)]
        self.holders = holders
        self.step, self.wait_s, self.max_err = 0, 0.0, 0.0
        self.record = record
        self.seen: list[dict] = []
        self._kept: list = [None] * 3
        self._A = None

    def forward(self, rows, A, C, keep):
        self.step += 1
        t0 = time.perf_counter()
        A = np.asarray(A, dtype=np.float64)
        check_room(A, C)
        outs = rs.in_process(lambda h: forward(h, self.shares[h.i], np.asarray(rows), A, C), self.holders)
        self._kept = [k for _, k in outs]
        self._A = A
        p = rs.decode(rs.open_pairs([(o.a, o.b) for o, _ in outs]), P_BITS)
        if self.record:
            self.seen.append({"kind": "pooled", "rows": np.asarray(rows).copy(), "A": A, "C": [np.array(c) for c in C],
                              "p": p.copy(), "train": bool(keep)})
        self.wait_s += time.perf_counter() - t0
        return p

    def backward(self, g, summed):
        t0 = time.perf_counter()
        g = np.asarray(g, dtype=np.float64)
        bits = grad_bits(self._A, g, summed)
        parts = share_g(g, bits)
        outs = rs.in_process(lambda h: backward(h, self.shares[h.i], self._kept[h.i],
                                                rs.Rss(rs.expand(parts[h.i][0], g.shape), rs.expand(parts[h.i][1], g.shape)),
                                                self._A, summed), self.holders)
        dC = decode_grad(rs.open_pairs([(o.a, o.b) for o in outs]), self._A.shape[-1], bits)
        if self.record:
            self.seen.append({"kind": "grad", "g": np.array(g), "dC": dC.copy(), "summed": summed})
        self.wait_s += time.perf_counter() - t0
        return dC

    def stop(self):
        pass


class _PooledOnShares(torch.autograd.Function):
    """p = (1/n) 1ᵀ Â ReLU(Â H W_0) from the holders; its backward asks them for dC (-> dW_0, dP_i)."""

    @staticmethod
    def forward(ctx, layer, rows, keep, A, W, *Ps):
        C = layer.publics(W, Ps)
        p = layer.link.forward(rows, A.detach().double().cpu().numpy(), [c.detach().double().cpu().numpy() for c in C],
                               keep=keep)
        ctx.layer = layer
        ctx.save_for_backward(W, *Ps)
        return torch.as_tensor(p, dtype=W.dtype, device=W.device)

    @staticmethod
    def backward(ctx, dp):
        layer = ctx.layer
        W, *Ps = ctx.saved_tensors
        scale = float(dp.shape[0])   # g of a batch-mean loss is O(1/B): scaled so its fixed point keeps precision
        summed = layer.align in ("none", "tied")
        dC = layer.link.backward((dp * scale).double().cpu().numpy(), summed)
        dW, dPs = first_layer_grads(layer, dC / scale, W, Ps, summed)
        return (None, None, None, None, dW, *dPs)


class SharedPooled(LayerOnShares):
    """``rows -> (A -> (1/n) 1ᵀ Â ReLU(Â H W_0))`` computed by the three holders (marked ``pooled`` for
    :meth:`~fedhet.algorithms.f3.models.GlobalGCN.fuse`)."""

    def __init__(self, model, link: MpcSteps, widths: list[int]):
        super().__init__(model, widths)
        self.link = link

    def __call__(self, rows: np.ndarray):
        def pooled(A):
            if A.requires_grad:
                raise ValueError("f3 mpc: the graph must be public and fixed (graph 'given' or 'none')")
            W = self.model.W0.weight
            keep = torch.is_grad_enabled() and W.requires_grad
            return _PooledOnShares.apply(self, np.asarray(rows), keep, A, W, *self.alignments())
        pooled.pooled = True   # type: ignore[attr-defined]
        return pooled
