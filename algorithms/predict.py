"""``fedhet predict``: a trained model scores new rows as a federation job, with declared messages.

Every party of the training federation takes part (same names, roles and ``[algorithm]`` keys; its
``[[party]] data`` names its NEW rows, the label column optional).  Each party that holds a trained
part reads its OWN, ``RUN/parties/<name>/model/`` (:func:`fedhet.parties.model_store.read_part`),
refuses one that does not fit (:func:`open_part`: the algorithm, the party and its role, every
training setting, the federation's parties; then the columns of its new file against the part's
feature names, in order), rebuilds it with the algorithm's ``load_model`` and proves the rebuilt
module scores its recorded check rows exactly as the trained part did (:func:`fedhet.algorithms.scoring.rebuild`).

An algorithm declares its job with :func:`prediction_job` and one of two layouts:

- :class:`Vertical` (STFL, MMVFL, HE split, F³): the label party (the first party of ``label_role``)
  aligns its new rows with every feature party by PSI (:mod:`fedhet.protocols.psi`, the backend of
  ``predict_psi_backend``, "auto" by default: rr22 for large sets, ecdh for small; order "sorted", the
  common list revealed to all, as the training algorithms align); then each feature
  party sends its part's output for the common rows (``contribution``, one declared kind
  ``<name>/predict``, to the label party only: STFL), or the two run an interactive
  :class:`Exchange` (the HE split network's encrypted layer; F³'s shares, holders and coordinator,
  the parties of ``others``), or nothing crosses but PSI (MMVFL); the label party turns its own
  part's output and what it received into class probabilities (``combine``).  Predictions land
  ONLY at the label party.  Its rows some party lacks are not dropped silently: ``missing.csv``
  lists each with the parties that lack it (with two or more feature parties the label party
  learns that from one extra PSI per feature party that reveals nothing to the feature party), and
  the result counts them.
- :class:`Horizontal` (FedAvg, CHFL, HyFEM): each party of ``scoring_role`` scores its own rows
  with the part it would deploy; no message but the closing barrier.

The job is an :class:`~fedhet.parties.contract.Algorithm` of its own, ``<name>.predict``
(:func:`prediction_job`, :func:`with_prediction`): its settings are the training settings plus
:class:`JobKeys`, so the runners, the launcher and the audit run it like a training run.

Files, in the prediction run folder ``PRED`` (``predictions_out``), at the party that scores:
``parties/<name>/predictions.csv`` (columns ``ID``, ``class``, ``p_<class>`` per class; floats
written so they read back bit-identical) and, vertical, ``parties/<label>/missing.csv`` (``ID``,
``missing_at``).  Both are written atomically.  Files of several columns per input (HyFEM's views)
name a column ``<input>.<feature>`` (``view0.f3``); a series input (F³'s owners) one column per step,
``<feature>.t<step>``.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from fedhet.algorithms.scoring import rebuild, score
from fedhet.algorithms.toolkit import PSIBackend, psi_backend_setting
from fedhet.algorithms.party_table import PartyTable, TableSpec, check_features, load_party_table
from fedhet.parties import schema as sch
from fedhet.parties.api import PartyError, PeerFault
from fedhet.parties.atomic import write_atomic
from fedhet.parties.contract import PREDICT_SUFFIX, Algorithm, PartyContext, PartyLike, settings_table
from fedhet.parties.declare import MessageDecl, declare
from fedhet.parties.federation import Federation, PartySpec
from fedhet.parties.model_store import META, TrainedPart, read_part
from fedhet.parties.settings import known_keys, setting
from fedhet.protocols import psi

PREDICTIONS, MISSING = "predictions.csv", "missing.csv"
Rows = Mapping[str, np.ndarray]


class PredictError(ValueError):
    """A trained part or a new-rows file that does not fit the prediction job; the text names the file
    and the field (or column)."""


@dataclass(frozen=True)
class JobKeys:
    """The prediction job's own ``[algorithm]`` keys (``fedhet predict`` sets them)."""

    trained_run: str = setting("", "the training run's folder: each party reads its own part, "
                                   "<trained_run>/parties/<name>/model/")
    predictions_out: str = setting("", "the prediction run's folder: a scoring party writes "
                                       "parties/<name>/predictions.csv there")
    predict_psi_workers: int | None = setting(None, "PSI worker processes (None: as PSI decides, 0: inline)", lo=0)
    predict_psi_backend: PSIBackend = psi_backend_setting("aligns the new rows")


# ------------------------------------------------------------------------------------ layouts
@dataclass(frozen=True)
class Exchange:
    """An interactive exchange between the label party and each feature party (instead of one
    contribution each), e.g. an encrypted layer (``s``: the training settings): ``label(party, s, data, rows,
    peers)`` returns each
    peer's result for the common rows (peers in federation order), ``feature(party, s, data, rows,
    label)`` serves it; ``declarations(train_settings)``: its message kinds."""

    label: Callable[[PartyLike, Any, "PartData", Rows, list[str]], dict[str, np.ndarray]]
    feature: Callable[[PartyLike, Any, "PartData", Rows, str], None]
    declarations: Callable[[Any], list[MessageDecl]]


@dataclass(frozen=True)
class Vertical:
    """Rows split by columns: PSI-aligned rows, predictions at the label party only.

    ``contribution(module, meta, rows)``: what a feature party's part gives for the common rows (an
    array, sent to the label party under ``<name>/predict``; None: a feature party sends nothing
    but PSI); ``schema(train_settings)``: that array's schema; ``what``: its declaration's words;
    ``protects``: what protects it (a key of :data:`fedhet.parties.declare.PROTECTIONS`, or a function
    of the training settings giving one).
    ``exchange`` (instead of a contribution): an interactive exchange per feature party; ``others``
    and ``part_roles``: the roles that take part without rows of their own (F³'s coordinator and holders).
    ``combine(module, meta, rows, contributions)``: the label party's class probabilities (rows,
    classes) from its own rows and the feature parties' contributions (name -> array, federation order)."""

    label_role: str
    feature_roles: tuple[str, ...]
    combine: Callable[[Any, Mapping[str, Any], Rows, dict[str, np.ndarray]], np.ndarray]
    contribution: Callable[[Any, Mapping[str, Any], Rows], np.ndarray] | None = None
    schema: Callable[[Any], sch.Spec] | None = None
    what: str = ""
    protects: str | Callable[[Any], str] | None = None
    exchange: Exchange | None = None
    # roles that hold a part but no rows (they load it, checked, without a data file) and the role
    # functions of the parties that neither label nor align (``fn(party, train_settings, data)``)
    part_roles: tuple[str, ...] | Callable[[Any], tuple[str, ...]] = ()     # or a function of the training settings
    others: Mapping[str, Callable[[PartyLike, Any, "PartData"], dict]] | None = None


@dataclass(frozen=True)
class Horizontal:
    """Rows split by rows: each party of ``scoring_role`` scores its own; ``probabilities(meta, out)``
    turns its part's output into class probabilities (rows, classes)."""

    scoring_role: str
    probabilities: Callable[[Mapping[str, Any], np.ndarray], np.ndarray]


Layout = Vertical | Horizontal


def softmax(meta: Mapping[str, Any], out: np.ndarray) -> np.ndarray:
    """A :class:`Horizontal` ``probabilities`` for parts whose output is the class logits."""
    return torch.softmax(torch.from_numpy(np.asarray(out)), dim=1).numpy()


@dataclass
class PartData:
    """A scoring party's own part (checked, rebuilt) and its new rows; all None for a party that scores
    nothing (a server, a share holder)."""

    folder: Path | None = None
    part: TrainedPart | None = None
    module: Any = None
    table: PartyTable | None = None


# ------------------------------------------------------------------------------------ settings
def job_settings(training: type) -> type:
    """The job's settings class: the training settings (flattened: the federation's ``[algorithm]``
    keys, checked against every part's) and :class:`JobKeys`."""
    clash = set(known_keys(training)) & set(known_keys(JobKeys))
    if clash:
        raise TypeError(f"{training.__name__}: keys {sorted(clash)} clash with the prediction job's own")
    return dataclasses.make_dataclass(
        f"{training.__name__}Prediction",
        [("train", training, setting(training(), "the training settings (the federation's [algorithm] keys)",
                                     flatten=True)),
         ("job", JobKeys, setting(JobKeys(), "the prediction job's own keys", flatten=True))],
        frozen=True)


# ------------------------------------------------------------------------------------ the parts
def _steps(meta: Mapping[str, Any]) -> int | None:
    """The steps of a part whose input ``x`` is a series (rows, steps, channels); None for plain rows."""
    spec = next((s for s in meta.get("inputs") or [] if s["name"] == "x"), None)
    return int(spec["shape"][1]) if spec is not None and len(spec["shape"]) == 3 else None


def columns(meta: Mapping[str, Any]) -> list[str]:
    """The columns a part's new rows must have, in order: its feature names (``<input>.<name>`` where
    the part names them per input; ``<name>.t<step>`` step by step where its input is a series, then
    ``lengths`` where it takes each row's number of real steps)."""
    names = meta.get("feature_names") or []
    if isinstance(names, Mapping):
        return [f"{inp}.{n}" for inp, ns in names.items() for n in ns]
    steps = _steps(meta)
    if steps is None:
        return [str(n) for n in names]
    lengths = ["lengths"] if any(s["name"] == "lengths" for s in meta.get("inputs") or []) else []
    return [f"{n}.t{t}" for t in range(steps) for n in names] + lengths


def own_rows(meta: Mapping[str, Any], table: PartyTable) -> dict[str, np.ndarray]:
    """The part's own inputs from the new rows (the feature columns in the part's order)."""
    names = meta.get("feature_names") or []
    specs = {s["name"]: s for s in meta.get("inputs") or []}

    def cast(name: str, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=np.float64 if specs.get(name, {}).get("dtype") == "float64"
                                    else np.float32)

    if isinstance(names, Mapping):
        out, j = {}, 0
        for inp, ns in names.items():
            out[inp] = cast(inp, table.X[:, j:j + len(ns)])
            j += len(ns)
        return out
    steps = _steps(meta)
    if steps is None:
        return {"x": cast("x", table.X)}
    width = steps * len(names)
    series = {"x": cast("x", table.X[:, :width].reshape(len(table.X), steps, len(names)))}
    if "lengths" in specs:
        series["lengths"] = cast("lengths", table.X[:, width])
    return series


def open_part(training: Algorithm, layout: Layout, s: Any, ctx: PartyContext) -> PartData:
    """The job's ``load_data``: a scoring party's part (read, checked against the federation, rebuilt,
    proven to score as trained) and its new rows (checked against the part's feature names)."""
    if ctx.role not in scoring_roles(layout) and not (isinstance(layout, Vertical) and
                                                      ctx.role in part_roles(layout, s.train)):
        return PartData()
    for key in ("trained_run", "predictions_out"):
        if not getattr(s.job, key):
            raise PredictError(f"[algorithm] {key} is not set (fedhet predict --model RUN --out PRED sets it)")
    folder = Path(s.job.trained_run) / "parties" / ctx.name / "model"
    part = read_part(folder)
    where = folder / META
    header = part.header
    for key, want in (("algorithm", training.name), ("party", ctx.name), ("role", ctx.role)):
        if header.get(key) != want:
            raise PredictError(f"{where}: field {key!r} is {header.get(key)!r}, but this party of the federation "
                               f"is {key} {want!r}")
    got = header.get("settings") or {}
    want_settings = json.loads(json.dumps(settings_table(s.train), default=str))
    for key in sorted(set(got) | set(want_settings)):
        if got.get(key) != want_settings.get(key):
            raise PredictError(f"{where}: field 'settings.{key}' is {got.get(key)!r}, but the federation's "
                               f"[algorithm] gives {want_settings.get(key)!r}: these parts were trained with "
                               f"other settings")
    module = rebuild(training, part, where)
    if ctx.role not in scoring_roles(layout):
        return PartData(folder, part, module)
    if not ctx.data:
        raise PredictError(f"party {ctx.name!r}: its [[party]] section names no data file with its new rows "
                           f"(data = {{ path = ..., id = ... }})")
    spec = TableSpec.from_dict(dict(ctx.data), party=ctx.name, base_dir=ctx.base_dir,
                               require=("id",) if isinstance(layout, Vertical) else ())
    table = load_party_table(spec)
    check_features(table, columns(part.meta), f"its trained part ({where}, field 'feature_names')")
    return PartData(folder, part, module, table)


def check_federation(party: PartyLike, data: PartData) -> None:
    """The part was trained by a federation of these parties and roles (its fingerprint's ``parties``;
    parts trained in memory carry no fingerprint)."""
    fp = data.part.header.get("fingerprint") if data.part is not None else None
    if not fp or data.folder is None:
        return
    here = Federation(name="", parties=[PartySpec(n, r, "") for n, r in party.roles.items()],
                      algorithm={"name": ""}).fingerprint()["parties"]
    if fp.get("parties") != here:
        raise PredictError(f"{data.folder / META}: field 'fingerprint.parties' is {fp.get('parties')!r}, but this "
                           f"federation's parties and roles give {here!r}: the part was trained by another federation")


def part_roles(layout: Vertical, train: Any) -> tuple[str, ...]:
    """The roles that load a part but hold no rows, under the training settings ``train``."""
    return layout.part_roles(train) if callable(layout.part_roles) else layout.part_roles


def scoring_roles(layout: Layout) -> tuple[str, ...]:
    if isinstance(layout, Vertical):
        return tuple(dict.fromkeys((layout.label_role, *layout.feature_roles)))
    return (layout.scoring_role,)


# ------------------------------------------------------------------------------------ files
def _num(v: float) -> str:
    return repr(float(v))   # the shortest text that reads back as the same float64


def write_predictions(path: Path, ids: Sequence[Any], probs: np.ndarray, classes: Sequence[Any]) -> Path:
    """``ID, class, p_<class>...`` (atomically); the class is the arg-max's."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[1] != len(classes) or probs.shape[0] != len(ids):
        raise ValueError(f"predictions: {probs.shape} probabilities for {len(ids)} rows and {len(classes)} classes")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["ID", "class", *(f"p_{c}" for c in classes)])
    best = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
    for i, row in enumerate(probs):
        w.writerow([ids[i], classes[int(best[i])], *map(_num, row)])
    return write_atomic(path, buf.getvalue())


def read_predictions(path: str | Path) -> tuple[list[str], list[str], np.ndarray]:
    """IDs, classes and probabilities of a ``predictions.csv`` (as text, text, float64)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    body = rows[1:]
    probs = np.array([[float(v) for v in r[2:]] for r in body], dtype=np.float64).reshape(len(body), len(rows[0]) - 2)
    return [r[0] for r in body], [r[1] for r in body], probs


def write_missing(path: Path, lacking: Mapping[Any, list[str]]) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["ID", "missing_at"])
    for i, who in lacking.items():
        w.writerow([i, ";".join(who)])
    return write_atomic(path, buf.getvalue())


def _out(s: Any, party: PartyLike, name: str) -> Path:
    return Path(s.job.predictions_out) / "parties" / party.name / name


def _ids(table: PartyTable) -> list:
    return table.ids.tolist() if table.ids is not None else list(range(1, table.n_rows + 1))


# ------------------------------------------------------------------------------------ roles
def _label_party(party: PartyLike, role: str) -> str:
    names = [n for n, r in party.roles.items() if r == role]
    if not names:
        raise PartyError(f"the federation has no party of role {role!r} (the label party)")
    return names[0]


def _ready(party: PartyLike, data: PartData) -> tuple[PartyTable, TrainedPart]:
    if data.table is None or data.part is None:
        raise PartyError(f"party {party.name!r}: no trained part or new rows loaded")
    check_federation(party, data)
    return data.table, data.part


def _label_side(layout: Vertical, kind: str, party: PartyLike, s: Any, data: PartData) -> dict:
    table, part = _ready(party, data)
    peers = [n for n, r in party.roles.items() if r in layout.feature_roles and n != party.name]
    ids = _ids(table)
    workers, backend = s.job.predict_psi_workers, s.job.predict_psi_backend
    t0 = time.perf_counter()
    res = psi.psi_label_owner(party, ids, peers, reveal_to_all=True, order="sorted", workers=workers, backend=backend)
    if res.rows is None:
        raise PartyError("PSI returned no rows to the label party")
    rows = np.asarray(res.rows, dtype=np.int64)
    # who lacks which of our rows: with one feature party it is that party; with more, one PSI per
    # feature party that reveals nothing to it tells us (ECDH's label owner matches pair by pair anyway)
    common = np.zeros(len(ids), dtype=bool)
    common[rows] = True
    lacks: dict[str, np.ndarray] = {}
    for p in peers:
        if len(peers) == 1:
            lacks[p] = ~common
            continue
        pair = psi.psi_label_owner(party, ids, [p], reveal_to_all=False, order="sorted", workers=workers,
                                   backend=backend)
        has = np.zeros(len(ids), dtype=bool)
        has[np.asarray(pair.rows, dtype=np.int64)] = True
        lacks[p] = ~has
    t1 = time.perf_counter()
    own = {k: v[rows] for k, v in own_rows(part.meta, table).items()}
    contributions: dict[str, np.ndarray] = {}
    if layout.exchange is not None and peers:
        contributions = layout.exchange.label(party, s.train, data, own, peers)
    elif layout.contribution is not None and peers:
        got = party.gather(kind, frm=peers)
        for p in peers:
            arr = np.asarray(got[p]["out"])
            if arr.shape[0] != len(rows):
                raise PeerFault(party.name, p, kind, f"holds {arr.shape[0]} rows; the common list has {len(rows)}")
            contributions[p] = arr
    t2 = time.perf_counter()
    probs = layout.combine(data.module, part.meta, own, contributions)
    classes = list(part.meta.get("classes") or range(np.asarray(probs).shape[1]))
    write_predictions(_out(s, party, PREDICTIONS), [ids[r] for r in rows], probs, classes)
    missing = {ids[i]: [p for p in peers if lacks[p][i]] for i in np.flatnonzero(~common)}
    write_missing(_out(s, party, MISSING), missing)
    party.log.info("predicted %d of %d rows; %d missing at some party", len(rows), len(ids), len(missing))
    return {"role": party.role, "label_party": True, "n_rows": len(ids), "n_predicted": int(len(rows)),
            "n_missing": len(missing), "missing_by_party": {p: int(lacks[p].sum()) for p in peers},
            "predictions": PREDICTIONS, "missing": MISSING, "psi_backend": res.stats["backend"],
            "psi_s": t1 - t0, "exchange_s": t2 - t1, "score_s": time.perf_counter() - t2}


def _feature_side(layout: Vertical, kind: str, label: str, party: PartyLike, s: Any, data: PartData) -> dict:
    table, part = _ready(party, data)
    ids = _ids(table)
    workers, backend = s.job.predict_psi_workers, s.job.predict_psi_backend
    res = psi.psi_feature_party(party, ids, label, workers=workers, backend=backend)
    if res.rows is None:
        raise PartyError(f"the label party {label!r} did not reveal the common rows")
    rows = np.asarray(res.rows, dtype=np.int64)
    n_feature = sum(1 for n, r in party.roles.items() if r in layout.feature_roles and n != label)
    if n_feature > 1:
        psi.psi_feature_party(party, ids, label, workers=workers, backend=backend)   # the label party's per-party count
    own = {k: v[rows] for k, v in own_rows(part.meta, table).items()}
    if layout.exchange is not None:
        layout.exchange.feature(party, s.train, data, own, label)
    elif layout.contribution is not None:
        party.send(label, kind, {"out": layout.contribution(data.module, part.meta, own)})
    return {"role": party.role, "label_party": False, "n_rows": len(ids), "n_common": int(len(rows)),
            "psi_backend": res.stats["backend"],
            "n_unmatched": len(ids) - int(len(rows))}


def _score_side(layout: Horizontal, party: PartyLike, s: Any, data: PartData) -> dict:
    table, part = _ready(party, data)
    out = score(data.module, part.meta, own_rows(part.meta, table))
    probs = layout.probabilities(part.meta, out)
    classes = list(part.meta.get("classes") or range(probs.shape[1]))
    write_predictions(_out(s, party, PREDICTIONS), _ids(table), probs, classes)
    return {"role": party.role, "n_rows": table.n_rows, "n_predicted": table.n_rows, "predictions": PREDICTIONS}


def _roles(training: Algorithm, layout: Layout, kind: str) -> dict[str, Callable[..., dict]]:
    def role(party: PartyLike, s: Any, data: PartData) -> dict:
        if isinstance(layout, Horizontal):
            if party.role == layout.scoring_role:
                return _score_side(layout, party, s, data)
        else:
            label = _label_party(party, layout.label_role)
            if party.name == label:
                return _label_side(layout, kind, party, s, data)
            if party.role in layout.feature_roles:
                return _feature_side(layout, kind, label, party, s, data)
            if layout.others and party.role in layout.others:
                check_federation(party, data)
                return layout.others[party.role](party, s.train, data)
        return {"role": party.role, "scores": False}

    return {r: role for r in training.roles}


def prediction_job(training: Algorithm, settings: type, layout: Layout, summary: str) -> Algorithm:
    """The prediction job of ``training`` (an :class:`Algorithm` named ``<name>.predict``), for its
    package to hand to its own ``Algorithm(predict=...)``: ``training`` here needs only its name,
    roles and ``load_model`` (build it first without ``predict``, then ``dataclasses.replace``)."""
    kind = f"{training.name}/predict"
    cls = job_settings(settings)

    def declarations(s: Any) -> list[MessageDecl]:
        if isinstance(layout, Horizontal):
            return []
        decls = psi.declarations(layout.label_role, layout.feature_roles, backend=s.job.predict_psi_backend)
        if layout.exchange is not None:
            decls += layout.exchange.declarations(s.train)
        elif layout.contribution is not None:
            if layout.schema is None:
                raise TypeError(f"{training.name}: a contribution needs its schema")
            protects = layout.protects(s.train) if callable(layout.protects) else layout.protects
            decls.append(declare(kind, layout.feature_roles, layout.label_role, layout.what,
                                 payload=sch.Fields({"out": layout.schema(s.train)}), protects=protects))
        return decls

    return Algorithm(name=training.name + PREDICT_SUFFIX, summary=summary, roles=_roles(training, layout, kind),
                     load_data=lambda s, ctx: open_part(training, layout, s, ctx), declarations=declarations,
                     settings=cls, headline=("n_predicted", "n_missing"))


def with_prediction(training: Algorithm, layout: Layout, summary: str) -> Algorithm:
    """``training`` with its prediction job (its settings class is ``training.settings``)."""
    if training.settings is None:
        raise TypeError(f"{training.name}: a prediction job needs typed settings")
    return dataclasses.replace(training, predict=prediction_job(training, training.settings, layout, summary))
