"""CHFL's settings: the ``[algorithm]`` keys, parsed by the one parser
(:func:`fedhet.parties.settings.parse_settings`), and what follows from them alone.

The derived values (lists of lr and mu, the table's shape, the common column's width and
parameter count P_c, secure aggregation's public bounds) are properties and functions of the
parsed :class:`Settings`, so every party and the audit compute them the same way without data.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from fedhet.algorithms.chfl.models import HIDDEN, column_params
from fedhet.algorithms.partition import split_samples
from fedhet.parties.settings import setting
from fedhet.protocols.aggregation_settings import AggregationSettings
from fedhet.protocols.dp_settings import DPSettings

NAME = "chfl"
METHODS = ("chfl", "common", "local")

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
FILES = "files"  # dataset = "files": each client reads its own table ([[party]] data = {...})
# A client's weight is its training-row count; from users' files no party knows the others', so
# secure aggregation's public weight bound defaults to this (set secagg_max_weight to tighten it).
FILES_MAX_WEIGHT = 1_000_000.0
# CHFL's aggregation defaults for unset keys.  plain_dtype stays the aggregator's float64: its
# float32 path forms w * x in float32, which would break equality with the in-process mean.
DEFAULT_CLIP = 16.0
AGGREGATION_DEFAULTS = AggregationSettings(aggregation="secure", secagg_clip=DEFAULT_CLIP)


def _distinct(values: float | tuple[float, ...]) -> tuple[float, ...]:
    return tuple(values) if isinstance(values, tuple) else (float(values),)


@dataclass(frozen=True)
class Settings:
    """The ``[algorithm]`` keys of a CHFL run (unknown keys are an error)."""

    method: Literal["chfl", "common", "local"] = setting("chfl", "chfl (Algorithm 2), common (FedAvg of the "
                                                         "common column) or local (each client alone)")
    dataset: str = setting("covertype", "covertype, sensorless, jannis, vehicle, helena, aloi, digits, wine, or "
                           "'files' (each client's own table: [[party]] data = {...})")
    common_ratio: float = setting(0.3, "share of features common to all clients (built-in sets), in (0, 1)",
                                  lo=0, lo_open=True, hi=1)
    common_features: tuple[str, ...] | None = setting(None, "dataset 'files': names of the columns every client "
                                                      "holds; a client's other feature columns are its own")
    mu: float | tuple[float, ...] = setting(0.5, "lateral scale in [0, 1], or a list (one unique column each)",
                                            lo=0, hi=1, min_len=1)
    lr: float | tuple[float, ...] = setting(1e-3, "Adam's lr, or a list (one federation per lr, per-client pick)",
                                            lo=0, lo_open=True, min_len=1)
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
    # record level: DP-SGD of the common column; client level: each client's clipped update of it, noised
    dp: DPSettings = setting(DPSettings(), flatten=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dataset", self.dataset.strip().lower())

    def validate(self) -> None:
        """The checks that span keys (the parser has checked each key's type and range)."""
        if self.dp.on and self.method == "local":
            raise ValueError(f"chfl: dp = {self.dp.dp!r} with method 'local': the Local baseline sends nothing "
                             "to protect")
        self.dp.check()
        if not self.common_ratio < 1:
            raise ValueError(f"chfl: common_ratio must be in (0, 1), got {self.common_ratio!r}")
        for key, values in (("mu", _distinct(self.mu)), ("lr", _distinct(self.lr))):
            if len(set(values)) != len(values):
                raise ValueError(f"chfl: {key} values repeat: {list(values)}")
        cf = self.common_features
        if self.dataset == FILES:
            if not cf or len(set(cf)) != len(cf) or not all(cf):
                raise ValueError("chfl: dataset 'files' needs common_features = [names of the columns every "
                                 f"client holds], got {cf!r}")
            if self.n_classes is None:
                raise ValueError("chfl: dataset 'files' needs n_classes (every client declares the same classes)")
        elif cf is not None:
            raise ValueError("chfl: common_features is only for dataset 'files' (built-in sets split by common_ratio)")
        elif self.dataset not in SHAPES and None in (self.n_samples, self.n_features, self.n_classes):
            raise ValueError(f"chfl: dataset {self.dataset!r} is not one of {sorted(SHAPES)}; give its "
                             "n_samples, n_features and n_classes in the config")
        rows, features, classes = self.shape
        if rows < 1 or features < 2 or classes < 2:
            raise ValueError(f"chfl: n_samples/n_features/n_classes {list(self.shape)} are not a table")
        if round(self.common_ratio * features) < 1:
            raise ValueError(f"chfl: common_ratio {self.common_ratio} of {features} features leaves none common")

    @property
    def mus(self) -> tuple[float, ...]:
        """One unique column per value (none for the Common baseline)."""
        return () if self.method == "common" else _distinct(self.mu)

    @property
    def lrs(self) -> tuple[float, ...]:
        return _distinct(self.lr)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(rows, features, classes) of the table: a known set's, overridden by n_samples, n_features,
        n_classes; for dataset 'files' (1, common + 1, n_classes): rows and unique columns are each
        client's own, and only these enter the declarations."""
        if self.dataset == FILES:
            return 1, len(self.common_features or ()) + 1, int(self.n_classes or 0)
        known = SHAPES.get(self.dataset, (0, 0, 0))
        given = (self.n_samples, self.n_features, self.n_classes)
        return tuple(int(g) if g is not None else k for g, k in zip(given, known))  # type: ignore[return-value]

    @property
    def class_count(self) -> int:
        return self.shape[2]

    @property
    def n_common(self) -> int:
        if self.common_features:
            return len(self.common_features)
        # The rule of partition.split_features (checked against the real split in data.client_rows).
        return int(round(self.common_ratio * self.shape[1]))

    @property
    def G(self) -> int:
        """Common columns trained side by side (one per lr)."""
        return 0 if self.method == "local" else len(self.lrs)

    @property
    def common_params(self) -> int:
        """P_c: the common column's parameter count, from the settings alone."""
        return column_params(self.n_common, self.class_count, self.hidden)

    def unique_params(self, d_unique: int, lateral: bool = True) -> int:
        """A unique column's parameter count (with its lateral matrices U^(2..L) unless ``lateral`` is off)."""
        return column_params(d_unique, self.class_count, self.hidden, lateral)

    @property
    def secagg_clip(self) -> float:
        """Secure aggregation's public clipping bound |x| <= clip (CHFL's default when unset)."""
        clip = self.agg.secagg_clip
        return DEFAULT_CLIP if clip is None else float(clip)


def max_train_rows(s: Settings, n_clients: int) -> int:
    """The largest training-row count of any client (secure aggregation's weight bound)."""
    return max(len(t) for t in split_samples(s.shape[0], n_clients, s.seed)[0])


def aggregation_defaults(s: Settings, n_clients: int) -> AggregationSettings:
    """CHFL's defaults for the aggregation keys left unset (``make_aggregator``'s ``defaults``)."""
    weight = FILES_MAX_WEIGHT if s.dataset == FILES else float(max_train_rows(s, n_clients))
    return replace(AGGREGATION_DEFAULTS, secagg_max_weight=weight)
