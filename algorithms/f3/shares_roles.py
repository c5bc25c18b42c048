"""F³'s holder and coordinator with ``fusion = "shares"`` (the maths: :mod:`fedhet.algorithms.f3.shares`); the
owners upload exactly as with mpc (replicated shares of h, ``f3/rss/share``).

holder       step 1: every owner's pairs (``f3/rss/share``) and the coordinator's pair of the one-hot labels
             (``f3/y/share``) received, the keys exchanged (``f3/rss/key``, every incarnation), the initial
             weights drawn jointly (:func:`~fedhet.algorithms.f3.shares.init_model`); then ``f3/op`` requests:
             train (one SGD step, its hit count to the coordinator, ``f3/shares/hits``), eval (a split's summed
             confusion matrix, ``f3/shares/confusion``), epoch (a checkpoint: shares only; the weights kept as the
             best when told), final (the best weights back, opened with ``open_model``: ``f3/shares/model``), stop;
             its trained part (:func:`~fedhet.algorithms.f3.model.holder_part`): its pairs of those weights and Â
coordinator  step 1: the labels from the label owner, shared to the holders; every epoch: the batches (the trusted
             loop's order, :func:`~fedhet.algorithms.f3.training.train_global`'s generator), the train accuracy
             from the opened counts, the validation confusion matrix -> macro F1 (early stopping on it); at the
             end the test split's confusion matrix -> test macro F1 and accuracy

A checkpoint holds shares only: a holder's pairs of h, of the labels, of the weights, their momentum and the best
weights; the coordinator's holds the labels (it had them), the batch generator, the history and counters.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedhet.algorithms.f3 import shares as S
from fedhet.algorithms.f3.data import provenance
from fedhet.algorithms.f3.messages import COORDINATOR, HOLDER, OWNER, Kind
from fedhet.algorithms.f3.model import coordinator_part, holder_part
from fedhet.algorithms.f3.settings import Settings
from fedhet.algorithms.f3.mpc import receive_holder_shares
from fedhet.algorithms.f3.training import batches, build_global, class_count, global_config, sample_positions
from fedhet.algorithms.toolkit import Phases, traffic_totals
from fedhet.parties.api import PeerFault
from fedhet.parties.contract import PartyLike
from fedhet.protocols import replicated as rs
from fedhet.protocols import replicated_share as rsh

LABELS_KIND = Kind.Y_PREFIX + "/share"


def _pairs(d: dict) -> dict[str, rs.Rss]:
    return {k: rs.Rss(np.asarray(x["a"]), np.asarray(x["b"])) for k, x in d.items()}


def _state(d: dict[str, rs.Rss]) -> dict:
    return {k: {"a": x.a, "b": x.b} for k, x in d.items()}


# ------------------------------------------------------------------------------------------------ holder

@dataclass
class SharesHolderState:
    """A holder's private checkpoint: its pairs of every owner's h (n, rows, d_i), of the one-hot labels, of the
    weights and their momentum (:class:`~fedhet.algorithms.f3.shares.SharedModel`), of the best weights so far,
    and its counters."""
    X: dict
    Y: dict
    model: dict
    best: dict | None = None
    steps: int = 0
    compute_s: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)

    def state(self) -> dict:
        return {"X": self.X, "Y": self.Y, "model": self.model, "best": self.best, "steps": self.steps,
                "compute_s": self.compute_s, "counters": self.counters}

    @classmethod
    def restored(cls, saved: dict) -> "SharesHolderState":
        return cls(**saved)


def shape_of(s: Settings, n: int, width: int, classes: int) -> S.Shape:
    return S.Shape(n, width, s.d, s.hidden, classes, s.align)


def holder(party: PartyLike, s: Settings, order: list[str], total: int, widths: list[int]) -> dict:
    """The holder role with fusion "shares"."""
    coord = party.peer_with_role(COORDINATOR)
    holders = [p for p, r in party.roles.items() if r == HOLDER]
    start, saved = party.restore()
    if start:
        st = SharesHolderState.restored(saved)
        h = rsh.connect(party, holders, Kind.RSS_PREFIX)         # fresh keys in every incarnation
    else:
        got = receive_holder_shares(party, s, order, total, widths)
        X = {"a": np.stack([g["a"] for g in got]), "b": np.stack([g["b"] for g in got])}
        y = rsh.receive_shares(party, [coord], LABELS_KIND, {coord: (total, None)}, S.F)[coord]
        if y.shape[1] < 2:
            raise PeerFault(party.name, coord, LABELS_KIND, f"labels one-hot over {y.shape[1]} classes, expected >= 2")
        h = rsh.connect(party, holders, Kind.RSS_PREFIX)
        shape = shape_of(s, len(order), widths[0], y.shape[1])
        rng = np.random.default_rng(None if s.init_seed is None else [s.init_seed, rsh.holder_index(holders)[party.name]])
        model = S.init_model(h, shape, rng)
        st = SharesHolderState(X, {"a": y.a, "b": y.b}, model.state())
        party.checkpoint(1, st.state())
    ops = SharesHolderOps(party, s, coord, st, h, len(order), total)
    while (msg := party.recv(coord, Kind.OP))["op"] != "stop":
        t0 = time.perf_counter()
        ops.serve(msg)
        if msg["op"] in ("train", "eval"):
            st.steps += 1
            st.compute_s += time.perf_counter() - t0
    # its trained part: its pairs of the final (best) weights and the public Â, never the opened weights
    if ops.A is None:
        raise PeerFault(party.name, coord, Kind.OP, "stopped before any step that sends Â")
    party.save_model(*holder_part(ops.model, ops.shape, ops.A, owners=order,
                                  holder=rsh.holder_index(holders)[party.name], dataset=s.dataset))
    return {"steps": st.steps, "compute_s": st.compute_s, **ops.counters(), **traffic_totals(party)}


class SharesHolderOps:
    """A holder's answers to the coordinator's ``f3/op`` requests (fusion "shares")."""

    def __init__(self, party: PartyLike, s: Settings, coord: str, st: SharesHolderState, h: rs.Holder, n: int,
                 total: int):
        self.party, self.s, self.coord, self.st, self.h, self.n, self.total = party, s, coord, st, h, n, total
        self.X = rs.Rss(np.asarray(st.X["a"]), np.asarray(st.X["b"]))
        self.Y = rs.Rss(np.asarray(st.Y["a"]), np.asarray(st.Y["b"]))
        self.model = S.SharedModel.restored(st.model)
        self.shape = shape_of(s, n, self.X.shape[2], self.Y.shape[1])
        self.before = dict(st.counters)
        self.A: np.ndarray | None = None    # the public Â of the last step (for the trained part)

    def _rows_A(self, msg: dict) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(msg["rows"], dtype=np.int64)
        A = np.asarray(msg["A"], dtype=np.float64)
        if rows.size == 0 or int(rows.max()) >= self.total:
            raise PeerFault(self.party.name, self.coord, Kind.OP, f"{msg['op']} step {msg['step']} asks for rows "
                            f"outside 0..{self.total - 1}")
        if A.shape != (self.n, self.n):
            raise PeerFault(self.party.name, self.coord, Kind.OP, f"{msg['op']} step {msg['step']}: Â {A.shape}, "
                            f"expected ({self.n}, {self.n})")
        self.A = A
        return rows, A

    def serve(self, msg: dict) -> None:
        party, coord, h = self.party, self.coord, self.h
        if msg["op"] == "train":
            rows, A = self._rows_A(msg)
            if rows.size >= 1 << S.MAX_ROWS_BITS:
                raise PeerFault(party.name, coord, Kind.OP, f"train step {msg['step']}: a batch of {rows.size} rows")
            lion = self.s.optimizer == "lion"
            count = S.train_step(h, self.model, self.shape, self.X[:, rows], self.Y[rows], A,
                                 self.s.lion_lr if lion else self.s.sgd_lr, self.s.momentum, self.s.optimizer)
            rsh.send_open(party, coord, Kind.SHARES_HITS, count, msg["step"])
        elif msg["op"] == "eval":
            rows, A = self._rows_A(msg)
            acc = None
            for lo in range(0, rows.size, self.s.batch):
                r = rows[lo:lo + self.s.batch]
                logits, _ = S.forward(h, self.model, self.shape, self.X[:, r], A)
                c = S.confusion(h, logits, self.Y[r])
                acc = c if acc is None else rs.add(acc, c)
            assert acc is not None
            rsh.send_open(party, coord, Kind.SHARES_CONFUSION, acc, msg["step"])
        elif msg["op"] == "epoch":
            if msg["best"]:
                self.st.best = _state(self.model.w)
            self.st.model, self.st.counters = self.model.state(), self.counters()
            party.checkpoint(msg["checkpoint"], self.st.state())
        elif msg["op"] == "final":
            if self.st.best is not None:
                self.model.w = _pairs(self.st.best)
            if msg["open"]:
                if not self.s.open_model:
                    raise PeerFault(party.name, coord, Kind.OP, "asked to open the model, but open_model = false")
                flat, _ = S.cat([self.model.w[k] for k in sorted(self.model.w)])
                rsh.send_open(party, coord, Kind.SHARES_MODEL, flat, 0)

    def counters(self) -> dict[str, int]:
        return {"rounds": self.before.get("rounds", 0) + self.h.rounds,
                "words_sent": self.before.get("words_sent", 0) + self.h.words_sent}


# ------------------------------------------------------------------------------------------- coordinator

class SharesLink:
    """The coordinator's side of the three holders: it sends rows and the public Â, and opens counts only."""

    def __init__(self, party: PartyLike, A: np.ndarray):
        self.party = party
        self.holders = party.peers_with_role(HOLDER)
        rsh.holder_index(self.holders)   # exactly three
        self.A = np.asarray(A, dtype=np.float32)
        self.step, self.wait_s = 0, 0.0

    def _ask(self, op: str, rows: np.ndarray, kind: str) -> np.ndarray:
        self.step += 1
        t0 = time.perf_counter()
        self.party.broadcast(Kind.OP, {"op": op, "step": self.step, "rows": np.asarray(rows).astype(np.uint32),
                                       "A": self.A}, to=self.holders)
        out = rsh.open_at(self.party, self.holders, kind, self.step)
        self.wait_s += time.perf_counter() - t0
        return out

    def train(self, rows: np.ndarray) -> int:
        return int(self._ask("train", rows, Kind.SHARES_HITS).view(np.int64)[0])

    def confusion(self, rows: np.ndarray) -> np.ndarray:
        return rs.decode(self._ask("eval", rows, Kind.SHARES_CONFUSION), S.F)

    def epoch(self, step: int, best: bool) -> None:
        self.party.broadcast(Kind.OP, {"op": "epoch", "checkpoint": step, "best": best}, to=self.holders)

    def final(self, open_model: bool) -> np.ndarray | None:
        self.party.broadcast(Kind.OP, {"op": "final", "open": open_model}, to=self.holders)
        return rs.decode(rsh.open_at(self.party, self.holders, Kind.SHARES_MODEL, 0), S.F) if open_model else None

    def stop(self) -> None:
        self.party.broadcast(Kind.OP, {"op": "stop"}, to=self.holders)


def coordinator(party: PartyLike, s: Settings, data: dict, order: list[str], widths: list[int]) -> dict:
    """The coordinator role with fusion "shares"."""
    holders = party.peers_with_role(HOLDER)
    start, saved = party.restore()
    if start:
        y, phases, training, link_state = (saved["y"], Phases.restored(saved["phases"]), saved["training"],
                                           saved["link"])
    else:
        phases = Phases()
        with phases.timed("wait_upload"):
            y = np.asarray(party.recv(order[0], Kind.LABELS)["y"])
        k = class_count(s, y)
        onehot = np.eye(k, dtype=np.int64)[y] << S.F
        rsh.share_to_holders(party, onehot.view(np.uint64), holders, LABELS_KIND, S.F)
        training, link_state = {}, None
        party.checkpoint(1, {"y": y, "phases": phases.state(), "training": training, "link": link_state})
    n_classes = class_count(s, y)
    gcfg = global_config(s, party.device)
    model = build_global(len(order), widths, n_classes, gcfg, given=data.get("adj"))
    with torch.no_grad():
        A = model.adj(1).double().cpu().numpy()
    link = SharesLink(party, A)
    if link_state is not None:
        link.step, link.wait_s = link_state["step"], link_state["wait_s"]
    train_pos, val_pos, test_pos = sample_positions(s)
    gen = torch.Generator().manual_seed(s.seed)
    history: list[dict] = list(training.get("history", []))
    best, since = training.get("best", -1.0), training.get("since", 0)
    if "batches" in training:
        gen.set_state(training["batches"])
    stop = training.get("stop", False)
    while not stop and len(history) < s.epochs:
        t0 = time.perf_counter()
        hits = sum(link.train(train_pos[b]) for b in batches(len(train_pos), s.batch, gen))
        conf = link.confusion(val_pos)
        f1 = S.macro_f1(conf)
        rec = {"epoch": len(history) + 1, "train_accuracy": hits / len(train_pos), "val_f1": f1,
               "val_accuracy": float(np.trace(conf) / max(conf.sum(), 1e-12)), "epoch_s": time.perf_counter() - t0}
        history.append(rec)
        improved = f1 > best + 1e-9
        best, since = (f1, 0) if improved else (best, since + 1)
        stop = since >= s.patience or len(history) >= s.epochs
        party.progress(len(history), s.epochs, val_f1=round(f1, 4))
        party.metric(val_f1=f1, train_accuracy=rec["train_accuracy"])
        step = 1 + len(history)
        link.epoch(step, improved)
        party.broadcast(Kind.EPOCH, {"checkpoint": step, "last": stop}, to=order)
        for o, msg in party.gather(Kind.EPOCH_DONE, frm=order).items():
            if msg["checkpoint"] != step:
                raise PeerFault(party.name, o, Kind.EPOCH_DONE, f"answered the end of checkpoint step {step} with "
                                f"{msg['checkpoint']}")
        training = {"history": history, "best": best, "since": since, "batches": gen.get_state(), "stop": stop}
        party.checkpoint(step, {"y": y, "phases": phases.state(), "training": training,
                                "link": {"step": link.step, "wait_s": link.wait_s}})
    with phases.timed("inference", party.device):
        weights = link.final(s.open_model)
        conf = link.confusion(test_pos)
    link.stop()
    if weights is not None:
        load_opened(model, weights, S.Shape(len(order), widths[0], s.d, s.hidden, n_classes, s.align))
        party.save_model(*coordinator_part(model, owners=order, widths=widths, n_classes=n_classes,
                                           fusion=s.fusion, dataset=s.dataset))
    test = {"f1": S.macro_f1(conf), "accuracy": float(np.trace(conf) / max(conf.sum(), 1e-12))}
    return {"fusion": s.fusion, "dataset": s.dataset, "provenance": provenance(s), "n_owners": len(order),
            "align": s.align, "graph": s.graph, "epochs": len(history), "history": history, "test": test,
            "test_confusion": conf.tolist(), "val_best_f1": best, "epoch_s": [h["epoch_s"] for h in history],
            "inference_s": phases.last("inference"), "wait_upload_s": phases.last("wait_upload"),
            "model_opened": weights is not None, **traffic_totals(party), "holder_wait_s": link.wait_s,
            "steps": link.step}


def load_opened(model: Any, flat: np.ndarray, shape: S.Shape) -> None:
    """The opened weights (sorted by name, flattened, as the holders send them) into the GlobalGCN."""
    at, got = 0, {}
    params = shape.params()
    for k in sorted(params):
        shp = params[k][0]
        size = int(np.prod(shp))
        got[k] = torch.as_tensor(flat[at:at + size].reshape(shp), dtype=torch.float32)
        at += size
    with torch.no_grad():
        model.W0.weight.copy_(got["W0"])
        model.W1.weight.copy_(got["W1"])
        if "P" in got:
            for i, p in enumerate(model.P):
                p.copy_(got["P"][i])


__all__ = ["holder", "coordinator", "SharesHolderOps", "SharesLink", "SharesHolderState", "OWNER"]
