"""F³'s prediction job (``fedhet predict``): training's inference path (f3.txt, Alg. 1 lines 8-10) on new rows.

Vertical (:class:`fedhet.algorithms.predict.Vertical`): the owners align their new series by PSI (the first
owner, the label owner, as label owner).  Each owner runs its part (its frozen LSTM behind its scaler) on its
common rows and hands its representations h on as training does: with ``fusion = "shamir_linear"`` (or "mpc") as t-of-m Shamir
shares to the holders (``f3p/share``), who compute the first layer ``Â_k H W_0`` for each of the coordinator's
part's graphs on request (``f3/op``, ``f3/pre/result``: the kinds of training); with ``"trusted"`` in the
clear to the coordinator (``f3/predict_rep``).  The first owner tells the coordinator how many rows there are
(``f3/predict_rows``); the coordinator finishes Eq. (8) with its part (:meth:`FusionScorer.fused`) and sends
the class probabilities to the first owner only (``f3/predictions``), which writes them.

With ``fusion = "shares"`` the model is on the holders' shares (each holder's part,
:func:`~fedhet.algorithms.f3.model.holder_part`; the coordinator holds none and takes no part): the owners share h
as with mpc (``f3p/rss/share``), the holders run training's forward on shares
(:func:`~fedhet.algorithms.f3.shares.class_batches`, ``batch`` rows at a time, their rounds ``f3p/rss/round``) and
send their pairs of each row's predicted class (0/1 per class) to the first owner only (``f3p/shares/class``),
which opens them and writes 1 on the class, 0 elsewhere: it learns the class of each row, no logit; a holder,
uniform words; the coordinator, nothing.

Numbers: "trusted" gives exactly the coordinator part's output on the owners' h.  "shamir_linear" reconstructs the
first layer from fixed-point shares (``frac_bits`` / ``public_frac_bits``), so its probabilities differ from
the part's on h in the clear by the fixed-point error (the run's ``max_fixed_point_err`` bounds the first
layer; the tests check the probabilities to 1e-4).  "shares" gives the class of the opened model's largest logit
wherever the two largest differ by more than the forward's fixed-point error (the tests: 1e-3).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from fedhet.algorithms.scoring import score
from fedhet.algorithms.f3.core import OwnerShares, SharedFirstLayer, holder_forward, unpack_symmetric
from fedhet.algorithms.f3.messages import COORDINATOR, HOLDER, OWNER, Kind
from fedhet.algorithms.f3.messages import declarations as training_declarations
from fedhet.algorithms.f3.roles import HolderLink, MpcLink
from fedhet.algorithms.toolkit import role_members
from fedhet.algorithms.f3.settings import MAX_BATCH, Settings, owner_widths
from fedhet.algorithms.predict import Exchange, PartData, Rows, Vertical
from fedhet.parties import schema as sch
from fedhet.parties.api import PartyError, PeerFault, PeersDisagree
from fedhet.parties.contract import PartyLike
from fedhet.parties.declare import MessageDecl, declare
from fedhet.algorithms.f3 import mpc
from fedhet.algorithms.f3 import shares as S
from fedhet.algorithms.f3.model import SharedPart
from fedhet.protocols import replicated as rs
from fedhet.protocols import replicated_share as rsh
from fedhet.protocols import shamir_share as ss

SHARE_PREFIX = "f3p"                 # f3p/share: an owner's shares of its new rows' h
RSS_PREFIX = "f3p/rss"               # mpc: f3p/rss/share, f3p/rss/key, f3p/rss/round
ROWS = "f3/predict_rows"             # first owner -> coordinator: how many common rows
REP = "f3/predict_rep"               # trusted: an owner's h of the common rows in the clear
PREDICTIONS = "f3/predictions"       # coordinator -> first owner: the class probabilities
CLASS = "f3p/shares/class"           # shares: holder -> first owner, its pair of a batch's predicted classes
PART = "f3p/shares/part"             # shares: holder -> next holder, the digest of the component both hold


def _h(data: PartData, rows: Rows) -> np.ndarray:
    if data.part is None:
        raise PartyError("f3: no trained part loaded")
    return score(data.module, data.part.meta, rows)


def _upload(party: PartyLike, s: Settings, h: np.ndarray) -> None:
    if s.fusion in ("mpc", "shares"):
        rsh.share_to_holders(party, rs.encode(h, mpc.H_BITS, "h").view(np.uint64), party.peers_with_role(HOLDER),
                             RSS_PREFIX + "/share", mpc.H_BITS)
    elif s.fusion != "trusted":   # |h| < 1 (an LSTM's hidden state): a public bound, as in training
        ss.share_to_holders(party, h, party.peers_with_role(HOLDER), s.t, SHARE_PREFIX, frac_bits=s.frac_bits,
                            max_abs=1.0, tag="h")
    else:
        party.send(party.peer_with_role(COORDINATOR), REP, {"h": h})


def owner_feature(party: PartyLike, s: Settings, data: PartData, rows: Rows, label: str) -> None:
    _upload(party, s, _h(data, rows))


def owner_label(party: PartyLike, s: Settings, data: PartData, rows: Rows, peers: list[str]) -> dict[str, np.ndarray]:
    h = _h(data, rows)
    if s.fusion == "shares":
        _upload(party, s, h)
        return _open_classes(party, s, data, len(h))
    coord = party.peer_with_role(COORDINATOR)
    party.send(coord, ROWS, {"n": int(len(h))})
    _upload(party, s, h)
    p = np.asarray(party.recv(coord, PREDICTIONS)["p"])
    if p.shape[0] != len(h):
        raise PeerFault(party.name, coord, PREDICTIONS, f"holds {p.shape[0]} rows, the common list {len(h)}")
    return {coord: p}


def _open_classes(party: PartyLike, s: Settings, data: PartData, n: int) -> dict[str, np.ndarray]:
    """fusion "shares", the first owner (the label party): each batch's predicted classes opened from the three
    holders' pairs (:func:`fedhet.algorithms.f3.shares.class_batches`), as probabilities: 1 on the predicted
    class (split evenly between tied classes), 0 elsewhere.  The class is all it learns of a row."""
    assert data.part is not None
    k = len(data.part.meta["classes"])
    holders = sorted(party.peers_with_role(HOLDER))
    out = []
    for step, lo in enumerate(range(0, n, s.batch)):
        q = rsh.open_at(party, holders, CLASS, step).view(np.int64)
        rows = min(s.batch, n - lo)
        if q.shape != (rows, k) or not np.isin(q, (0, 1)).all() or not (q.sum(1) >= 1).all():
            raise PeersDisagree(party.name, holders, CLASS, f"batch {step} opens to {q.shape} values "
                                f"{np.unique(q)[:5].tolist()}, expected 0/1 classes ({rows}, {k}) with a class per row")
        out.append(q)
    q = np.concatenate(out) if out else np.zeros((0, k), np.int64)
    return {holders[0]: (q / np.maximum(q.sum(1, keepdims=True), 1)).astype(np.float32)}


def probabilities(module: Any, meta: Mapping[str, Any], rows: Rows, received: dict[str, np.ndarray]) -> np.ndarray:
    """The coordinator's probabilities, as received (the first owner's part makes its h, not the classes)."""
    return np.asarray(next(iter(received.values())), dtype=np.float64)


def coordinator(party: PartyLike, s: Settings, data: PartData) -> dict:
    """Eq. (8) with the coordinator's part on every owner's h of the common rows (shamir: the first layer
    from the holders, a batch of at most MAX_BATCH rows per request); the probabilities to the first owner.
    fusion "shares": nothing (the holders open each row's class to the first owner; the coordinator holds no
    part and receives nothing)."""
    if s.fusion == "shares":
        return {"role": COORDINATOR, "n_predicted": 0, "fusion": s.fusion}
    if data.part is None:
        raise PartyError("f3: the coordinator has no trained part loaded")
    scorer, meta = data.module, data.part.meta
    order = role_members(party, OWNER)
    if list(meta["owners"]) != order:
        raise PartyError(f"f3: the coordinator's part fuses owners {meta['owners']}, the federation has {order}")
    n = int(party.recv(order[0], ROWS)["n"])
    with torch.no_grad():
        if s.fusion == "trusted":
            hs = []
            for o, w in zip(order, meta["widths"]):
                h = np.asarray(party.recv(o, REP)["h"])
                if h.shape != (n, int(w)):
                    raise PeerFault(party.name, o, REP, f"has shape {h.shape}, expected ({n}, {w})")
                hs.append(torch.as_tensor(h))
            p = scorer(*hs).numpy()
        else:
            widths = [int(w) for w in meta["widths"]]
            link: HolderLink | MpcLink
            layer: SharedFirstLayer | mpc.SharedLogits
            if s.fusion == "mpc":
                link = MpcLink(party, s)
                layer = mpc.SharedLogits(scorer.gcn, link, widths)
            else:
                link = HolderLink(party, s)
                layer = SharedFirstLayer(scorer.gcn, link, widths)
            parts = [scorer.fused(layer(np.arange(a, min(a + MAX_BATCH, n)))).numpy() for a in range(0, n, MAX_BATCH)]
            link.stop()
            p = np.concatenate(parts) if parts else np.zeros((0, len(meta["classes"])), dtype=np.float32)
    party.send(order[0], PREDICTIONS, {"p": p})
    return {"role": COORDINATOR, "n_predicted": n, "fusion": s.fusion}


def holder(party: PartyLike, s: Settings, data: PartData) -> dict:
    """The first layer on this holder's shares of the owners' new h, one forward request at a time (fusion
    "shares": the whole forward with its part's shares of the weights, the classes to the first owner)."""
    if s.fusion == "trusted":
        return {"role": HOLDER, "steps": 0}
    order = role_members(party, OWNER)
    if s.fusion == "shares":
        return _shares_holder(party, s, data, order)
    coord = party.peer_with_role(COORDINATOR)
    if s.fusion == "mpc":
        return _mpc_holder(party, s, order, coord)
    got = ss.receive_shares(party, order, SHARE_PREFIX, t=s.t, tag="h")
    if len({got[o].shape[0] for o in order}) != 1:
        raise PeersDisagree(party.name, order, SHARE_PREFIX, "the owners shared different row counts "
                         f"{ {o: got[o].shape for o in order} }")
    total, n = got[order[0]].shape[0], len(order)
    shares = OwnerShares([got[o] for o in order])
    steps = 0
    while True:
        msg = party.recv(coord, Kind.OP)
        if msg["op"] == "stop":
            return {"role": HOLDER, "steps": steps}
        if msg["op"] != "forward":
            raise PeerFault(party.name, coord, Kind.OP, f"prediction asks for forward steps only, got {msg['op']!r}")
        rows, A = np.asarray(msg["rows"], dtype=np.int64), np.asarray(msg["A"])
        if rows.size == 0 or int(rows.max()) >= total:
            raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} asks for rows outside 0..{total - 1}")
        if msg["packed"]:
            A = unpack_symmetric(A, n)
        U, _ = holder_forward(shares, rows, A.astype(np.float64), [np.asarray(c) for c in msg["C"]], s)
        ss.send_to_coordinator(party, coord, U, Kind.PRE_PREFIX, tag=f"u{msg['step']}")
        steps += 1


def _receive_h(party: PartyLike, s: Settings, order: list[str]) -> list[rs.Rss]:
    """A holder's pairs of every owner's new h (replicated, mpc and shares), the same row count from each."""
    widths = owner_widths(s, len(order))
    got = rsh.receive_shares(party, order, RSS_PREFIX + "/share", {o: (None, w) for o, w in zip(order, widths)},
                             mpc.H_BITS)
    if len({got[o].shape[0] for o in order}) != 1:
        raise PeersDisagree(party.name, order, RSS_PREFIX + "/share", "the owners shared different row counts "
                         f"{ {o: got[o].shape for o in order} }")
    return [got[o] for o in order]


def _shares_holder(party: PartyLike, s: Settings, data: PartData, order: list[str]) -> dict:
    """fusion "shares": training's forward on shares (:func:`fedhet.algorithms.f3.shares.class_batches`) with this
    holder's part (its pairs of the weights, the public Â) on its pairs of the owners' new h; each batch's
    predicted classes to the first owner (the label party) only."""
    part = data.module
    if not isinstance(part, SharedPart):
        raise PartyError(f"f3: holder {party.name!r} has no shares part loaded (fusion 'shares' trains one)")
    if part.shape.n != len(order) or [part.shape.width] * len(order) != owner_widths(s, len(order)):
        raise PartyError(f"f3: holder {party.name!r}'s part fits {part.shape.n} owners of width {part.shape.width}, "
                         f"the federation has {owner_widths(s, len(order))}")
    got = _receive_h(party, s, order)
    X = rs.Rss(np.stack([g.a for g in got]), np.stack([g.b for g in got]))
    holders = [p for p, r in party.roles.items() if r == HOLDER]
    h = rsh.connect(party, holders, RSS_PREFIX)
    _same_model(party, holders, part)
    steps = 0
    for step, q in S.class_batches(h, part.model, part.shape, X, part.A, s.batch):
        rsh.send_open(party, order[0], CLASS, q, step)
        steps += 1
    return {"role": HOLDER, "steps": steps, "rounds": h.rounds, "words_sent": h.words_sent}


def _same_model(party: PartyLike, holders: list[str], part: SharedPart) -> None:
    """The three parts are one sharing of one model: each holder sends the next the digest of the component they
    both hold (its "b", the next's "a") and checks its predecessor's against its own "a"; parts of different runs,
    or an altered one, stop the job before any row is computed."""
    names = sorted(holders)
    i = names.index(party.name)
    nxt, prv = names[(i + 1) % 3], names[(i - 1) % 3]
    party.send(nxt, PART, {"digest": part.digest("b")})
    if party.recv(prv, PART)["digest"] != part.digest("a"):
        raise PeersDisagree(party.name, [prv, party.name], PART, "their trained parts' common component of the "
                            "weight shares (or Â) differs: parts of different training runs, or one altered (the check "
                            "cannot tell which)")


def _mpc_holder(party: PartyLike, s: Settings, order: list[str], coord: str) -> dict:
    """Training's mpc forward step on this holder's pairs of the owners' new h; only the logits are opened."""
    holders = [p for p, r in party.roles.items() if r == HOLDER]
    got = _receive_h(party, s, order)
    total, n = got[0].shape[0], len(order)
    shares = mpc.MpcShares(got)
    h = rsh.connect(party, holders, RSS_PREFIX)
    steps = 0
    while True:
        msg = party.recv(coord, Kind.OP)
        if msg["op"] == "stop":
            return {"role": HOLDER, "steps": steps, "rounds": h.rounds}
        if msg["op"] != "forward":
            raise PeerFault(party.name, coord, Kind.OP, f"prediction asks for forward steps only, got {msg['op']!r}")
        rows, A = np.asarray(msg["rows"], dtype=np.int64), np.asarray(msg["A"], dtype=np.float64)
        C, W1 = [np.asarray(c) for c in msg["C"]], np.asarray(msg["W1"])
        if rows.size == 0 or int(rows.max()) >= total or A.shape != (n, n) or len(C) != n:
            raise PeerFault(party.name, coord, Kind.OP, f"{Kind.OP} asks for rows outside 0..{total - 1} or sends Â "
                             f"{A.shape} / {len(C)} C_i for {n} owners")
        mpc.check_room(A, C, W1)
        logits, _ = mpc.forward(h, shares, rows, A, C, W1)
        rsh.send_open(party, coord, Kind.MPC_LOGITS, logits, msg["step"])
        steps += 1


def declarations(s: Settings) -> list[MessageDecl]:
    width = s.local_hidden if s.owner_hidden is None else None
    out = [declare(ROWS, OWNER, COORDINATOR, "the number of common new rows (the first owner's PSI result's "
                   "size); no arrays", payload=sch.Fields({"n": sch.Int(lo=0)}), protects="control"),
           declare(PREDICTIONS, COORDINATOR, OWNER, "the class probabilities of the common new rows, to the first "
                   "owner (the label owner) only: float32 (n_common, classes)",
                   payload=sch.Fields({"p": sch.Arr("<f4", (None, None))}), protects="derived")]
    if s.fusion == "trusted":
        return out + [declare(REP, OWNER, COORDINATOR, "trusted fusion: an owner's representations h of the common "
                              "new rows IN THE CLEAR (as training's f3/rep); float32 (n_common, d_i)",
                              payload=sch.Fields({"h": sch.Arr("<f4", (None, width))}), protects="derived")]
    if s.fusion == "shares":      # no ROWS, no PREDICTIONS: the coordinator takes no part
        classes = None if s.dataset == "vowels" else 2
        pair = sch.Arr("<u8", (None, classes), max_elems=MAX_BATCH * 4096)
        return [*rsh.declarations(RSS_PREFIX, OWNER, HOLDER, (None, width)),
                declare(PART, HOLDER, HOLDER, "shares: the SHA-256 of the component of the trained weights' shares "
                        "(and of Â) that this holder and the next both hold, once, to check the three parts are one "
                        "sharing of one model: a function of words the receiver holds already",
                        payload=sch.Fields({"digest": sch.Bytes(length=32)}), protects="shares"),
                declare(CLASS, HOLDER, OWNER, "shares: a holder's pair of each new row's predicted class, one batch "
                        "(the training batch size) per message, to the first owner (the label party) only, which "
                        "opens them: a 0/1 integer per class, 1 on the row's largest logit (every tied class on a "
                        "tie); no logit, probability or h", payload=sch.Fields({"step": sch.Int(lo=0), "a": pair,
                                                                               "b": pair}), protects="derived")]
    train = {d.kind: d for d in training_declarations(s)}
    if s.fusion == "mpc":
        return out + [*rsh.declarations(RSS_PREFIX, OWNER, HOLDER, (None, width)), train[Kind.OP],
                      train[Kind.MPC_LOGITS]]
    share_decl, _ = ss.declarations(SHARE_PREFIX, OWNER, HOLDER, COORDINATOR, share_shape=(None, width))
    return out + [share_decl, train[Kind.OP], train[ss.Kind.of(Kind.PRE_PREFIX)[1]]]


LAYOUT = Vertical(label_role=OWNER, feature_roles=(OWNER,), combine=probabilities,
                  exchange=Exchange(label=owner_label, feature=owner_feature, declarations=declarations),
                  part_roles=lambda s: (HOLDER,) if s.fusion == "shares" else (COORDINATOR,), others={COORDINATOR: coordinator, HOLDER: holder})
