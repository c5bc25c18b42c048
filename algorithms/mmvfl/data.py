"""MMVFL's data: participant k's view of the fold's rows, minus the training rows it lacks.

The built-in multi-view sets of :mod:`fedhet.algorithms.data_multiview` (Table 2; ``msrc_v5`` is a
stand-in for Caltech7).  Participant k loads view k, the fold's rows (``cv_folds``, seed
``split_seed``); each participant lacks ``missing`` of the fold's training rows (seeded, disjoint
between participants), so the common set is smaller than anyone's own and the alignment matters.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.algorithms.data_multiview import cv_folds, load_multiview
from fedhet.algorithms.toolkit import Stream, stream_rng
from fedhet.parties.contract import PartyContext

from .settings import PARTICIPANT, SERVER, Settings


@dataclass(frozen=True, eq=False)
class ParticipantData:
    """One participant's rows: its own training rows' IDs and features, its validation rows (with the
    labels it is scored on, never sent), and the training labels for the label holder only."""

    ids: list[int]
    X_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray  # evaluation only (the package docstring)
    view: str
    kind: str
    n_classes: int
    y_train: np.ndarray | None = None  # participant 0 only


def fold_rows(s: Settings, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) row numbers of the configured fold (sorted)."""
    tr, va = s.split()
    f = cv_folds(y, tr, va, s.split_seed, s.n_folds)[s.fold]
    return f.train, f.val


def missing_rows(s: Settings, train: np.ndarray, n_participants: int) -> list[np.ndarray]:
    """The training rows each participant lacks: disjoint blocks of one seeded permutation."""
    perm = stream_rng(s.seed, Stream.MMVFL_SPLIT).permutation(train)
    return [np.sort(perm[k * s.missing:(k + 1) * s.missing]) for k in range(n_participants)]


def common_rows(s: Settings, train: np.ndarray, n_participants: int) -> np.ndarray:
    """What PSI must find: the training rows nobody lacks, sorted (the centralised reference uses it)."""
    gone = np.concatenate(missing_rows(s, train, n_participants))
    return np.setdiff1d(train, gone)


def load_data(s: Settings, ctx: PartyContext) -> ParticipantData | None:
    """A participant's own view and rows; the server has no data."""
    if ctx.role == SERVER:
        return None
    if ctx.role != PARTICIPANT:
        raise ValueError(f"mmvfl: unknown role {ctx.role!r} (roles: {SERVER}, {PARTICIPANT})")
    mv = load_multiview(s.dataset, data_dir=ctx.data_dir)
    if ctx.n_of_role != len(mv.views):
        raise ValueError(f"mmvfl: data set {s.dataset!r} has {len(mv.views)} views, so it needs "
                         f"{len(mv.views)} participants; the federation has {ctx.n_of_role}")
    train, val = fold_rows(s, mv.y)
    lack = missing_rows(s, train, ctx.n_of_role)[ctx.index]
    own_train = np.setdiff1d(train, lack)
    X = mv.views[ctx.index]
    return ParticipantData(ids=own_train.tolist(), X_train=X[own_train], X_val=X[val], y_val=mv.y[val],
                           view=mv.view_names[ctx.index], kind=mv.kind, n_classes=mv.n_classes,
                           y_train=mv.y[own_train] if ctx.index == 0 else None)
