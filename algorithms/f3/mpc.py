"""F³ with ``fusion = "mpc"`` (f3.txt, Eq. (8)): the first layer, ReLU, the pooling and W_1 on shares; the
coordinator receives only each sample's logits and batch-summed gradients.

The owners' representations are 2-of-3 replicated shares over Z_2^64 held by exactly three holders
(:mod:`fedhet.protocols.replicated`), fixed point with ``H_BITS`` fractional bits (|h| < 1: an LSTM state).
Public operands (Â, C_i = P_iᵀW_0ᵀ, a = (1/n) Âᵀ1, W_1) are encoded by the holders from what the coordinator
sends.  Per sample b (n owners, ``hidden`` units):

  Eq. (8) first layer  G_b[i] = h_b^i C_i,  U_b = Â G_b                -> :func:`forward` (local, public x shared)
  ReLU                 Z_b = ReLU(U_b), s_b = [U_b >= 0]                 -> replicated.relu (11 rounds, exact)
  pooling              p_b = (1/n) 1ᵀ Â Z_b = a Z_b  (hidden,)           -> local, then truncated (10 rounds)
  logits               ℓ_b = W_1 p_b  (classes,)                         -> local; OPENED to the coordinator
  softmax and loss     dℓ_b = dL/dℓ_b                                   -> the coordinator; dℓ goes back SHARED
  backward             g_b = W_1ᵀ dℓ_b, δ_b = (a ⊗ g_b) ⊙ s_b,           -> :func:`backward` (one product, one
                       E_b = Âᵀ δ_b                                        truncation)
                       dC_i = Σ_b h_b^iᵀ E_b[i]  (d_i x hidden),          -> one product per output element,
                       dW_1 = Σ_b dℓ_b p_bᵀ                                reshared once, OPENED (summed over the
                                                                          batch; dC over the owners too with
                                                                          align "tied" / "none")
                       dP_i = W_0ᵀ dC_iᵀ, dW_0 = (Σ_i P_i dC_i)ᵀ          -> the coordinator
                       (:func:`fedhet.algorithms.f3.core.first_layer_grads`)

What the coordinator receives, and nothing else (the declared kinds ``f3/mpc/logits`` and ``f3/mpc/grad``; the
audit checks them): ℓ_b, a function of all owners' h after the non-linearity (classes numbers per sample), for
every sample of every training, validation and test step; dC and dW_1, summed over the batch.  The holders
receive the public operands and uniform words (shares, reshared products, masked rounds, the shared dℓ); any one
of them learns nothing of h nor of the coordinator's per-sample gradients.  The learned ICDF graph is not
offered: its gradient needs the per-sample dÂ_b weighted by per-sample public coefficients of magnitude about
1/degree on shares, whose fixed point does not fit 64 bits without truncating B n hidden products per step;
graph "given" and "none" have a public Â.

Fixed point.  U has H_BITS + C_BITS + A_BITS = 40 fractional bits and p 52, truncated to PT_BITS = 24 before
W_1 (LOGIT_BITS = 38); dℓ has :func:`grad_bits` (at most 16, fewer when the bound needs room), dC DC_BASE = 36
more and dW_1 PT_BITS more; g = W_1ᵀ dℓ is truncated back to dℓ's bits.  :func:`check_room` bounds |U|, |p| and
the logits from the public operands (|h| < 1) and refuses a step whose values could leave the ring (a model
whose weights grew that far).
"""
from __future__ import annotations

import time
from typing import Protocol

import numpy as np
import torch

from fedhet.algorithms.f3.core import LayerOnShares, first_layer_grads
from fedhet.algorithms.f3.messages import Kind
from fedhet.algorithms.f3.settings import Settings
from fedhet.parties.api import PeerFault
from fedhet.parties.contract import PartyLike
from fedhet.protocols import replicated as rs
from fedhet.protocols import replicated_share as rsh
from fedhet.protocols import shamir_share as ss

H_BITS, C_BITS, A_BITS, NA_BITS, W1_BITS, G_BITS_MAX = 14, 14, 12, 10, 14, 16
U_BITS = H_BITS + C_BITS + A_BITS        # 40
P_BITS = U_BITS + A_BITS                 # 52: the pooled vectors, then truncated (on shares) to
PT_BITS = 24
LOGIT_BITS = PT_BITS + W1_BITS           # 38: the opened logits
DC_BASE = H_BITS + NA_BITS + A_BITS      # 36: dC has DC_BASE + dℓ's bits (grad_bits), dW_1 PT_BITS + dℓ's bits
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
    """a = (1/n) Âᵀ 1: the pooling of Eq. (8) as weights over the owners (GlobalGCN.fuse's ``A.mean(-2)``)."""
    return np.asarray(A, dtype=np.float64).mean(-2)


def check_room(A: np.ndarray, C: list[np.ndarray], W1: np.ndarray) -> None:
    """Refuse operands whose results could overflow the ring: |U| <= max_i Σ_j |Â_ij| · max_j Σ_k |C_j[k, .]|
    (|h| < 1), |p| <= Σ_k |a_k| |U|max and |logits| <= max_c Σ_k |W_1[c, k]| |p|max."""
    A = np.asarray(A, dtype=np.float64)
    colsum = max(float(np.abs(c).sum(0).max()) for c in C) + 1.0
    u = float(np.abs(A).sum(-1).max()) * colsum
    pmax = float(np.abs(pooling_weights(A)).sum()) * u
    if pmax * 2.0 ** P_BITS >= ROOM:
        raise ValueError(f"f3 mpc: the pooled vectors could reach {pmax:.3g}, beyond the 2^{62 - P_BITS} the "
                         f"fixed point of {P_BITS} fractional bits leaves (the first layer's weights grew too large)")
    lmax = float(np.abs(W1).sum(1).max()) * pmax
    if lmax * 2.0 ** LOGIT_BITS >= ROOM:
        raise ValueError(f"f3 mpc: the logits could reach {lmax:.3g}, beyond the fixed point's 2^{62 - LOGIT_BITS}")


def grad_bits(A: np.ndarray, g: np.ndarray, summed: bool) -> int:
    """The fractional bits of the shared dℓ (at most G_BITS_MAX), from g = dℓ W_1 = dL/dp: as many as leave n dC
    below 2^62, where
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


def forward(h: rs.Holder, shares: MpcShares, rows: np.ndarray, A: np.ndarray, C: list[np.ndarray],
            W1: np.ndarray) -> tuple:
    """One holder's forward step: its pair of the logits W_1 p (B, classes; LOGIT_BITS) and what the backward keeps
    (the ReLU bits, and p truncated to PT_BITS for dW_1)."""
    Ae = rs.encode(A, A_BITS, "Â")
    ae = _tt(rs.encode(pooling_weights(A), A_BITS, "a"))
    G = _first(shares, rows, C)
    U = rs.lin_public(G, Ae, torch.matmul, float(np.abs(Ae).sum(1).max()))
    Z, pos = rs.relu(h, U)
    p = rs.trunc(h, rs.lin(Z, lambda t: torch.matmul(ae, t)), P_BITS - PT_BITS)     # (B, hidden), PT_BITS
    W1t = _tt(np.ascontiguousarray(rs.encode(W1, W1_BITS, "W_1").T))
    return rs.lin(p, lambda t: t @ W1t), {"rows": rows, "pos": pos, "p": p}


def backward(h: rs.Holder, shares: MpcShares, kept: dict, dl: rs.Rss, W1: np.ndarray, A: np.ndarray,
             summed: bool) -> rs.Rss:
    """One holder's backward step from its pair of dℓ = dL/d logits (B, classes, scaled by the batch; shared by
    the coordinator, so that the holders see none of its per-sample values): its pair of [n dC, dW_1] flattened.
    g = W_1ᵀ dℓ (truncated back to dℓ's bits), δ = (n a ⊗ g) ⊙ [U >= 0] (one product), E = Âᵀ δ, and every
    owner's Σ_b h_bᵀ E_b[i] (or their sum over the owners) and Σ_b dℓ_b p_bᵀ, reshared together (one round)."""
    W1e = _tt(rs.encode(W1, W1_BITS, "W_1"))
    g = rs.trunc(h, rs.lin(dl, lambda t: t @ W1e), W1_BITS)                           # (B, hidden), dℓ's bits
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
    w1 = rs.cross(dl, kept["p"], lambda x, y: x.T @ y)             # (classes, hidden)
    return h.reshare(np.concatenate([t.reshape(-1), w1.reshape(-1)]))


def decode_grads(words: np.ndarray, n: int, bits: int, w1_shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(dC, dW_1), scaled by the batch only, from the opened words of :func:`backward` (dℓ shared with ``bits``)."""
    k = int(np.prod(w1_shape))
    return (rs.decode(words[:-k], DC_BASE + bits) / n, rs.decode(words[-k:], PT_BITS + bits).reshape(w1_shape))


def share_dl(dl: np.ndarray, bits: int) -> list[tuple]:
    """The coordinator's 2-of-3 sharing of dℓ for the holders (:func:`fedhet.protocols.replicated.share`)."""
    return rs.share(rs.encode(dl, bits, "dL/dlogits").view(np.uint64))


class MpcSteps(Protocol):
    """The holders as the coordinator's layer on shares sees them."""

    step: int

    def forward(self, rows: np.ndarray, A: np.ndarray, C: list[np.ndarray], W1: np.ndarray, keep: bool) -> np.ndarray: ...
    def backward(self, dl: np.ndarray, summed: bool) -> tuple[np.ndarray, np.ndarray]: ...
    def stop(self) -> None: ...


class InProcessMpc:
    """The three holders in this process (threads; the same functions as the federation's holders), for tests
    and the leakage benchmark: ``seen`` records what the coordinator sent and received, step by step, when
    asked: {"kind": "logits", "rows", "A", "C", "W1", "logits", "train"} per forward step and
    {"kind": "grad", "dl", "dC", "dW1", "summed"} per backward step."""

    def __init__(self, reps: list[np.ndarray], record: bool = False):
        holders = rs.in_process_holders()
        parts = [rs.share(rs.encode(r, H_BITS, "h").view(np.uint64)) for r in reps]
        self.shares = [MpcShares([rs.Rss(rs.expand(p[i][0], r.shape), rs.expand(p[i][1], r.shape))
                                  for p, r in zip(parts, reps)]) for i in range(3)]
        self.holders = holders
        self.step, self.wait_s = 0, 0.0
        self.record = record
        self.seen: list[dict] = []
        self._kept: list = [None] * 3
        self._A: np.ndarray = np.zeros((0, 0))
        self._W1: np.ndarray = np.zeros((0, 0))

    def forward(self, rows, A, C, W1, keep):
        self.step += 1
        t0 = time.perf_counter()
        A, W1 = np.asarray(A, dtype=np.float64), np.asarray(W1, dtype=np.float64)
        check_room(A, C, W1)
        outs = rs.in_process(lambda h: forward(h, self.shares[h.i], np.asarray(rows), A, C, W1), self.holders)
        self._kept, self._A, self._W1 = [k for _, k in outs], A, W1
        logits = rs.decode(rs.open_pairs([(o.a, o.b) for o, _ in outs]), LOGIT_BITS)
        if self.record:
            self.seen.append({"kind": "logits", "rows": np.asarray(rows).copy(), "A": A, "C": [np.array(c) for c in C],
                              "W1": W1.copy(), "logits": logits.copy(), "train": bool(keep)})
        self.wait_s += time.perf_counter() - t0
        return logits

    def backward(self, dl, summed):
        t0 = time.perf_counter()
        dl = np.asarray(dl, dtype=np.float64)
        bits = grad_bits(self._A, dl @ self._W1, summed)
        parts = share_dl(dl, bits)
        outs = rs.in_process(lambda h: backward(h, self.shares[h.i], self._kept[h.i],
                                                rs.Rss(rs.expand(parts[h.i][0], dl.shape), rs.expand(parts[h.i][1], dl.shape)),
                                                self._W1, self._A, summed), self.holders)
        dC, dW1 = decode_grads(rs.open_pairs([(o.a, o.b) for o in outs]), self._A.shape[-1], bits, self._W1.shape)
        if self.record:
            self.seen.append({"kind": "grad", "dl": dl.copy(), "dC": dC.copy(), "dW1": dW1.copy(), "summed": summed})
        self.wait_s += time.perf_counter() - t0
        return dC, dW1

    def stop(self):
        pass


class _LogitsOnShares(torch.autograd.Function):
    """W_1 (1/n) 1ᵀ Â ReLU(Â H W_0) from the holders; its backward asks them for dC (-> dW_0, dP_i) and dW_1."""

    @staticmethod
    def forward(ctx, layer, rows, keep, A, W, W1, *Ps):
        C = layer.publics(W, Ps)
        out = layer.link.forward(rows, A.detach().double().cpu().numpy(),
                                 [c.detach().double().cpu().numpy() for c in C], W1.detach().double().cpu().numpy(),
                                 keep=keep)
        ctx.layer = layer
        ctx.save_for_backward(W, *Ps)
        return torch.as_tensor(out, dtype=W.dtype, device=W.device)

    @staticmethod
    def backward(ctx, dlogits):
        layer = ctx.layer
        W, *Ps = ctx.saved_tensors
        scale = float(dlogits.shape[0])   # dℓ of a batch-mean loss is O(1/B): scaled so its fixed point keeps precision
        summed = layer.align in ("none", "tied")
        dC, dW1 = layer.link.backward((dlogits * scale).double().cpu().numpy(), summed)
        dW, dPs = first_layer_grads(layer, dC / scale, W, Ps, summed)
        return (None, None, None, None, dW, torch.as_tensor(dW1 / scale, dtype=W.dtype, device=W.device), *dPs)


class SharedLogits(LayerOnShares):
    """``rows -> (A -> W_1 (1/n) 1ᵀ Â ReLU(Â H W_0))`` computed by the three holders (marked ``logits`` for
    :meth:`~fedhet.algorithms.f3.models.GlobalGCN.logits`)."""

    def __init__(self, model, link: MpcSteps, widths: list[int]):
        super().__init__(model, widths)
        self.link = link

    def __call__(self, rows: np.ndarray):
        def logits(A):
            if A.requires_grad:
                raise ValueError("f3 mpc: the graph must be public and fixed (graph 'given' or 'none')")
            W = self.model.W0.weight
            keep = torch.is_grad_enabled() and W.requires_grad
            return _LogitsOnShares.apply(self, np.asarray(rows), keep, A, W, self.model.W1.weight, *self.alignments())
        logits.logits = True   # type: ignore[attr-defined]
        return logits


def receive_holder_shares(party: PartyLike, s: Settings, order: list[str], total: int, widths: list[int]) -> list:
    """Algorithm 1 line 5 at a holder: its shares of every owner's h, checked against the settings' shapes, as a
    checkpoint keeps them."""
    if s.fusion in ("mpc", "shares"):
        got = rsh.receive_shares(party, order, Kind.RSS_PREFIX + "/share", {o: (total, w) for o, w in zip(order, widths)},
                                 H_BITS)
        return [{"a": got[o].a, "b": got[o].b} for o in order]
    shamir = ss.receive_shares(party, order, Kind.SHARE_PREFIX, t=s.t, tag="h")
    for o, w in zip(order, widths):
        if shamir[o].shape != (total, w):
            raise PeerFault(party.name, o, Kind.SHARE_PREFIX, f"shared an array of shape {shamir[o].shape}, the "
                            f"settings say ({total}, {w})")
    return [ss.share_state(shamir[o]) for o in order]
