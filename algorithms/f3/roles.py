"""F³'s roles (f3.txt, Algorithm 1): ``owner`` (n; the first in federation order is the label owner),
``holder`` (m, fusion "shamir_linear" or "mpc") and ``coordinator``.

owner        lines 1-4: :func:`~fedhet.algorithms.f3.training.pretrain_owner` on its own series, then its
             representations to the holders as t-of-m Shamir shares (``f3/share``) or, with fusion
             "trusted", in the clear to the coordinator (``f3/rep``); the label owner also sends the labels
holder       the first layer and its gradients on its shares, one ``f3/op`` request at a time
             (:func:`~fedhet.algorithms.f3.core.holder_forward`, :func:`~fedhet.algorithms.f3.core.holder_backward`)
coordinator  lines 5-10: eq. (8) trained and evaluated with the first layer asked of the holders
             (:class:`HolderLink` under :class:`~fedhet.algorithms.f3.core.SharedFirstLayer`)

Checkpoint step 1: the owners' representations delivered; step 1 + e: e global epochs done (the coordinator tells
the holders, ``f3/op`` "epoch", and the owners, ``f3/epoch``, which answer ``f3/epoch/done``, so every party
checkpoints at every epoch).  An owner keeps its report and its trained part; a holder its shares (secret: its
private checkpoint) and counters; the coordinator the labels (and, trusted, the representations), the global
model, its optimizer, both generators, early stopping and history, and the holder link's counters.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from fedhet.algorithms.f3.core import OwnerShares, SharedFirstLayer, holder_backward, holder_forward, \
    pack_symmetric, unpack_symmetric
from fedhet.algorithms.f3.data import provenance
from fedhet.algorithms.f3.messages import COORDINATOR, HOLDER, OWNER, Kind
from fedhet.algorithms.f3.model import coordinator_part, owner_part
from fedhet.algorithms.f3.settings import Settings, n_rows, owner_widths
from fedhet.algorithms.f3.training import FirstLayerFor, GlobalConfig, build_global, entropy, plain_first_layer, predict, \
    pretrain_owner, scores, train_global
from fedhet.parties.api import PeerFault
from fedhet.parties.contract import PartyLike
from fedhet.parties.settings import SettingsError
from fedhet.algorithms.f3 import mpc
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


def owners_in_order(party: PartyLike) -> list[str]:
    return [n for n, r in party.roles.items() if r == OWNER]


def owner(party: PartyLike, s: Settings, data: dict) -> dict:
    _threads(s)
    order = owners_in_order(party)
    idx = order.index(party.name)
    coord = party.peers_with_role(COORDINATOR)[0]
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
    return {**{k: v for k, v in saved["report"].items() if k != "part"}, "bytes_sent": sum(party.bytes_sent.values())}


def _pretrain_and_upload(party: PartyLike, s: Settings, data: dict, order: list[str], idx: int, coord: str) -> dict:
    """An owner's Algorithm 1 lines 1-5: its local model, its representations sent; its report and its part."""
    st = pretrain_owner(s, data, idx, len(order), party.device,
                        progress=lambda e, v: party.progress(e, s.local_epochs, val_loss=round(v, 4)))
    reps, yt = st.reps, data["splits"]["test"][2]
    assert st.model is not None
    raw_x, raw_len = data["raw_test"]
    # its part: the frozen local model with its scaler, checked on its own first test rows (made before the
    # upload, so that the checkpoint of step 1 follows the upload at once)
    part = owner_part(st.model, mean=data["scaler"][0], std=data["scaler"][1], n_classes=data["n_classes"],
                      feature_names=data["feature_names"], raw_x=raw_x, std_x=data["splits"]["test"][0],
                      lengths=raw_len, dataset=s.dataset)
    t0 = time.perf_counter()
    if s.fusion == "mpc":
        rsh.share_to_holders(party, rs.encode(reps, mpc.H_BITS, "h").view(np.uint64), party.peers_with_role(HOLDER),
                             Kind.RSS_PREFIX + "/share", mpc.H_BITS)
    elif s.fusion != "trusted":
        holders = party.peers_with_role(HOLDER)
        # |h| < 1 (an LSTM's hidden state): a public bound, so the holders learn nothing from max_abs
        ss.share_to_holders(party, reps, holders, s.t, Kind.SHARE_PREFIX, frac_bits=s.frac_bits, max_abs=1.0, tag="h")
    else:
        party.send(coord, Kind.REP, {"h": reps})
    if idx == 0:
        party.send(coord, Kind.LABELS, {"y": st.y})
    upload_s = time.perf_counter() - t0
    return {"index": idx, "width": st.info["width"], "local_epochs": st.info["epochs"],
            "local_val_loss": st.info["val_loss"], "local_test": scores(st.test_probabilities, yt, data["n_classes"]),
            "local_test_entropy": [float(v) for v in entropy(st.test_probabilities)],
            "local_s": st.seconds, "upload_s": upload_s, "part": list(part)}


def holder(party: PartyLike, s: Settings, data: dict) -> dict:
    if s.fusion == "trusted":   # nothing would ever reach it: say so now, not after the receive timeout
        raise SettingsError(f"f3: party {party.name!r} is a holder, but fusion = 'trusted' has no holders "
                            f"(the owners send their representations to the coordinator); remove the holders "
                            f"or set fusion = 'shamir_linear' or 'mpc'")
    _threads(s)
    order = owners_in_order(party)
    coord = party.peers_with_role(COORDINATOR)[0]
    total = sum(n_rows(s))
    widths = owner_widths(s, len(order))
    if s.fusion == "mpc":
        return _mpc_holder(party, s, order, coord, total, widths)
    start, saved = party.restore()
    if start == 0:
        got = ss.receive_shares(party, order, Kind.SHARE_PREFIX, t=s.t, tag="h")
        for o, w in zip(order, widths):
            if got[o].shape != (total, w):
                raise PeerFault(party.name, o, Kind.SHARE_PREFIX, f"shared an array of shape {got[o].shape}, the "
                                f"settings say ({total}, {w})")
        saved = {"shares": [ss.share_state(got[o]) for o in order], "steps": 0, "busy": 0.0}
        party.checkpoint(1, saved)
    shares = OwnerShares([ss.share_from_state(a) for a in saved["shares"]])
    n = len(order)
    G, g_rows, g_step, steps, busy = None, None, None, saved["steps"], saved["busy"]
    while True:
        msg = party.recv(coord, Kind.OP)
        if msg["op"] == "stop":
            break
        if msg["op"] == "epoch":
            party.checkpoint(msg["checkpoint"], {"shares": saved["shares"], "steps": steps, "busy": busy})
            continue
        t0 = time.perf_counter()
        if msg["op"] == "forward":
            rows, A, C = np.asarray(msg["rows"], dtype=np.int64), np.asarray(msg["A"]), msg["C"]
            if rows.size == 0 or int(rows.max()) >= total:   # at most MAX_BATCH rows: the schema's bound
                raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} step {msg['step']} asks for rows outside "
                                 f"0..{total - 1}")
            if msg["packed"]:
                if A.shape != (rows.size, n * (n + 1) // 2):
                    raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} step {msg['step']}: packed Â {A.shape}, "
                                     f"expected ({rows.size}, {n * (n + 1) // 2})")
                A = unpack_symmetric(A, n)
            if len(C) != n or any(np.shape(c)[0] != w for c, w in zip(C, widths)) or \
                    A.shape[-2:] != (n, n) or (A.ndim == 3 and A.shape[0] != rows.size):
                raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} step {msg['step']}: Â {A.shape} or C_i shapes "
                                 f"do not fit {n} owners, batch {rows.size}, hidden {s.hidden}")
            U, Gs = holder_forward(shares, rows, A.astype(np.float64), [np.asarray(c) for c in C], s)
            G, g_rows, g_step = (Gs if msg["keep"] else None), rows, msg["step"]
            ss.send_to_coordinator(party, coord, U, Kind.PRE_PREFIX, tag=f"u{msg['step']}")
        else:
            if g_rows is None or msg["step"] != g_step or (G is None and msg["dU"] is not None):
                raise PeerFault(party.name, coord, Kind.OP, f"backward step {msg['step']} without its forward")
            E = np.asarray(msg["E"])
            if E.shape[:2] != (g_rows.size, n):
                raise PeerFault(party.name, coord, Kind.OP, f"E has shape {E.shape}, expected "
                                 f"({g_rows.size}, {n}, {s.hidden})")
            dC, dA = holder_backward(shares, g_rows, G, E, msg["dU"], msg["summed"], s)
            ss.send_to_coordinator(party, coord, dC, Kind.GRAD_PREFIX, tag=f"g{msg['step']}")
            if dA is not None:
                ss.send_to_coordinator(party, coord, dA, Kind.ADJ_PREFIX, tag=f"a{msg['step']}")
        steps += 1
        busy += time.perf_counter() - t0
    return {"steps": steps, "compute_s": busy, "bytes_sent": sum(party.bytes_sent.values()),
            "bytes_received": sum(party.bytes_received.values())}


def _mpc_holder(party: PartyLike, s: Settings, order: list[str], coord: str, total: int, widths: list[int]) -> dict:
    """A holder of fusion "mpc": its pairs of every owner's h, then one forward / backward step at a time, each a
    computation with the two other holders (:mod:`fedhet.algorithms.f3.mpc`)."""
    holders = [p for p, r in party.roles.items() if r == HOLDER]
    start, saved = party.restore()
    if start == 0:
        got = rsh.receive_shares(party, order, Kind.RSS_PREFIX + "/share", {o: (total, w) for o, w in zip(order, widths)},
                                 mpc.H_BITS)
        saved = {"pairs": [{"a": got[o].a, "b": got[o].b} for o in order], "steps": 0, "busy": 0.0}
        party.checkpoint(1, saved)
    shares = mpc.MpcShares([rs.Rss(np.asarray(p["a"]), np.asarray(p["b"])) for p in saved["pairs"]])
    h = rsh.connect(party, holders, Kind.RSS_PREFIX)     # fresh keys in every incarnation
    n = len(order)
    kept, k_step, A, W1, steps, busy = None, None, None, np.zeros((0, 0)), saved["steps"], saved["busy"]
    while True:
        msg = party.recv(coord, Kind.OP)
        if msg["op"] == "stop":
            break
        if msg["op"] == "epoch":
            party.checkpoint(msg["checkpoint"], {**saved, "steps": steps, "busy": busy})
            continue
        t0 = time.perf_counter()
        if msg["op"] == "forward":
            rows, A = np.asarray(msg["rows"], dtype=np.int64), np.asarray(msg["A"], dtype=np.float64)
            C, W1 = [np.asarray(c) for c in msg["C"]], np.asarray(msg["W1"])
            if rows.size == 0 or int(rows.max()) >= total:
                raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} step {msg['step']} asks for rows outside "
                                 f"0..{total - 1}")
            if A.shape != (n, n) or len(C) != n or any(c.shape[0] != w for c, w in zip(C, widths)):
                raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} step {msg['step']}: Â {A.shape} or C_i shapes "
                                 f"do not fit {n} owners of widths {sorted(set(widths))}")
            mpc.check_room(A, C, W1)
            logits, kept = mpc.forward(h, shares, rows, A, C, W1)
            k_step = msg["step"] if msg["keep"] else None
            rsh.send_open(party, coord, Kind.MPC_LOGITS, logits, msg["step"])
        else:
            if kept is None or msg["step"] != k_step or A is None:
                raise PeerFault(party.name, coord, Kind.OP, f"backward step {msg['step']} without its forward")
            try:
                shape = (kept["rows"].size, W1.shape[0])
                dl = rs.Rss(rs.expand(msg["ga"], shape), rs.expand(msg["gb"], shape))
            except ValueError as e:
                raise PeerFault(party.name, coord, Kind.OP, f"backward step {msg['step']}: dℓ {e}") from None
            rsh.send_open(party, coord, Kind.MPC_GRAD, mpc.backward(h, shares, kept, dl, W1, A, msg["summed"]),
                          msg["step"])
            kept = None
        steps += 1
        busy += time.perf_counter() - t0
    return {"steps": steps, "compute_s": busy, "rounds": h.rounds, "words_sent": h.words_sent,
            "bytes_sent": sum(party.bytes_sent.values()), "bytes_received": sum(party.bytes_received.values())}


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


def coordinator(party: PartyLike, s: Settings, data: dict) -> dict:
    _threads(s)
    order = owners_in_order(party)
    n = len(order)
    widths = owner_widths(s, n)
    if s.align == "none" and any(w != s.d for w in widths):
        raise ValueError(f"f3: align 'none' stacks the representations as they are, so every d_i must equal "
                         f"d = {s.d}; got {widths}")
    tr, va, te = n_rows(s)
    start, saved = party.restore()
    if start == 0:
        t0 = time.perf_counter()
        y = np.asarray(party.recv(order[0], Kind.LABELS)["y"])
        reps = None
        if s.fusion == "trusted":
            reps = [np.asarray(party.recv(o, Kind.REP)["h"]) for o in order]
            for o, h, w in zip(order, reps, widths):
                if h.shape[1] != w:   # rows, dtype and finite values: the schema's
                    raise PeerFault(party.name, o, Kind.REP, f"shape {h.shape}, expected ({tr + va + te}, {w})")
        saved = {"y": y, "reps": reps, "wait_upload_s": time.perf_counter() - t0, "training": {}, "link": None}
        party.checkpoint(1, saved)
    y, reps, wait_upload_s = saved["y"], saved["reps"], saved["wait_upload_s"]
    n_classes = int(y.max()) + 1 if s.dataset == "vowels" else 2
    n_classes = max(n_classes, 9 if s.dataset == "vowels" else 2)
    gcfg = GlobalConfig(d=s.d, hidden=s.hidden, align=s.align, graph=s.graph, tau=s.tau,
                        test_samples=s.test_samples, epochs=s.epochs, patience=s.patience, lr=s.lr,
                        batch=s.batch, seed=s.seed, device=party.device)
    model = build_global(n, widths, n_classes, gcfg, given=data.get("adj"))
    first: FirstLayerFor
    link: HolderLink | MpcLink | None = None
    if s.fusion == "mpc":   # (graph given or none: Settings.validate)
        link = MpcLink(party, s)
        if saved["link"] is not None:
            link.restore(saved["link"])
        first = mpc.SharedLogits(model, link, widths)
    elif s.fusion != "trusted":
        link = HolderLink(party, s)
        if saved["link"] is not None:
            link.restore(saved["link"])
        first = SharedFirstLayer(model, link, widths)
    else:
        assert reps is not None
        first = plain_first_layer(model, reps)

    def progress(epoch: int, rec: dict) -> None:
        party.progress(epoch, s.epochs, val_loss=round(rec["val_loss"], 4))
        party.metric(val_loss=rec["val_loss"], val_f1=rec["val_f1"])
    pos = np.arange(tr + va + te)
    trp, vap, tep = pos[:tr], pos[tr:tr + va], pos[tr + va:]

    def end_epoch(epoch: int, last: bool, training: dict) -> None:
        step = 1 + epoch   # every party checkpoints here: the holders and the owners are told, the owners answer
        if link is not None:
            link.epoch(step)
        party.broadcast(Kind.EPOCH, {"checkpoint": step, "last": last}, to=order)
        for o, msg in party.gather(Kind.EPOCH_DONE, frm=order).items():
            if msg["checkpoint"] != step:
                raise PeerFault(party.name, o, Kind.EPOCH_DONE, f"answered the end of checkpoint step {step} with {msg['checkpoint']}")
        party.checkpoint(step, {**saved, "training": training, "link": None if link is None else link.state()})
    history = train_global(model, first, y, trp, vap, gcfg, progress=progress, resume=saved["training"],
                           end_epoch=end_epoch)
    t0 = time.perf_counter()
    p_test = predict(model, first, tep, s.batch)
    infer_s = time.perf_counter() - t0
    if link is not None:
        link.stop()
    # its part: the global model taking the owners' h as inputs (a holder saves none: it holds shares only)
    party.save_model(*coordinator_part(model, owners=order, widths=widths, n_classes=n_classes,
                                       fusion=s.fusion, dataset=s.dataset))
    out = {"fusion": s.fusion, "dataset": s.dataset, "provenance": provenance(s), "n_owners": n,
           "align": s.align, "graph": s.graph, "epochs": len(history), "history": history,
           "test": scores(p_test, y[tep], n_classes), "val_best_loss": min(h["val_loss"] for h in history),
           "epoch_s": [h["epoch_s"] for h in history], "inference_s": infer_s, "wait_upload_s": wait_upload_s,
           "test_probabilities": p_test.tolist(),
           "bytes_sent": sum(party.bytes_sent.values()), "bytes_received": sum(party.bytes_received.values())}
    if link is not None:
        out.update({"holder_wait_s": link.wait_s, "steps": link.step})
        if isinstance(link, HolderLink):   # shamir_linear's reconstructions carry an error bound; mpc's are exact
            out["max_fixed_point_err"] = link.max_err
    return out


ROLES = {OWNER: owner, HOLDER: holder, COORDINATOR: coordinator}
