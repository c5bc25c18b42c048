"""MMVFL's ``[algorithm]`` keys: one typed settings class, parsed by ``parse_settings``, and the sizes
the message schemas use (rows of Z, classes, percentages)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedhet.algorithms.data_multiview import TABLE2_SPLITS
from fedhet.algorithms.toolkit import PSIBackend, psi_backend_setting
from fedhet.parties.settings import setting
from fedhet.protocols.aggregation_settings import AggregationSettings

from .core import OBJECTIVE_FIELDS, MMVFLSettings

NAME = "mmvfl"
SERVER, PARTICIPANT = "server", "participant"

# (classes, views, rows) of each built-in data set (views after dropping Handwritten's 6-feature one).
DATASET_SHAPES = {"handwritten": (10, 5, 2000), "isolet": (26, 3, 1560), "relathe": (2, 3, 1427),
                  "msrc_v5": (7, 5, 210), "digits": (10, 4, 1797)}
PAPER_PERCENTS = (2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0)


@dataclass(frozen=True)
class Settings:
    """The ``[algorithm]`` keys of ``mmvfl`` (the aggregation keys flattened in)."""

    dataset: Literal["handwritten", "isolet", "relathe", "msrc_v5", "digits"] = setting(
        "handwritten", "built-in multi-view data set (msrc_v5 stands in for Caltech7; digits: scikit-learn's, "
                       "4 quadrant views, packaged, needs no data folder)")
    fold: int = setting(0, "cross-validation fold", lo=0)
    n_folds: int = setting(5, "folds of the cross-validation", lo=1)
    split_seed: int = setting(0, "seeds the folds (data_multiview.cv_folds)", lo=0)
    train_per_class: int | None = setting(None, "training rows per class (None: Table 2)", lo=1)
    val_per_class: int | None = setting(None, "validation rows per class (None: Table 2)", lo=1)
    missing: int = setting(2, "training rows each participant lacks (seeded, disjoint): what PSI removes",
                           lo=0)
    percents: list[float] = setting(list(PAPER_PERCENTS), "feature percentages p to evaluate", min_len=1)
    beta: float = setting(1e-2, "l2,1 weight of Eq. (3)", lo=0, lo_open=True)
    zeta: float = setting(1000.0, "weight of ||Z_k - Z||^2 (every participant)", lo=0, lo_open=True)
    eta: float = setting(1000.0, "weight of ||Z_1 - Y||^2 (label holder)", lo=0)
    epsilon: float = setting(1e-8, "eps of the reweighting, Eq. (4)", lo=0, lo_open=True)
    max_iter: int = setting(200, "outer rounds at most", lo=1)
    tol: float = setting(1e-6, "stop when the smoothed objective changes by <= tol (relative)", lo=0)
    inner_iters: int = setting(3, "reweighting steps per W-update (Eq. (4) <-> 6)", lo=1)
    inner_tol: float = setting(0.0, "stop the reweighting earlier below this relative change of W", lo=0)
    solver: Literal["auto", "cholesky", "woodbury"] = setting(
        "auto", "Eq. (6) solver; auto: Woodbury iff d_k > rows")
    knn_k: int = setting(1, "neighbours of the k-NN classifier", lo=1)
    report_model: bool = setting(False, "participants put W_k, Z_k (and the server Z) in their OWN result "
                                        "files (tests; nothing more is sent)")
    psi_timeout: float | None = setting(None, "seconds to wait for any one PSI message", lo=0, lo_open=True)
    psi_backend: PSIBackend = psi_backend_setting()
    seed: int = setting(0, "seeds W_k^0 and which rows each participant lacks", lo=0)
    agg: AggregationSettings = setting(AggregationSettings(), flatten=True)

    def validate(self) -> None:
        if self.fold >= self.n_folds:
            raise ValueError(f"mmvfl: fold {self.fold} must be < n_folds {self.n_folds}")
        bad = [p for p in self.percents if not 0 < p <= 100]
        if bad:
            raise ValueError(f"mmvfl: percents must lie in (0, 100], got {bad}")
        n_train = self.split()[0] * DATASET_SHAPES[self.dataset][0]
        k = DATASET_SHAPES[self.dataset][1]
        if k * self.missing >= n_train:
            raise ValueError(f"mmvfl: {k} participants lacking {self.missing} rows each leave no common "
                             f"training rows out of {n_train}")

    def split(self) -> tuple[int, int]:
        """(training, validation) rows per class."""
        tr, va = TABLE2_SPLITS[self.dataset]
        return (self.train_per_class or tr, self.val_per_class or va)

    def core(self) -> MMVFLSettings:
        """The numerical core's settings (training rows only)."""
        return MMVFLSettings(beta=self.beta, zeta=self.zeta, eta=self.eta, epsilon=self.epsilon,
                             max_iter=self.max_iter, tol=self.tol, inner_iters=self.inner_iters,
                             inner_tol=self.inner_tol, solver=self.solver, seed=self.seed,
                             rows="train", knn_k=self.knn_k)


def n_common_rows(s: Settings) -> int:
    """Training rows common to all participants: Table 2's (or the set) count minus K * missing."""
    n_classes, k, _ = DATASET_SHAPES[s.dataset]
    return s.split()[0] * n_classes - k * s.missing


def sizes(s: Settings) -> dict[str, int]:
    """The symbolic sizes of the schemas: Z's rows and classes, its flattened length, the percentages."""
    n_classes, k, _ = DATASET_SHAPES[s.dataset]
    return {"n_rows": n_common_rows(s), "n_classes": n_classes, "z_len": n_common_rows(s) * n_classes,
            "n_percents": len(s.percents), "n_participants": k}


N_OBJECTIVE = len(OBJECTIVE_FIELDS)  # the objective's aggregated vector: its two terms
