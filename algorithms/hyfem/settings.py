"""HyFEM's ``[algorithm]`` settings: the one parser of its keys (``parse_settings(Settings, table)``),
and what they fix: the partition of the paper's scenarios, the networks' shapes
(:func:`model_spec`) and the message sizes (:func:`sizes`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedhet.algorithms.hyfem.core import HyFEMConfig
from fedhet.algorithms.hyfem.models import ExtractorSpec, HyFEMModelSpec
from fedhet.parties.settings import setting
from fedhet.protocols.aggregation_settings import AggregationSettings
from fedhet.protocols.dp_settings import DPSettings

# Extractor weights of these small nets stay well inside [-8, 8]; each client's Eq. (7) weight is 1.
DEFAULT_AGGREGATION: Literal["secure", "plain"] = "secure"
DEFAULT_CLIP = 8.0
AGGREGATION_DEFAULTS = AggregationSettings(aggregation=DEFAULT_AGGREGATION, secagg_clip=DEFAULT_CLIP,
                                           secagg_max_weight=1.0)
HANDWRITTEN_DIMS = (240, 76, 216, 47, 64, 6)   # pixel, fourier, profile, zer, kar, mor
HANDWRITTEN_CLASSES = 10
# Feature-view data sets: their view widths (scikit-learn's digits ships with the package: tests and
# first looks need no data folder; it stands in for Handwritten).
VIEW_DIMS = {"handwritten": HANDWRITTEN_DIMS, "digits": (16, 16, 16, 16)}
COIL_POSES, COIL_OBJECTS = 72, 20
SCENARIOS = {  # scenario -> (n_views, views_per_client, classes_per_client, unused_fraction)
    "fig3": (4, 3, 0.75, 0.0),
    "fig4": (6, 3, 15 / 40, 0.12),
}


@dataclass(frozen=True)
class Settings:
    method: Literal["avg", "prox"] = setting("avg", "HyFEM-Avg (Eq. (9)) or HyFEM-Prox (Eq. (6))")
    mu: float = setting(0.1, "Prox weight of ||Pi_m theta_0 - w_m||^2 (paper: 0.1, 0.5)", lo=0)
    extractor_weight: float = setting(1.0, "Prox weight of sum_d ||theta_md - theta_0d||^2", lo=0)
    loss_reduction: Literal["mean", "sum"] = setting("mean", "data term: batch-mean cross-entropy, or "
                                                      "that x the client's rows (Eq. (6) literally)")
    rounds: int = setting(32, "T rounds (paper 32)", lo=1)
    local_steps: int = setting(32, "Q mini-batch steps per round (paper 32)", lo=1)
    batch_size: int = setting(32, "mini-batch size (paper 32)", lo=1)
    lr: float = setting(0.005, "initial learning rate (paper 0.005)", lo=0, lo_open=True)
    lr_decay: float = setting(0.2, "lr factor every decay_every rounds (paper 0.2)", lo=0, lo_open=True, hi=1)
    decay_every: int = setting(8, "rounds between lr decays (paper 8)", lo=1)
    optimizer: Literal["adam", "sgd"] = setting("adam", "local solver")
    passes: int | None = setting(None, "P matching passes (None: 2 M)", lo=1)
    threshold: float = setting(1.0, "matching cost of a new global neuron (relative to |a_j|^2)", lo=0)
    max_width: int | None = setting(None, "cap on the global hidden width (None: 2 x local)", lo=1)
    dataset: Literal["handwritten", "coil20", "digits"] = setting(
        "handwritten", "handwritten (6 feature views), coil20 (pose views, CNN extractors) or digits "
                       "(scikit-learn's, 4 quadrant views; packaged stand-in, no data folder)")
    scenario: Literal["fig3", "fig4", "custom"] = setting("fig3", "partition of the paper's Fig. 3 "
                                                         "or Fig. 4, or custom (the four keys below)")
    n_views: int | None = setting(None, "D views used (None: the setting's)", lo=1)
    views_per_client: int | None = setting(None, "views each client holds (None: the setting's)", lo=1)
    classes_per_client: float | None = setting(None, "classes per client, a count >= 1 or a fraction "
                                               "< 1 (None: the setting's)", lo=0, lo_open=True)
    unused_fraction: float | None = setting(None, "training rows no client holds (None: the setting's)",
                                            lo=0, hi=0.99)
    test_fraction: float = setting(0.2, "evaluation rows held out of training", lo=0, lo_open=True, hi=0.9)
    max_rows: int | None = setting(None, "use only this many (shuffled) rows (tests)", lo=20)
    embed_dim: int = setting(32, "embedding units per view", lo=1)
    extractor_hidden: int = setting(128, "hidden width of an MLP extractor", lo=1)
    cnn_channels: int = setting(16, "channels of a CNN extractor's first conv (the second: twice)", lo=1)
    inference_hidden: int = setting(64, "hidden width of the inference MLP", lo=1)
    allow_plain_views: bool = setting(False, "a view held by too few clients for secure aggregation "
                                      "goes to the server in the clear instead of refusing")
    return_models: bool = setting(False, "the server's result includes the final theta_0,d and theta_0 (tests)")
    torch_threads: int = setting(1, "torch.set_num_threads per party (0: torch's default)", lo=0)
    seed: int = setting(0, "split, partition, initialisation, batches and matching", lo=0)
    agg: AggregationSettings = setting(AggregationSettings(), flatten=True)
    dp: DPSettings = setting(DPSettings(), flatten=True)   # record level: DP-SGD of every local step

    def partition(self) -> tuple[int, int, float, float]:
        """(n_views D, views per client, classes per client, unused fraction): the scenario's,
        each overridden by its key when set."""
        d, v, c, u = SCENARIOS.get(self.scenario, (None, None, None, None))
        n_views = self.n_views if self.n_views is not None else d
        per_client = self.views_per_client if self.views_per_client is not None else v
        classes = self.classes_per_client if self.classes_per_client is not None else c
        unused = self.unused_fraction if self.unused_fraction is not None else u
        if n_views is None or per_client is None or classes is None or unused is None:
            raise ValueError("scenario = 'custom' needs n_views, views_per_client, classes_per_client "
                             "and unused_fraction")
        return n_views, per_client, classes, unused

    def validate(self) -> None:
        if self.dp.dp == "client":
            raise ValueError("hyfem: dp = 'client' is not offered; dp = 'record' runs DP-SGD in every local step")
        self.dp.check()
        d, v, c, _ = self.partition()
        if self.dataset in VIEW_DIMS and d > len(VIEW_DIMS[self.dataset]):
            raise ValueError(f"n_views = {d}: {self.dataset} has {len(VIEW_DIMS[self.dataset])} views")
        if self.dataset == "coil20" and (d < 1 or COIL_POSES % d):
            raise ValueError(f"n_views = {d}: coil20 pose views need a divisor of {COIL_POSES}")
        if v > d:
            raise ValueError(f"views_per_client = {v} exceeds n_views = {d}")
        if c >= 1 and c != int(c):
            raise ValueError(f"classes_per_client = {c}: a count must be whole, a fraction < 1")

    def aggregation(self) -> str:
        """"secure" or "plain": the ``aggregation`` key, else HyFEM's default."""
        return self.agg.aggregation or DEFAULT_AGGREGATION

    def secagg_clip(self) -> float:
        """The public clipping bound of every aggregated extractor value."""
        return float(self.agg.secagg_clip if self.agg.secagg_clip is not None else DEFAULT_CLIP)

    def config(self, device: str = "cpu") -> HyFEMConfig:
        """The steps' training settings (``core.HyFEMConfig``) on ``device``: built here only."""
        return HyFEMConfig(method=self.method, mu=self.mu, extractor_weight=self.extractor_weight,
                           loss_reduction=self.loss_reduction,
                           lr=self.lr, lr_decay=self.lr_decay, decay_every=self.decay_every,
                           local_steps=self.local_steps, batch_size=self.batch_size,
                           optimizer=self.optimizer, passes=self.passes, threshold=self.threshold,
                           max_width=self.max_width, device=device, seed=self.seed)


def classes_arg(c: float) -> int | float:
    """classes_per_client as ``partition.hybrid_partition`` takes it: a count, or a fraction < 1."""
    return int(c) if c >= 1 else float(c)


def n_classes(s: Settings) -> int:
    return COIL_OBJECTS if s.dataset == "coil20" else HANDWRITTEN_CLASSES   # digits: 10 as well


def model_spec(s: Settings) -> HyFEMModelSpec:
    d = s.partition()[0]
    if s.dataset in VIEW_DIMS:
        ext = tuple(ExtractorSpec("mlp", VIEW_DIMS[s.dataset][k], embed_dim=s.embed_dim,
                                  hidden=(s.extractor_hidden,)) for k in range(d))
    else:
        ext = tuple(ExtractorSpec("cnn", 1024, embed_dim=s.embed_dim, image_shape=(1, 32, 32),
                                  channels=(s.cnn_channels, 2 * s.cnn_channels)) for _ in range(d))
    return HyFEMModelSpec(ext, n_classes(s), (s.inference_hidden,))


def extractor_size(e: ExtractorSpec) -> int:
    """Parameter count of ``build_extractor(e)``, counted without building it (no RNG use)."""
    if e.kind == "mlp":
        w = [e.in_dim, *e.hidden, e.embed_dim]
        return sum(a * b + b for a, b in zip(w[:-1], w[1:]))
    assert e.image_shape is not None  # ExtractorSpec checks it for a cnn
    c, total = e.image_shape[0], 0
    for k in e.channels:
        total += c * k * 9 + k
        c = k
    return total + c * e.embed_dim + e.embed_dim


def sizes(s: Settings) -> dict:
    """The symbolic sizes of the schemas: ``n_inference`` (a client's flat w_m) and ``ext<d>``."""
    spec = model_spec(s)
    k = s.partition()[1]
    in_w = k * s.embed_dim
    h, c = s.inference_hidden, spec.n_classes
    out = {"n_views": spec.n_views, "n_inference": h * in_w + h + c * h + c}
    for d, e in enumerate(spec.extractors):
        out[f"ext{d}"] = extractor_size(e)
    return out
