"""F³'s roles (f3.txt, Algorithm 1): ``owner`` (n; the first in federation order is the label owner),
``holder`` (m, fusion "shamir_linear" or "mpc") and ``coordinator``.

owner        lines 1-4: :func:`~fedhet.algorithms.f3.training.pretrain_owner` on its own series, then its
             representations to the holders as t-of-m Shamir shares (``f3/share``) or, with fusion
             "trusted", in the clear to the coordinator (``f3/rep``); the label owner also sends the labels
holder       the first layer and its gradients on its shares, one ``f3/op`` request at a time
             (:class:`ShamirHolderOps`, :class:`MpcHolderOps` under :func:`serve_ops`)
coordinator  lines 5-10: Eq. (8) trained and evaluated with the first layer asked of the holders
             (:class:`HolderLink` under :class:`~fedhet.algorithms.f3.core.SharedFirstLayer`)

Equation -> function (the paper's numbering; the maths live in the modules named):

=====================================  ===========================================================================
Eq. (3), Alg. 1 lines 1-4              :func:`owner` -> :func:`~fedhet.algorithms.f3.training.pretrain_owner` (the
                                       local LSTM, trained alone and frozen; h_k^i for every sample)
Alg. 1 line 5 (the one upload)         :func:`upload_representations` (owner), :func:`receive_uploads` (coordinator,
                                       trusted), :func:`receive_holder_shares` (holder)
Eq. (8), first layer Â H W_0           :meth:`ShamirHolderOps.forward` (:func:`~fedhet.algorithms.f3.core.holder_forward`)
                                       or :meth:`MpcHolderOps.forward` (:func:`~fedhet.algorithms.f3.mpc.forward`),
                                       asked by :class:`HolderLink` / :class:`MpcLink`
Eq. (8), its gradients                 :meth:`ShamirHolderOps.backward`, :meth:`MpcHolderOps.backward`
Eq. (8), Alg. 1 lines 6-7 (training)   :func:`coordinator` -> :func:`~fedhet.algorithms.f3.training.train_global` over
                                       :func:`first_layer` (:class:`CoordinatorEpochs` at every epoch's end)
Eq. (9), the ICDF graph                :func:`~fedhet.algorithms.f3.training.build_global` (coordinator;
                                       :func:`~fedhet.algorithms.f3.models.icdf_sample`)
Alg. 1 lines 8-10 (inference)          :func:`coordinator` -> :func:`~fedhet.algorithms.f3.training.predict`
=====================================  ===========================================================================

Checkpoint step 1: the owners' representations delivered; step 1 + e: e global epochs done (the coordinator tells
the holders, ``f3/op`` "epoch", and the owners, ``f3/epoch``, which answer ``f3/epoch/done``, so every party
checkpoints at every epoch).  An owner keeps its report and its trained part; a holder its shares (secret: its
private checkpoint) and counters (:class:`HolderState`); the coordinator (:class:`CoordinatorState`) the labels
(and, trusted, the representations), the global model, its optimizer, both generators, early stopping and history,
and the holder link's counters.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from fedhet.algorithms.f3.core import OwnerShares, SharedFirstLayer, holder_backward, holder_forward, \
    pack_symmetric, unpack_symmetric
from fedhet.algorithms.f3.data import provenance
from fedhet.algorithms.f3.messages import COORDINATOR, HOLDER, OWNER, Kind
from fedhet.algorithms.f3.model import coordinator_part, owner_part
from fedhet.algorithms.f3.models import GlobalGCN
from fedhet.algorithms.f3.settings import Settings, n_rows, owner_widths
from fedhet.algorithms.f3.training import FirstLayerFor, build_global, entropy, plain_first_layer, predict, \
    pretrain_owner, scores, train_global
from fedhet.algorithms.toolkit import Phases, role_members, traffic_totals
from fedhet.parties.api import PeerFault
from fedhet.parties.contract import PartyLike
from fedhet.parties.settings import SettingsError
from fedhet.algorithms.f3 import mpc, shares_roles
from fedhet.algorithms.f3.mpc import receive_holder_shares
from fedhet.algorithms.f3.training import class_count, global_config, sample_positions
from fedhet.protocols import replicated as rs
from fedhet.protocols import replicated_share as rsh
from fedhet.protocols import shamir_share as ss


def _threads(s: Settings) -> None:
    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)
        try:   # numpy's BLAS too: the holders' share products are BLAS calls, and on a shared machine
            # a second BLAS thread mostly spins (py-spy put the holders in gemm, not in our code)
            from threadpoolctl import threadpool_limits
            threadpool_limits(s.torch_threads)
        except ImportError:  # pragma: no cover - scikit-learn brings it
            pass


# ------------------------------------------------------------------------------------------------- owner

def owner(party: PartyLike, s: Settings, data: dict) -> dict:
    _threads(s)
    order = role_members(party, OWNER)
    idx = order.index(party.name)
    coord = party.peer_with_role(COORDINATOR)
    start, saved = party.restore()
    if start == 0:
        saved = {"report": _pretrain_and_upload(party, s, data, order, idx, coord), "last": False}
        party.checkpoint(1, saved)
    step = max(start, 1)
    while not saved["last"]:   # the global epochs: checkpoint where the coordinator and the holders do
        msg = party.recv(coord, Kind.EPOCH)
        if msg["checkpoint"] != step + 1:
            raise PeerFault(party.name, coord, Kind.EPOCH, f"ended checkpoint step {msg['checkpoint']}, "
                             f"expected {step + 1}")
        step = msg["checkpoint"]
        party.send(coord, Kind.EPOCH_DONE, {"checkpoint": step})
        saved = {**saved, "last": msg["last"]}
        party.checkpoint(step, saved)
    tensors, meta = saved["report"]["part"]
    party.save_model(tensors, meta)
    return {**{k: v for k, v in saved["report"].items() if k != "part"},
            "bytes_sent": traffic_totals(party)["bytes_sent"]}


def _pretrain_and_upload(party: PartyLike, s: Settings, data: dict, order: list[str], idx: int, coord: str) -> dict:
    """An owner's Algorithm 1 lines 1-5: its local model (Eq. (3)), its representations sent; its report and its
    part."""
    st = pretrain_owner(s, data, idx, len(order), party.device,
                        progress=lambda e, v: party.progress(e, s.local_epochs, val_loss=round(v, 4)))
    yt = data["splits"]["test"][2]
    assert st.model is not None
    raw_x, raw_len = data["raw_test"]
    # its part: the frozen local model with its scaler, checked on its own first test rows (made before the
    # upload, so that the checkpoint of step 1 follows the upload at once)
    part = owner_part(st.model, mean=data["scaler"][0], std=data["scaler"][1], n_classes=data["n_classes"],
                      feature_names=data["feature_names"], raw_x=raw_x, std_x=data["splits"]["test"][0],
                      lengths=raw_len, dataset=s.dataset)
    phases = Phases()
    with phases.timed("upload"):
        upload_representations(party, s, st.reps, coord)
        if idx == 0:
            party.send(coord, Kind.LABELS, {"y": st.y})
    return {"index": idx, "width": st.info["width"], "local_epochs": st.info["epochs"],
            "local_val_loss": st.info["val_loss"], "local_test": scores(st.test_probabilities, yt, data["n_classes"]),
            "local_test_entropy": [float(v) for v in entropy(st.test_probabilities)],
            "local_s": st.seconds, "upload_s": phases.last("upload"), "part": list(part)}


def upload_representations(party: PartyLike, s: Settings, reps: np.ndarray, coord: str) -> None:
    """Algorithm 1 line 5 at an owner: its h for every sample as replicated shares to the three holders (fusion
    "mpc"), t-of-m Shamir shares to the holders ("shamir_linear") or in the clear to the coordinator ("trusted")."""
    if s.fusion in ("mpc", "shares"):
        rsh.share_to_holders(party, rs.encode(reps, mpc.H_BITS, "h").view(np.uint64), party.peers_with_role(HOLDER),
                             Kind.RSS_PREFIX + "/share", mpc.H_BITS)
    elif s.fusion != "trusted":
        holders = party.peers_with_role(HOLDER)
        # |h| < 1 (an LSTM's hidden state): a public bound, so the holders learn nothing from max_abs
        ss.share_to_holders(party, reps, holders, s.t, Kind.SHARE_PREFIX, frac_bits=s.frac_bits, max_abs=1.0, tag="h")
    else:
        party.send(coord, Kind.REP, {"h": reps})


# ------------------------------------------------------------------------------------------------ holder

@dataclass
class HolderState:
    """What a holder carries across epochs (its private checkpoint): its shares of every owner's h as it received
    them (Shamir share states, or fusion "mpc"'s replicated pairs ``{"a", "b"}``), the steps it has served, the
    seconds they took (``compute_s``, one total) and its ops' counters (mpc: rounds and words among the holders)."""

    shares: list[Any]
    steps: int = 0
    compute_s: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)

    def state(self) -> dict:
        return {"shares": self.shares, "steps": self.steps, "compute_s": self.compute_s, "counters": self.counters}

    @classmethod
    def restored(cls, saved: dict) -> "HolderState":
        return cls(saved["shares"], saved["steps"], saved["compute_s"], saved["counters"])

    @contextmanager
    def serving(self) -> Iterator[None]:
        """One step served: counted, and its seconds added to ``compute_s``."""
        t0 = time.perf_counter()
        yield
        self.steps += 1
        self.compute_s += time.perf_counter() - t0

    def result(self, party: PartyLike) -> dict:
        return {"steps": self.steps, "compute_s": self.compute_s, **traffic_totals(party)}


def holder(party: PartyLike, s: Settings, data: dict) -> dict:
    if s.fusion == "trusted":   # nothing would ever reach it: say so now, not after the receive timeout
        raise SettingsError(f"f3: party {party.name!r} is a holder, but fusion = 'trusted' has no holders "
                            f"(the owners send their representations to the coordinator); remove the holders "
                            f"or set fusion = 'shamir_linear' or 'mpc'")
    _threads(s)
    order = role_members(party, OWNER)
    coord = party.peer_with_role(COORDINATOR)
    total = sum(n_rows(s))
    widths = owner_widths(s, len(order))
    if s.fusion == "shares":
        return shares_roles.holder(party, s, order, total, widths)
    state = holder_state(party, s, order, total, widths)
    ops: ShamirHolderOps | MpcHolderOps
    if s.fusion == "mpc":
        ops = MpcHolderOps(party, coord, state.shares, total, widths, state.counters)
    else:
        ops = ShamirHolderOps(party, s, coord, state.shares, total, widths)
    serve_ops(party, coord, state, ops)
    return {**state.result(party), **ops.counters()}


def holder_state(party: PartyLike, s: Settings, order: list[str], total: int, widths: list[int]) -> HolderState:
    """The checkpoint's state, or (step 1) every owner's shares received and checkpointed."""
    start, saved = party.restore()
    if start:
        return HolderState.restored(saved)
    state = HolderState(receive_holder_shares(party, s, order, total, widths))
    party.checkpoint(1, state.state())
    return state


def serve_ops(party: PartyLike, coord: str, state: HolderState, ops: ShamirHolderOps | MpcHolderOps) -> None:
    """The coordinator's ``f3/op`` requests until "stop": a checkpoint at every "epoch", else one forward or
    backward step of ``ops``."""
    while (msg := party.recv(coord, Kind.OP))["op"] != "stop":
        if msg["op"] == "epoch":
            state.counters = ops.counters()
            party.checkpoint(msg["checkpoint"], state.state())
            continue
        with state.serving():
            if msg["op"] == "forward":
                ops.forward(msg)
            else:
                ops.backward(msg)


def _op_rows(party: PartyLike, coord: str, msg: dict, total: int) -> np.ndarray:
    """A forward request's rows, all within the shared arrays' ``total`` rows (at most MAX_BATCH of them: the
    schema's bound)."""
    rows = np.asarray(msg["rows"], dtype=np.int64)
    if rows.size == 0 or int(rows.max()) >= total:
        raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} step {msg['step']} asks for rows outside "
                         f"0..{total - 1}")
    return rows


def _no_forward(party: PartyLike, coord: str, msg: dict) -> PeerFault:
    return PeerFault(party.name, coord, Kind.OP, f"backward step {msg['step']} without its forward")


class ShamirHolderOps:
    """A holder's steps of fusion "shamir_linear": Eq. (8)'s first layer and its gradients on its Shamir shares
    alone, each answer a share for the coordinator to reconstruct; it keeps what a forward leaves its backward."""

    def __init__(self, party: PartyLike, s: Settings, coord: str, shares: list, total: int, widths: list[int]):
        self.party, self.s, self.coord, self.total, self.widths = party, s, coord, total, widths
        self.shares = OwnerShares([ss.share_from_state(a) for a in shares])
        self.n = len(widths)
        self.G: Any = None
        self.g_rows: np.ndarray | None = None
        self.g_step: int | None = None

    def forward(self, msg: dict) -> None:
        n, party, coord = self.n, self.party, self.coord
        rows, A, C = _op_rows(party, coord, msg, self.total), np.asarray(msg["A"]), msg["C"]
        if msg["packed"]:
            if A.shape != (rows.size, n * (n + 1) // 2):
                raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} step {msg['step']}: packed Â {A.shape}, "
                                 f"expected ({rows.size}, {n * (n + 1) // 2})")
            A = unpack_symmetric(A, n)
        if len(C) != n or any(np.shape(c)[0] != w for c, w in zip(C, self.widths)) or \
                A.shape[-2:] != (n, n) or (A.ndim == 3 and A.shape[0] != rows.size):
            raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} step {msg['step']}: Â {A.shape} or C_i shapes "
                             f"do not fit {n} owners, batch {rows.size}, hidden {self.s.hidden}")
        U, Gs = holder_forward(self.shares, rows, A.astype(np.float64), [np.asarray(c) for c in C], self.s)
        self.G, self.g_rows, self.g_step = (Gs if msg["keep"] else None), rows, msg["step"]
        ss.send_to_coordinator(party, coord, U, Kind.PRE_PREFIX, tag=f"u{msg['step']}")

    def backward(self, msg: dict) -> None:
        party, coord, g_rows = self.party, self.coord, self.g_rows
        if g_rows is None or msg["step"] != self.g_step or (self.G is None and msg["dU"] is not None):
            raise _no_forward(party, coord, msg)
        E = np.asarray(msg["E"])
        if E.shape[:2] != (g_rows.size, self.n):
            raise PeerFault(party.name, coord, Kind.OP, f"E has shape {E.shape}, expected "
                             f"({g_rows.size}, {self.n}, {self.s.hidden})")
        dC, dA = holder_backward(self.shares, g_rows, self.G, E, msg["dU"], msg["summed"], self.s)
        ss.send_to_coordinator(party, coord, dC, Kind.GRAD_PREFIX, tag=f"g{msg['step']}")
        if dA is not None:
            ss.send_to_coordinator(party, coord, dA, Kind.ADJ_PREFIX, tag=f"a{msg['step']}")

    def counters(self) -> dict[str, int]:
        return {}


class MpcHolderOps:
    """A holder's steps of fusion "mpc": Eq. (8)'s forward / backward pass, each a computation with the two other
    holders on its pairs of every owner's h (:mod:`fedhet.algorithms.f3.mpc`); it keeps what a forward leaves its
    backward."""

    def __init__(self, party: PartyLike, coord: str, pairs: list[dict], total: int, widths: list[int],
                 before: dict[str, int]):
        self.party, self.coord, self.total, self.widths, self.before = party, coord, total, widths, before
        self.shares = mpc.MpcShares([rs.Rss(np.asarray(p["a"]), np.asarray(p["b"])) for p in pairs])
        holders = [p for p, r in party.roles.items() if r == HOLDER]
        self.h = rsh.connect(party, holders, Kind.RSS_PREFIX)     # fresh keys in every incarnation
        self.kept: dict | None = None
        self.k_step: int | None = None
        self.A: np.ndarray | None = None
        self.W1 = np.zeros((0, 0))

    def forward(self, msg: dict) -> None:
        party, coord, n = self.party, self.coord, len(self.widths)
        rows = _op_rows(party, coord, msg, self.total)
        A = self.A = np.asarray(msg["A"], dtype=np.float64)
        C, W1 = [np.asarray(c) for c in msg["C"]], np.asarray(msg["W1"])
        self.W1 = W1
        if A.shape != (n, n) or len(C) != n or any(c.shape[0] != w for c, w in zip(C, self.widths)):
            raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} step {msg['step']}: Â {A.shape} or C_i shapes "
                             f"do not fit {n} owners of widths {sorted(set(self.widths))}")
        mpc.check_room(A, C, W1)
        logits, self.kept = mpc.forward(self.h, self.shares, rows, A, C, W1)
        self.k_step = msg["step"] if msg["keep"] else None
        rsh.send_open(party, coord, Kind.MPC_LOGITS, logits, msg["step"])

    def backward(self, msg: dict) -> None:
        kept, party, coord = self.kept, self.party, self.coord
        if kept is None or msg["step"] != self.k_step or self.A is None:
            raise _no_forward(party, coord, msg)
        try:
            shape = (kept["rows"].size, self.W1.shape[0])
            dl = rs.Rss(rs.expand(msg["ga"], shape), rs.expand(msg["gb"], shape))
        except ValueError as e:
            raise PeerFault(party.name, coord, Kind.OP, f"backward step {msg['step']}: dℓ {e}") from None
        rsh.send_open(party, coord, Kind.MPC_GRAD, mpc.backward(self.h, self.shares, kept, dl, self.W1, self.A,
                                                                msg["summed"]), msg["step"])
        self.kept = None

    def counters(self) -> dict[str, int]:
        """Rounds and words among the holders, the earlier incarnations' (``before``) included."""
        return {"rounds": self.before.get("rounds", 0) + self.h.rounds,
                "words_sent": self.before.get("words_sent", 0) + self.h.words_sent}


# ------------------------------------------------------------------------------ the coordinator's holder links

class _Link:
    """What both of the coordinator's holder links do alike: the ends of epochs and of the run, their counters."""
    party: PartyLike
    holders: list[str]
    step: int
    max_err: float
    wait_s: float

    def epoch(self, step: int) -> None:
        """A global epoch ended at checkpoint step ``step``: every holder checkpoints there too."""
        self.party.broadcast(Kind.OP, {"op": "epoch", "checkpoint": step}, to=self.holders)

    def state(self) -> dict:
        return {"step": self.step, "max_err": self.max_err, "wait_s": self.wait_s}

    def restore(self, state: dict) -> None:
        self.step, self.max_err, self.wait_s = state["step"], state["max_err"], state["wait_s"]

    def stop(self):
        self.party.broadcast(Kind.OP, {"op": "stop"}, to=self.holders)


class MpcLink(_Link):
    """The coordinator's side of the three mpc holders: it sends the public operands and opens only the logits and
    the batch-summed gradients."""

    def __init__(self, party: PartyLike, s: Settings):
        self.party, self.s = party, s
        self.holders = party.peers_with_role(HOLDER)
        rsh.holder_index(self.holders)   # exactly three
        self.step, self.max_err, self.wait_s = 0, 0.0, 0.0
        self._A, self._W1 = np.zeros((0, 0)), np.zeros((0, 0))

    def forward(self, rows: np.ndarray, A: np.ndarray, C: list[np.ndarray], W1: np.ndarray, keep: bool) -> np.ndarray:
        self.step += 1
        t0 = time.perf_counter()
        A32 = np.asarray(A, dtype=np.float32)
        self._A, self._W1 = A32.astype(np.float64), np.asarray(W1, dtype=np.float64)   # what the holders encode
        mpc.check_room(self._A, C, self._W1)
        self.party.broadcast(Kind.OP, {"op": "forward", "step": self.step, "rows": rows.astype(np.uint32), "A": A32,
                                       "C": C, "W1": self._W1, "keep": keep}, to=self.holders)
        logits = rs.decode(rsh.open_at(self.party, self.holders, Kind.MPC_LOGITS, self.step), mpc.LOGIT_BITS)
        self.wait_s += time.perf_counter() - t0
        return logits

    def backward(self, dl: np.ndarray, summed: bool) -> tuple[np.ndarray, np.ndarray]:
        t0 = time.perf_counter()
        bits = mpc.grad_bits(self._A, dl @ self._W1, summed)
        parts = mpc.share_dl(dl, bits)       # the holders get dℓ shared: its per-sample values stay here
        for holder, i in rsh.holder_index(self.holders).items():
            self.party.send(holder, Kind.OP, {"op": "backward", "step": self.step, "ga": parts[i][0],
                                              "gb": parts[i][1], "summed": summed})
        out = mpc.decode_grads(rsh.open_at(self.party, self.holders, Kind.MPC_GRAD, self.step), self._A.shape[-1],
                               bits, self._W1.shape)
        self.wait_s += time.perf_counter() - t0
        return out


class HolderLink(_Link):
    """The coordinator's side of the holders: one forward / backward request, one reconstruction each."""

    def __init__(self, party: PartyLike, s: Settings):
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
        self.party.broadcast(Kind.OP, {"op": "forward", "step": self.step, "rows": rows.astype(np.uint32),
                                    "A": pack_symmetric(A).astype(np.float32) if packed else A.astype(np.float32),
                                    "packed": packed, "C": C, "keep": keep}, to=self.asked)
        U = self._rebuild(Kind.PRE_PREFIX, f"u{self.step}")
        self.wait_s += time.perf_counter() - t0
        return U

    def backward(self, E: np.ndarray, dU: np.ndarray | None, summed: bool):
        t0 = time.perf_counter()
        adj_holders = self.asked[:self.s.t]   # dÂ needs exactly t shares: ask no more holders than that
        for h in self.asked:
            self.party.send(h, Kind.OP, {"op": "backward", "step": self.step, "E": E, "summed": summed,
                                      "dU": dU if h in adj_holders else None})
        dC = self._rebuild(Kind.GRAD_PREFIX, f"g{self.step}")
        dA = None
        if dU is not None:
            r = ss.reconstruct_at_coordinator(self.party, self.holders, self.s.t, Kind.ADJ_PREFIX, tag=f"a{self.step}",
                                              asked=adj_holders)
            self.max_err = max(self.max_err, float(r.err))
            dA = unpack_symmetric(r.value, E.shape[1]) * 0.5
        self.wait_s += time.perf_counter() - t0
        return dC, dA



# ------------------------------------------------------------------------------------------- coordinator

@dataclass
class CoordinatorState:
    """What the coordinator carries across global epochs (its checkpoint): the labels, the owners' h (fusion
    "trusted" only), the training loop's state (:func:`~fedhet.algorithms.f3.training.train_global`'s ``resume``:
    the global model, its optimizer, both generators, early stopping and history), the holder link's counters and
    its timings (``wait_upload``; ``inference`` is timed after the last checkpoint)."""

    y: np.ndarray
    reps: list[np.ndarray] | None
    phases: Phases
    training: dict = field(default_factory=dict)
    link: dict | None = None

    def state(self) -> dict:
        return {"y": self.y, "reps": self.reps, "phases": self.phases.state(), "training": self.training,
                "link": self.link}

    @classmethod
    def restored(cls, saved: dict) -> "CoordinatorState":
        return cls(saved["y"], saved["reps"], Phases.restored(saved["phases"]), saved["training"], saved["link"])


def coordinator(party: PartyLike, s: Settings, data: dict) -> dict:
    _threads(s)
    order = role_members(party, OWNER)
    widths = owner_widths(s, len(order))
    check_alignable(s, widths)
    if s.fusion == "shares":
        return shares_roles.coordinator(party, s, data, order, widths)
    state = coordinator_state(party, s, order, widths)
    n_classes = class_count(s, state.y)
    gcfg = global_config(s, party.device)
    model = build_global(len(order), widths, n_classes, gcfg, given=data.get("adj"))
    first, link = first_layer(party, s, model, widths, state)
    train_pos, val_pos, test_pos = sample_positions(s)
    epochs = CoordinatorEpochs(party, s, order, link, state)
    history = train_global(model, first, state.y, train_pos, val_pos, gcfg, progress=epochs.progress,
                           resume=state.training, end_epoch=epochs.end)
    with state.phases.timed("inference", party.device):
        p_test = predict(model, first, test_pos, s.batch)
    if link is not None:
        link.stop()
    # its part: the global model taking the owners' h as inputs (a holder saves none: it holds shares of h only; with
    # fusion "shares" it saves its shares of the weights, shares_roles.holder)
    party.save_model(*coordinator_part(model, owners=order, widths=widths, n_classes=n_classes,
                                       fusion=s.fusion, dataset=s.dataset))
    out = {"fusion": s.fusion, "dataset": s.dataset, "provenance": provenance(s), "n_owners": len(order),
           "align": s.align, "graph": s.graph, "epochs": len(history), "history": history,
           "test": scores(p_test, state.y[test_pos], n_classes),
           "val_best_loss": min(h["val_loss"] for h in history), "epoch_s": [h["epoch_s"] for h in history],
           "inference_s": state.phases.last("inference"), "wait_upload_s": state.phases.last("wait_upload"),
           "test_probabilities": p_test.tolist(), **traffic_totals(party), **link_counters(link)}
    return out


def check_alignable(s: Settings, widths: list[int]) -> None:
    if s.align == "none" and any(w != s.d for w in widths):
        raise ValueError(f"f3: align 'none' stacks the representations as they are, so every d_i must equal "
                         f"d = {s.d}; got {widths}")


def coordinator_state(party: PartyLike, s: Settings, order: list[str], widths: list[int]) -> CoordinatorState:
    """The checkpoint's state, or (step 1) the owners' uploads received and checkpointed."""
    start, saved = party.restore()
    if start:
        return CoordinatorState.restored(saved)
    phases = Phases()
    with phases.timed("wait_upload"):
        y, reps = receive_uploads(party, s, order, widths)
    state = CoordinatorState(y, reps, phases)
    party.checkpoint(1, state.state())
    return state


def receive_uploads(party: PartyLike, s: Settings, order: list[str],
                    widths: list[int]) -> tuple[np.ndarray, list[np.ndarray] | None]:
    """Algorithm 1 line 5 at the coordinator: the labels from the label owner and, with fusion "trusted", every
    owner's h (rows, dtype and finite values: the schema's; the width checked here)."""
    y = np.asarray(party.recv(order[0], Kind.LABELS)["y"])
    if s.fusion != "trusted":
        return y, None
    reps = [np.asarray(party.recv(o, Kind.REP)["h"]) for o in order]
    for o, h, w in zip(order, reps, widths):
        if h.shape[1] != w:
            raise PeerFault(party.name, o, Kind.REP, f"shape {h.shape}, expected ({sum(n_rows(s))}, {w})")
    return y, reps


def first_layer(party: PartyLike, s: Settings, model: GlobalGCN, widths: list[int],
                state: CoordinatorState) -> tuple[FirstLayerFor, HolderLink | MpcLink | None]:
    """Eq. (8)'s first layer as the coordinator computes it: asked of the holders through a link (its counters
    restored) or, with fusion "trusted", on the owners' h in the clear (no link)."""
    if s.fusion == "trusted":
        assert state.reps is not None
        return plain_first_layer(model, state.reps), None
    link: HolderLink | MpcLink = MpcLink(party, s) if s.fusion == "mpc" else HolderLink(party, s)
    if state.link is not None:
        link.restore(state.link)
    if isinstance(link, MpcLink):   # (graph given or none: Settings.validate)
        return mpc.SharedLogits(model, link, widths), link
    return SharedFirstLayer(model, link, widths), link


def link_counters(link: HolderLink | MpcLink | None) -> dict:
    """The coordinator's result entries of its holder link: its wait, its steps and (shamir_linear, whose
    reconstructions carry an error bound; mpc's are exact) the largest fixed-point error."""
    if link is None:
        return {}
    out: dict[str, Any] = {"holder_wait_s": link.wait_s, "steps": link.step}
    if isinstance(link, HolderLink):
        out["max_fixed_point_err"] = link.max_err
    return out


@dataclass
class CoordinatorEpochs:
    """:func:`~fedhet.algorithms.f3.training.train_global`'s callbacks at the coordinator: each epoch's progress,
    and its end, where every party checkpoints (the holders and the owners are told, the owners answer)."""

    party: PartyLike
    s: Settings
    order: list[str]
    link: HolderLink | MpcLink | None
    state: CoordinatorState

    def progress(self, epoch: int, rec: dict) -> None:
        self.party.progress(epoch, self.s.epochs, val_loss=round(rec["val_loss"], 4))
        self.party.metric(val_loss=rec["val_loss"], val_f1=rec["val_f1"])

    def end(self, epoch: int, last: bool, training: dict) -> None:
        party, step = self.party, 1 + epoch
        if self.link is not None:
            self.link.epoch(step)
        party.broadcast(Kind.EPOCH, {"checkpoint": step, "last": last}, to=self.order)
        for o, msg in party.gather(Kind.EPOCH_DONE, frm=self.order).items():
            if msg["checkpoint"] != step:
                raise PeerFault(party.name, o, Kind.EPOCH_DONE,
                                f"answered the end of checkpoint step {step} with {msg['checkpoint']}")
        self.state.training = training
        self.state.link = None if self.link is None else self.link.state()
        party.checkpoint(step, self.state.state())


ROLES = {OWNER: owner, HOLDER: holder, COORDINATOR: coordinator}
