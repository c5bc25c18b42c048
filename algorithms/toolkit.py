"""Building blocks every fedhet learning algorithm shares (one definition of each idea).

An algorithm module assembles its roles from these instead of writing its own copy:

=====================  =========================================================================
idea                   names
=====================  =========================================================================
seeds                  :func:`derive_seed` (the one derivation for new code); the frozen ones
                       models were trained with: :func:`frozen_seed` (STFL, HyFEM),
                       :func:`crc32_seed` (the HE split network); numpy streams
                       :func:`stream_rng` with the named tags of :class:`Stream`
devices                :func:`resolve_device` (a ``torch.device`` from ``parties.api.device_name``,
                       the one resolution of a device spec)
seeded RNG             :func:`seeded` (fork torch's global RNG, seed it, serialise such blocks
                       across threads)
tensors                :func:`as_tensor`, :func:`synchronize`
classification         :func:`logit_width`, :func:`label_tensor`, :func:`class_loss`,
                       :func:`predict_classes`, :func:`class_probabilities`, :func:`accuracy`
networks               :data:`ACTIVATIONS`, :func:`make_activation`, :func:`hidden_width`,
                       :func:`mlp_from_widths`, :func:`mlp`
scaling                :class:`Scaler` (z-score with a party's own training-row statistics),
                       :class:`Standardise` (the same in torch, for exported parts scoring raw rows)
batch order            :func:`epoch_permutation` (keyed, one permutation per epoch),
                       :func:`batch_slices`, :func:`shuffled_batches` (a torch RNG stream)
PSI-aligned views      :func:`align_host_rows` -> :class:`HostRows`, :func:`align_guest_rows`
                       -> :class:`GuestRows`, :func:`sorted_intersection` (PSI's sorted order,
                       computed in one process for references); :data:`PSIBackend` and
                       :func:`psi_backend_setting` (the ``psi_backend`` key of every vertical
                       algorithm and of ``fedhet predict``)
a role's result        :class:`Phases` (every timing under one convention, ``<phase>_s``, the
                       report's), :func:`traffic_totals` (bytes as the runtime counted them)
the federation         :func:`role_members` (a role's parties, in federation order)
=====================  =========================================================================

Everything here but :class:`Phases` is deterministic given its inputs; nothing touches the network.
"""
from __future__ import annotations

import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

# The named numpy streams live in fedhet.algorithms.streams (numpy only, so jobs without torch use
# them too); the toolkit is their face.
from fedhet.algorithms.streams import Stream, stream_rng  # noqa: F401
from fedhet.parties.api import device_name
from fedhet.parties.settings import setting

# ----------------------------------------------------------------------------------- seeds


def derive_seed(seed: int, *tags: int | str) -> int:
    """A 63-bit seed for one model or stream from the run seed and tags (client index, "unique"...).

    numpy's ``SeedSequence`` over the words ``[seed, *tags]`` (a string tag contributes its UTF-8
    bytes, an int itself), so distinct tag tuples give independent streams.  CHFL's seeds.
    """
    words = [int(seed)]
    for t in tags:
        words.extend(t.encode() if isinstance(t, str) else [int(t)])
    state = np.random.SeedSequence(words).generate_state(2, dtype=np.uint32)
    return int.from_bytes(state.tobytes(), "little") & ((1 << 63) - 1)


def frozen_seed(seed: int, *tags: int | str) -> int:
    """The 31-bit seed STFL and HyFEM were trained with: CRC-32 of ``repr((seed, *tags))``.

    Kept so that their models stay the same for the same seed; new algorithms use
    :func:`derive_seed`.
    """
    return crc32_seed(repr((int(seed), *tags)), 31)


def crc32_seed(key: str, bits: int = 32) -> int:
    """CRC-32 of the text ``key``, keeping its low ``bits`` bits (31 or 32).

    The derivation STFL (key ``repr((seed, *tags))``, 31 bits) and the HE split network (key
    ``f"{seed}/he_split/{what}"``, 32 bits) were trained with; it stays so that their models are
    the same for the same seed.  New algorithms use :func:`derive_seed`.
    """
    if bits not in (31, 32):
        raise ValueError(f"crc32_seed keeps 31 or 32 bits, got {bits}")
    return zlib.crc32(key.encode()) & ((1 << bits) - 1)


# ---------------------------------------------------------------------------- devices, RNG


def resolve_device(device: str | torch.device | None = "cpu") -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when torch sees it) as a torch device:
    :func:`fedhet.parties.api.device_name`, the one resolution of a device spec.

    Asking for CUDA where torch sees none is an error, never a silent fall-back to the CPU.
    """
    return torch.device(device_name(None if device is None else str(device)))


# fork_rng saves and restores process-wide state: two threads (parties of an in-memory run)
# inside seeded blocks at once would draw from and restore each other's state.
_RNG_LOCK = threading.RLock()


@contextmanager
def seeded(seed: int, device: str | torch.device | None = None) -> Iterator[None]:
    """Run the block on torch's global RNG seeded with ``seed``, restoring the caller's state after.

    The CPU generator (and that of ``device`` when it is a CUDA device) is forked; draws inside
    (weight init, ``randperm``, ``randn_like``) depend only on ``seed``.  Blocks are serialised
    across threads of one process, so a block must never wait for another party's message.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    cuda = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with _RNG_LOCK, torch.random.fork_rng(devices=cuda):
        torch.manual_seed(int(seed))
        yield


def as_tensor(x: Any, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``x`` (numpy array, list, tensor) as a ``dtype`` tensor on ``device``."""
    t = torch.as_tensor(np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x, dtype=dtype)
    return t.to(device)


def synchronize(device: str | torch.device) -> None:
    """Wait for queued CUDA work on ``device`` (before reading a wall clock); no-op on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- classification


def logit_width(n_classes: int) -> int:
    """One logit for two classes (binary cross-entropy), one per class otherwise."""
    if n_classes < 2:
        raise ValueError(f"need at least 2 classes, got {n_classes}")
    return 1 if n_classes == 2 else n_classes


def label_tensor(y: Any, n_classes: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """Labels ``0..n_classes-1`` checked and typed for :func:`class_loss`: float32 for two classes
    (BCE targets), int64 otherwise."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    if len(y) and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(f"labels must be in 0..{n_classes - 1}, got range {y.min()}..{y.max()}")
    return as_tensor(y, device, torch.float32 if n_classes == 2 else torch.long)


def class_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean classification loss over the batch: binary cross-entropy on one logit, else
    cross-entropy over the class logits (the width says which, see :func:`logit_width`)."""
    if logits.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(logits.squeeze(1), y.to(logits.dtype))
    return F.cross_entropy(logits, y.long())


def predict_classes(logits: torch.Tensor) -> np.ndarray:
    """Class decisions (int64 numpy): logit > 0 for one logit, else the arg-max."""
    if logits.shape[1] == 1:
        return (logits.squeeze(1) > 0).long().cpu().numpy()
    return logits.argmax(1).cpu().numpy()


def class_probabilities(logits: torch.Tensor) -> torch.Tensor:
    """Class probabilities (rows, classes): ``[1 - p, p]`` with ``p = sigmoid(logit)`` for one logit,
    else the softmax (the decisions of :func:`predict_classes` are their arg-max)."""
    if logits.shape[1] == 1:
        p = torch.sigmoid(logits)
        return torch.cat([1 - p, p], dim=1)
    return torch.softmax(logits, dim=1)


def accuracy(pred: Any, y: Any) -> float:
    """Share of ``pred`` equal to ``y`` (0.0 for no rows)."""
    pred, y = np.asarray(pred), np.asarray(y)
    if pred.shape != y.shape:
        raise ValueError(f"{pred.shape} predictions for {y.shape} labels")
    return int((pred == y).sum()) / max(1, len(y))


# --------------------------------------------------------------------------------- networks

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "leaky_relu": nn.LeakyReLU, "sigmoid": nn.Sigmoid}


def make_activation(name: str) -> nn.Module:
    """A fresh activation module by name (one of :data:`ACTIVATIONS`)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


def hidden_width(in_dim: int, mult: float) -> int:
    """``round(mult * in_dim)`` units, at least 2."""
    if in_dim < 1 or mult <= 0:
        raise ValueError(f"need in_dim >= 1 and mult > 0, got {in_dim}, {mult}")
    return max(2, int(round(mult * in_dim)))


def mlp_from_widths(widths: Sequence[int], activation: str = "relu") -> nn.Sequential:
    """``Linear(w0, w1), act, ..., Linear(w_{L-1}, w_L)``: an activation after every layer but the last."""
    widths = [int(w) for w in widths]
    if len(widths) < 2 or min(widths) < 1:
        raise ValueError(f"an MLP needs >= 2 positive widths, got {widths}")
    make_activation(activation)  # check the name before building anything
    mods: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        mods.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            mods.append(make_activation(activation))
    return nn.Sequential(*mods)


def mlp(in_dim: int, out_dim: int, hidden_mult: float = 2.0, layers: int = 1,
        activation: str = "relu") -> nn.Sequential:
    """``layers`` hidden layers of :func:`hidden_width` ``(in_dim, hidden_mult)`` units, then a
    linear output layer of ``out_dim`` units."""
    if layers < 0:
        raise ValueError(f"layers must be >= 0, got {layers}")
    make_activation(activation)
    h = hidden_width(in_dim, hidden_mult)
    return mlp_from_widths([in_dim] + [h] * layers + [out_dim], activation)


# ---------------------------------------------------------------------------------- scaling


@dataclass
class Scaler:
    """Per-column z-score ``(x - mean) / std`` with statistics of one party's own rows; columns
    whose spread is at most ``min_std`` are centred only."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray, min_std: float = 1e-12) -> "Scaler":
        x = np.asarray(x)
        if x.ndim != 2:
            raise ValueError(f"a standardisation is fitted on a 2-D table, got shape {x.shape}")
        if len(x) == 0:
            raise ValueError("cannot fit a standardisation on zero rows")
        std = x.std(axis=0)
        return cls(x.mean(axis=0), np.where(std > min_std, std, 1.0))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mean) / self.std).astype(np.float32)


class Standardise(nn.Module):
    """``(x - mean) / std`` in torch, with a party's own statistics as buffers in their dtype: the
    same elementwise operations as :class:`Scaler` (float32) or a float64 z-score, so an exported
    part scores raw rows exactly as the run scored its standardised ones."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: Any, std: Any) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(np.array(mean)))
        self.register_buffer("std", torch.as_tensor(np.array(std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


# ------------------------------------------------------------------------------ batch order


def epoch_permutation(key: int | Sequence[int], epoch: int, n: int) -> np.ndarray:
    """The order of ``n`` training rows in ``epoch``: numpy's generator seeded with
    ``[*key, epoch]``, so any epoch's order is known without replaying the earlier ones."""
    words = [int(key)] if isinstance(key, (int, np.integer)) else [int(k) for k in key]
    return np.random.default_rng([*words, int(epoch)]).permutation(int(n))


def batch_slices(order: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """``order`` cut into consecutive mini-batches of ``batch_size`` (the last may be shorter)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator | None = None,
                     device: str | torch.device | None = None) -> Iterator[torch.Tensor]:
    """One epoch of mini-batch indices from ``torch.randperm`` (``generator``, or torch's global
    RNG, e.g. inside :func:`seeded`): an RNG stream, each epoch continuing where the last ended."""
    perm = torch.randperm(n, generator=generator, device=device)
    for s in range(0, n, batch_size):
        yield perm[s:s + batch_size]


# ------------------------------------------------------------------------ PSI-aligned views
PSIBackend = Literal["auto", "ecdh", "kkrt", "rr22"]   # fedhet.protocols.psi.CHOICES


def psi_backend_setting(what: str = "aligns the rows") -> Any:
    """The ``psi_backend`` key (a settings field of type :data:`PSIBackend`): ``"auto"`` by default, the
    label owner's choice by its own size (:func:`fedhet.protocols.psi.choose_backend`)."""
    return setting("auto", f"PSI protocol that {what}: auto (the label owner runs rr22 from "
                   f"{_auto_from()} IDs, ecdh below; feature parties follow its first message), ecdh (X25519), kkrt "
                   "(KKRT16) or rr22 (OKVS + silent VOLE); the backend in force is the result's psi_backend")


def _auto_from() -> int:
    from fedhet.protocols.psi import AUTO_RR22_FROM
    return AUTO_RR22_FROM



@dataclass
class HostRows:
    """The label owner's train and test rows that are in the PSI intersection.

    ``pos_*[i]`` is the position in the common list of row ``i`` of ``x_*``/``y_*`` (what the
    host sends the feature parties to name a batch)."""

    x_train: np.ndarray
    y_train: np.ndarray
    pos_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    pos_test: np.ndarray
    n_common: int
    n_dropped: int  # own train/test rows some party lacks (never used)


def align_host_rows(common_rows: Sequence[int] | np.ndarray, x_train: np.ndarray, y_train: np.ndarray,
                    x_test: np.ndarray, y_test: np.ndarray, order: str = "own") -> HostRows:
    """The host's rows in the intersection, from PSI's ``rows`` for the host's IDs listed as
    ``[train IDs..., test IDs...]`` (``common_rows[j]`` = the host row at common position ``j``).

    ``order="own"`` keeps the host's row order, ``"common"`` puts rows in the common list's order
    (the batch order permutes these rows, so the choice is part of an algorithm's results).
    """
    n_tr, n_own = len(x_train), len(x_train) + len(x_test)
    rows = np.asarray(common_rows, dtype=np.int64).reshape(-1)
    if len(rows) and (rows.min() < 0 or rows.max() >= n_own):
        raise ValueError(f"PSI rows must index the host's {n_own} train+test rows, got "
                         f"{rows.min()}..{rows.max()}")
    if len(np.unique(rows)) != len(rows):
        raise ValueError("PSI rows name one host row twice")
    if order == "common":
        pos = np.arange(len(rows))
        is_tr = rows < n_tr
        tr, tr_pos = rows[is_tr], pos[is_tr]
        te, te_pos = rows[~is_tr] - n_tr, pos[~is_tr]
    elif order == "own":
        at = np.full(n_own, -1, dtype=np.int64)
        at[rows] = np.arange(len(rows))
        tr = np.flatnonzero(at[:n_tr] >= 0)
        te = np.flatnonzero(at[n_tr:] >= 0)
        tr_pos, te_pos = at[:n_tr][tr], at[n_tr:][te]
    else:
        raise ValueError(f"order must be 'own' or 'common', got {order!r}")
    return HostRows(x_train[tr], y_train[tr], tr_pos, x_test[te], y_test[te], te_pos,
                    n_common=len(rows), n_dropped=n_own - len(rows))


@dataclass
class GuestRows:
    """A feature party's rows, standardised with the statistics of its rows OUTSIDE the
    intersection (or of all its rows when every row is common)."""

    x_common: np.ndarray  # float32, the common list's order
    x_rest: np.ndarray    # float32, rows outside the intersection in the party's own order
    rest: np.ndarray      # bool mask over the party's rows
    scaler: Scaler


def align_guest_rows(x: np.ndarray, common_rows: Sequence[int] | np.ndarray) -> GuestRows:
    """``x``'s rows at PSI's ``common_rows`` (this party's row of each common ID, in order)."""
    x = np.asarray(x, dtype=np.float32)
    rows = np.asarray(common_rows, dtype=np.int64).reshape(-1)
    if len(rows) and (rows.min() < 0 or rows.max() >= len(x)):
        raise ValueError(f"PSI rows must index this party's {len(x)} rows, got {rows.min()}..{rows.max()}")
    rest = np.ones(len(x), dtype=bool)
    rest[rows] = False
    sc = Scaler.fit(x[rest] if rest.any() else x)
    return GuestRows(sc(x[rows]), sc(x[rest]), rest, sc)


def sorted_intersection(*id_lists: Sequence[Any]) -> tuple[list, list[np.ndarray]]:
    """PSI's ``order="sorted"`` result computed in one process (for plaintext references):
    the IDs common to every list, sorted, and for each list the row of each common ID in it
    (its first occurrence, as PSI reports)."""
    if not id_lists:
        raise ValueError("sorted_intersection needs at least one ID list")
    common = set(id_lists[0])
    for ids in id_lists[1:]:
        common &= set(ids)
    order = sorted(common)
    rows = []
    for ids in id_lists:
        first: dict = {}
        for i, v in enumerate(ids):
            first.setdefault(v, i)
        rows.append(np.array([first[v] for v in order], dtype=np.int64))
    return order, rows


# ------------------------------------------------------------------------- a role's result

@dataclass
class Phases:
    """A role's timings, one convention: each phase's seconds under ``<phase>_s`` (the key the report
    and the benchmarks read), a list with one entry per time the phase ran.  A role times a phase with
    ``with phases.timed("train", device): ...`` (``device``: waits for CUDA before the clock stops),
    puts :meth:`result` into its result and keeps :meth:`state` in its checkpoints."""

    seconds: dict[str, list[float]] = field(default_factory=dict)

    @contextmanager
    def timed(self, phase: str, device: str | torch.device | None = None) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        if device is not None:
            synchronize(device)
        self.add(phase, time.perf_counter() - t0)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds.setdefault(phase, []).append(float(seconds))

    def last(self, phase: str) -> float:
        return self.seconds[phase][-1]

    def result(self) -> dict[str, list[float]]:
        return {f"{k}_s": list(v) for k, v in self.seconds.items()}

    def state(self) -> dict[str, list[float]]:
        return {k: list(v) for k, v in self.seconds.items()}

    @classmethod
    def restored(cls, saved: dict[str, list[float]] | None) -> "Phases":
        return cls({k: list(v) for k, v in (saved or {}).items()})


def role_members(party: Any, role: str) -> list[str]:
    """Every party of ``role``, ``party`` itself included, in federation order (an algorithm's
    "first owner", "first participant": position 0 of this list)."""
    return [n for n, r in party.roles.items() if r == role]


def traffic_totals(party: Any) -> dict[str, int]:
    """The bytes ``party`` sent and received so far, as its runtime counted them (never summed by a role)."""
    return {"bytes_sent": int(sum(party.bytes_sent.values())),
            "bytes_received": int(sum(party.bytes_received.values()))}
