"""Federated HyFEM as party roles (Zhang, Yin, Hong & Chen, "Hybrid Federated Learning",
Algorithm 1): one ``server`` and M ``client`` parties, each its own process.

Every step is :mod:`fedhet.algorithms.hyfem_steps`; this module only moves its inputs and
outputs between parties.  Round t (t = 0..T-1; ``round`` = t below):

* server -> client m: theta_{0,d} for each d in D_m (kind ``hyfem/theta<d>``, float32 of the
  view's extractor size) and w_m = Pi_m theta_0 (``hyfem/w``, float32 of ``n_inference``)
  -- ``message_for_client``;
* client m: scores what it received on the evaluation rows with its views (``evaluate_local``,
  reported as scalars, ``hyfem/report``), then Q local steps, eq. (9) (Avg) or eq. (6) (Prox)
  -- ``local_update``;
* eq. (7): for each view d, in view order, theta_{m,d} goes into **secure aggregation among the
  clients holding d** (:mod:`fedhet.protocols.aggregation`, aggregation round t*D + d; the server
  sees only the mean).  Secure aggregation needs >= 2 clients (``SecAggConfig.t``); a view with
  fewer holders makes every party refuse to start, unless ``allow_plain_views = true``, which
  sends that view's extractor in the clear (``hyfem/plain_view``, declared disclosure);
  ``aggregation = "plain"`` sends every view in the clear (the reference run);
* eq. (8): client m sends w_m to the server **in the clear** (``hyfem/inference``: Hungarian
  matching is not linear, so it cannot run on masked sums -- a declared disclosure of the local
  inference model, not of data); the server runs ``match_inference`` (P passes).

After T rounds one more model exchange and report give the final local scores.  Nothing else
leaves a client: no features, no labels (a client's messages are the aggregation's masked
vectors, w_m, its view list and scalar reports).

Data (``load_data``): Handwritten (UCI mfeat, all six views; ModelNet40 is not available offline,
Handwritten is the stand-in) or COIL-20 (a sample = one object seen from ``n_views`` poses at
fixed angular offsets 72/V apart, each pose a view with a small CNN extractor).  The rows are
shuffled with the seed and split into training and evaluation rows (``test_fraction``; COIL-20's
samples overlap -- the V samples of an image set are the same images rotated -- so whole image
sets go to one side, stratified by object: ``split_rows``, ``coil_image_sets``); every
client computes the same seeded :func:`partition.hybrid_partition` of the training labels
(``views_per_client``, ``classes_per_client``, ``unused_fraction``) and keeps only its own rows
and views.  **Evaluation convenience (declared):** every party loads the held-out evaluation
rows (all views, with labels) -- clients to score their local model on all evaluation rows with
only their views (the paper's local accuracy), the server to score theta_0 with every view
(global accuracy).  They are a public benchmark split, never trained on.  Features are
standardised per view with the evaluation rows' column means and deviations (features only;
the same public statistics at every party, so local and global models see one scaling).

``scenario = "fig3"``: D = 4 views (the first four), 3 per client, 3/4 of the classes, no unused
rows (the paper's Fig. 3 with M = 4); ``"fig4"``: D = 6, 3 per client, 15/40 of the classes,
12 % unused rows (Fig. 4 with M = 8); ``"custom"``: ``n_views``, ``views_per_client``,
``classes_per_client``, ``unused_fraction`` as given (they override fig3/fig4 when set).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from fedhet.algorithms import hyfem_steps as H
from fedhet.algorithms.hyfem_models import ExtractorSpec, HyFEMModelSpec
from fedhet.algorithms.partition import hybrid_partition
from fedhet.parties import schema as sch
from fedhet.parties.api import PartyError
from fedhet.parties.contract import Algorithm, PartyContext
from fedhet.parties.declare import declare
from fedhet.parties.settings import TableView, setting
from fedhet.protocols import aggregation
from fedhet.protocols.aggregation_settings import AggregationSettings
from fedhet.protocols.secagg import SecAggError

NAME = "hyfem"
K_HELLO = "hyfem/hello"
K_THETA = "hyfem/theta{}"          # one kind per view d
K_W = "hyfem/w"
K_REPORT = "hyfem/report"
K_INFERENCE = "hyfem/inference"
K_PLAIN_VIEW = "hyfem/plain_view"

# Extractor weights of these small nets stay well inside [-8, 8]; each client's eq. (7) weight is 1.
AGGREGATION_DEFAULTS = {"aggregation": "secure", "secagg_clip": 8.0, "secagg_max_weight": 1.0}
HANDWRITTEN_DIMS = (240, 76, 216, 47, 64, 6)   # pixel, fourier, profile, zer, kar, mor
HANDWRITTEN_CLASSES = 10
# Feature-view data sets: their view widths (scikit-learn's digits ships with the package: tests and
# first looks need no data folder; it stands in for Handwritten).
VIEW_DIMS = {"handwritten": HANDWRITTEN_DIMS, "digits": (16, 16, 16, 16)}
COIL_POSES, COIL_OBJECTS = 72, 20
SETTINGS = {  # setting -> (n_views, views_per_client, classes_per_client, unused_fraction)
    "fig3": (4, 3, 0.75, 0.0),
    "fig4": (6, 3, 15 / 40, 0.12),
}


@dataclass(frozen=True)
class Settings(TableView):
    method: Literal["avg", "prox"] = setting("avg", "HyFEM-Avg (eq. 9) or HyFEM-Prox (eq. 6)")
    mu: float = setting(0.1, "Prox weight of ||Pi_m theta_0 - w_m||^2 (paper: 0.1, 0.5)", lo=0)
    extractor_weight: float = setting(1.0, "Prox weight of sum_d ||theta_md - theta_0d||^2", lo=0)
    loss_reduction: Literal["mean", "sum"] = setting("mean", "data term: batch-mean cross-entropy, or "
                                                      "that x the client's rows (eq. 6 literally)")
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

    def partition(self) -> tuple[int, int, float, float]:
        d, v, c, u = SETTINGS.get(self.scenario, (None, None, None, None))
        out = (self.n_views if self.n_views is not None else d,
               self.views_per_client if self.views_per_client is not None else v,
               self.classes_per_client if self.classes_per_client is not None else c,
               self.unused_fraction if self.unused_fraction is not None else u)
        if any(x is None for x in out):
            raise ValueError("scenario = 'custom' needs n_views, views_per_client, classes_per_client "
                             "and unused_fraction")
        return out

    def validate(self) -> None:
        d, v, c, _ = self.partition()
        if self.dataset in VIEW_DIMS and d > len(VIEW_DIMS[self.dataset]):
            raise ValueError(f"n_views = {d}: {self.dataset} has {len(VIEW_DIMS[self.dataset])} views")
        if self.dataset == "coil20" and (d < 1 or COIL_POSES % d):
            raise ValueError(f"n_views = {d}: coil20 pose views need a divisor of {COIL_POSES}")
        if v > d:
            raise ValueError(f"views_per_client = {v} exceeds n_views = {d}")
        if c >= 1 and c != int(c):
            raise ValueError(f"classes_per_client = {c}: a count must be whole, a fraction < 1")

    def config(self, device: str = "cpu") -> H.HyFEMConfig:
        return H.HyFEMConfig(method=self.method, mu=self.mu, extractor_weight=self.extractor_weight,
                             loss_reduction=self.loss_reduction,
                             lr=self.lr, lr_decay=self.lr_decay, decay_every=self.decay_every,
                             local_steps=self.local_steps, batch_size=self.batch_size,
                             optimizer=self.optimizer, passes=self.passes, threshold=self.threshold,
                             max_width=self.max_width, device=device, seed=self.seed)


def classes_arg(c: float) -> int | float:
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


def sizes(s: Settings) -> dict:
    spec = model_spec(s)
    k = s.partition()[1]
    in_w = k * s.embed_dim
    h, c = s.inference_hidden, spec.n_classes
    out = {"n_views": spec.n_views, "n_inference": h * in_w + h + c * h + c}
    for d, e in enumerate(spec.extractors):
        out[f"ext{d}"] = extractor_size(e)
    return out


def extractor_size(e: ExtractorSpec) -> int:
    """Parameter count of ``build_extractor(e)``, counted without building it (no RNG use)."""
    if e.kind == "mlp":
        w = [e.in_dim, *e.hidden, e.embed_dim]
        return sum(a * b + b for a, b in zip(w[:-1], w[1:]))
    c, total = e.image_shape[0], 0
    for k in e.channels:
        total += c * k * 9 + k
        c = k
    return total + c * e.embed_dim + e.embed_dim


def _plain_view_allowed(arrays, cfg) -> str | None:
    """The audit's check: a view's extractor in the clear only where the run allowed it."""
    if not cfg.get("allow_plain_views", False):
        return "a view's extractor was sent in the clear although allow_plain_views is false"
    return None


def declarations(s: Settings) -> list:
    D = s.partition()[0]
    theta = [declare(K_THETA.format(d), "server", "client", f"theta_0,{d}: view {d}'s averaged extractor",
                     payload=sch.Fields({"round": sch.Int(lo=0),
                                         "theta": sch.Arr("<f4", (f"ext{d}",))})) for d in range(D)]
    return theta + [
        declare(K_HELLO, "client", "server", "the client's index and the views it holds (D_m)",
                payload=sch.Fields({"index": sch.Int(lo=0), "views": sch.ListOf(sch.Int(lo=0, hi=D - 1))})),
        declare(K_W, "server", "client", "w_m = Pi_m theta_0 on the client's views, flat float32",
                payload=sch.Fields({"round": sch.Int(lo=0), "w": sch.Arr("<f4", ("n_inference",))})),
        declare(K_INFERENCE, "client", "server",
                "DISCLOSED: the client's trained inference model w_m in the clear (eq. 8 matching is "
                "not linear), flat float32",
                payload=sch.Fields({"round": sch.Int(lo=0), "w": sch.Arr("<f4", ("n_inference",))})),
        declare(K_PLAIN_VIEW, "client", "server",
                "DISCLOSED (allow_plain_views only): the extractor of a view too few clients hold for "
                "secure aggregation, in the clear",
                check=_plain_view_allowed,
                payload=sch.Fields({"round": sch.Int(lo=0), "view": sch.Int(lo=0, hi=D - 1),
                                    "theta": sch.Arr("<f4", (None,))})),
        declare(K_REPORT, "client", "server", "scores of the received local model on the evaluation "
                "rows (scalars) and the round's training loss", payload=sch.Scalars()),
    ] + aggregation.declarations(None, max(extractor_size(e) for e in model_spec(s).extractors),
                                 s.agg.table(), AGGREGATION_DEFAULTS)
    # per-view extractors, lengths ext<d> (views differ): bounded by the longest


# ------------------------------------------------------------------------------- data

def load_views(s: Settings, data_dir=None) -> tuple[list[np.ndarray], np.ndarray]:
    """All rows of the data set: the used views (float32, rows aligned) and the labels."""
    D = s.partition()[0]
    if s.dataset in VIEW_DIMS:
        from fedhet.algorithms.data_multiview import load_multiview
        mv = load_multiview(s.dataset, data_dir, **({"drop_small": False} if s.dataset == "handwritten" else {}))
        return [np.asarray(v, dtype=np.float32) for v in mv.views[:D]], np.asarray(mv.y, dtype=np.int64)
    from fedhet.algorithms.data_multiview import load_coil20
    pi = load_coil20(data_dir)
    idx = coil_sample_images(D)
    views = [pi.images[idx[:, k]] for k in range(D)]
    y = np.repeat(np.arange(COIL_OBJECTS, dtype=np.int64), COIL_POSES)
    return views, y


def coil_sample_images(n_views: int) -> np.ndarray:
    """(1440, V) image indices (object x 72 + pose, COIL20.mat's row) of every COIL-20 sample's
    views: sample object x 72 + p sees poses p, p + 72/V, ..., p + (V-1) 72/V (mod 72)."""
    step = COIL_POSES // n_views
    poses = (np.arange(COIL_POSES)[:, None] + step * np.arange(n_views)[None, :]) % COIL_POSES
    return (np.arange(COIL_OBJECTS)[:, None, None] * COIL_POSES + poses[None]).reshape(-1, n_views)


def coil_image_sets(n_views: int) -> np.ndarray:
    """Per COIL-20 sample, the id of its image set: object x 72/V + (p mod 72/V).  The V samples
    of a set (starting poses p, p + 72/V, ...) are the same V images in rotated view order; samples
    of different sets share no image."""
    step = COIL_POSES // n_views
    p = np.arange(COIL_POSES)
    return (np.arange(COIL_OBJECTS)[:, None] * step + (p % step)[None, :]).reshape(-1)


def row_groups(s: Settings) -> np.ndarray | None:
    """Rows that must stay on one side of the training / evaluation split (None: each row alone):
    COIL-20's image sets (:func:`coil_image_sets`)."""
    return coil_image_sets(s.partition()[0]) if s.dataset == "coil20" else None


def split_rows(s: Settings, n: int, groups: np.ndarray | None = None,
               labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, evaluation rows), seeded; ``max_rows`` keeps a shuffled subset.

    With ``groups`` (one id per row) whole groups go to one side, and ``max_rows`` keeps whole
    groups (the first ones reaching it).  COIL-20 needs this: its samples overlap (the V samples of
    an image set are the same V images rotated), so a row split would put evaluation images into
    training.  All samples of a set are kept rather than one per set: one per set leaves 72/V
    samples per object (120 in all at V = 12, 24 of them for evaluation), and the rotations are
    honest training data (which pose is "view 0" is arbitrary).  With ``labels`` the split is
    stratified: each label's groups are shuffled and the groups are taken round-robin over the
    labels (in a random order), so the evaluation groups spread over the labels as evenly as their
    count allows.  A group's label is its first row's."""
    rng = np.random.default_rng([s.seed, 7013])
    if groups is None:
        order = rng.permutation(n)
        if s.max_rows is not None:
            order = order[:s.max_rows]
        n_test = int(round(len(order) * s.test_fraction))
        return np.sort(order[n_test:]), np.sort(order[:n_test])
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"split_rows: {groups.shape} group ids for {n} rows")
    ids, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    G = len(ids)
    stratum = np.zeros(G, dtype=np.int64) if labels is None else np.asarray(labels)[first]
    if labels is not None and np.shape(labels) != (n,):
        raise ValueError(f"split_rows: {np.shape(labels)} labels for {n} rows")
    shuffled = rng.permutation(G)
    rank = np.empty(G, dtype=np.int64)
    for c in np.unique(stratum):   # position of each group in its label's shuffled order
        mine = shuffled[stratum[shuffled] == c]
        rank[mine] = np.arange(len(mine))
    gorder = np.lexsort((rng.permutation(G), rank))   # by rank; labels in random order within it
    if s.max_rows is not None:
        size = np.bincount(inverse, minlength=G)[gorder]
        gorder = gorder[:int(np.searchsorted(np.cumsum(size), s.max_rows)) + 1]
    n_test = int(round(len(gorder) * s.test_fraction))
    side = np.full(G, -1)      # -1 unused, 0 training, 1 evaluation
    side[gorder] = 0
    side[gorder[:n_test]] = 1
    rows = np.arange(n)
    return rows[side[inverse] == 0], rows[side[inverse] == 1]


def make_partition(s: Settings, y_train: np.ndarray, n_clients: int):
    D, v, c, u = s.partition()
    return hybrid_partition(y_train, n_clients, D, v, classes_arg(c), u, seed=s.seed)


def plain_views(s: Settings, holders: dict[int, list[int]]) -> dict[int, str]:
    """Views whose holders are too few for secure aggregation (SecAggConfig.t) -> why; empty
    unless aggregation is secure."""
    if aggregation_method(s) != "secure":
        return {}
    cfg = aggregation.make_aggregator(s.agg.table(), AGGREGATION_DEFAULTS).config
    out = {}
    for d, h in holders.items():
        try:
            cfg.t(len(h))
        except SecAggError as e:
            out[d] = str(e)
    return out


def check_holders(s: Settings, client_views: list, who: str) -> dict[int, list[int]]:
    """View -> holder indices; refuses views secure aggregation cannot serve (unless allowed)."""
    D = s.partition()[0]
    holders = {d: [m for m, v in enumerate(client_views) if d in v] for d in range(D)}
    if s.allow_plain_views:
        return holders
    for d, e in plain_views(s, holders).items():
        h = holders[d]
        raise PartyError(f"hyfem ({who}): view {d} is held by {len(h)} client(s) {h}; secure "
                         f"aggregation of its extractor is impossible ({e}). Give clients more "
                         f"views, or set allow_plain_views = true to send it in the clear")
    return holders


def aggregation_method(s: Settings) -> str:
    return s.agg.table().get("aggregation", AGGREGATION_DEFAULTS["aggregation"])


def prepared_views(s: Settings, data_dir=None):
    """(views scaled as every party scales them, labels, training rows, evaluation rows)."""
    views, y = load_views(s, data_dir)
    groups = row_groups(s)
    train, test = split_rows(s, len(y), groups, None if groups is None else y)
    # Public standardisation: the evaluation rows' column statistics (features only).
    stats = [(v[test].mean(0), v[test].std(0) + 1e-6) for v in views]
    scale = [((v - mu) / sd).astype(np.float32) if s.dataset in VIEW_DIMS else v
             for v, (mu, sd) in zip(views, stats)]
    return scale, y, train, test


def load_data(s: Settings, ctx: PartyContext):
    scale, y, train, test = prepared_views(s, ctx.data_dir)
    x_test = {d: scale[d][test] for d in range(len(scale))}
    out = {"x_test": x_test, "y_test": y[test]}
    if ctx.role == "server":
        return out
    split = make_partition(s, y[train], ctx.n_of_role)
    m = ctx.index
    rows = train[split.rows[m]]   # every other client's rows are dropped here
    mine = [int(d) for d in split.views[m]]
    out.update(index=m, views=mine, all_views=[[int(d) for d in v] for v in split.views],
               x_train={d: scale[d][rows] for d in mine}, y_train=y[rows],
               x_test={d: x_test[d] for d in mine})
    return out


# ------------------------------------------------------------------------------- roles

def _threads(s: Settings) -> None:
    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)


def flat_layers(layers) -> np.ndarray:
    return np.concatenate([np.concatenate([W.reshape(-1), b.reshape(-1)]) for W, b in layers]
                          ).astype(np.float32)


def unflat_layers(vec: np.ndarray, widths: list[int]):
    out, pos = [], 0
    for i, o in zip(widths[:-1], widths[1:]):
        W = vec[pos:pos + i * o].reshape(o, i)
        pos += i * o
        b = vec[pos:pos + o]
        pos += o
        out.append((np.array(W, dtype=np.float32), np.array(b, dtype=np.float32)))
    if pos != vec.size:
        raise PartyError(f"hyfem: inference vector has {vec.size} values, widths {widths} need {pos}")
    return out


def _check_round(msg: dict, r: int, kind: str, frm: str) -> None:
    if msg.get("round") != r:
        raise PartyError(f"hyfem: {kind} from {frm} is for round {msg.get('round')}, expected {r}")


def client(party, s: Settings, data) -> dict:
    _threads(s)
    srv = party.peers_with_role("server")
    if len(srv) != 1:
        raise PartyError(f"hyfem needs exactly one server, the federation has {srv}")
    srv = srv[0]
    spec = model_spec(s)
    D = spec.n_views
    holders = check_holders(s, data["all_views"], party.name)
    in_clear = plain_views(s, holders)
    views = tuple(data["views"])
    m = int(data["index"])
    cfg = s.config(party.device)
    agg = aggregation.make_aggregator(s.agg.table(), AGGREGATION_DEFAULTS)
    clip = float(s.agg.table().get("secagg_clip", AGGREGATION_DEFAULTS["secagg_clip"]))
    widths = spec.inference_widths(views)
    train = H.ClientData(data["x_train"], data["y_train"])
    party.send(srv, K_HELLO, {"index": m, "views": list(views)})
    curve, train_loss, train_s, max_abs, clipped = [], [], [], 0.0, 0
    for r in range(s.rounds + 1):
        party.round = r
        ext = {}
        for d in views:
            msg = party.recv(srv, K_THETA.format(d))
            _check_round(msg, r, K_THETA.format(d), srv)
            ext[d] = np.asarray(msg["theta"], dtype=np.float32)
        msg = party.recv(srv, K_W)
        _check_round(msg, r, K_W, srv)
        received = H.ClientModels(views, ext, unflat_layers(np.asarray(msg["w"]), widths))
        ev = H.evaluate_local(received, spec, data["x_test"], data["y_test"], party.device)
        curve.append({"accuracy": ev["accuracy"], "loss": ev["loss"]})
        rep = {"round": r, "local_accuracy": ev["accuracy"], "local_loss": ev["loss"], "n_test": ev["n"],
               "train_loss": train_loss[-1] if train_loss else float("nan")}
        party.send(srv, K_REPORT, rep)
        party.metric(round=r, local_accuracy=ev["accuracy"])
        if r == s.rounds:
            break
        t0 = time.perf_counter()
        trained, info = H.local_update(received, train, spec, cfg, r, m)
        train_s.append(time.perf_counter() - t0)
        train_loss.append(info["loss"])
        for d in views:   # ascending: every aggregator's rounds increase
            vec = H.extractor_share(trained, d, 1.0)
            if d in in_clear:   # allowed by check_holders (allow_plain_views): in the clear
                party.send(srv, K_PLAIN_VIEW, {"round": r, "view": d, "theta": vec.astype(np.float32)})
                continue
            a = float(np.abs(vec).max())
            max_abs = max(max_abs, a)
            clipped += int(a > clip)
            res = agg.submit(party, srv, vec, weight=1.0, round=r * D + d)
            if res.status != "ok":
                raise PartyError(f"hyfem round {r}: view {d} aggregation {res.status} ({res.reason})")
        party.send(srv, K_INFERENCE, {"round": r, "w": flat_layers(trained.inference)})
        party.progress(r + 1, s.rounds, loss=round(info["loss"], 4))
    if clipped and agg.method == "secure":
        party.log.warning("hyfem: |theta_md| reached %.3g > secagg_clip %g in %d submissions: clipped",
                          max_abs, clip, clipped)
    return {"index": m, "views": list(views), "n_train": train.n, "local_curve": curve,
            "train_loss": train_loss, "max_abs_extractor": max_abs, "clipped_submissions": clipped,
            "train_s": train_s, "bytes_sent": sum(party.bytes_sent.values()),
            "bytes_received": sum(party.bytes_received.values())}


def server(party, s: Settings, data) -> dict:
    _threads(s)
    names = party.peers_with_role("client")
    if len(names) < 1:
        raise PartyError("hyfem: the federation has no client")
    spec = model_spec(s)
    D = spec.n_views
    hello = party.gather(K_HELLO, frm=names)
    index = {n: int(h["index"]) for n, h in hello.items()}
    if sorted(index.values()) != list(range(len(names))):
        raise PartyError(f"hyfem: client indices {sorted(index.values())} are not 0..{len(names) - 1}")
    by_index = {i: n for n, i in index.items()}
    client_views = {index[n]: tuple(int(d) for d in hello[n]["views"]) for n in names}
    holders = check_holders(s, [client_views[m] for m in range(len(names))], party.name)
    in_clear = plain_views(s, holders)
    orphan = [d for d, h in holders.items() if not h]
    if orphan:
        raise PartyError(f"hyfem: view(s) {orphan} are held by no client")
    cfg = s.config(party.device)
    agg = aggregation.make_aggregator(s.agg.table(), AGGREGATION_DEFAULTS)
    state = H.init_server(spec, client_views, cfg)
    curves = {"global_accuracy": [], "global_loss": [], "local_accuracy": [], "local_loss": [],
              "local_accuracy_per_client": [], "train_loss": []}
    round_s, bound, view_method = [], 0.0, {}
    for r in range(s.rounds + 1):
        party.round = r
        t0 = time.perf_counter()
        for m in range(len(names)):
            msg = H.message_for_client(state, spec, m)
            for d in msg.views:
                party.send(by_index[m], K_THETA.format(d), {"round": r, "theta": msg.extractors[d]})
            party.send(by_index[m], K_W, {"round": r, "w": flat_layers(msg.inference)})
        reps = party.gather(K_REPORT, frm=names)
        g = H.evaluate_global(state, spec, data["x_test"], data["y_test"], party.device)
        loc = [reps[by_index[m]] for m in range(len(names))]
        curves["global_accuracy"].append(g["accuracy"])
        curves["global_loss"].append(g["loss"])
        curves["local_accuracy"].append(float(np.mean([x["local_accuracy"] for x in loc])))
        curves["local_loss"].append(float(np.mean([x["local_loss"] for x in loc])))
        curves["local_accuracy_per_client"].append([x["local_accuracy"] for x in loc])
        if r > 0:
            curves["train_loss"].append(float(np.mean([x["train_loss"] for x in loc])))
        party.metric(round=r, global_accuracy=g["accuracy"], local_accuracy=curves["local_accuracy"][-1])
        if r == s.rounds:
            break
        means = {}
        for d in range(D):
            h = [by_index[m] for m in holders[d]]
            if d in in_clear:
                msg = party.recv(h[0], K_PLAIN_VIEW)
                _check_round(msg, r, K_PLAIN_VIEW, h[0])
                if msg["view"] != d or np.shape(msg["theta"]) != state.extractors[d].shape:
                    raise PartyError(f"hyfem: {h[0]} sent a malformed plain view {msg['view']} for view {d}")
                means[d] = np.asarray(msg["theta"], dtype=np.float32)
                view_method[d] = "plain (too few holders)"
                continue
            res = agg.aggregate(party, h, round=r * D + d, length=int(state.extractors[d].size))
            if res.dropped:
                raise PartyError(f"hyfem round {r}: view {d} aggregation dropped {res.dropped}")
            means[d] = res.mean.astype(np.float32)
            bound = max(bound, float(res.mean_error_bound))
            view_method[d] = agg.method
        state = H.update_extractors(state, means)
        inf = party.gather(K_INFERENCE, frm=names)
        layers = {}
        for n, msg in inf.items():
            _check_round(msg, r, K_INFERENCE, n)
            layers[index[n]] = unflat_layers(np.asarray(msg["w"]), spec.inference_widths(client_views[index[n]]))
        state, _ = H.match_inference(state, spec, layers, cfg, r)
        round_s.append(time.perf_counter() - t0)
        party.progress(r + 1, s.rounds, global_acc=round(g["accuracy"], 4))
    models = {}
    if s.return_models:
        models = {"extractors": [state.extractors[d].tolist() for d in range(D)],
                  "inference": [[W.tolist(), b.tolist()] for W, b in state.inference]}
    return {**curves, **models, "rounds": s.rounds, "clients": len(names), "method": s.method, "mu": s.mu,
            "dataset": s.dataset, "scenario": s.scenario, "partition": list(s.partition()),
            "client_views": {str(m): list(v) for m, v in client_views.items()},
            "view_aggregation": {str(d): view_method.get(d) for d in range(D)},
            "max_mean_error_bound": bound, "global_widths": [e["global_widths"] for e in state.history],
            "final_global_accuracy": curves["global_accuracy"][-1],
            "final_local_accuracy": curves["local_accuracy"][-1], "round_s": round_s,
            "note": "ModelNet40 is not available offline; Handwritten / COIL-20 stand in"}


ROLES = {"server": server, "client": client}

ALGORITHM = Algorithm(
    name=NAME, summary="HyFEM: hybrid FL by matched averaging (per-view extractors with secure "
                       "per-view aggregation, Hungarian-matched inference models)",
    roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings, sizes=sizes,
    headline=("final_global_accuracy", "final_local_accuracy"))
