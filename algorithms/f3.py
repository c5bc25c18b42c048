"""F³ as a federation (f3.txt, Algorithm 1): n owners, m share holders, one coordinator.

Roles: ``owner`` (n; the first in federation order is the label owner), ``holder`` (m, fusion =
"shamir" only) and ``coordinator``.

Paper -> functions
  Eq. (3), Alg. 1 lines 1-4   owner: :func:`fedhet.algorithms.f3_training.train_local` on its own series
                              (LSTM -> h^i -> softmax; Adam, early stopping), frozen; h_k^i for every sample
  Alg. 1 line 5 (one round)   owner -> holders: t-of-m Shamir shares of [h^i_train; h^i_val; h^i_test]
                              (``f3/share``, :func:`fedhet.protocols.shamir_share.share_to_holders`), or,
                              with ``fusion = "trusted"``, h^i in the clear to the coordinator (``f3/rep``)
  Eq. (8), Alg. 1 lines 6-7   coordinator: :func:`~fedhet.algorithms.f3_training.train_global` with the
                              first layer Â H W_0 computed by the holders (:class:`SharedFirstLayer`,
                              :func:`holder_forward`, :func:`holder_backward`); ReLU, Â(.), mean over owners,
                              W_1 and softmax at the coordinator
  Eq. (9)                     ICDF graph: :func:`fedhet.algorithms.f3_models.icdf_sample`, a fresh Â per sample
  Alg. 1 lines 8-10           inference: the same share -> holders -> coordinator path
                              (:func:`fedhet.algorithms.f3_training.predict`)

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

What the coordinator learns (stated honestly; ``benchmarks/f3_leakage.py`` measures it).  U_b = Â_b G_b
for every sample of every training step and of inference; Â_b is invertible in practice (self-loops,
normalised), so the coordinator obtains G_b[i] = h_b^i P_iᵀ W_0ᵀ, a linear image of each owner's
representation through a public d_i x hidden matrix that changes every step.  When hidden >= d_i and
that matrix has full rank it recovers h_b^i exactly (least squares over any one step).  The Shamir
protection is therefore against the *holders* (fewer than t of them see uniformly random shares) and
against anyone outside; it does not hide h from the coordinator beyond what a rank-deficient first
layer (hidden < d_i) or a fresh re-parametrisation would.  dC_i adds nothing beyond dP_i when W_0 has
full row rank (hidden <= d); dÂ_b adds nothing beyond U_b (the coordinator can form δ_b G_bᵀ itself).
In trusted mode the coordinator sees h^i directly (the paper's base setting).  Labels (train, validation
and test: the last two for model selection and scoring) reach the coordinator from the label owner
(``f3/labels``, declared).  The owners' series, local models and their predictions never leave them.

Data: Japanese Vowels (UCI, real: 12 owners, one LPC series each, lengths 7-29) or incident windows
*simulated* on the real METR-LA / PEMS-BAY road graphs (:mod:`fedhet.algorithms.data_traffic`; one
sensor per owner, ``n_sensors`` keeps the first sensors and their subgraph).  Every owner holds every
sample (the owners observe the same events), so no PSI is needed: samples are aligned by index.
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from fedhet.algorithms import f3_training as T
from fedhet.parties import schema as sch
from fedhet.parties.contract import Algorithm, PartyContext
from fedhet.parties.declare import declare
from fedhet.parties.settings import TableView, parse_settings, setting
from fedhet.protocols import shamir_share as ss

NAME = "f3"
OWNER, HOLDER, COORDINATOR = "owner", "holder", "coordinator"
K_REP, K_LABELS, K_OP = "f3/rep", "f3/labels", "f3/op"
P_SHARE, P_PRE, P_GRAD, P_ADJ = "f3", "f3/pre", "f3/grad", "f3/adj"
VOWELS_ROWS = (270, 370)          # the .ts files' TRAIN / TEST sizes
MAX_BATCH = 4096


@dataclass(frozen=True)
class Settings(TableView):
    dataset: Literal["vowels", "metr_la", "pems_bay", "grid"] = setting(
        "vowels", "vowels: Japanese Vowels (real, 12 owners); metr_la / pems_bay: incident windows SIMULATED on "
                  "the real road graph (one sensor per owner); grid: SIMULATED on a generated 4 x 4 street grid "
                  "(no data folder)")
    n_sensors: int | None = setting(None, "traffic: keep the first n sensors and their subgraph (None: all)", lo=2)
    n_windows: int | None = setting(None, "traffic: simulated windows (None: the paper's 2,856 / 4,343)", lo=10)
    data_seed: int = setting(0, "traffic: seed of the simulator", lo=0)
    speeds_file: str | None = setting(None, "traffic: the REAL speeds (DCRNN's metr-la.h5 / pems-bay.h5) instead "
                                            "of the simulator; needs labels_file")
    labels_file: str | None = setting(None, "traffic: one 0/1 label per 12-step window of speeds_file "
                                            "(.npy or text)")
    split_seed: int = setting(123, "seed of the train/validation split (traffic: the reference 70/10/20)", lo=0)
    val_fraction: float = setting(0.2, "vowels: part of the TRAIN file held out for validation", lo=0, hi=1,
                                  lo_open=True)
    fusion: Literal["shamir", "trusted"] = setting(
        "shamir", "shamir: representations Shamir-shared to the holders; trusted: sent in the clear to the "
                  "coordinator (the paper's base setting)")
    t: int = setting(2, "Shamir threshold: any t holders reconstruct, t - 1 learn nothing", lo=1)
    ask: Literal["t", "all"] = setting(
        "t", "holders asked for each training and inference step: 't' (t of the m, rotating from step to step, "
        "the others idle) or 'all' (every share beyond the first t is checked to lie on the same polynomial, "
        "which detects a holder sending a wrong share, at (m - t) / t more holder work)")
    local_hidden: int = setting(16, "width d_i of every owner's LSTM (unless owner_hidden)", lo=1)
    owner_hidden: list[int] | None = setting(None, "per-owner widths d_i in federation order (rectangular P_i)")
    local_epochs: int = setting(200, "local pre-training epochs at most", lo=1)
    local_patience: int = setting(20, "local early stopping (epochs without a better validation loss)", lo=1)
    local_lr: float = setting(1e-3, "local Adam learning rate", lo=0, lo_open=True)
    local_batch: int = setting(100, "local mini-batch", lo=1)
    d: int = setting(16, "width of the aligned representations P_i h^i", lo=1)
    hidden: int = setting(16, "width of W_0's output", lo=1)
    align: Literal["none", "soft", "hard", "tied"] = setting("soft", "alignment P_i (none needs d_i = d)")
    graph: Literal["none", "given", "icdf"] = setting("icdf", "consensus graph: none (Â = I), given (the road "
                                                              "graph, binarised), icdf (eq. 9, learned)")
    tau: float = setting(0.1, "ICDF temperature", lo=0, lo_open=True)
    test_samples: int = setting(10, "ICDF graphs averaged at evaluation", lo=1)
    epochs: int = setting(100, "global epochs at most", lo=1)
    patience: int = setting(20, "global early stopping (epochs)", lo=1)
    lr: float = setting(1e-2, "global Adam learning rate", lo=0, lo_open=True)
    batch: int = setting(100, "global mini-batch", lo=1, hi=MAX_BATCH)
    frac_bits: int = setting(16, "fixed-point fractional bits of the shared representations", lo=1, hi=30)
    public_frac_bits: int = setting(14, "fractional bits of the public operands C_i and Â", lo=1, hi=30)
    grad_frac_bits: int = setting(18, "fractional bits of the public backward operands (batch x δ, E)", lo=1,
                                  hi=30)
    seed: int = setting(0, "seeds the local models (seed + owner index) and the global model", lo=0)
    torch_threads: int = setting(1, "torch.set_num_threads (and numpy's BLAS threads) in every role (1: results do not depend on how the "
                                    "parties share a process; 0: leave torch's default)", lo=0)

    def validate(self):
        if (self.speeds_file is None) != (self.labels_file is None):
            raise ValueError("f3: speeds_file and labels_file go together (real speeds need the user's labels)")
        if self.speeds_file is not None and self.dataset not in ("metr_la", "pems_bay"):
            raise ValueError("f3: speeds_file / labels_file are for the real road graphs (metr_la, pems_bay)")
        if self.graph == "given" and self.dataset == "vowels":
            raise ValueError("f3: graph 'given' needs a traffic data set (Japanese Vowels has no given graph)")


def n_rows(s) -> tuple[int, int, int]:
    """(train, validation, test) sample counts; every owner's representation array is their concatenation."""
    if s.dataset == "vowels":
        n_val = int(round(s.val_fraction * VOWELS_ROWS[0]))
        return VOWELS_ROWS[0] - n_val, n_val, VOWELS_ROWS[1]
    from fedhet.algorithms.data_traffic import SIZES
    w = s.n_windows or SIZES[s.dataset][0]
    a, b = int(round(0.7 * w)), int(round(0.8 * w))
    return a, b - a, w - b


def sizes(s: Settings) -> dict:
    tr, va, te = n_rows(s)
    return {"n_rows": tr + va + te, "hidden": s.hidden, "d": s.d, "batch": s.batch}


def owner_widths(s, n: int) -> list[int]:
    if s.owner_hidden is None:
        return [s.local_hidden] * n
    if len(s.owner_hidden) != n:
        raise ValueError(f"f3: owner_hidden lists {len(s.owner_hidden)} widths for {n} owners")
    return [int(w) for w in s.owner_hidden]


def declarations(s: Settings) -> list:
    share_decl, _ = ss.declarations(P_SHARE, OWNER, HOLDER, COORDINATOR, share_shape=(sum(n_rows(s)), None))
    result_decls = [ss.declarations(prefix, OWNER, HOLDER, COORDINATOR, result_shape=shape)[1]
                    for prefix, shape in ((P_PRE, (None, None, s.hidden)), (P_GRAD, (None,)), (P_ADJ, (None, None)))]
    f64_2d, f32_any = sch.Arr("<f8", (None, None)), sch.OneOf((sch.Arr("<f4", (None, None)),
                                                               sch.Arr("<f4", (None, None, None))))
    op = sch.OneOf((
        sch.Fields({"op": sch.Str(choices=("forward",)), "step": sch.Int(lo=0), "rows": sch.Arr("<u4", (None,)),
                    "A": f32_any, "packed": sch.Bool(), "C": sch.ListOf(f64_2d, max_len=100_000),
                    "keep": sch.Bool()}),
        sch.Fields({"op": sch.Str(choices=("backward",)), "step": sch.Int(lo=0), "E": sch.Arr("<f8", (None, None, None)),
                    "dU": sch.Optional(sch.Arr("<f8", (None, None, None))), "summed": sch.Bool()}),
        sch.Fields({"op": sch.Str(choices=("stop",))}),
    ))
    labels = declare(K_LABELS, OWNER, COORDINATOR, "the label owner's labels of every sample (train, validation "
                     "and test: the latter two for model selection and scoring); int64 (n_rows,)",
                     payload=sch.Fields({"y": sch.Arr("<i8", ("n_rows",))}))
    if s.fusion == "trusted":
        return [labels, declare(K_REP, OWNER, COORDINATOR, "trusted fusion: an owner's representations h^i of "
                                "every sample IN THE CLEAR (the paper's base setting); float64 (n_rows, d_i)",
                                payload=sch.Fields({"h": sch.Arr("<f8", ("n_rows", None))}))]
    return [labels, share_decl, *result_decls,
            declare(K_OP, COORDINATOR, HOLDER, "one step of the first layer on shares: forward (batch rows, "
                    "public Â float32, a graph per sample as its upper triangle, and C_i = P_iᵀW_0ᵀ) or backward (public "
                    "E = Âᵀδ and, to t holders only, δ, both scaled by the batch size), or stop", payload=op)]


def _cfg(cfg) -> Settings:
    """The settings of a run's [algorithm] table (what the audit and receipt checks get)."""
    return cfg if isinstance(cfg, Settings) else parse_settings(Settings, dict(cfg or {}), NAME)


# ------------------------------------------------------------------------------------ data
_TRAFFIC_LOCK = threading.Lock()


def _traffic_once(*key):
    # the owners of one host process are threads: simulate once per process, not once per owner at a time
    with _TRAFFIC_LOCK:
        return _traffic(*key)


@functools.lru_cache(maxsize=2)
def _traffic(name: str, seed: int, n_windows: int | None, data_dir: str | None, speeds: str | None = None,
             labels: str | None = None):
    from fedhet.algorithms import data_traffic
    if speeds is not None:
        return data_traffic.load_real(speeds, labels, name, data_dir)
    return data_traffic.simulate(name, seed=seed, n_windows=n_windows, data_dir=data_dir)


def provenance(s) -> str:
    if s.dataset == "vowels":
        return "real (UCI Japanese Vowels)"
    if s.speeds_file is not None:
        return f"real speeds ({s.speeds_file}) with user-given labels ({s.labels_file}): {s.dataset}"
    from fedhet.algorithms.data_traffic import provenance as traffic_provenance
    return f"{traffic_provenance(s.dataset)}: {s.dataset}"


def traffic_graph(s, data_dir=None) -> np.ndarray:
    from fedhet.algorithms.data_traffic import load_graph
    adj = load_graph(s.dataset, data_dir)[1]
    k = s.n_sensors or adj.shape[0]
    return adj[:k, :k]


def n_owners(s, data_dir=None) -> int:
    if s.dataset == "vowels":
        return 12
    return s.n_sensors or traffic_graph(s, data_dir).shape[0]


def _path(p: str | None, ctx: PartyContext) -> str | None:
    """A user's file, relative to the federation file's folder."""
    if p is None:
        return None
    from pathlib import Path
    q = Path(p).expanduser()
    return str(q if q.is_absolute() or ctx.base_dir is None else Path(ctx.base_dir) / q)


def load_data(s: Settings, ctx: PartyContext):
    if ctx.role in (HOLDER, COORDINATOR):
        return {"adj": traffic_graph(s, ctx.data_dir) if (ctx.role == COORDINATOR and s.graph == "given") else None}
    if ctx.role != OWNER:
        raise ValueError(f"f3: unknown role {ctx.role!r} (roles: {OWNER}, {HOLDER}, {COORDINATOR})")
    want = n_owners(s, ctx.data_dir)
    if ctx.n_of_role != want:
        raise ValueError(f"f3: data set {s.dataset!r} has {want} owners' series (n_sensors for traffic), the "
                         f"federation has {ctx.n_of_role} owners")
    c = ctx.index
    if s.dataset == "vowels":
        parts = T.vowels_parts(s.split_seed, s.val_fraction, ctx.data_dir)
        raw = {k: (S.owner(c)[i], S.lengths[i], S.labels[i]) for k, (S, i) in parts.items()}
        n_classes = 9
    else:
        data = _traffic_once(s.dataset, s.data_seed, s.n_windows, ctx.data_dir, _path(s.speeds_file, ctx),
                             _path(s.labels_file, ctx))
        if s.speeds_file is not None and len(data.y) != sum(n_rows(s)):
            raise ValueError(f"f3: {s.speeds_file} gives {len(data.y)} windows; set n_windows = {len(data.y)} so "
                             "every party agrees on the split sizes")
        raw = {k: (data.x[i, c, :, None], None, data.y[i]) for k, i in data.split.items()}
        n_classes = 2
    out = T.standardise_owner(raw, padded=s.dataset == "vowels")
    return {"splits": out, "n_classes": n_classes, "index": c}


# ------------------------------------------------------------------------- holder algebra
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


def holder_forward(shares: list, rows: np.ndarray, A: np.ndarray, C: list, s) -> tuple:
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
                    s) -> tuple:
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


# ---------------------------------------------------------------------------------- roles
def _threads(s) -> None:
    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)
        try:   # numpy's BLAS too: the holders' share products are BLAS calls, and on a shared machine
            # a second BLAS thread mostly spins (py-spy put the holders in gemm, not in our code)
            from threadpoolctl import threadpool_limits
            threadpool_limits(s.torch_threads)
        except ImportError:  # pragma: no cover - scikit-learn brings it
            pass


def owners_in_order(party) -> list[str]:
    return [n for n, r in party.roles.items() if r == OWNER]


@dataclass
class LocalStage:
    """One owner's Algorithm 1 lines 1-4: its frozen model's representations of every sample and more."""
    reps: np.ndarray           # (n_rows, d_i): train, validation, test rows in that order
    y: np.ndarray              # the owner's labels of the same rows
    test_probabilities: np.ndarray
    info: dict
    seconds: float


def pretrain_owner(s, data, index: int, n_owners: int, device: str = "cpu", progress=None) -> LocalStage:
    """Eq. (3) on owner ``index``'s own series (``load_data``'s output), alone, then h_k^i for every sample."""
    width = owner_widths(s, n_owners)[index]
    sp = data["splits"]
    (x, ln, y), (xv, lv, yv), (xt, lt, yt) = sp["train"], sp["val"], sp["test"]
    cfg = T.LocalConfig(hidden=width, epochs=s.local_epochs, patience=s.local_patience, lr=s.local_lr,
                        batch=s.local_batch, seed=s.seed * 100_003 + index, device=device)
    t0 = time.perf_counter()
    model, info = T.train_local(x, ln, y, xv, lv, yv, data["n_classes"], cfg, progress=progress)
    reps = np.concatenate([T.represent(model, a, b, device) for a, b in ((x, ln), (xv, lv), (xt, lt))])
    pt = T.local_probabilities(model, xt, lt, device)
    return LocalStage(reps, np.concatenate([y, yv, yt]).astype(np.int64), pt, {**info, "width": width},
                      time.perf_counter() - t0)


def owner(party, s: Settings, data) -> dict:
    _threads(s)
    order = owners_in_order(party)
    idx = order.index(party.name)
    st = pretrain_owner(s, data, idx, len(order), party.device,
                        progress=lambda e, v: party.progress(e, s.local_epochs, val_loss=round(v, 4)))
    reps, yt = st.reps, data["splits"]["test"][2]
    t0 = time.perf_counter()
    if s.fusion == "shamir":
        holders = party.peers_with_role(HOLDER)
        # |h| < 1 (an LSTM's hidden state): a public bound, so the holders learn nothing from max_abs
        ss.share_to_holders(party, reps, holders, s.t, P_SHARE, frac_bits=s.frac_bits, max_abs=1.0, tag="h")
    else:
        party.send(party.peers_with_role(COORDINATOR)[0], K_REP, {"h": reps})
    if idx == 0:
        party.send(party.peers_with_role(COORDINATOR)[0], K_LABELS, {"y": st.y})
    upload_s = time.perf_counter() - t0
    return {"index": idx, "width": st.info["width"], "local_epochs": st.info["epochs"],
            "local_val_loss": st.info["val_loss"], "local_test": T.scores(st.test_probabilities, yt, data["n_classes"]),
            "local_test_entropy": [float(v) for v in T.entropy(st.test_probabilities)],
            "local_s": st.seconds, "upload_s": upload_s,
            "bytes_sent": sum(party.bytes_sent.values())}


def holder(party, s: Settings, data) -> dict:
    _threads(s)
    order = owners_in_order(party)
    coord = party.peers_with_role(COORDINATOR)[0]
    got = ss.receive_shares(party, order, P_SHARE, t=s.t, tag="h")
    total = sum(n_rows(s))
    widths = owner_widths(s, len(order))
    for o, w in zip(order, widths):
        if got[o].shape != (total, w):
            raise ValueError(f"f3 holder {party.name}: {o!r} shared an array of shape {got[o].shape}, the settings "
                             f"say ({total}, {w})")
    shares = OwnerShares([got[o] for o in order])
    n = len(order)
    G, g_rows, g_step, steps, busy = None, None, None, 0, 0.0
    while True:
        msg = party.recv(coord, K_OP)
        if msg["op"] == "stop":
            break
        t0 = time.perf_counter()
        if msg["op"] == "forward":
            rows, A, C = np.asarray(msg["rows"], dtype=np.int64), np.asarray(msg["A"]), msg["C"]
            if rows.size == 0 or rows.size > MAX_BATCH or int(rows.max()) >= total:
                raise ValueError(f"f3 holder {party.name}: {K_OP} step {msg['step']} asks for rows outside "
                                 f"0..{total - 1} or more than {MAX_BATCH}")
            if msg["packed"]:
                if A.shape != (rows.size, n * (n + 1) // 2):
                    raise ValueError(f"f3 holder {party.name}: {K_OP} step {msg['step']}: packed Â {A.shape}, "
                                     f"expected ({rows.size}, {n * (n + 1) // 2})")
                A = unpack_symmetric(A, n)
            if len(C) != n or any(np.shape(c) != (w, s.hidden) for c, w in zip(C, widths)) or \
                    A.shape[-2:] != (n, n) or (A.ndim == 3 and A.shape[0] != rows.size):
                raise ValueError(f"f3 holder {party.name}: {K_OP} step {msg['step']}: Â {A.shape} or C_i shapes "
                                 f"do not fit {n} owners, batch {rows.size}, hidden {s.hidden}")
            U, Gs = holder_forward(shares, rows, A.astype(np.float64), [np.asarray(c) for c in C], s)
            G, g_rows, g_step = (Gs if msg["keep"] else None), rows, msg["step"]
            ss.send_to_coordinator(party, coord, U, P_PRE, tag=f"u{msg['step']}")
        else:
            if g_rows is None or msg["step"] != g_step or (G is None and msg["dU"] is not None):
                raise ValueError(f"f3 holder {party.name}: backward step {msg['step']} without its forward")
            E = np.asarray(msg["E"])
            if E.shape != (g_rows.size, n, s.hidden):
                raise ValueError(f"f3 holder {party.name}: E has shape {E.shape}, expected "
                                 f"({g_rows.size}, {n}, {s.hidden})")
            dC, dA = holder_backward(shares, g_rows, G, E, msg["dU"], msg["summed"], s)
            ss.send_to_coordinator(party, coord, dC, P_GRAD, tag=f"g{msg['step']}")
            if dA is not None:
                ss.send_to_coordinator(party, coord, dA, P_ADJ, tag=f"a{msg['step']}")
        steps += 1
        busy += time.perf_counter() - t0
    return {"steps": steps, "compute_s": busy, "bytes_sent": sum(party.bytes_sent.values()),
            "bytes_received": sum(party.bytes_received.values())}


class HolderLink:
    """The coordinator's side of the holders: one forward / backward request, one reconstruction each."""

    def __init__(self, party, s: Settings):
        self.party, self.s = party, s
        self.holders = party.peers_with_role(HOLDER)
        self.asked = list(self.holders)
        self.step, self.max_err, self.wait_s = 0, 0.0, 0.0

    def _ask(self) -> list[str]:
        """This step's holders: all, or t of them in turn, so that every holder idles one step in m / (m - t)
        and on a machine with fewer cores than holders the asked ones do not share a core."""
        m, t = len(self.holders), self.s.t
        if self.s.ask == "all" or m == t:
            return list(self.holders)
        return [self.holders[(self.step + i) % m] for i in range(t)]

    def _rebuild(self, prefix: str, tag: str, asked: list[str] | None = None) -> np.ndarray:
        r = ss.reconstruct_at_coordinator(self.party, self.holders, self.s.t, prefix, tag=tag,
                                          asked=self.asked if asked is None else asked)
        self.max_err = max(self.max_err, float(r.err))
        return r.value

    def forward(self, rows: np.ndarray, A: np.ndarray, C: list[np.ndarray], keep: bool) -> np.ndarray:
        self.step += 1
        self.asked = self._ask()
        t0 = time.perf_counter()
        packed = A.ndim == 3   # a graph per sample, symmetric: its upper triangle is enough
        self.party.broadcast(K_OP, {"op": "forward", "step": self.step, "rows": rows.astype(np.uint32),
                                    "A": pack_symmetric(A).astype(np.float32) if packed else A.astype(np.float32),
                                    "packed": packed, "C": C, "keep": keep}, to=self.asked)
        U = self._rebuild(P_PRE, f"u{self.step}")
        self.wait_s += time.perf_counter() - t0
        return U

    def backward(self, E: np.ndarray, dU: np.ndarray | None, summed: bool):
        t0 = time.perf_counter()
        adj_holders = self.asked[:self.s.t]   # dÂ needs exactly t shares: ask no more holders than that
        for h in self.asked:
            self.party.send(h, K_OP, {"op": "backward", "step": self.step, "E": E, "summed": summed,
                                      "dU": dU if h in adj_holders else None})
        dC = self._rebuild(P_GRAD, f"g{self.step}")
        dA = None
        if dU is not None:
            r = ss.reconstruct_at_coordinator(self.party, self.holders, self.s.t, P_ADJ, tag=f"a{self.step}",
                                              asked=adj_holders)
            self.max_err = max(self.max_err, float(r.err))
            dA = unpack_symmetric(r.value, E.shape[1]) * 0.5
        self.wait_s += time.perf_counter() - t0
        return dC, dA

    def stop(self):
        self.party.broadcast(K_OP, {"op": "stop"}, to=self.holders)


class InProcessHolders:
    """:class:`HolderLink`'s arithmetic without parties: shares made here, every holder's step run on its own
    shares, any t reconstructed.  For tests and the leakage benchmark (same functions as the federation)."""

    def __init__(self, reps: list[np.ndarray], s, m: int = 3, seed: int = 0):
        from fedhet.crypto.prg import PRG
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


class _OnShares(torch.autograd.Function):
    """U = Â H W_0 from the holders; its backward asks them for dC (-> dW_0, dP_i) and dÂ (module docstring)."""

    @staticmethod
    def forward(ctx, layer, rows, A, W, *Ps):
        C = layer.publics(W, Ps)
        # a per-sample Â travels as its upper triangle (HolderLink.forward); normalise_adj makes Â exactly
        # symmetric (f3_models), so the holders' mirrored Â is the coordinator's
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
        hidden = W.shape[0]
        dev, dt = W.device, W.dtype
        if summed:
            dCs = [torch.as_tensor(dC / scale, dtype=dt, device=dev).reshape(-1, hidden)]
        else:
            cuts = np.cumsum([0] + [w * hidden for w in layer.widths])
            dCs = [torch.as_tensor(dC[a:b] / scale, dtype=dt, device=dev).reshape(-1, hidden)
                   for a, b in zip(cuts[:-1], cuts[1:])]
        # C_i = P_iᵀ Wᵀ (W = W_0.weight, hidden x d):  dP_i = Wᵀ dC_iᵀ,  dW = (Σ_i P_i dC_i)ᵀ
        if layer.align == "none":
            dW, dPs = dCs[0].T, []
        elif layer.align == "tied":
            dW, dPs = (Ps[0] @ dCs[0]).T, [W.T @ dCs[0].T]
        else:
            dW = sum(P @ c for P, c in zip(Ps, dCs)).T
            dPs = [W.T @ c.T for c in dCs]
        gA = None
        if need_A:
            gA = torch.as_tensor(dA / scale, dtype=A.dtype, device=A.device)
        return (None, None, gA, dW, *dPs)


class SharedFirstLayer:
    """``rows -> (A -> Â H W_0)`` computed by the share holders (:func:`fedhet.algorithms.f3_training.train_global`)."""

    def __init__(self, model, link: HolderLink, widths: list[int]):
        self.model, self.link, self.widths = model, link, widths
        self.align, self.n = model.align, model.n

    def publics(self, W, Ps):
        if self.align == "none":
            return [W.T] * self.n
        if self.align == "tied":
            return [Ps[0].T @ W.T] * self.n
        return [P.T @ W.T for P in Ps]

    def __call__(self, rows: np.ndarray):
        model = self.model

        def first(A):
            W = model.W0.weight
            if self.align == "none":
                Ps = []
            elif self.align == "tied":
                Ps = [model.P]
            else:
                Ps = model.alignments()
            return _OnShares.apply(self, np.asarray(rows), A, W, *Ps)
        return first


def coordinator(party, s: Settings, data) -> dict:
    _threads(s)
    order = owners_in_order(party)
    n = len(order)
    widths = owner_widths(s, n)
    if s.align == "none" and any(w != s.d for w in widths):
        raise ValueError(f"f3: align 'none' stacks the representations as they are, so every d_i must equal "
                         f"d = {s.d}; got {widths}")
    tr, va, te = n_rows(s)
    t0 = time.perf_counter()
    y = np.asarray(party.recv(order[0], K_LABELS)["y"])
    reps = None
    if s.fusion == "trusted":
        reps = [np.asarray(party.recv(o, K_REP)["h"]) for o in order]
        for o, h, w in zip(order, reps, widths):
            if h.shape != (tr + va + te, w) or not np.all(np.isfinite(h)):
                raise ValueError(f"f3: {K_REP} from {o!r}: shape {h.shape}, expected ({tr + va + te}, {w}), "
                                 "finite values")
    wait_upload_s = time.perf_counter() - t0
    n_classes = int(y.max()) + 1 if s.dataset == "vowels" else 2
    n_classes = max(n_classes, 9 if s.dataset == "vowels" else 2)
    gcfg = T.GlobalConfig(d=s.d, hidden=s.hidden, align=s.align, graph=s.graph, tau=s.tau,
                          test_samples=s.test_samples, epochs=s.epochs, patience=s.patience, lr=s.lr,
                          batch=s.batch, seed=s.seed, device=party.device)
    model = T.build_global(n, widths, n_classes, gcfg, given=data.get("adj"))
    link = None
    if s.fusion == "shamir":
        link = HolderLink(party, s)
        first = SharedFirstLayer(model, link, widths)
    else:
        first = T.plain_first_layer(model, reps)
    pos = np.arange(tr + va + te)
    trp, vap, tep = pos[:tr], pos[tr:tr + va], pos[tr + va:]
    history = T.train_global(model, first, y, trp, vap, gcfg,
                             progress=lambda e, r: (party.progress(e, s.epochs, val_loss=round(r["val_loss"], 4)),
                                                    party.metric(val_loss=r["val_loss"], val_f1=r["val_f1"])))
    t0 = time.perf_counter()
    p_test = T.predict(model, first, tep, s.batch)
    infer_s = time.perf_counter() - t0
    if link is not None:
        link.stop()
    out = {"fusion": s.fusion, "dataset": s.dataset, "provenance": provenance(s), "n_owners": n,
           "align": s.align, "graph": s.graph, "epochs": len(history), "history": history,
           "test": T.scores(p_test, y[tep], n_classes), "val_best_loss": min(h["val_loss"] for h in history),
           "epoch_s": [h["epoch_s"] for h in history], "inference_s": infer_s, "wait_upload_s": wait_upload_s,
           "test_probabilities": p_test.tolist(),
           "bytes_sent": sum(party.bytes_sent.values()), "bytes_received": sum(party.bytes_received.values())}
    if link is not None:
        out.update({"max_fixed_point_err": link.max_err, "holder_wait_s": link.wait_s, "steps": link.step})
    return out


ROLES = {OWNER: owner, HOLDER: holder, COORDINATOR: coordinator}

ALGORITHM = Algorithm(
    name=NAME, summary="F³: frozen local LSTMs, representations Shamir-shared to holders, a GCN over a learned "
                       "consensus graph trained by the coordinator on reconstructed linear results",
    roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings, sizes=sizes,
    headline=("test",))
