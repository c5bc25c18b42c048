"""Federated CHFL and its baselines as party roles (Mori et al., "Continual Horizontal FL").

Roles: one ``server`` and K ``client`` parties.  Each client holds disjoint rows of one table and
the *common* feature columns plus its own *unique* columns (:func:`partition.chfl_partition`:
every party computes the same partition of the public row and feature index from the seeds, so
nothing about the data is exchanged to set it up).  ``load_data`` keeps only the client's own
rows (train, val, test) and columns; the server loads nothing.

``method = "chfl"`` (Algorithm 2): per mini-batch a client takes one Adam step on its copy of
the common column theta_c with the common-only loss, then one on its unique column and lateral
matrices U_k with the whole network's loss, theta_c fixed (eqs. 6-7;
:meth:`chfl_local.CHFLClient.train_round`).  After E local epochs it submits theta_c, one flat
float32 vector, weighted by its training-row count, to the aggregator
(:mod:`fedhet.protocols.aggregation`: ``"secure"`` = Bonawitz et al.'s secure aggregation, the
server sees masked ring vectors only; ``"plain"`` = in the clear).  The server sends the
weighted mean back (Algorithm 2 line 7, ``chfl/global``) and the client evaluates
(theta_c^(t+1), theta_u,k, U_k), as the paper defines Theta_k^t.  ``mu`` may be a list: one
unique column per value on one shared common column (its trajectory never depends on them).
``method = "common"``: FedAvg of the common column alone (the Common baseline).
``method = "local"``: each client trains one MLP on all its features alone; no parameter ever
leaves a client, the server only receives the final scores.

What leaves a client (declared, checked by ``fedhet audit``): the aggregator's messages, whose
only array is the masked (or, with plain aggregation, clear) vector of exactly the common
column's parameter count P_c = sum over layers of (in*out + out) for the widths
[n_common, *hidden, n_classes] (+1 masked weight coordinate) -- a unique column, the laterals
or the whole network cannot pass; in a Local run no aggregation message at all; and at the end
one ``chfl/result`` of scalars (per-client test accuracies, chosen hyper-parameters, counts,
timings).  The server sends ``chfl/global``: the averaged common column(s), float32 (P_c,).

Selection (done by each client alone on its validation rows):
``lr`` may be a list (one common column per lr, each aggregated separately, each message still
exactly P_c long) and ``mu`` a list; each client picks lr, mu and (``select = "best_round"``)
the round on its own validation accuracy.  Reported groups: ``common``, ``chfl_mu0``,
``chfl_mu>0``, ``local`` -- the columns of Table II.

Determinism: the models, batches and partition come from ``seed`` (and ``feature_seed``, default
``seed``; ``toolkit.derive_seed``); with plain aggregation the federated run computes the same
numbers as plain FedAvg in one loop (bit-identical: the plain mean is the same float64 weighted
sum as ``chfl_local.aggregate``, cast to float32; tested).  Secure aggregation rounds each
weighted input to the grid 2**-f, so its mean differs by at most the returned ``mean_error_bound``.

Experiments (the paper's tables, sweeps over seeds) run these same roles in memory:
:func:`run_table` on an in-memory table, :func:`sweep` for Table II's four numbers of one
(feature split, seed); there is no second copy of the round loop.

Configuration (``[algorithm]`` keys; unknown keys are an error):

====================  ==================  ===========================================================
key                   default             meaning
====================  ==================  ===========================================================
method                "chfl"              "chfl", "common" or "local"
dataset               "covertype"         covertype, sensorless, jannis, vehicle, helena, aloi
                                          (``data_tabular``), digits, wine (scikit-learn, no files)
common_ratio          0.3                 share of features common to all clients
mu                    0.5                 lateral scale in [0, 1], or a list (one unique column each)
lr                    0.001               Adam's lr, or a list (one federation per lr, per-client pick)
rounds                20                  T aggregation rounds
local_epochs          5                   E local epochs per round
batch_size            64
hidden                [512, 256, 128]     both columns' hidden widths (smaller only for tests)
select                "best_round"        per-client pick on validation: best_round or last
feature_seed          = seed              the feature split's seed (``seed`` splits the rows)
standardize           true                scale with the client's own training-row statistics
reset_common_optim    true                fresh Adam for theta_c each round (plain FedAvg clients)
n_samples, n_features, n_classes          the table's shape, for data sets not in SHAPES (all
                                          parties must agree on it; the audit derives P_c from it)
torch_threads         1                   torch.set_num_threads per party (0: torch's default)
recv_timeout          None                seconds to wait for one message (None: the federation's)
return_weights        false               server returns the final common vector(s) (tests)
aggregation           "secure"            or "plain"; also plain_dtype (default "float64": exactly the
                                          in-process mean), aggregation_timeout and secagg_* keys
                                          (secagg_clip default 16, secagg_max_weight default the
                                          largest client training count of the split)
====================  ==================  ===========================================================

The device is each party's (``device`` in the federation file: cpu, cuda, auto).
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from fedhet.algorithms.chfl_local import HIDDEN, CHFLClient, LocalClient, client_data, select_per_client
from fedhet.algorithms.chfl_model import init_common_flat
from fedhet.algorithms.partition import HorizontalSplit, chfl_partition, split_samples
from fedhet.algorithms.toolkit import derive_seed, synchronize
from fedhet.algorithms.party_table import DataFileError, DataSpecError, TableSpec, check_finite, load_party_table
from fedhet.parties.api import PartyError
from fedhet.parties import schema as sch
from fedhet.parties.contract import Algorithm, PartyContext
from fedhet.parties.settings import TableView, setting
from fedhet.protocols.aggregation_settings import AggregationSettings
from fedhet.parties.declare import declare, no_arrays
from fedhet.protocols import aggregation

NAME = "chfl"
METHODS = ("chfl", "common", "local")
K_GLOBAL = "chfl/global"
K_RESULT = "chfl/result"

# (rows, features, classes) of every known table: the audit derives P_c from it without data.
SHAPES = {
    "covertype": (15120, 54, 7),
    "sensorless": (2200, 48, 11),
    "jannis": (30145, 54, 4),
    "vehicle": (846, 18, 4),
    "helena": (65196, 27, 100),
    "aloi": (108000, 128, 1000),
    "digits": (1797, 64, 10),
    "wine": (178, 13, 3),
}
SKLEARN_SETS = ("digits", "wine")

DEFAULTS: dict[str, Any] = {
    "method": "chfl", "dataset": "covertype", "common_ratio": 0.3, "mu": 0.5, "lr": 1e-3,
    "rounds": 20, "local_epochs": 5, "batch_size": 64, "hidden": list(HIDDEN),
    "select": "best_round", "feature_seed": None, "standardize": True, "reset_common_optim": True,
    "n_samples": None, "n_features": None, "n_classes": None, "n_clients": None,
    "torch_threads": 1, "recv_timeout": None, "return_weights": False, "seed": 0,
    "common_features": None,
}
FILES = "files"  # dataset = "files": each client reads its own table ([[party]] data = {...})
# A client's weight is its training-row count; from users' files no party knows the others', so
# secure aggregation's public weight bound defaults to this (set secagg_max_weight to tighten it).
FILES_MAX_WEIGHT = 1_000_000.0
# Aggregation keys pass through to make_aggregator; these defaults apply when unset.
AGG_KEYS = {"aggregation", "plain_dtype", "aggregation_timeout"}
# plain_dtype stays the aggregator's float64: its float32 path forms w * x in float32, which
# would break equality with the in-process mean.
AGG_DEFAULTS = {"aggregation": "secure", "secagg_clip": 16.0}
GROUPS = ("common", "chfl_mu0", "chfl_mu>0", "local")


# ------------------------------------------------------------------------------- settings

@dataclass(frozen=True)
class Settings:
    method: str
    dataset: str
    common_ratio: float
    mus: tuple[float, ...]
    lrs: tuple[float, ...]
    rounds: int
    epochs: int
    batch_size: int
    hidden: tuple[int, ...]
    select: str
    seed: int
    feature_seed: int | None
    standardize: bool
    reset_common_optim: bool
    shape: tuple[int, int, int]          # rows, features, classes
    n_clients: int | None
    torch_threads: int
    recv_timeout: float | None
    return_weights: bool
    common_features: tuple[str, ...] | None = None  # dataset "files": the common columns, by name

    @property
    def n_common(self) -> int:
        if self.common_features:
            return len(self.common_features)
        # The rule of partition.split_features (checked against the real split in load_data).
        return int(round(self.common_ratio * self.shape[1]))

    @property
    def n_classes(self) -> int:
        return self.shape[2]

    @property
    def G(self) -> int:
        """Common columns trained side by side (one per lr)."""
        return 0 if self.method == "local" else len(self.lrs)


def _num_list(v, key: str) -> tuple[float, ...]:
    vals = v if isinstance(v, (list, tuple)) else [v]
    if not vals:
        raise ValueError(f"chfl: {key} must not be empty")
    out = []
    for x in vals:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"chfl: {key} must be a number or a list of numbers, got {v!r}")
        out.append(float(x))
    if len(set(out)) != len(out):
        raise ValueError(f"chfl: {key} values repeat: {out}")
    return tuple(out)


def _int(cfg: dict, key: str, lo: int = 1) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"chfl: {key} must be an integer >= {lo}, got {v!r}")
    return v


def settings(cfg: dict | None) -> Settings:
    """Parse and check an ``[algorithm]`` table (``name`` ignored); errors name the key."""
    raw = {k: v for k, v in dict(cfg or {}).items() if k != "name"}
    unknown = sorted(k for k in raw if k not in DEFAULTS and k not in AGG_KEYS
                     and not k.startswith("secagg_"))
    if unknown:
        raise ValueError(f"chfl: unknown config key(s) {unknown}; known: "
                         f"{sorted(DEFAULTS)} and the aggregation keys {sorted(AGG_KEYS)}, secagg_*")
    c = {**DEFAULTS, **raw}
    method = str(c["method"]).strip().lower()
    if method not in METHODS:
        raise ValueError(f"chfl: method must be one of {METHODS}, got {c['method']!r}")
    dataset = str(c["dataset"]).strip().lower()
    ratio = c["common_ratio"]
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio < 1:
        raise ValueError(f"chfl: common_ratio must be in (0, 1), got {ratio!r}")
    mus = _num_list(c["mu"], "mu")
    if any(not 0.0 <= m <= 1.0 for m in mus):
        raise ValueError(f"chfl: mu must be in [0, 1], got {list(mus)}")
    lrs = _num_list(c["lr"], "lr")
    if any(not lr > 0 for lr in lrs):
        raise ValueError(f"chfl: lr must be > 0, got {list(lrs)}")
    hidden = c["hidden"]
    if (not isinstance(hidden, (list, tuple)) or not hidden
            or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in hidden)):
        raise ValueError(f"chfl: hidden must be a list of positive integers, got {hidden!r}")
    if c["select"] not in ("best_round", "last"):
        raise ValueError(f"chfl: select must be best_round or last, got {c['select']!r}")
    fs = c["feature_seed"]
    if fs is not None and (isinstance(fs, bool) or not isinstance(fs, int) or fs < 0):
        raise ValueError(f"chfl: feature_seed must be an integer >= 0, got {fs!r}")
    known = SHAPES.get(dataset)
    given = [c["n_samples"], c["n_features"], c["n_classes"]]
    common_features = c["common_features"]
    if dataset == FILES:
        if (not isinstance(common_features, (list, tuple)) or not common_features
                or not all(isinstance(f, str) and f for f in common_features)
                or len(set(common_features)) != len(common_features)):
            raise ValueError("chfl: dataset 'files' needs common_features = [names of the columns every "
                             f"client holds], got {common_features!r}")
        if c["n_classes"] is None:
            raise ValueError("chfl: dataset 'files' needs n_classes (every client declares the same classes)")
        # Rows and unique columns are each client's own; only these enter the declarations.
        known = (1, len(common_features) + 1, int(c["n_classes"]))
        given = [None, None, c["n_classes"]]
    elif common_features is not None:
        raise ValueError("chfl: common_features is only for dataset 'files' (built-in sets split by common_ratio)")
    if known is None and None in given:
        raise ValueError(f"chfl: dataset {dataset!r} is not one of {sorted(SHAPES)}; give its "
                         "n_samples, n_features and n_classes in the config")
    shape = tuple(int(g) if g is not None else int(k) for g, k in zip(given, known or given))
    if shape[0] < 1 or shape[1] < 2 or shape[2] < 2:
        raise ValueError(f"chfl: n_samples/n_features/n_classes {list(shape)} are not a table")
    if round(ratio * shape[1]) < 1:
        raise ValueError(f"chfl: common_ratio {ratio} of {shape[1]} features leaves none common")
    n_clients = c["n_clients"]
    if n_clients is not None:
        n_clients = _int(c, "n_clients")
    rt = c["recv_timeout"]
    if rt is not None and not (isinstance(rt, (int, float)) and rt > 0):
        raise ValueError(f"chfl: recv_timeout must be a positive number of seconds, got {rt!r}")
    seed = c["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"chfl: seed must be an integer >= 0, got {seed!r}")
    return Settings(
        method=method, dataset=dataset, common_ratio=float(ratio),
        mus=() if method == "common" else mus, lrs=lrs, rounds=_int(c, "rounds"),
        epochs=_int(c, "local_epochs"), batch_size=_int(c, "batch_size"),
        hidden=tuple(int(h) for h in hidden), select=c["select"], seed=seed, feature_seed=fs,
        standardize=bool(c["standardize"]), reset_common_optim=bool(c["reset_common_optim"]),
        shape=shape, n_clients=n_clients, torch_threads=_int(c, "torch_threads", 0),
        recv_timeout=None if rt is None else float(rt), return_weights=bool(c["return_weights"]),
        common_features=tuple(common_features) if dataset == FILES else None,
    )


def _widths(d_in: int, s: Settings) -> list[int]:
    return [int(d_in), *s.hidden, s.n_classes]


def _mlp_count(widths: list[int]) -> int:
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def common_count(cfg: dict | Settings) -> int:
    """P_c: the common column's parameter count, from the configuration alone."""
    s = cfg if isinstance(cfg, Settings) else settings(cfg)
    return _mlp_count(_widths(s.n_common, s))


def unique_count(cfg: dict | Settings, d_unique: int, lateral: bool = True) -> int:
    """A unique column's parameter count (with its lateral matrices U^(2..L), no bias)."""
    s = cfg if isinstance(cfg, Settings) else settings(cfg)
    w = _widths(d_unique, s)
    lat = sum(a * b for a, b in zip(w[1:-1], w[2:])) if lateral else 0
    return _mlp_count(w) + lat


def max_train_rows(s: Settings, n_clients: int) -> int:
    """The largest training-row count of any client (secure aggregation's weight bound)."""
    return max(len(t) for t in split_samples(s.shape[0], n_clients, s.seed)[0])


def aggregation_defaults(s: Settings, n_clients: int) -> dict:
    if s.dataset == FILES:
        return {**AGG_DEFAULTS, "secagg_max_weight": FILES_MAX_WEIGHT}
    return {**AGG_DEFAULTS, "secagg_max_weight": float(max_train_rows(s, n_clients))}


# ------------------------------------------------------------------------------- data

def load_table(name: str, data_dir=None):
    """``(X float32, y int64 0..C-1, name)``: scikit-learn's digits/wine, else ``data_tabular``."""
    key = name.strip().lower()
    if key in SKLEARN_SETS:
        from sklearn import datasets
        X, y = getattr(datasets, f"load_{key}")(return_X_y=True)
        _, codes = np.unique(y, return_inverse=True)
        return (np.ascontiguousarray(X, dtype=np.float32), codes.astype(np.int64).reshape(-1), key)
    from fedhet.algorithms.data_tabular import load_tabular
    return tuple(load_tabular(key, data_dir))


@dataclass
class ClientRows:
    """One client's own rows, columns common-first then unique, ordered train | val | test."""

    x: np.ndarray          # float32 (n_train + n_val + n_test, n_common + n_unique), raw values
    y: np.ndarray          # int64
    n_parts: tuple[int, int, int]
    n_common: int
    n_classes: int
    index: int
    n_clients: int


def _largest_label(y: np.ndarray) -> int:
    """The largest finite label (-1 for none): NaN / inf labels are reported by client_rows."""
    y = np.asarray(y)
    finite = y[np.isfinite(y)] if y.dtype.kind in "fc" else y
    return int(finite.max()) if finite.size else -1


def client_rows(s: Settings, X: np.ndarray, y: np.ndarray, index: int, n_clients: int,
                party: str | None = None) -> ClientRows:
    """Client ``index``'s part of the whole table under the seeded CHFL partition.

    ``X`` and ``y`` come from the caller (a built-in table, or arrays handed to :func:`run_table`):
    the client's rows of them are checked like a party's file, and a NaN or infinite value is an
    error naming the party (``party``, default ``client<index + 1>``), the argument, the row and
    the column of the caller's arrays."""
    who = party or f"client{index + 1}"
    X, y = np.asarray(X), np.asarray(y)
    if X.ndim != 2 or y.ndim != 1 or len(y) != len(X):
        raise ValueError(f"chfl: party {who!r}: X must be 2-D and y 1-D with one label per row of X, "
                         f"got X {X.shape} and y {y.shape}")
    top = _largest_label(y)  # a NaN label is reported below, with its party
    if tuple(X.shape) != tuple(s.shape[:2]) or top + 1 != s.n_classes:
        raise ValueError(f"chfl: the {s.dataset} table is {X.shape[0]} x {X.shape[1]} with "
                         f"{top + 1} classes, the configuration says "
                         f"{s.shape[0]} x {s.shape[1]} with {s.n_classes} (set n_samples, "
                         "n_features, n_classes to your copy's shape)")
    split = chfl_partition(X.shape[0], X.shape[1], n_clients, s.common_ratio, s.seed,
                           s.feature_seed)
    if len(split.common) != s.n_common:  # the audit's P_c assumes the rule in Settings.n_common
        raise AssertionError(f"partition has {len(split.common)} common features, expected {s.n_common}")
    rows = [split.rows(index, p) for p in ("train", "val", "test")]
    cols = split.features(index)
    r = np.concatenate(rows)
    order = np.argsort(r, kind="stable")  # report the first bad cell in the caller's row order
    check_finite(y[r][order], party=who, argument="y", rows=r[order] + 1, what="label")
    check_finite(X[r][:, cols][order], party=who, argument="X", rows=r[order] + 1,
                 columns=[int(c) + 1 for c in cols])
    return ClientRows(np.ascontiguousarray(X[r][:, cols], dtype=np.float32), np.asarray(y[r], np.int64),
                      tuple(len(a) for a in rows), len(split.common), s.n_classes, index, n_clients)


def load_data(cfg: dict, name: str, role: str, index: int, n_of_role: int, data_dir=None):
    s = settings(cfg)
    if role == "server":
        return None
    if role != "client":
        raise ValueError(f"chfl: unknown role {role!r}")
    if s.n_clients is not None and s.n_clients != n_of_role:
        raise ValueError(f"chfl: n_clients = {s.n_clients} but the federation has {n_of_role} clients")
    if s.dataset == FILES:
        raise ValueError(f"chfl: dataset 'files' but party {name!r} has no data file in the federation "
                         "(give its [[party]] a data = { path = ..., label = ..., classes = [...] })")
    X, y, _ = load_table(s.dataset, data_dir)
    return client_rows(s, X, y, index, n_of_role, party=name)  # the rest of the table is dropped here


def file_rows(s: Settings, ctx: PartyContext) -> ClientRows:
    """A client's own rows from its own file: the common columns by name (the same at every
    client), every other feature column unique to it; train | val | test = 60 | 20 | 20 % of its
    rows in a seeded order.  Errors name the party, file and column before training starts."""
    t = load_party_table(TableSpec.from_dict(dict(ctx.data or {}), party=ctx.name, base_dir=ctx.base_dir,
                                             require=("label", "classes")))
    if len(t.classes) != s.n_classes:
        raise DataSpecError(f"party {ctx.name!r}, file '{t.path}': {len(t.classes)} classes declared "
                            f"({list(t.classes)}) but the federation's n_classes is {s.n_classes}",
                            party=ctx.name, path=str(t.path), key="classes")
    missing = [f for f in s.common_features if f not in t.feature_names]
    if missing:
        raise DataFileError(f"party {ctx.name!r}, file '{t.path}': common feature column(s) {missing} "
                            f"missing (its feature columns: {list(t.feature_names)})",
                            party=ctx.name, path=str(t.path), column=missing[0])
    common = [t.feature_names.index(f) for f in s.common_features]
    unique = [i for i, f in enumerate(t.feature_names) if f not in s.common_features]
    if not unique:
        raise DataFileError(f"party {ctx.name!r}, file '{t.path}': no feature column besides the common "
                            f"ones {list(s.common_features)}: CHFL needs a client's own features",
                            party=ctx.name, path=str(t.path))
    n = t.n_rows
    if n < 5:
        raise DataFileError(f"party {ctx.name!r}, file '{t.path}': {n} rows; at least 5 are needed for "
                            "train/validation/test", party=ctx.name, path=str(t.path))
    order = np.random.default_rng([s.seed, ctx.index, 7]).permutation(n)
    n_tr, n_va = int(round(0.6 * n)), int(round(0.2 * n))
    cols = common + unique
    x = np.ascontiguousarray(t.X[order][:, cols], dtype=np.float32)
    return ClientRows(x, np.asarray(t.y[order], np.int64), (n_tr, n_va, n - n_tr - n_va), len(common),
                      s.n_classes, ctx.index, ctx.n_of_role)


def load_party(cfg, ctx: PartyContext):
    """The contract's ``load_data``: a client's own file when its section names one, else its
    part of a built-in table."""
    s = settings(cfg)
    if ctx.role == "client" and ctx.data:
        if s.dataset != FILES:
            raise ValueError(f"chfl: party {ctx.name!r} names a data file, so set dataset = \"files\" and "
                             "common_features in [algorithm]")
        if s.n_clients is not None and s.n_clients != ctx.n_of_role:
            raise ValueError(f"chfl: n_clients = {s.n_clients} but the federation has {ctx.n_of_role} clients")
        return file_rows(s, ctx)
    return load_data(cfg, ctx.name, ctx.role, ctx.index, ctx.n_of_role, ctx.data_dir)


def own_client_data(rows: ClientRows, s: Settings, device) -> Any:
    """:class:`chfl_local.ClientData` from the client's own rows: ``client_data`` on a
    one-client split of them (the same values and scaling as on the whole table)."""
    ntr, nva, nte = rows.n_parts
    d = rows.x.shape[1]
    own = HorizontalSplit(common=np.arange(rows.n_common), unique=[np.arange(rows.n_common, d)],
                          train=[np.arange(ntr)], val=[np.arange(ntr, ntr + nva)],
                          test=[np.arange(ntr + nva, ntr + nva + nte)], n_features=d,
                          n_samples=len(rows.y))
    return client_data(rows.x, rows.y, own, 0, rows.n_classes, s.standardize, device)


# ------------------------------------------------------------------------------- roles

def _threads(s: Settings) -> None:
    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)


def _labels(s: Settings) -> list[str]:
    if s.method == "local":
        return ["local"]
    return ["common"] + [f"chfl_mu={m:g}" for m in s.mus]


def _groups(s: Settings) -> dict[str, list[tuple[int, str, dict]]]:
    """Table II's columns -> the (lr index, label, config) candidates each client picks from, in the
    order of :func:`sweep`'s candidates (lr outer, mu inner; ties keep the first)."""
    out: dict[str, list] = {}
    for j, lr in enumerate(s.lrs):
        if s.method == "local":
            out.setdefault("local", []).append((j, "local", {"lr": lr}))
            continue
        out.setdefault("common", []).append((j, "common", {"lr": lr}))
        for m in s.mus:
            g = "chfl_mu0" if m == 0 else "chfl_mu>0"
            out.setdefault(g, []).append((j, f"chfl_mu={m:g}", {"lr": lr, "mu": m}))
    return out


def client(party, cfg: dict, data: ClientRows) -> dict:
    s = settings(cfg)
    _threads(s)
    srv = party.peers_with_role("server")
    if len(srv) != 1:
        raise PartyError(f"chfl needs exactly one server, the federation has {srv}")
    srv = srv[0]
    if data.n_clients != len(party.peers_with_role("client")) + 1:
        raise PartyError(f"chfl: data was split for {data.n_clients} clients, the federation has "
                         f"{len(party.peers_with_role('client')) + 1}")
    cd = own_client_data(data, s, party.device)
    k = data.index
    # Weights come from toolkit.seeded blocks, which parties that are threads of one process (the
    # in-memory transport) never enter at once.
    if s.method == "local":
        models = [LocalClient(cd, lr=lr, hidden=s.hidden, seed=s.seed, index=k) for lr in s.lrs]
    else:
        models = [CHFLClient(cd, mus=s.mus, lr=lr, hidden=s.hidden, seed=s.seed, index=k,
                             reset_common_optim=s.reset_common_optim) for lr in s.lrs]
    P = common_count(s)
    labels = _labels(s)
    n_train = cd.n_train
    agg = aggregation.make_aggregator(cfg, aggregation_defaults(s, data.n_clients))
    clip = float(cfg.get("secagg_clip", AGG_DEFAULTS["secagg_clip"]))
    curves = [{lab: {"val": [], "test": []} for lab in labels} for _ in s.lrs]
    losses, train_s, submit_s = [], [], []
    max_abs, clipped_rounds = 0.0, 0
    timeout = s.recv_timeout

    def evaluate():
        for j, m in enumerate(models):
            for part in ("val", "test"):
                e = m.evaluate(part)
                if s.method == "local":
                    curves[j]["local"][part].append(e["local"])
                else:
                    curves[j]["common"][part].append(e["common"])
                    for h, lab in enumerate(labels[1:]):
                        curves[j][lab][part].append(e["heads"][h])

    for r in range(s.rounds + 1):
        party.round = r
        if s.method != "local":
            msg = party.recv(srv, K_GLOBAL, timeout=timeout)
            thetas = msg.get("theta") if isinstance(msg, dict) else None
            if not isinstance(thetas, list) or msg.get("r") != r or len(thetas) != s.G:
                raise PartyError(f"chfl: malformed global model for round {r} from {srv}")
            for m, th in zip(models, thetas):
                m.set_common(th)  # checks the length and finiteness
        if r > 0:  # Theta_k^(r-1) = (theta_c^(r), theta_u,k, U_k)
            evaluate()
            last = curves[-1][labels[-1]]
            party.metric(round=r - 1, loss=float(np.mean(losses[-1])), val=last["val"][-1],
                         test=last["test"][-1], train_s=train_s[-1])
            party.progress(r, s.rounds, val=round(last["val"][-1], 4))
        if r == s.rounds:
            break
        t0 = time.perf_counter()
        rl = []
        for m in models:
            out = m.train_round(s.epochs, s.batch_size)
            rl.append(out["loss"] if s.method == "local" else out["loss_common"])
        synchronize(party.device)
        train_s.append(time.perf_counter() - t0)
        losses.append(rl)
        if s.method != "local":
            t0 = time.perf_counter()
            for j, m in enumerate(models):
                vec = m.get_common()
                if vec.shape != (P,):  # never send anything but the common column
                    raise AssertionError(f"common vector has {vec.shape}, expected ({P},)")
                a = float(np.abs(vec).max())
                max_abs = max(max_abs, a)
                clipped_rounds += int(a > clip)
                res = agg.submit(party, srv, vec, weight=n_train, round=r * s.G + j)
                if res.status != "ok":
                    party.log.warning("chfl round %d: aggregation %s (%s)", r, res.status, res.reason)
            submit_s.append(time.perf_counter() - t0)
    if clipped_rounds and agg.method == "secure":
        party.log.warning("chfl: |theta_c| reached %.3g > secagg_clip %g in %d submissions: clipped",
                          max_abs, clip, clipped_rounds)

    # Each client picks lr / mu / round on its own validation rows (chfl_local.select_per_client
    # on a one-client table).
    n_test = int(cd.y["test"].shape[0])
    selected = {}
    for g, cands in _groups(s).items():
        c = [{"val": [[v] for v in curves[j][lab]["val"]], "test": [[v] for v in curves[j][lab]["test"]],
              "config": cfgd} for j, lab, cfgd in cands]
        sel = select_per_client(c, s.select)
        selected[g] = {"test": sel["test"][0], "chosen": sel["chosen"][0]}
    final = {lab if len(s.lrs) == 1 else f"{lab} lr={lr:g}": curves[j][lab]["test"][-1]
             for j, lr in enumerate(s.lrs) for lab in labels}
    report = {"n_test": n_test, "selected": selected, "final": final,
              "train_s": train_s, "submit_s": submit_s}
    party.send(srv, K_RESULT, report)
    return {**report, "curves": curves, "train_loss": losses, "n_train": n_train,
            "n_val": int(cd.y["val"].shape[0]), "n_common": cd.d_common, "n_unique": cd.d_unique,
            "common_params": P if s.method != "local" else 0, "max_abs_common": max_abs,
            "clipped_submissions": clipped_rounds, "aggregation": agg.method if s.G else None,
            "device": party.device, "bytes_sent": sum(party.bytes_sent.values()),
            "bytes_received": sum(party.bytes_received.values())}


def server(party, cfg: dict, data) -> dict:
    s = settings(cfg)
    _threads(s)
    clients = party.peers_with_role("client")
    if not clients:
        raise PartyError("chfl: the federation has no client")
    if s.n_clients is not None and s.n_clients != len(clients):
        raise PartyError(f"chfl: n_clients = {s.n_clients} but the federation has {len(clients)} clients")
    t_start = time.perf_counter()
    P = common_count(s)
    agg = aggregation.make_aggregator(cfg, aggregation_defaults(s, len(clients)))
    round_s, agg_s, bound, dropped = [], [], 0.0, {}
    thetas = []
    if s.method != "local":
        theta0 = init_common_flat(s.n_common, s.n_classes, s.hidden, derive_seed(s.seed, "theta0"))
        thetas = [theta0] * s.G
        for r in range(s.rounds + 1):
            party.round = r
            t0 = time.perf_counter()
            party.broadcast(K_GLOBAL, {"r": r, "theta": thetas}, to=clients)
            if r == s.rounds:
                break
            new = []
            ta = 0.0
            for j in range(s.G):
                t1 = time.perf_counter()
                res = agg.aggregate(party, clients, round=r * s.G + j, length=P)
                ta += time.perf_counter() - t1
                new.append(res.mean.astype(np.float32))
                bound = max(bound, float(res.mean_error_bound))
                if res.dropped:
                    dropped[r] = sorted(set(dropped.get(r, [])) | set(res.dropped))
            thetas = new
            round_s.append(time.perf_counter() - t0)
            agg_s.append(ta)
            party.metric(round=r, round_s=round_s[-1], aggregate_s=ta)
            party.progress(r + 1, s.rounds)
    # Local clients train alone for all rounds before reporting: allow each round the timeout.
    wait = (s.recv_timeout or party.timeout) * (s.rounds + 1 if s.method == "local" else 1)
    reports = {c: party.recv(c, K_RESULT, timeout=wait) for c in clients}
    out_sel = {}
    for g in _groups(s):
        tests = [float(reports[c]["selected"][g]["test"]) for c in clients]
        out_sel[g] = {"mean_test": float(np.mean(tests)), "test": tests,
                      "chosen": [reports[c]["selected"][g]["chosen"] for c in clients]}
    final_keys = list(reports[clients[0]]["final"])
    final = {lab: float(np.mean([reports[c]["final"][lab] for c in clients])) for lab in final_keys}
    n_test = [int(reports[c]["n_test"]) for c in clients]
    train_s = [reports[c]["train_s"] for c in clients]
    out = {
        "method": s.method, "dataset": s.dataset, "clients": clients, "rounds": s.rounds,
        "local_epochs": s.epochs, "lrs": list(s.lrs), "mus": list(s.mus), "seed": s.seed,
        "feature_seed": s.seed if s.feature_seed is None else s.feature_seed,
        "aggregation": agg.method if s.G else None, "n_common": s.n_common,
        "common_params": P if s.G else 0,
        "selected": out_sel, "final_test": final, "n_test": n_test,
        "round_s": round_s, "aggregate_s": agg_s,
        "mean_round_s": float(np.mean(round_s)) if round_s else None,
        "client_train_s": train_s, "client_submit_s": [reports[c]["submit_s"] for c in clients],
        "max_mean_error_bound": bound, "dropped": {str(k): v for k, v in dropped.items()},
        "wall_s": time.perf_counter() - t_start,
        "bytes_sent": sum(party.bytes_sent.values()),
        "bytes_received": sum(party.bytes_received.values()),
    }
    if s.return_weights:
        out["theta"] = [t.tolist() for t in thetas]
    return out


ROLES = {"server": server, "client": client}


# ------------------------------------------------------------------- experiments in memory

def run_table(cfg: dict, X: np.ndarray, y: np.ndarray, n_clients: int, *, device: str = "cpu",
              timeout: float = 3600.0) -> dict[str, Any]:
    """CHFL's roles (``server``, ``client1..K``) run in memory on a table the caller holds.

    ``cfg`` is an ``[algorithm]`` table; the table's shape is taken from ``X`` and ``y`` (labels
    0..C-1) unless ``cfg`` gives it.  Each client gets its part of the table as ``load_data``
    would cut it.  Returns party name -> role result (``fedhet.parties.inmemory.run_inmemory``).
    """
    from fedhet.parties.inmemory import run_inmemory

    X, y = np.asarray(X), np.asarray(y)
    cfg = {"dataset": "table", "n_samples": int(X.shape[0]), "n_features": int(X.shape[1]),
           "n_classes": _largest_label(y) + 1, **cfg}
    s = settings(cfg)
    names = [f"client{k + 1}" for k in range(int(n_clients))]
    data: dict[str, Any] = {"server": None}
    for k, name in enumerate(names):  # before any thread starts: a bad table fails here
        data[name] = client_rows(s, X, y, k, len(names), party=name)
    return run_inmemory(sys.modules[__name__], [("server", "server")] + [(n, "client") for n in names],
                        cfg=cfg, seed=s.seed, data=data, device=device, timeout=timeout)


def sweep(dataset, K: int = 5, common_ratio: float = 0.3, rounds: int = 20, seed: int = 0,
          feature_seed: int | None = None, lr_grid=(1e-3, 1e-4), mu_grid=(0.1, 0.5, 1.0),
          select: str = "best_round", device: str = "cpu", epochs: int = 5, batch_size: int = 64,
          progress=None, *, hidden=HIDDEN, reset_common_optim: bool = True, standardize: bool = True,
          data_dir=None, timeout: float = 3600.0) -> dict:
    """Table II's four numbers for one (feature split, seed): Common, Local, CHFL mu=0 and CHFL
    mu>0, each client choosing lr (and mu, round) on its own validation rows.

    Two federations of the roles in memory, with plain aggregation: CHFL with every lr and the
    heads mu = 0 and each of ``mu_grid`` on one shared common column per lr (which is also the
    Common model), and Local.  ``dataset``: a name for :func:`load_table` or an ``(X, y[, name])``
    tuple.  Each party thread uses the caller's torch thread count.  ``progress(round, rounds,
    loss=, val=)`` is called per round of each (lr, method) after the runs, in the order CHFL
    lr_1, Local lr_1, CHFL lr_2, ...; ``results[group]`` holds ``test`` (per client),
    ``mean_test`` and ``chosen`` (per client: lr, mu, round).
    """
    if isinstance(dataset, str):
        dataset = load_table(dataset, data_dir)
    X, y = np.asarray(dataset[0]), np.asarray(dataset[1])
    name = str(dataset[2]) if len(dataset) > 2 else "data"
    mu_grid = [float(m) for m in mu_grid]
    if any(not 0 < m <= 1 for m in mu_grid):
        raise ValueError(f"mu_grid must hold values in (0, 1], got {mu_grid}")
    lrs = [float(lr) for lr in lr_grid]
    base = {"dataset": name, "common_ratio": float(common_ratio), "lr": lrs, "rounds": int(rounds),
            "local_epochs": int(epochs), "batch_size": int(batch_size), "hidden": [int(h) for h in hidden],
            "select": select, "seed": int(seed), "standardize": bool(standardize),
            "feature_seed": None if feature_seed is None else int(feature_seed),
            "reset_common_optim": bool(reset_common_optim), "n_clients": int(K),
            "torch_threads": torch.get_num_threads()}
    t0 = time.perf_counter()
    runs = {"chfl": run_table({**base, "mu": [0.0] + mu_grid, "aggregation": "plain"}, X, y, K,
                              device=device, timeout=timeout),
            "local": run_table({**base, "method": "local"}, X, y, K, device=device, timeout=timeout)}
    seconds = time.perf_counter() - t0
    clients = [f"client{k + 1}" for k in range(int(K))]
    if progress is not None:
        last = {"chfl": f"chfl_mu={mu_grid[-1]:g}" if mu_grid else "chfl_mu=0", "local": "local"}
        for j in range(len(lrs)):
            for method in ("chfl", "local"):
                res = [runs[method][c] for c in clients]
                for t in range(int(rounds)):
                    progress(t + 1, int(rounds), loss=float(np.mean([r["train_loss"][t][j] for r in res])),
                             val=float(np.mean([r["curves"][j][last[method]]["val"][t] for r in res])))
    results = {}
    for method, groups in (("chfl", ("common", "chfl_mu0", "chfl_mu>0")), ("local", ("local",))):
        for g in groups:
            sel = runs[method]["server"]["selected"][g]
            results[g] = {"test": sel["test"], "mean_test": sel["mean_test"], "chosen": sel["chosen"]}
    return {"results": {g: results[g] for g in ("common", "local", "chfl_mu0", "chfl_mu>0")},
            "n_common": runs["chfl"]["server"]["n_common"],
            "n_unique": [runs["chfl"][c]["n_unique"] for c in clients], "seconds": seconds}


# ------------------------------------------------------------------------- declarations

def _settings_or_error(cfg: dict) -> tuple[Settings | None, str | None]:
    try:
        return settings(cfg), None
    except ValueError as e:
        return None, f"configuration does not parse: {e}"


def _global_check(arrays: list, cfg: dict) -> str | None:
    s, err = _settings_or_error(cfg)
    if err:
        return err
    if s.method == "local":
        return "a Local run has no global model"
    if len(arrays) != s.G:
        return f"expected {s.G} common vector(s) (one per lr), got {len(arrays)} arrays"
    P = common_count(s)
    for dt, shape in arrays:
        if dt != "<f4" or tuple(shape) != (P,):
            return f"global model must be float32 ({P},) (the common column), got {dt}{list(shape)}"
    return None


def _guard(d):
    """An aggregator declaration, checked with CHFL's aggregation defaults, and refused
    outright in a Local run (no parameter leaves a client there)."""
    inner = d.check

    def check(arrays, cfg):
        s, err = _settings_or_error(cfg)
        if err:
            return err
        if s.method == "local":
            return "aggregation message in a Local run: no parameters may leave a client"
        merged = {**AGG_DEFAULTS, **cfg}
        return None if inner is None else inner(arrays, merged)

    return declare(d.kind, d.sender, d.receiver, d.what, check, d.payload)


def _update_length(cfg: dict) -> int:
    return common_count(cfg)


DECLARATIONS = [
    declare(K_GLOBAL, "server", "client",
            "the averaged common column theta_c, one float32 (P_c,) vector per lr", _global_check),
    declare(K_RESULT, "client", "server",
            "final scalars: per-client test accuracies, chosen lr/mu/round, test count, timings",
            no_arrays),
] + [_guard(d) for d in aggregation.declarations()]


# ------------------------------------------------------------------------- the contract

@dataclass(frozen=True)
class Table(TableView):
    """The ``[algorithm]`` keys, parsed and documented by the one settings parser; the roles
    derive :class:`Settings` (lists of lr/mu, the table's shape) from it."""

    method: Literal["chfl", "common", "local"] = setting("chfl", "chfl (Algorithm 2), common (FedAvg of the "
                                                         "common column) or local (each client alone)")
    dataset: str = setting("covertype", "covertype, sensorless, jannis, vehicle, helena, aloi, digits, wine, or "
                           "'files' (each client's own table: [[party]] data = {...})")
    common_ratio: float = setting(0.3, "share of features common to all clients (built-in sets)", lo=0,
                                  lo_open=True, hi=1)
    common_features: tuple[str, ...] | None = setting(None, "dataset 'files': names of the columns every client "
                                                      "holds; a client's other feature columns are its own")
    mu: float | tuple[float, ...] = setting(0.5, "lateral scale in [0, 1], or a list (one unique column each)",
                                            lo=0, hi=1)
    lr: float | tuple[float, ...] = setting(1e-3, "Adam's lr, or a list (one federation per lr, per-client pick)",
                                            lo=0, lo_open=True)
    rounds: int = setting(20, "T aggregation rounds", lo=1)
    local_epochs: int = setting(5, "E local epochs per round", lo=1)
    batch_size: int = setting(64, "mini-batch size", lo=1)
    hidden: tuple[int, ...] = setting(tuple(HIDDEN), "both columns' hidden widths", lo=1, min_len=1)
    select: Literal["best_round", "last"] = setting("best_round", "per-client pick on validation")
    feature_seed: int | None = setting(None, "the feature split's seed (None: seed)", lo=0)
    standardize: bool = setting(True, "scale with the client's own training-row statistics")
    reset_common_optim: bool = setting(True, "fresh Adam for theta_c each round (plain FedAvg clients)")
    n_samples: int | None = setting(None, "rows of a table not in SHAPES", lo=1)
    n_features: int | None = setting(None, "features of a table not in SHAPES", lo=1)
    n_classes: int | None = setting(None, "classes (required for dataset 'files')", lo=2)
    n_clients: int | None = setting(None, "expected number of clients (checked against the federation)", lo=1)
    torch_threads: int = setting(1, "torch.set_num_threads per party (0: torch's default)", lo=0)
    recv_timeout: float | None = setting(None, "seconds to wait for one message (None: the federation's)",
                                         lo=0, lo_open=True)
    return_weights: bool = setting(False, "the server returns the final common vector(s) (tests)")
    seed: int = setting(0, "splits the rows, seeds the models and batches", lo=0)
    agg: AggregationSettings = setting(AggregationSettings(), flatten=True)

    def validate(self):
        settings(self)  # the derived settings' own checks (the shape of the table, files mode)


def sizes(t: Table) -> dict:
    s = settings(t)
    return {"P_c": common_count(s) if s.method != "local" else 0, "G": s.G}


def _result_schema():
    return sch.Scalars()


def declarations(t: Table) -> list:
    s = settings(t)
    glob = sch.Fields({"r": sch.Int(lo=0), "theta": sch.ListOf(sch.Arr("<f4", ("P_c",)), length="G")})
    return [
        declare(K_GLOBAL, "server", "client",
                "the averaged common column theta_c, one float32 (P_c,) vector per lr", _global_check,
                payload=glob if s.method != "local" else None),
        declare(K_RESULT, "client", "server",
                "final scalars: per-client test accuracies, chosen lr/mu/round, test count, timings",
                no_arrays, payload=_result_schema()),
    ] + [_guard(d) for d in aggregation.declarations(*[common_count(s) if s.method != "local" else None] * 2)]


ALGORITHM = Algorithm(name=NAME, summary="CHFL: horizontal FL with common and client-unique features "
                      "(Mori et al.), with its Common and Local baselines", roles=ROLES, load_data=load_party,
                      declarations=declarations, settings=Table, sizes=sizes,
                      headline=("final_test", "final"))
