"""F³ trained on shares end to end (``fusion = "shares"``; f3.txt, Eq. (8) and Algorithm 1 lines 5-10): the three
holders keep the owners' h, the labels, every weight and its optimiser state as 2-of-3 replicated shares over
Z_2^64 (:mod:`fedhet.protocols.replicated`); the coordinator schedules the batches and opens, per batch, the
NUMBER of correctly classified samples only (and per evaluation a confusion matrix summed over a whole split).

Why a new mode beside ``mpc``: mpc opens each sample's logits and the per-owner batch-summed dC under public
C_i and W_1, and the project's own attacks recover h from them (R² up to 0.91 against a label-only bound of
0.08, docs/security.md).  Here nothing per sample or per owner is opened: the softmax cross-entropy, its
gradient and the SGD-with-momentum update run on shares, and the weights start from the holders' joint
randomness (a public seed would make them known).

Per step (B rows, n owners of equal width d_i, ``hidden`` units, k classes; all products reshared; the
fixed-point bits in brackets):

  C_i = P_iᵀ W_0ᵀ                       (n, d_i, hidden)   shared x shared, truncated [C_BITS]
  G_b[i] = h_b^i C_i                     (B, n, hidden)     shared x shared, one round          [H_BITS + C_BITS]
  U_b = Â G_b, Z = ReLU(U), s = [U >= 0]                    public Â, then replicated.relu      [+ A_BITS]
  p_b = a Z_b, a = (1/n) Âᵀ1             (B, hidden)        public, truncated                   [F]
  ℓ_b = W_1 p_b                          (B, k)             shared x shared, truncated          [F]
  dℓ_b = softmax(ℓ_b) - y_b                                 replicated.softmax_ce_grad, y shared [F]
  hits = Σ_b [ℓ_b,y_b >= max_c ℓ_b,c]    OPENED (a count)
  dW_1 = Σ_b dℓ_b p_bᵀ, g_b = W_1ᵀ dℓ_b                     one round, truncated                [F], [G_BITS]
  δ_b = (n a ⊗ g_b) ⊙ s_b, E_b = Âᵀ δ_b                     one product (the bits), public Â
  n dC_i = Σ_b h_b^iᵀ E_b[i]                                one round, truncated                [F]
  n dP_i = (n dC_i W_0)ᵀ, n dW_0 = (Σ_i P_i n dC_i)ᵀ        one round, truncated                [F]
  v <- μ v + grad, w <- w - (lr / scale) v                  public μ and lr, truncated (SGD with momentum)
  or Lion: w <- w - lr sign(β1 m + (1-β1) grad), m <- ...   one comparison, one truncation (:func:`lion`)

The gradients are batch sums (P_i and W_0's also times n: the scale is folded into the learning rate, so the
shared values keep their bits).  ``align`` "none" has no P (C_i = W_0ᵀ); the graph is public ("given": the road
graph, or "none"), as in mpc: the learned ICDF graph is not offered (see :data:`ICDF_NOTE`).

What each party learns (semi-honest, one holder at most corrupt): a holder sees uniform words only (shares,
reshared products, the comparison rounds); the coordinator, the counts it opens (batch accuracy, per-split
confusion matrices) and, if ``open_model``, the trained weights at the end.  The labels it shared it knew.
Each holder keeps its pair of the trained weights as its part; ``fedhet predict`` runs :func:`forward` on them
(:func:`class_batches`) and opens each new row's class to the label party (the first owner) only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from fedhet.algorithms.f3.mpc import A_BITS, C_BITS, H_BITS, NA_BITS, pooling_weights
from fedhet.protocols import replicated as rs

F = 20                  # weights, logits, probabilities, gradients
G_BITS = 12             # g = W_1ᵀ dℓ before the per-owner products (keeps n dC below 2^63)
U_BITS = H_BITS + C_BITS + A_BITS       # 40
P_SHIFT = U_BITS + A_BITS - F           # p = a Z: 52 bits, truncated to F
DC_SHIFT = H_BITS + G_BITS + NA_BITS + A_BITS - F    # n dC: 48 bits, truncated to F
EXP_N = 8               # exp by (1 + x/2^8)^(2^8): rs.exp_error(F, 8) ~ 1.6e-3
COEF_BITS = 16          # significant bits of the public μ and lr / scale
MAX_ROWS_BITS = 62 - (H_BITS + G_BITS + NA_BITS + A_BITS) - 4   # a batch's n dC keeps 4 bits of headroom
ICDF_NOTE = ("the learned ICDF graph's gradient dÂ_b = δ_b G_bᵀ needs a per-sample (n, n) product of two shared "
             "values and the normalisation's derivative (a reciprocal square root per node and sample) on shares: "
             "about 20 more fixed-point bits than 64 leave at 207 owners (mpc's figure), so it would need a "
             "128-bit ring or a truncation of B n² products per step")


def cat(xs: list[rs.Rss]) -> tuple[rs.Rss, list[tuple]]:
    """Several pairs flattened into one (one truncation for all), with their shapes to split them again."""
    return (rs.Rss(np.concatenate([x.a.reshape(-1) for x in xs]), np.concatenate([x.b.reshape(-1) for x in xs])),
            [x.shape for x in xs])


def _split(x: rs.Rss, shapes: list[tuple]) -> list[rs.Rss]:
    out, at = [], 0
    for s in shapes:
        k = int(np.prod(s))
        out.append(rs.Rss(x.a[at:at + k].reshape(s), x.b[at:at + k].reshape(s)))
        at += k
    return out


def trunc_all(h: rs.Holder, xs: list[rs.Rss], d: int) -> list[rs.Rss]:
    """:func:`~fedhet.protocols.replicated.trunc` of several arrays in one call (10 rounds for all)."""
    flat, shapes = cat(xs)
    return _split(rs.trunc(h, flat, d), shapes)


def _t(x: rs.Rss) -> rs.Rss:
    """The transpose of the last two axes (a copy: contiguous)."""
    return rs.Rss(np.ascontiguousarray(np.swapaxes(x.a, -1, -2)), np.ascontiguousarray(np.swapaxes(x.b, -1, -2)))


def _bcast(x: rs.Rss, shape: tuple) -> rs.Rss:
    return rs.Rss(np.ascontiguousarray(np.broadcast_to(x.a, shape)), np.ascontiguousarray(np.broadcast_to(x.b, shape)))


@dataclass(frozen=True)
class Shape:
    """The public sizes of the model on shares."""
    n: int
    width: int          # d_i (every owner's)
    d: int
    hidden: int
    classes: int
    align: str          # "soft" or "none"

    def params(self) -> dict[str, tuple[tuple, float]]:
        """Each weight's shape and its initial uniform bound (torch's: Xavier for P, 1/sqrt(fan_in) for Linear)."""
        out: dict[str, tuple[tuple, float]] = {"W0": ((self.hidden, self.d), 1.0 / math.sqrt(self.d)),
               "W1": ((self.classes, self.hidden), 1.0 / math.sqrt(self.hidden))}
        if self.align == "soft":
            out["P"] = ((self.n, self.d, self.width), math.sqrt(6.0 / (self.d + self.width)))
        return out


@dataclass
class SharedModel:
    """One holder's pairs of every weight and its momentum buffer (name -> pair; F fractional bits)."""
    w: dict[str, rs.Rss]
    v: dict[str, rs.Rss]

    def state(self) -> dict:
        return {"w": {k: {"a": x.a, "b": x.b} for k, x in self.w.items()},
                "v": {k: {"a": x.a, "b": x.b} for k, x in self.v.items()}}

    @classmethod
    def restored(cls, saved: dict) -> "SharedModel":
        return cls({k: rs.Rss(x["a"], x["b"]) for k, x in saved["w"].items()},
                   {k: rs.Rss(x["a"], x["b"]) for k, x in saved["v"].items()})


def init_model(h: rs.Holder, shape: Shape, rng: np.random.Generator | None = None) -> SharedModel:
    """Weights from the holders' joint randomness: every holder draws its own term uniform in
    [-bound/√3, bound/√3] (its private generator), the three terms are summed by one reshare (one round), so the
    weight has the variance of torch's uniform initialisation and no party knows it (a holder knows its own term
    only).  Momentum buffers start at zero."""
    rng = rng if rng is not None else np.random.default_rng()
    w, v = {}, {}
    for name, (shp, bound) in shape.params().items():
        term = rs.encode(rng.uniform(-bound / math.sqrt(3.0), bound / math.sqrt(3.0), shp), F, name)
        w[name] = h.reshare(term.view(np.uint64))
        z = np.zeros(shp, np.uint64)
        v[name] = rs.Rss(z, z.copy())
    return SharedModel(w, v)


def first_weights(h: rs.Holder, model: SharedModel, shape: Shape) -> rs.Rss:
    """C_i = P_iᵀ W_0ᵀ for every owner, (n, d_i, hidden), C_BITS (align "none": W_0ᵀ for every owner)."""
    W0 = model.w["W0"]
    if shape.align == "none":
        Wt = _t(W0)
        return rs.trunc(h, _bcast(rs.Rss(Wt.a[None], Wt.b[None]), (shape.n, shape.d, shape.hidden)), F - C_BITS)
    C = rs.bilinear(h, model.w["P"], W0, lambda p, w: torch.matmul(p.transpose(1, 2), w.T))
    return rs.trunc(h, C, 2 * F - C_BITS)


def forward(h: rs.Holder, model: SharedModel, shape: Shape, X: rs.Rss, A: np.ndarray) -> tuple[rs.Rss, dict]:
    """The logits (B, classes; F bits) of the batch whose owners' h are ``X`` (n, B, d_i; H_BITS), and what the
    backward keeps."""
    C = first_weights(h, model, shape)
    G = rs.bilinear(h, X, C, torch.bmm)                                               # (n, B, hidden)
    G = rs.Rss(np.ascontiguousarray(G.a.transpose(1, 0, 2)), np.ascontiguousarray(G.b.transpose(1, 0, 2)))
    Ae = rs.encode(A, A_BITS, "Â")
    U = rs.lin_public(G, Ae, torch.matmul, float(np.abs(Ae).sum(1).max()))          # (B, n, hidden)
    Z, pos = rs.relu(h, U)
    ae = torch.from_numpy(rs.encode(pooling_weights(A), A_BITS, "a"))
    p = rs.trunc(h, rs.lin(Z, lambda t: torch.matmul(ae, t)), P_SHIFT)                # (B, hidden), F
    logits = rs.trunc(h, rs.bilinear(h, p, model.w["W1"], lambda x, w: x @ w.T), F)
    return logits, {"X": X, "pos": pos, "p": p}


def hits(h: rs.Holder, logits: rs.Rss, Y: rs.Rss) -> rs.Rss:
    """Σ_b [ℓ_b,y_b >= max_c ℓ_b,c] (a tie counts as a hit), an integer: y's logit against the maximum."""
    m = rs.max_last(h, logits)                                                        # (B, 1)
    ly = rs.bilinear(h, Y, logits, lambda y, v: (y * v).sum(-1, keepdim=True))       # 2F bits
    ok = _one_minus(h, rs.ltz(h, rs.sub(ly, _shl(m, F))))
    return rs.Rss(ok.a.sum(dtype=np.uint64).reshape(1), ok.b.sum(dtype=np.uint64).reshape(1))


def _shl(x: rs.Rss, k: int) -> rs.Rss:
    return rs.Rss(x.a << np.uint64(k), x.b << np.uint64(k))


def _one_minus(h: rs.Holder, bit: rs.Rss) -> rs.Rss:
    return rs.add_public(h, rs.Rss(0 - bit.a, 0 - bit.b), np.ones(bit.shape, np.int64))


def backward(h: rs.Holder, model: SharedModel, shape: Shape, kept: dict, dl: rs.Rss, A: np.ndarray) -> dict[str, rs.Rss]:
    """The batch-summed gradients (F bits) from dℓ = softmax - y (B, classes; F bits): W1's, and P's and W0's
    times n."""
    W1, p, X = model.w["W1"], kept["p"], kept["X"]
    w1_t = rs.cross(dl, p, lambda x, y: x.T @ y)                                      # (classes, hidden), 2F
    g_t = rs.cross(dl, W1, lambda x, w: x @ w)                                        # (B, hidden), 2F
    both = h.reshare(np.concatenate([w1_t.reshape(-1), g_t.reshape(-1)]))
    dW1, g = _split(both, [W1.shape, p.shape])
    dW1, = trunc_all(h, [dW1], F)
    g = rs.trunc(h, g, 2 * F - G_BITS)
    na = rs.encode(pooling_weights(A) * shape.n, NA_BITS, "n a").view(np.uint64)[None, :, None]
    dz = rs.Rss(g.a[:, None, :] * na, g.b[:, None, :] * na)                           # (B, n, hidden)
    delta = rs.mul(h, dz, kept["pos"])
    AeT = np.ascontiguousarray(rs.encode(A, A_BITS, "Â").T)
    E = rs.lin_public(delta, AeT, torch.matmul, float(np.abs(AeT).sum(1).max()))
    Et = rs.Rss(np.ascontiguousarray(E.a.transpose(1, 0, 2)), np.ascontiguousarray(E.b.transpose(1, 0, 2)))
    dC = rs.trunc(h, rs.bilinear(h, X, Et, lambda x, e: torch.bmm(x.transpose(1, 2), e)), DC_SHIFT)   # (n, d_i, hidden)
    grads = {"W1": dW1}
    W0 = model.w["W0"]
    if shape.align == "none":
        grads["W0"] = rs.Rss(np.ascontiguousarray(dC.a.sum(0, dtype=np.uint64).T),
                             np.ascontiguousarray(dC.b.sum(0, dtype=np.uint64).T))
        return grads
    P = model.w["P"]
    dP_t = rs.cross(dC, W0, lambda c, w: torch.matmul(c, w).transpose(1, 2))        # (n, d, d_i)
    dW0_t = rs.cross(P, dC, lambda pp, c: torch.matmul(pp, c).sum(0).T)              # (hidden, d)
    both = h.reshare(np.concatenate([dP_t.reshape(-1), dW0_t.reshape(-1)]))
    grads["P"], grads["W0"] = trunc_all(h, _split(both, [P.shape, W0.shape]), F)
    return grads


def _coef(c: float, what: str) -> tuple[int, int]:
    """A public positive coefficient as an integer with COEF_BITS significant bits and its shift."""
    if not c > 0:
        raise ValueError(f"f3 shares: {what} must be positive, got {c}")
    shift = COEF_BITS - int(math.floor(math.log2(c)))
    if not 0 < shift < 62:
        raise ValueError(f"f3 shares: {what} = {c} is outside what {COEF_BITS} significant bits represent")
    return int(round(c * 2 ** shift)), shift


def sgd(h: rs.Holder, model: SharedModel, grads: dict[str, rs.Rss], lr: dict[str, float], momentum: float) -> None:
    """v <- μ v + grad, w <- w - lr v for every weight (``lr`` per weight, the gradients' scale folded in): two
    truncations for all (20 rounds)."""
    names = sorted(grads)
    mu, mshift = _coef(momentum, "momentum") if momentum > 0 else (0, 1)
    vs = trunc_all(h, [_scale(model.v[k], mu) for k in names], mshift)
    for k, v in zip(names, vs):
        model.v[k] = rs.add(v, grads[k])
    by_shift: dict[int, list[tuple[str, int]]] = {}
    for k in names:
        c, s = _coef(lr[k], f"lr of {k}")
        by_shift.setdefault(s, []).append((k, c))
    for s, kcs in by_shift.items():          # weights whose rates share a shift: one truncation
        upd = trunc_all(h, [_scale(model.v[k], c) for k, c in kcs], s)
        for (k, _), u in zip(kcs, upd):
            model.w[k] = rs.sub(model.w[k], u)


LION_BETAS = (0.9, 0.99)     # Lion's (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms") defaults


def lion(h: rs.Holder, model: SharedModel, grads: dict[str, rs.Rss], lr: float) -> None:
    """Lion: w <- w - lr sign(β1 m + (1 - β1) g), m <- β2 m + (1 - β2) g.  The sign is one comparison on shares
    (β1 m + (1 - β1) g with integer coefficients, no truncation: the sign ignores the scale, so the gradients'
    batch and owner factors need no folding), lr sign(.) is exact at F bits, and the EMA one truncation: cheaper
    than :func:`sgd`, and per-coordinate normalised like Adam (which would need a reciprocal square root of a
    value of unknown range on shares).  A zero argument counts as positive (sign +1)."""
    names = sorted(grads)
    b1, b2 = LION_BETAS
    c1, c2 = (int(round(b1 * 2 ** COEF_BITS)), int(round((1 - b1) * 2 ** COEF_BITS)))
    z, shapes = cat([rs.add(_scale(model.v[k], c1), _scale(grads[k], c2)) for k in names])
    neg = rs.ltz(h, z)                                                        # [z < 0]
    step = np.int64(rs.encode(lr, F, "lr"))
    if step < 1:
        raise ValueError(f"f3 shares: lr {lr} is below the fixed point's 2^-{F}")
    # lr sign(z) = lr (1 - 2 [z < 0]): w - lr + 2 lr [z < 0]
    upd = rs.add_public(h, rs.Rss(neg.a * np.uint64(2 * step), neg.b * np.uint64(2 * step)),
                        np.full(neg.shape, -step, np.int64))
    for k, u in zip(names, _split(upd, shapes)):
        model.w[k] = rs.add(model.w[k], u)
    d1, d2 = (int(round(b2 * 2 ** COEF_BITS)), int(round((1 - b2) * 2 ** COEF_BITS)))
    ms = trunc_all(h, [rs.add(_scale(model.v[k], d1), _scale(grads[k], d2)) for k in names], COEF_BITS)
    for k, m in zip(names, ms):
        model.v[k] = m


def _scale(x: rs.Rss, c: int) -> rs.Rss:
    return rs.Rss(x.a * np.uint64(c), x.b * np.uint64(c))


def learning_rates(lr: float, batch: int, n: int) -> dict[str, float]:
    """The per-weight learning rates on the batch-summed gradients: lr / B for W_1, lr / (B n) for P and W_0 (their
    gradients carry the factor n of δ's n a)."""
    return {"W1": lr / batch, "W0": lr / (batch * n), "P": lr / (batch * n)}


def train_step(h: rs.Holder, model: SharedModel, shape: Shape, X: rs.Rss, Y: rs.Rss, A: np.ndarray, lr: float,
               momentum: float, optimizer: str = "sgd") -> rs.Rss:
    """One step of ``optimizer`` (:func:`sgd` with ``momentum``, or :func:`lion`) on the batch (X: the owners' h
    rows, (n, B, d_i); Y: one-hot labels, (B, classes), F bits);
    returns the holder's pair of the batch's hit count (to open)."""
    B = X.shape[1]
    if B >= 1 << MAX_ROWS_BITS:
        raise ValueError(f"f3 shares: a batch of {B} rows could overflow n dC (at most {(1 << MAX_ROWS_BITS) - 1})")
    logits, kept = forward(h, model, shape, X, A)
    dl, _ = rs.softmax_ce_grad(h, logits, Y, F, EXP_N)
    count = hits(h, logits, Y)
    grads = backward(h, model, shape, kept, dl, A)
    if optimizer == "lion":
        lion(h, model, grads, lr)
    else:
        sgd(h, model, grads, learning_rates(lr, B, shape.n), momentum)
    return count


def predicted(h: rs.Holder, logits: rs.Rss) -> rs.Rss:
    """The predicted class as a one-hot integer row per sample, [ℓ_c >= max ℓ] (a tie marks every tied class)."""
    m = rs.max_last(h, logits)
    return _one_minus(h, rs.ltz(h, rs.sub(logits, _bcast(m, logits.shape))))


def class_batches(h: rs.Holder, model: SharedModel, shape: Shape, X: rs.Rss, A: np.ndarray,
                  batch: int) -> Iterator[tuple[int, rs.Rss]]:
    """Prediction on shares: the training :func:`forward` on the rows of ``X`` (n, rows, d_i; H_BITS), ``batch``
    rows at a time, and each row's predicted class (:func:`predicted`: a 0/1 integer per class, one-hot but for
    ties) as a pair to open to the label party only: (batch index, pair).  Nothing else leaves the holders."""
    rows = X.shape[1]
    for step, lo in enumerate(range(0, rows, batch)):
        logits, _ = forward(h, model, shape, X[:, lo:lo + batch], A)
        yield step, predicted(h, logits)


def confusion(h: rs.Holder, logits: rs.Rss, Y: rs.Rss) -> rs.Rss:
    """Σ_b y_b ⊗ predicted_b, (classes, classes), F bits: the batch's confusion matrix (true x predicted)."""
    return rs.bilinear(h, Y, predicted(h, logits), lambda y, q: y.T @ q)


def macro_f1(conf: np.ndarray) -> float:
    """Macro F1 from a confusion matrix (rows true, columns predicted; classes never true nor predicted skipped)."""
    tp = np.diag(conf)
    pred, true = conf.sum(0), conf.sum(1)
    keep = (pred + true) > 0
    f1 = np.where(keep, 2 * tp / np.maximum(pred + true, 1e-12), 0.0)
    return float(f1[keep].mean()) if keep.any() else 0.0


@dataclass
class InProcessShares:
    """The three holders in this process (threads), the coordinator's side with them: it shares the labels,
    schedules batches, and opens only the batch hit counts and (per evaluation) summed confusion matrices;
    ``opened`` records every opened value (kind, size), the audit of what the coordinator learned."""

    reps: list[np.ndarray]
    y: np.ndarray
    classes: int
    A: np.ndarray
    d: int
    hidden: int
    align: str = "soft"
    seed: int | None = None          # the holders' private generators (tests; None: fresh entropy)
    opened: list[tuple[str, int]] = field(default_factory=list)

    def __post_init__(self):
        widths = {r.shape[1] for r in self.reps}
        if len(widths) != 1:
            raise ValueError(f"f3 shares: every owner needs the same width d_i, got {sorted(widths)}")
        self.shape = Shape(len(self.reps), widths.pop(), self.d, self.hidden, self.classes, self.align)
        if self.align == "none" and self.shape.width != self.d:
            raise ValueError("f3 shares: align 'none' needs d_i = d")
        self.holders = rs.in_process_holders()
        H = np.stack([rs.encode(r, H_BITS, "h") for r in self.reps])                 # owners' dealing
        Yw = (np.eye(self.classes, dtype=np.int64)[np.asarray(self.y)] << F)         # the coordinator's
        self._X = self._deal(H)
        self._Y = self._deal(Yw)
        rngs = [np.random.default_rng(None if self.seed is None else [self.seed, i]) for i in range(3)]
        self.models = rs.in_process(lambda h: init_model(h, self.shape, rngs[h.i]), self.holders)

    @staticmethod
    def _deal(words: np.ndarray) -> list[rs.Rss]:
        parts = rs.share(words.view(np.uint64))
        return [rs.Rss(rs.expand(parts[i][0], words.shape), rs.expand(parts[i][1], words.shape)) for i in range(3)]

    def _open(self, outs: list[rs.Rss], kind: str) -> np.ndarray:
        v = rs.open_pairs([(o.a, o.b) for o in outs])
        self.opened.append((kind, int(v.size)))
        return v.view(np.int64)

    def _run(self, fn: Callable[[rs.Holder], rs.Rss]) -> list[rs.Rss]:
        return rs.in_process(fn, self.holders)

    def step(self, rows: np.ndarray, lr: float, momentum: float, optimizer: str = "sgd") -> int:
        rows = np.asarray(rows)
        got = self._run(lambda h: train_step(h, self.models[h.i], self.shape, self._X[h.i][:, rows],
                                             self._Y[h.i][rows], self.A, lr, momentum, optimizer))
        return int(self._open(got, "hits")[0])

    def confusion(self, rows: np.ndarray, batch: int) -> np.ndarray:
        """The confusion matrix over ``rows`` (summed over its batches on shares, opened once)."""
        def fn(h):
            acc = None
            for lo in range(0, len(rows), batch):
                r = np.asarray(rows[lo:lo + batch])
                logits, _ = forward(h, self.models[h.i], self.shape, self._X[h.i][:, r], self.A)
                c = confusion(h, logits, self._Y[h.i][r])
                acc = c if acc is None else rs.add(acc, c)
            return acc
        return rs.decode(self._open(self._run(fn), "confusion").view(np.uint64), F)

    def predict(self, reps: list[np.ndarray], batch: int) -> np.ndarray:
        """New rows' classes on shares (the owners' new h ``reps``, dealt as the owners deal them): each row's
        predicted class as 0/1 per class (int64, (rows, classes)), the only value opened (to the label party)."""
        X = self._deal(np.stack([rs.encode(r, H_BITS, "h") for r in reps]))
        got = rs.in_process(lambda h: [q for _, q in class_batches(h, self.models[h.i], self.shape, X[h.i], self.A,
                                                                   batch)], self.holders)
        outs = [self._open([got[i][j] for i in range(3)], "class") for j in range(len(got[0]))]
        return np.concatenate(outs) if outs else np.zeros((0, self.classes), np.int64)

    def open_model(self) -> dict[str, np.ndarray]:
        """The trained weights (``open_model = true``), float64."""
        return {k: rs.decode(self._open([m.w[k] for m in self.models], f"model/{k}").view(np.uint64), F)
                for k in self.models[0].w}

    @property
    def rounds(self) -> int:
        return self.holders[0].rounds

    @property
    def words_sent(self) -> int:
        return self.holders[0].words_sent


def plain_step(w: dict[str, np.ndarray], v: dict[str, np.ndarray], H: np.ndarray, Y: np.ndarray, A: np.ndarray,
               lr: float, momentum: float, align: str, optimizer: str = "sgd") -> int:
    """The same step in float64 (torch autograd), the reference of the shares: H (n, B, d_i), Y one-hot (B, k);
    updates ``w`` and ``v`` in place, returns the hit count."""
    tw = {k: torch.tensor(x, requires_grad=True) for k, x in w.items()}
    logits = plain_logits(tw, H, A, align)
    yt = torch.tensor(Y)
    loss = -(yt * torch.log_softmax(logits, -1)).sum()
    loss.backward()
    n, B = H.shape[0], H.shape[1]
    lrs = learning_rates(lr, B, n)
    b1, b2 = LION_BETAS
    for k in w:
        grad = tw[k].grad
        assert grad is not None
        g = grad.numpy() * (n if k != "W1" else 1)
        if optimizer == "lion":
            w[k] = w[k] - lr * np.where(b1 * v[k] + (1 - b1) * g < 0, -1.0, 1.0)
            v[k] = b2 * v[k] + (1 - b2) * g
        else:
            v[k] = momentum * v[k] + g
            w[k] = w[k] - lrs[k] * v[k]
    lg = logits.detach().numpy()
    return int((lg[np.arange(B), Y.argmax(1)] >= lg.max(1)).sum())


def plain_logits(w: dict[str, torch.Tensor], H: np.ndarray, A: np.ndarray, align: str) -> torch.Tensor:
    """The logits of :func:`forward` in float64 (torch), the reference of the shares: H (n, B, d_i)."""
    Ht, At = torch.as_tensor(H, dtype=torch.float64), torch.as_tensor(A, dtype=torch.float64)
    C = (w["P"].transpose(1, 2) @ w["W0"].T) if align == "soft" else w["W0"].T.expand(H.shape[0], -1, -1)
    G = torch.bmm(Ht, C).transpose(0, 1)
    Z = torch.relu(At @ G)
    return (At.mean(-2) @ Z) @ w["W1"].T
