"""F³ models (f3.txt): the owners' local model (Eq. (3)) and the global fusion model (Eq. (8)), torch.

Eq. (3) local model           -> LocalLSTM (LSTM(1 -> d) over the series, h = last hidden, linear softmax head)
Eq. (8) global model          -> GlobalGCN: softmax((1/n) 1ᵀ Â ReLU(Â H W_0) W_1), H rows = P_i h^i
Alignment P_i                 -> soft (Xavier, unconstrained), hard (sinkhorn, 10 iterations), tied, none
Eq. (9) ICDF Bernoulli graph  -> icdf_sample: z = sigmoid((Φ⁻¹(θ) − s) / τ), s ~ N(0, 1)
Â                             -> normalise_adj: D^-1/2 (A + I) D^-1/2
Baselines                     -> mean pooling (E, Eq. (5)) and concatenation (G): MeanPool, Concat
Table 3, Gumbel-softmax graph -> gumbel_sample (binary Concrete), GlobalGCN(graph="gumbel"), for comparison
"""
from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["LocalLSTM", "sinkhorn", "icdf_sample", "gumbel_sample", "normalise_adj", "GlobalGCN", "MeanPool", "Concat"]


class LocalLSTM(nn.Module):
    """Owner i's model: LSTM over (batch, T, 1) -> h (batch, hidden) -> logits. ``lengths`` picks each sample's last step."""

    def __init__(self, n_classes: int, hidden: int = 16, in_dim: int = 1):
        super().__init__()
        self.lstm = nn.LSTM(in_dim, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_classes)

    def represent(self, x, lengths=None):
        out, _ = self.lstm(x)
        if lengths is None:
            return out[:, -1]
        idx = (torch.as_tensor(lengths, device=out.device) - 1).clamp(min=0)
        return out[torch.arange(out.shape[0], device=out.device), idx]

    def forward(self, x, lengths=None):
        return self.head(self.represent(x, lengths))


def sinkhorn(logits, iters: int = 10):
    """Doubly stochastic matrix from logits by alternating row/column normalisation in log space."""
    la = logits
    for _ in range(iters):
        la = la - torch.logsumexp(la, dim=-1, keepdim=True)
        la = la - torch.logsumexp(la, dim=-2, keepdim=True)
    return la.exp()


def icdf_sample(theta, tau: float = 0.1, generator=None, batch: int | None = None):
    """Eq. (9): relaxed Bernoulli(θ) via the inverse CDF of N(0,1); θ clamped to [1e-4, 0.9999]; in (0, 1).

    ``batch``: draw that many independent graphs from one (n, n) θ, shape (batch, n, n).  Φ⁻¹(θ) depends on θ
    only, so it is computed once and broadcast rather than once per sample (the draws are the same as
    sampling from θ expanded to (batch, n, n): same shape, same generator).
    """
    th = theta.clamp(1e-4, 0.9999)
    shape = th.shape if batch is None else (batch, *th.shape)
    z = torch.randn(shape, generator=generator, device=th.device, dtype=th.dtype)
    q = math.sqrt(2.0) * torch.erfinv(2 * th - 1)
    # sigmoid((q - s) / τ) in the noise's own buffer: at (100, 325, 325) a fresh tensor per step costs
    # more than the arithmetic; each in-place op here keeps what its backward needs (sigmoid: its output)
    return z.neg_().add_(q).div_(tau).sigmoid_()


def gumbel_sample(theta, tau: float = 0.1, generator=None, batch: int | None = None):
    """Gumbel-softmax over {edge, no edge} (binary Concrete): sigmoid((logit θ + log u − log(1 − u)) / τ), u ~ U(0, 1).

    The comparison to Eq. (9) in Table 3: the same θ, clamped alike, logistic instead of Gaussian noise;
    ``batch`` as in :func:`icdf_sample`.
    """
    th = theta.clamp(1e-4, 0.9999)
    shape = th.shape if batch is None else (batch, *th.shape)
    u = torch.rand(shape, generator=generator, device=th.device, dtype=th.dtype).clamp(1e-6, 1 - 1e-6)
    return torch.sigmoid((torch.log(th) - torch.log1p(-th) + torch.log(u) - torch.log1p(-u)) / tau)


def normalise_adj(a):
    """Symmetrise, add self-loops, D^-1/2 A D^-1/2 (works on (n, n) or (batch, n, n)).

    With S = (A + Aᵀ)/2 and d = rowsum(S + I)^-1/2, the result is d_i d_j S_ij + δ_ij d_i²; written that
    way it takes four passes over the (batch, n, n) tensor instead of seven, which is most of an F³ step
    at 325 owners.  The result is exactly symmetric in floating point ((0.5 d_i) d_j = 0.5 (d_i d_j)), so
    its upper triangle describes it (what the F³ share holders receive).
    """
    a2 = a + a.transpose(-1, -2)                  # 2 S
    d = (0.5 * a2.sum(-1) + 1).rsqrt()
    scale = 0.5 * d.unsqueeze(-1) * d.unsqueeze(-2)
    # without autograd the product can reuse a2's buffer; with it, the product's backward needs a2
    out = a2.mul_(scale) if not (torch.is_grad_enabled() and a2.requires_grad) else a2 * scale
    # in place on a fresh product whose backward needs only its inputs: autograd-safe
    out.diagonal(dim1=-2, dim2=-1).add_(d * d)
    return out


class GlobalGCN(nn.Module):
    """Eq. (8) over n owners' representations (batch, n, d_i) with alignment and a graph option."""

    def __init__(self, n: int, dims, d: int, hidden: int, n_classes: int, align: str = "soft",
                 graph: str = "icdf", given=None, tau: float = 0.1, test_samples: int = 10):
        super().__init__()
        if align not in ("none", "soft", "hard", "tied") or graph not in ("none", "given", "icdf", "gumbel"):
            raise ValueError(f"align {align!r} / graph {graph!r} not supported")
        self.n, self.align, self.graph, self.tau, self.test_samples = n, align, graph, tau, test_samples
        self.generator: torch.Generator | None = None   # ICDF draws (None: torch's global RNG)
        self.P: nn.ParameterList | nn.Parameter   # one P_i per owner; "tied": one P for all
        if align == "soft":
            self.P = nn.ParameterList([nn.Parameter(nn.init.xavier_uniform_(torch.empty(d, di))) for di in dims])
        elif align == "hard":
            self.P = nn.ParameterList([nn.Parameter(torch.randn(d, di) * 0.1) for di in dims])
        elif align == "tied":
            self.P = nn.Parameter(nn.init.xavier_uniform_(torch.empty(d, dims[0])))
        if graph in ("icdf", "gumbel"):
            self.theta = nn.Parameter(torch.full((n, n), 0.5))
        if graph == "given":
            self.register_buffer("a_given", normalise_adj((torch.as_tensor(given) > 0).float()))
        self.W0 = nn.Linear(d, hidden, bias=False)
        self.W1 = nn.Linear(hidden, n_classes, bias=False)

    def stack(self, hs):
        if self.align == "none":
            return torch.stack(hs, 1)
        if self.align == "tied":
            return torch.stack([h @ self.P.T for h in hs], 1)
        Ps = [sinkhorn(p) if self.align == "hard" else p for p in self.P]
        return torch.stack([h @ p.T for h, p in zip(hs, Ps)], 1)

    def adj(self, batch: int):
        if self.graph == "none":
            return torch.eye(self.n, device=self.W0.weight.device)
        if self.graph == "given":
            return self.a_given
        sample = gumbel_sample if self.graph == "gumbel" else icdf_sample
        return normalise_adj(sample(self.theta, self.tau, self.generator, batch=batch))   # a fresh graph per sample

    def alignments(self) -> list | None:
        """The alignment matrices P_i, (d, d_i) each (hard: after sinkhorn; tied: one P repeated); None for 'none'."""
        if self.align == "none":
            return None
        if self.align == "tied":
            return [self.P] * self.n
        return [sinkhorn(p) if self.align == "hard" else p for p in self.P]

    def fuse(self, first_layer, batch: int):
        """Eq. (8) given the first layer's pre-activations: ``first_layer(A)`` -> Â H W_0, (batch, n, hidden).

        Split out so that Â H W_0, the only part linear in the owners' representations, can be computed
        elsewhere (on Shamir shares, :mod:`fedhet.algorithms.f3.core`) while the rest runs here.  A
        ``first_layer`` with ``logits = True`` returns W_1 (1/n) 1ᵀ Â ReLU(Â H W_0) itself, (batch, classes)
        (:mod:`fedhet.algorithms.f3.mpc`: ReLU, pooling and W_1 on shares too).
        """
        reps = self.test_samples if (self.graph in ("icdf", "gumbel") and not self.training) else 1
        out: torch.Tensor | int = 0
        for _ in range(reps):
            out = out + torch.softmax(self.logits(first_layer, self.adj(batch)), -1)
        return out / reps          # class probabilities

    def logits(self, first_layer, A):
        """W_1 (1/n) 1ᵀ Â ReLU(first_layer(Â)), (batch, classes); a ``first_layer`` marked ``logits`` returns them
        itself (computed elsewhere up to W_1: F³'s mpc fusion)."""
        if getattr(first_layer, "logits", False):
            return first_layer(A)
        Z = torch.relu(first_layer(A))
        # (1/n) 1ᵀ Â Z as one row vector times Z: the same sum without the (n, n) x (n, hidden) product
        return self.W1((A.mean(-2, keepdim=True) @ Z).squeeze(-2))

    def forward(self, hs):
        H = self.stack(hs)
        return self.fuse(lambda A: A @ self.W0(H), H.shape[0])


class MeanPool(nn.Module):
    """Baseline E (Eq. (5)): mean of the owners' representations, linear softmax head."""

    def __init__(self, d: int, n_classes: int):
        super().__init__()
        self.head = nn.Linear(d, n_classes)

    def forward(self, hs):
        return torch.softmax(self.head(torch.stack(hs, 1).mean(1)), -1)


class Concat(nn.Module):
    """Baseline G: concatenated representations, linear softmax head."""

    def __init__(self, dims, n_classes: int):
        super().__init__()
        self.head = nn.Linear(sum(dims), n_classes)

    def forward(self, hs):
        return torch.softmax(self.head(torch.cat(hs, 1)), -1)
