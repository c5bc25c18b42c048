"""One split-learning driver: the host's and the guests' training loops, with pluggable links.

Split learning over vertically partitioned rows (the rows aligned by PSI first): the *host* holds
the labels and some features, each *guest* more features of the same rows and a bottom model.
Per mini-batch the host names the rows (their positions in the common list), every guest computes
its bottom model's output on them, a *link* carries that output to the host (in the clear, or as
the guest's part of an encrypted interactive layer), the host computes its model and the loss,
and the gradient goes back the same way; every party steps its own optimiser.

* :func:`train_host` — the host's loop: batch order (:func:`toolkit.epoch_permutation` on the
  schedule's key, one permutation per epoch), forward through the links, loss
  (:func:`toolkit.class_loss`), backward, optimiser steps, optional batch budget, evaluation on
  the test rows, per-epoch metrics and progress, timings and training traffic.
* :func:`serve_guest` — a guest's loop: receive the next batch from its link, run its bottom model
  (:class:`GuestBottom`), send the output, receive the gradient, step.
* Host-side links (:class:`HostLink`), one per guest: :class:`ClearHostLink` (activations and
  gradients in the clear over the party channel), :class:`HEHostLink` (the guest's part of an
  interactive layer under Paillier or CKKS, :mod:`fedhet.protocols.he_interactive`) and
  :class:`LocalLink` (the guest's bottom model in this process, for plaintext references, through
  an optional :class:`PlainLinearLayer`: the interactive layer in the clear).  Guest-side links
  (:class:`GuestLink`): :class:`ClearGuestLink`, :class:`HEGuestLink`.

Any number of guests and any bottom and host models: the host's model is a
:class:`HostPart` whose ``forward(x_batch, outputs)`` takes the links' outputs in link order
(STFL's hierarchical network concatenates them; the HE split network adds them to its own part of
the interactive layer).  Configurations: ``stfl.py`` (``variant = "hierarchical"``: clear links,
kinds ``split/*``), ``he_split`` (HE links, kind ``hes/batch``, and its plaintext reference with
local links).  The batch messages of the two link families keep their own payloads (clear:
``{"op", "rows"}``; HE: ``{"pos", "train", "stop", "round"}``) so that existing runs, transcripts
and declarations are unchanged.

Resume: both loops take the state they handed their ``checkpoint`` callback (after every training
batch, step = training batches done, a true boundary on both sides: the host has sent the batch's
last message and the guest received it) and go on exactly where it was: the host's model and
optimisers, its position in the epoch order and the losses so far; a guest's bottom model, optimiser
and counters (:func:`torch_state` / :func:`load_torch_state`).  What a link holds (e.g. the shares of
an HE interactive layer) is the caller's to keep.

Separate optimisers over disjoint parameters equal one joint optimiser, so with local links the
loop computes exactly joint backprop of the whole network (tested), and over clear links exactly
what local links compute (tested); HE links agree within the fixed-point error of the layer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.toolkit import (HostRows, accuracy, as_tensor, batch_slices, class_loss, epoch_permutation,
                                       label_tensor, predict_classes, traffic_totals)
from fedhet.parties.api import PeerFault
from fedhet.parties.contract import PartyLike

# ------------------------------------------------------------------------------ interfaces


class HostLink(Protocol):
    """The host's end of one guest's link.  Per batch the driver calls ``begin`` on every link,
    then ``start_forward`` on every link (guests work in parallel), then ``finish_forward``; for
    a training batch, after the loss, ``send_gradient`` on every link, the host's optimiser
    steps, then ``finish_backward``.  ``stop`` ends the guest's loop."""

    def begin(self, rows: np.ndarray, train: bool, step: int) -> None: ...
    def start_forward(self) -> None: ...
    def finish_forward(self) -> np.ndarray | torch.Tensor: ...
    def send_gradient(self, grad: torch.Tensor) -> None: ...
    def finish_backward(self) -> None: ...
    def stop(self) -> None: ...


class GuestLink(Protocol):
    """A guest's end of its link: ``next_batch`` -> (positions in the common list, train?) or
    None when the host stops; ``forward`` delivers the bottom model's output; for a training
    batch ``backward`` returns d loss / d output."""

    def next_batch(self) -> tuple[np.ndarray, bool] | None: ...
    def forward(self, out: torch.Tensor, train: bool) -> None: ...
    def backward(self) -> np.ndarray | torch.Tensor: ...


class HELayerHost(Protocol):
    """The host side of one encrypted interactive layer (``he_interactive.host_layer``), as the links use it."""

    def recv_acts(self) -> None: ...
    def send_forward(self) -> None: ...
    def recv_forward(self) -> np.ndarray: ...
    def send_gradient(self, delta_ps: np.ndarray) -> None: ...
    def finish_backward(self) -> None: ...


class HELayerGuest(Protocol):
    """The guest side of one encrypted interactive layer (``he_interactive.guest_layer``)."""

    def forward(self, A: np.ndarray, train: bool) -> None: ...
    def backward(self) -> np.ndarray: ...


@dataclass
class HostPart:
    """The host's network: ``forward(x_batch, link_outputs) -> logits`` (one logit for two
    classes, see ``toolkit.logit_width``), the module holding its parameters, its optimisers."""

    module: nn.Module
    forward: Callable[[torch.Tensor, list[torch.Tensor]], torch.Tensor]
    optimizers: list[torch.optim.Optimizer]


@dataclass
class Schedule:
    """How the host trains: ``epochs`` over its training rows in mini-batches of ``batch_size``,
    each epoch's order ``toolkit.epoch_permutation(order_key, epoch, n)``; at most
    ``max_batches`` training batches (None: all); ``evaluate`` the test rows afterwards;
    ``round_per``: what ``party.round`` (the envelope's round) counts, "batch" or "epoch"."""

    epochs: int
    batch_size: int
    order_key: int | Sequence[int]
    max_batches: int | None = None
    evaluate: bool = True
    round_per: str = "batch"

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"epochs and batch_size must be >= 1, got {self.epochs}, {self.batch_size}")
        if self.max_batches is not None and self.max_batches < 1:
            raise ValueError(f"max_batches must be >= 1, got {self.max_batches}")
        if self.round_per not in ("batch", "epoch"):
            raise ValueError(f"round_per must be 'batch' or 'epoch', got {self.round_per!r}")


class GuestBottom:
    """A guest's bottom model over its common rows ``x`` (float32, the common list's order) and
    its optimiser."""

    def __init__(self, model: nn.Module, x: np.ndarray | torch.Tensor, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        dev = next(model.parameters()).device
        self.x = as_tensor(x, dev)
        self._out: torch.Tensor | None = None
        # (rows, output) -> what leaves the party (DP: clipped and noised per row); None: the output itself
        self.release: Callable[[np.ndarray, torch.Tensor], torch.Tensor] | None = None

    @property
    def n_rows(self) -> int:
        return int(self.x.shape[0])

    def forward(self, rows: np.ndarray, train: bool) -> torch.Tensor:
        """The model's output on common rows ``rows``; a training output is kept for ``backward``."""
        idx = torch.as_tensor(np.asarray(rows), dtype=torch.long, device=self.x.device)
        if train:
            self.model.train()
            out = self.model(self.x[idx])
            self._out = out if self.release is None else self.release(np.asarray(rows), out)
            return self._out
        self.model.eval()
        with torch.no_grad():
            out = self.model(self.x[idx])
            return out if self.release is None else self.release(np.asarray(rows), out)

    def backward(self, grad: np.ndarray | torch.Tensor) -> None:
        """One optimiser step from d loss / d output of the last training ``forward``."""
        if self._out is None:
            raise RuntimeError("backward without a training forward")
        self.optimizer.zero_grad(set_to_none=True)
        self._out.backward(as_tensor(grad, self._out.device, self._out.dtype))
        self.optimizer.step()
        self._out = None


# ------------------------------------------------------------------------------ checkpoints
Checkpoint = Callable[[int, dict[str, Any]], None]   # (training batches done, the loop's state)


def torch_state(module: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> dict[str, Any]:
    """A model's and its optimisers' state, as a checkpoint holds it."""
    return {"module": module.state_dict(), "optimizers": [o.state_dict() for o in optimizers]}


def load_torch_state(module: nn.Module, optimizers: Sequence[torch.optim.Optimizer], state: Mapping[str, Any]) -> None:
    """Load what :func:`torch_state` gave back into the same model and optimisers."""
    module.load_state_dict(state["module"])
    for o, st in zip(optimizers, state["optimizers"], strict=True):
        o.load_state_dict(st)


# ------------------------------------------------------------------------------ the loops


def _traffic(party: PartyLike | None) -> tuple[int, int]:
    """(sent, received) bytes so far (:func:`toolkit.traffic_totals`); none without a party."""
    if party is None:
        return 0, 0
    t = traffic_totals(party)
    return t["bytes_sent"], t["bytes_received"]


def _outputs(links: Sequence[HostLink], device: torch.device) -> list[torch.Tensor]:
    for ln in links:
        ln.start_forward()
    out = []
    for ln in links:
        z = ln.finish_forward()
        out.append(as_tensor(z.detach() if torch.is_tensor(z) else z, device))
    return out


def host_step(host: HostPart, links: Sequence[HostLink], xb: torch.Tensor, yb: torch.Tensor) -> float:
    """One training batch on the host (every link already ``begin``-ed); returns the batch loss."""
    zs = [z.requires_grad_(True) for z in _outputs(links, xb.device)]
    loss = class_loss(host.forward(xb, zs), yb)
    for o in host.optimizers:
        o.zero_grad(set_to_none=True)
    loss.backward()
    for ln, z in zip(links, zs):
        assert z.grad is not None  # every link output takes part in the loss
        ln.send_gradient(z.grad)
    for o in host.optimizers:
        o.step()
    for ln in links:
        ln.finish_backward()
    return float(loss.detach())


def evaluate_host(host: HostPart, links: Sequence[HostLink], x: np.ndarray, y: np.ndarray, pos: np.ndarray,
                  batch_size: int, step: int = 0) -> float:
    """Accuracy on rows ``x``/``y`` at common positions ``pos``, in batches through the links."""
    dev = next(host.module.parameters()).device
    xt = as_tensor(x, dev)
    host.module.eval()
    preds = []
    for i in range(0, len(pos), batch_size):
        p = pos[i:i + batch_size]
        for ln in links:
            ln.begin(p, False, step)
        zs = _outputs(links, dev)
        with torch.no_grad():
            preds.append(predict_classes(host.forward(xt[i:i + len(p)], zs)))
    host.module.train()
    return accuracy(np.concatenate(preds) if preds else np.zeros(0, dtype=np.int64), y)


@dataclass(frozen=True)
class BatchBudget:
    """How many training batches the host runs: ``per_epoch`` batches in an epoch of ``n_train`` rows, ``budget``
    in all (the schedule's epochs, cut at ``max_batches``), over ``epochs`` epochs (the last maybe cut)."""

    n_train: int
    per_epoch: int
    budget: int
    epochs: int

    @classmethod
    def of(cls, schedule: Schedule, n_train: int) -> "BatchBudget":
        if n_train == 0:
            raise ValueError("no training rows")
        per_epoch = -(-n_train // schedule.batch_size)
        budget = schedule.epochs * per_epoch
        if schedule.max_batches is not None:
            budget = min(budget, schedule.max_batches)
        return cls(n_train, per_epoch, budget, -(-budget // per_epoch))


@dataclass
class HostState:
    """What the host's loop carries across batches (its checkpoint, with the model's and the optimisers' state):
    the training batches done, the epoch under way with its batch losses and sizes so far, each finished epoch's
    mean batch loss and mean row loss, and where its clock and traffic counters stand (``t0``, ``bytes0``: as if
    training had never stopped, so that ``train_s`` and ``train_bytes`` run on across a resume)."""

    done: int = 0
    epoch: int = 0
    batch_losses: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    row_losses: list[float] = field(default_factory=list)
    t0: float = 0.0
    bytes0: tuple[int, int] = (0, 0)

    def state(self, host: HostPart, party: PartyLike | None) -> dict[str, Any]:
        return {"torch": torch_state(host.module, host.optimizers), "done": self.done, "epoch": self.epoch,
                "losses": self.losses, "row_losses": self.row_losses, "batch_losses": self.batch_losses,
                "sizes": self.sizes, "train_s": self.train_s(), "train_bytes": self.train_bytes(party)}

    @classmethod
    def restored(cls, saved: Mapping[str, Any], host: HostPart, party: PartyLike | None) -> "HostState":
        """The state :meth:`state` gave (loaded into ``host``), or the first batch's when ``saved`` is empty."""
        if saved:
            load_torch_state(host.module, host.optimizers, saved["torch"])
        prior_s, prior_bytes = float(saved.get("train_s", 0.0)), saved.get("train_bytes", (0, 0))
        now = _traffic(party)
        return cls(int(saved.get("done", 0)), int(saved.get("epoch", 0)), list(saved.get("batch_losses", [])),
                   list(saved.get("sizes", [])), list(saved.get("losses", [])), list(saved.get("row_losses", [])),
                   t0=time.perf_counter() - prior_s,
                   bytes0=(now[0] - int(prior_bytes[0]), now[1] - int(prior_bytes[1])))

    def train_s(self) -> float:
        return time.perf_counter() - self.t0

    def train_bytes(self, party: PartyLike | None) -> tuple[int, int]:
        now = _traffic(party)
        return now[0] - self.bytes0[0], now[1] - self.bytes0[1]

    def begin_epoch(self, epoch: int, schedule: Schedule, n_train: int) -> list[np.ndarray]:
        """Epoch ``epoch``'s batches still to run: all of a new epoch, those after the ones done of a resumed one."""
        if epoch != self.epoch:
            self.epoch, self.batch_losses, self.sizes = epoch, [], []
        order = epoch_permutation(schedule.order_key, epoch, n_train)
        return batch_slices(order, schedule.batch_size)[len(self.batch_losses):]

    def add_batch(self, loss: float, size: int) -> None:
        self.batch_losses.append(loss)
        self.sizes.append(size)
        self.done += 1

    def end_epoch(self) -> float | None:
        """The epoch's mean batch loss and mean row loss onto the traces; the former, or None for no batches."""
        if not self.batch_losses:
            return None
        self.losses.append(float(np.mean(self.batch_losses)))
        total = 0.0
        for loss, m in zip(self.batch_losses, self.sizes):   # in order: the sum the results were made with
            total += loss * m
        self.row_losses.append(total / sum(self.sizes))
        return self.losses[-1]


def train_host(host: HostPart, links: Sequence[HostLink], rows: HostRows, n_classes: int, schedule: Schedule,
               party: PartyLike | None = None, resume: Mapping[str, Any] | None = None,
               checkpoint: Checkpoint | None = None) -> dict[str, Any]:
    """The host's whole training run (then the test pass unless ``schedule.evaluate`` is off).

    ``rows`` holds ``x_train, y_train, pos_train, x_test, y_test, pos_test`` (``toolkit.HostRows``).
    Returns ``test_accuracy`` (None without evaluation), ``losses`` (per epoch, the mean of the
    batch losses), ``row_losses`` (per epoch, the mean over its rows), ``batches``,
    ``batches_per_epoch``, ``epochs`` (completed; fractional when ``max_batches`` cut an epoch),
    ``train_s``, ``t_trained`` (``perf_counter`` at the end of training), ``eval_s``,
    ``s_per_batch``, ``s_per_epoch`` (extrapolated from ``s_per_batch`` when
    ``s_per_epoch_extrapolated``) and ``train_bytes`` (sent/received while training).
    ``checkpoint(k, state)`` is called after each training batch (k = batches done); ``resume``:
    such a ``state``, to go on from there.
    """
    dev = next(host.module.parameters()).device
    xtr, ytr = as_tensor(rows.x_train, dev), label_tensor(rows.y_train, n_classes, dev)
    pos_train = np.asarray(rows.pos_train)
    plan = BatchBudget.of(schedule, len(pos_train))
    state = HostState.restored(resume or {}, host, party)
    host.module.train()
    for epoch in range(state.epoch, schedule.epochs):
        _count_round(party, schedule, "epoch", epoch + 1)
        for idx in state.begin_epoch(epoch, schedule, plan.n_train):
            if state.done >= plan.budget:
                break
            _count_round(party, schedule, "batch", state.done)
            for ln in links:
                ln.begin(pos_train[idx], True, state.done)
            state.add_batch(host_step(host, links, xtr[idx], ytr[idx]), len(idx))
            if checkpoint is not None:
                checkpoint(state.done, state.state(host, party))
        _report_epoch(party, state, plan, epoch)
        if state.done >= plan.budget:
            break
    t_trained = time.perf_counter()
    train_s, train_bytes = t_trained - state.t0, state.train_bytes(party)
    acc = (evaluate_host(host, links, rows.x_test, rows.y_test, np.asarray(rows.pos_test), schedule.batch_size,
                         state.done) if schedule.evaluate else None)
    return _host_result(state, plan, acc, t_trained, train_s, train_bytes)


def _count_round(party: PartyLike | None, schedule: Schedule, per: str, value: int) -> None:
    """``party.round`` (the envelope's round) set to ``value`` where the schedule counts rounds ``per``."""
    if party is not None and schedule.round_per == per:
        party.round = value


def _report_epoch(party: PartyLike | None, state: HostState, plan: BatchBudget, epoch: int) -> None:
    """The epoch's losses onto the traces; its metric line and progress when it ran batches."""
    loss = state.end_epoch()
    if loss is not None and party is not None:
        party.metric(epoch=epoch + 1, loss=loss, s=round(state.train_s(), 3))
        party.progress(epoch + 1, plan.epochs, loss=round(loss, 4))


def _host_result(state: HostState, plan: BatchBudget, acc: float | None, t_trained: float, train_s: float,
                 train_bytes: tuple[int, int]) -> dict[str, Any]:
    done, per_epoch = state.done, plan.per_epoch
    s_batch = train_s / max(1, done)
    return {"test_accuracy": acc, "train_s": train_s, "t_trained": t_trained,
            "epochs": done // per_epoch if done % per_epoch == 0 else done / per_epoch, "batches": done,
            "batches_per_epoch": per_epoch, "s_per_batch": s_batch, "s_per_epoch": s_batch * per_epoch,
            "s_per_epoch_extrapolated": done % per_epoch != 0 or done == 0,
            "eval_s": time.perf_counter() - t_trained, "losses": state.losses, "row_losses": state.row_losses,
            "train_bytes": {"sent": train_bytes[0], "received": train_bytes[1]}}


def serve_guest(bottom: GuestBottom, link: GuestLink, resume: Mapping[str, Any] | None = None,
                checkpoint: Checkpoint | None = None) -> dict[str, int]:
    """A guest's loop until the host stops it; returns batch counts and how many distinct common
    rows it trained on.  ``checkpoint(k, state)`` is called after each training batch (k = batches
    done); ``resume``: such a ``state``, to go on from there."""
    saved = dict(resume or {})
    if saved:
        load_torch_state(bottom.model, [bottom.optimizer], saved["torch"])
    n_train, n_eval = int(saved.get("train_batches", 0)), int(saved.get("eval_batches", 0))
    used = np.array(saved.get("used", np.zeros(bottom.n_rows, dtype=bool)), dtype=bool)
    while (batch := link.next_batch()) is not None:
        rows, train = batch
        out = bottom.forward(rows, train)
        link.forward(out, train)
        if train:
            bottom.backward(link.backward())
            n_train += 1
            used[np.asarray(rows)] = True
            if checkpoint is not None:
                checkpoint(n_train, {"torch": torch_state(bottom.model, [bottom.optimizer]), "train_batches": n_train,
                                     "eval_batches": n_eval, "used": used})
        else:
            n_eval += 1
    return {"train_batches": n_train, "eval_batches": n_eval, "rows_trained_on": int(used.sum())}


# ------------------------------------------------------------------------------ clear links


@dataclass(frozen=True)
class SplitKinds:
    """Message kinds of a clear link: the batch announcement (host -> guest: ``{"op": "train" |
    "eval" | "stop", "rows": [positions]}``, no arrays), the activation (guest -> host: ``{"a":
    float32 (batch, width)}``) and the gradient (host -> guest: ``{"g": same shape}``)."""

    batch: str
    activation: str
    gradient: str


def _describe(a: Any) -> str:
    return f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', []))}"


class ClearHostLink:
    """Host end of a clear link to ``guest``, whose output is ``width`` wide."""

    def __init__(self, party: PartyLike, guest: str, kinds: SplitKinds, width: int, timeout: float | None = None,
                 name: str = "split"):
        self.party, self.guest, self.kinds, self.width = party, guest, kinds, int(width)
        self.timeout, self.name = timeout, name
        self._n = 0

    def begin(self, rows: np.ndarray, train: bool, step: int) -> None:
        self._n = len(rows)
        self.party.send(self.guest, self.kinds.batch, {"op": "train" if train else "eval",
                                                       "rows": np.asarray(rows).tolist()})

    def start_forward(self) -> None:
        pass

    def finish_forward(self) -> np.ndarray:
        msg = self.party.recv(self.guest, self.kinds.activation, timeout=self.timeout)
        a = msg.get("a") if isinstance(msg, dict) else None
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.shape != (self._n, self.width):
            raise PeerFault(self.name, self.guest, self.kinds.activation, "must be float32 "
                             f"({self._n}, {self.width}), got {_describe(a)}")
        return a

    def send_gradient(self, grad: torch.Tensor) -> None:
        self.party.send(self.guest, self.kinds.gradient,
                        {"g": grad.detach().cpu().numpy().astype(np.float32, copy=False)})

    def finish_backward(self) -> None:
        pass

    def stop(self) -> None:
        self.party.send(self.guest, self.kinds.batch, {"op": "stop", "rows": []})


class ClearGuestLink:
    """Guest end of a clear link from ``host``; batches name positions among ``n_rows`` common
    rows, at most ``batch_size`` of them.  ``party.round`` counts the training batches done."""

    def __init__(self, party: PartyLike, host: str, kinds: SplitKinds, n_rows: int, batch_size: int,
                 timeout: float | None = None, name: str = "split"):
        self.party, self.host, self.kinds = party, host, kinds
        self.n_rows, self.batch_size, self.timeout, self.name = int(n_rows), int(batch_size), timeout, name
        self._shape: tuple[int, ...] = ()
        self._trained = 0

    def next_batch(self) -> tuple[np.ndarray, bool] | None:
        msg = self.party.recv(self.host, self.kinds.batch, timeout=self.timeout)
        op, rows = (msg.get("op"), msg.get("rows")) if isinstance(msg, dict) else (None, None)
        if op == "stop":
            return None
        if op not in ("train", "eval") or not isinstance(rows, list) or not rows or len(rows) > self.batch_size \
                or not all(isinstance(r, int) and 0 <= r < self.n_rows for r in rows):
            raise PeerFault(self.name, self.host, self.kinds.batch, f"op {op!r}, rows must be "
                             f"1..{self.batch_size} positions in 0..{self.n_rows - 1}")
        return np.asarray(rows, dtype=np.int64), op == "train"

    def forward(self, out: torch.Tensor, train: bool) -> None:
        self._shape = tuple(out.shape)
        self.party.send(self.host, self.kinds.activation,
                        {"a": out.detach().cpu().numpy().astype(np.float32, copy=False)})

    def backward(self) -> np.ndarray:
        msg = self.party.recv(self.host, self.kinds.gradient, timeout=self.timeout)
        g = msg.get("g") if isinstance(msg, dict) else None
        if not isinstance(g, np.ndarray) or g.dtype != np.float32 or g.shape != self._shape:
            raise PeerFault(self.name, self.host, self.kinds.gradient, "must be float32 "
                             f"{list(self._shape)}, got {_describe(g)}")
        self._trained += 1
        self.party.round = self._trained
        return g


# --------------------------------------------------------------------------------- HE links


class HEHostLink:
    """Host end of an encrypted interactive layer to ``guest``: ``layer`` is
    ``he_interactive.host_layer`` (set up); batches are announced with ``batch_kind``
    (``{"pos": uint32 positions, "train", "stop": False, "round"}``; ``{"stop": True}`` ends).
    The output is the guest's share of the layer's pre-activation, A_g W_g (float64)."""

    def __init__(self, party: PartyLike, guest: str, layer: HELayerHost, batch_kind: str):
        self.party, self.guest, self.layer, self.batch_kind = party, guest, layer, batch_kind

    def begin(self, rows: np.ndarray, train: bool, step: int) -> None:
        self.party.send(self.guest, self.batch_kind, {"pos": np.asarray(rows, dtype=np.uint32), "train": bool(train),
                                                      "stop": False, "round": int(step)})

    def start_forward(self) -> None:
        self.layer.recv_acts()
        self.layer.send_forward()

    def finish_forward(self) -> np.ndarray:
        return self.layer.recv_forward()

    def send_gradient(self, grad: torch.Tensor) -> None:
        # The layer protocol takes per-sample d loss / d output (the loss is a batch mean).
        self.layer.send_gradient(grad.double().cpu().numpy() * grad.shape[0])

    def finish_backward(self) -> None:
        self.layer.finish_backward()

    def stop(self) -> None:
        self.party.send(self.guest, self.batch_kind, {"stop": True})


class HEGuestLink:
    """Guest end of an encrypted interactive layer: ``layer`` is ``he_interactive.guest_layer``
    (set up); batches name positions among ``n_rows`` common rows; ``party.round`` follows the
    host's ``round``."""

    def __init__(self, party: PartyLike, host: str, layer: HELayerGuest, batch_kind: str, n_rows: int):
        self.party, self.host, self.layer, self.batch_kind, self.n_rows = party, host, layer, batch_kind, int(n_rows)

    def next_batch(self) -> tuple[np.ndarray, bool] | None:
        # {"stop": True} or {"pos": uint32 (<= batch_size,), "train", "stop", "round"}: checked against the
        # kind's schema on receipt; what it cannot know is the number of common rows.
        msg = self.party.recv(self.host, self.batch_kind)
        if msg["stop"]:
            return None
        pos = np.asarray(msg.get("pos", []), dtype=np.int64)
        if len(pos) == 0 or pos.max() >= self.n_rows:
            raise PeerFault(self.party.name, self.host, self.batch_kind, f"positions outside the {self.n_rows} common rows")
        self.party.round = int(msg["round"])
        return pos, bool(msg["train"])

    def forward(self, out: torch.Tensor, train: bool) -> None:
        self.layer.forward(out.detach().double().cpu().numpy(), train)

    def backward(self) -> np.ndarray:
        return self.layer.backward()


# ------------------------------------------------------------------------------ local links


@dataclass
class PlainLinearLayer:
    """A guest's part ``W`` (d x K) of an interactive layer in the clear, trained by SGD with
    learning rate ``lr``: what the HE links compute, without encryption (references).
    Forward ``A W``; backward from d loss / d output G of a batch of b rows (mean loss):
    input gradient ``G W^T`` and ``W -= lr * A^T G``, in float64."""

    W: np.ndarray
    lr: float
    _A: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.W = np.array(self.W, dtype=np.float64)

    def forward(self, out: torch.Tensor) -> np.ndarray:
        self._A = out.detach().double().cpu().numpy()
        return self._A @ self.W

    def backward(self, grad: torch.Tensor) -> np.ndarray:
        if self._A is None:
            raise RuntimeError("backward without a forward")
        b = grad.shape[0]
        delta = grad.double().cpu().numpy() * b  # per sample, as the HE layer receives it
        g_in = delta @ self.W.T / b
        self.W = self.W - self.lr * (self._A.T @ delta) / b
        return g_in


class LocalLink:
    """A guest's bottom model run by the host's process (plaintext references): its output goes
    to the host as is, or through ``layer`` (:class:`PlainLinearLayer`)."""

    def __init__(self, bottom: GuestBottom, layer: PlainLinearLayer | None = None):
        self.bottom, self.layer = bottom, layer
        self._rows, self._train = np.zeros(0, dtype=np.int64), False

    def begin(self, rows: np.ndarray, train: bool, step: int) -> None:
        self._rows, self._train = np.asarray(rows), bool(train)

    def start_forward(self) -> None:
        self._out = self.bottom.forward(self._rows, self._train)

    def finish_forward(self) -> np.ndarray | torch.Tensor:
        return self._out.detach() if self.layer is None else self.layer.forward(self._out)

    def send_gradient(self, grad: torch.Tensor) -> None:
        self._grad = grad

    def finish_backward(self) -> None:
        self.bottom.backward(self._grad if self.layer is None else self.layer.backward(self._grad))

    def stop(self) -> None:
        pass
