"""Federated STFL and the federated plaintext Hierarchical split network, as party roles.

Roles (STFL's names, paper §III): ``host`` = the label owner with some feature columns; ``guest``
= a feature party (>= 1).  Both variants share the data loading, the PSI alignment and the
host's network; ``variant`` picks the joint training.

Alignment (every variant): the host runs ``fedhet.protocols.psi`` as label owner on the IDs of
its labelled rows, the guests as feature parties on all their IDs; the common list is revealed to
all in sorted order.  Rows outside the intersection are never used for joint training.  A guest's
*self-taught* rows are its rows whose IDs are NOT in the intersection (the rows the host dropped);
the guest learns that set only from PSI — nothing in its data marks them.

``variant = "stfl"`` (Chu & Zhang, arXiv 2102.05883, Algorithm 3):

1. each guest standardises its columns on its self-taught rows and trains a VAE on them by
   minimising the negative ELBO, eq. (5) (``stfl_local.fit_vae``), then drops the decoder;
2. it sends ONCE the encoder's latent means, eq. (7), of the intersected rows (train and test,
   in the PSI's agreed order): ``stfl/latent``, float32 (n_common, d_latent), d_latent = guest
   input width // 2 (``latent_frac``);
3. the host trains its MLP on [own features || z_1 || ... || z_G] with its labels, eq. (6)
   (``stfl_local.train_host``) and reports test accuracy.  No gradient, no control message,
   nothing but PSI ever goes back to a guest.

``variant = "hierarchical"`` (paper §V-A's Hierarchical baseline, federated): the same network
(deterministic guest encoders of STFL's widths feeding the host MLP) trained jointly by
backprop as a plaintext split network.  Per mini-batch the host tells every guest which rows
(positions in the common list; ``split/batch``, no arrays), each guest sends its encoder's
activations (``split/activation``, float32 (batch, d_latent)), the host runs its MLP and the
loss and sends back d loss / d activation (``split/gradient``, same shape), and every party
steps its own Adam.  Separate Adams over disjoint parameters equal one joint Adam, so the run
equals in-process joint training with the same initial weights and batch order (tested).  The
guest learns which common rows are training and which test rows (inherent to split learning).
The loops are ``fedhet.algorithms.split_driver``'s (``train_host`` / ``serve_guest`` over
``ClearHostLink`` / ``ClearGuestLink`` with the kinds ``SPLIT_KINDS``); this module supplies the
networks (``host_net``, ``guest_net``), the batch order key and the guests' ordering.

Determinism: every model's weights come from its own seed ``stfl_local.stfl_seed(seed, ...)``
(STFL: the same seeds as ``stfl_local.stfl``), the host's batch order from ``seed``.
Federated STFL equals ``stfl_local.stfl`` on the same rows in the same order; against
``stfl_local.prepare``'s views it differs only in the order of a guest's self-taught rows
(``stfl_local`` uses the split's secret random order, a guest only knows its own row order),
which changes the VAE's batches — the accuracies are close, not equal.

Configuration (``[algorithm]`` keys; unknown keys are an error):

=================  ==============  ===============================================================
key                default         meaning
=================  ==============  ===============================================================
variant            "stfl"          "stfl" or "hierarchical"
dataset            "breast_sk"     breast_sk (alias breast_sklearn; no files), cancer, payment,
                                   credit, vehicle (``data_fate``; the last four need ../shared)
n_guests           1               guest parties; must match the federation (the audit's widths)
selftaught_frac    0.4             share of IDs whose host rows are dropped (guests' self-taught)
test_frac          0.2             share of IDs that are the host's test rows
psi_order          "sorted"        order of the common list ("sorted" or "label_owner")
psi_workers        None            PSI worker processes (None: automatic, 0: inline)
recv_timeout       None            seconds to wait for one message (None: the federation's)
torch_threads      1               torch.set_num_threads in each party (0: leave torch's default)
return_weights     false           hierarchical: put the final weights in the results (tests)
seed               federation's    every model's init and the batch order derive from it
epochs, vae_epochs, batch_size, lr, vae_lr, weight_decay, vae_hidden_mult, latent_frac,
host_hidden_mult, hidden_layers, activation, kl_weight:  ``stfl_local.STFLConfig`` (paper §V-A:
Adam, batch 128, 100 epochs, BCE).  Hierarchical's guest encoders use ``vae_hidden_mult`` and
``latent_frac`` (STFL's encoder widths) and ``lr``.  The device is the party's (federation file).
=================  ==============  ===============================================================

Results: host ``test_accuracy``, ``train_s`` (joint training wall time from the end of PSI to the
trained model; STFL: the guests' VAE training, encoding and transfer plus the host's MLP),
``epochs``, ``s_per_epoch`` (= train_s / epochs, for STFL the VAE amortised over the supervised
epochs), ``psi_s`` (includes waiting for slower peers), ``warmup_s`` (torch's one-time optimizer
import, paid before PSI), ``total_s``, ``n_common``, ``sizes`` and bytes; guests ``train_s``,
``vae_s``, ``n_common``, ``n_selftaught`` (their ``test_accuracy`` is None: they never see labels).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Literal

import numpy as np
import torch

from fedhet.algorithms import data_fate, split_driver
from fedhet.algorithms.datapath import dataset_path
from fedhet.algorithms.split_driver import (ClearGuestLink, ClearHostLink, GuestBottom, HostPart, Schedule, SplitKinds,
                                            serve_guest)
from fedhet.algorithms.stfl_local import STFLConfig, encode, fit_vae, predict_host, stfl_seed, train_host
from fedhet.algorithms.stfl_models import latent_width
from fedhet.algorithms.toolkit import (accuracy, align_guest_rows, align_host_rows, epoch_permutation, logit_width,
                                       mlp, seeded)
from fedhet.algorithms.party_table import DataSpecError, TableSpec, check_features, load_party_table
from fedhet.parties.api import PartyError
from fedhet.parties import schema as sch
from fedhet.parties.contract import Algorithm, PartyContext
from fedhet.parties.settings import TableView, setting
from fedhet.parties.declare import declare, no_arrays
from fedhet.protocols import psi

NAME = "stfl"
HOST, GUEST = "host", "guest"
VARIANTS = ("stfl", "hierarchical")
ALIASES = {"breast_sklearn": "breast_sk"}

# What the experiment fixes about each data set (rows, host columns, guest columns): the audit
# derives the allowed latent widths and the intersection size from it; the loaders verify it.
SHAPES = {
    "breast_sk": (569, 10, 20),
    "cancer": (569, 10, 20),
    "payment": (30000, 13, 10),
    "credit": (30000, 5, 5),
    "vehicle": (846, 9, 9),
}
_FATE_FILES = {"cancer": ("breast", ".csv"), "payment": ("default_credit", ".csv.gz"),
               "vehicle": ("vehicle_scale", ".csv")}

K_LATENT = "stfl/latent"
K_READY, K_BATCH, K_ACT, K_GRAD = "split/ready", "split/batch", "split/activation", "split/gradient"

OWN_DEFAULTS = {"variant": "stfl", "dataset": "breast_sk", "n_guests": 1, "selftaught_frac": 0.4,
                "test_frac": 0.2, "psi_order": "sorted", "psi_workers": None, "recv_timeout": None,
                "torch_threads": 1, "return_weights": False, "guest_features": None, "n_classes": None}
# dataset = "files": every party reads its own table ([[party]] data = {...}); the declarations'
# widths then come from guest_features (one input width per guest) and n_classes.
FILES = "files"
_STFL_KEYS = {f.name for f in fields(STFLConfig)} - {"device"}


# --------------------------------------------------------------------------------- settings


@dataclass
class Settings:
    variant: str
    dataset: str
    n_guests: int
    selftaught_frac: float
    test_frac: float
    psi_order: str
    psi_workers: int | None
    recv_timeout: float | None
    torch_threads: int
    return_weights: bool
    model: STFLConfig
    guest_features: tuple[int, ...] | None = None  # dataset "files": each guest's input width
    n_classes: int | None = None                   # dataset "files": the host's declared classes

    @property
    def seed(self) -> int:
        return self.model.seed


def settings(cfg: dict) -> Settings:
    """Parse and check an ``[algorithm]`` table (``name`` ignored); errors name the key."""
    cfg = {k: v for k, v in dict(cfg or {}).items() if k != "name"}
    unknown = sorted(set(cfg) - set(OWN_DEFAULTS) - _STFL_KEYS)
    if unknown:
        raise ValueError(f"stfl: unknown config key(s) {unknown}; known: {sorted(set(OWN_DEFAULTS) | _STFL_KEYS)}")
    own = {k: cfg.get(k, v) for k, v in OWN_DEFAULTS.items()}
    if own["variant"] not in VARIANTS:
        raise ValueError(f"stfl: variant must be one of {VARIANTS}, got {own['variant']!r}")
    ds = ALIASES.get(own["dataset"], own["dataset"])
    gf = own["guest_features"]
    if ds == FILES:
        if (not isinstance(gf, (list, tuple)) or not gf
                or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in gf)):
            raise ValueError("stfl: dataset 'files' needs guest_features = [input width of each guest], "
                             f"got {gf!r}")
        if len(gf) != own["n_guests"]:
            raise ValueError(f"stfl: guest_features lists {len(gf)} width(s) but n_guests = {own['n_guests']}")
        nc = own["n_classes"]
        if isinstance(nc, bool) or not isinstance(nc, int) or nc < 2:
            raise ValueError(f"stfl: dataset 'files' needs n_classes (an int >= 2), got {nc!r}")
    elif gf is not None or own["n_classes"] is not None:
        raise ValueError("stfl: guest_features and n_classes are only for dataset 'files'")
    if ds != FILES and ds not in SHAPES:
        raise ValueError(f"stfl: unknown dataset {own['dataset']!r}; choose one of "
                         f"{sorted(SHAPES) + sorted(ALIASES)}")
    n_guests = own["n_guests"]
    max_guests = len(gf) if ds == FILES else SHAPES[ds][2]
    if not isinstance(n_guests, int) or isinstance(n_guests, bool) or not 1 <= n_guests <= max_guests:
        raise ValueError(f"stfl: n_guests must be an int in 1..{SHAPES[ds][2]} (guest columns of {ds}), "
                         f"got {n_guests!r}")
    if own["psi_order"] not in psi.ORDERS:
        raise ValueError(f"stfl: psi_order must be one of {psi.ORDERS}, got {own['psi_order']!r}")
    threads = own["torch_threads"]
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
        raise ValueError(f"stfl: torch_threads must be an int >= 0, got {threads!r}")
    model = STFLConfig.from_dict({k: v for k, v in cfg.items() if k in _STFL_KEYS})
    return Settings(own["variant"], ds, n_guests, float(own["selftaught_frac"]), float(own["test_frac"]),
                    own["psi_order"], None if own["psi_workers"] is None else int(own["psi_workers"]),
                    None if own["recv_timeout"] is None else float(own["recv_timeout"]), threads,
                    bool(own["return_weights"]), model,
                    tuple(gf) if ds == FILES else None, own["n_classes"] if ds == FILES else None)


def guest_widths(s: Settings) -> list[int]:
    """Input width of each guest (the guest columns cut into n_guests contiguous blocks)."""
    if s.guest_features is not None:
        return list(s.guest_features)
    return [len(b) for b in np.array_split(np.arange(SHAPES[s.dataset][2]), s.n_guests)]


def latent_widths(s: Settings) -> list[int]:
    """d_latent of each guest: its input width x latent_frac (paper: half), rounded down."""
    return [latent_width(w, s.model.latent_frac) for w in guest_widths(s)]


def expected_common(s: Settings) -> int:
    """Size of the intersection: the host's labelled rows (every guest holds every ID); None for
    users' files, whose overlap only the PSI knows."""
    if s.dataset == FILES:
        return None
    n = SHAPES[s.dataset][0]
    return n - int(round(s.selftaught_frac * n))


# ------------------------------------------------------------------------------ declarations


def _one_f32(arrays: list) -> tuple[tuple | None, str | None]:
    if len(arrays) != 1:
        return None, f"expected exactly one array, got {len(arrays)}"
    dt, shape = arrays[0]
    if dt != "<f4" or len(shape) != 2:
        return None, f"expected a 2-D float32 array, got {dt}{list(shape)}"
    return tuple(shape), None


def latent_check(arrays: list, cfg: dict) -> str | None:
    """stfl/latent: float32 (n_common, d_latent) — latent means of exactly the intersected rows."""
    s = settings(cfg)
    if s.variant != "stfl":
        return f"stfl/latent in a {s.variant!r} run"
    shape, err = _one_f32(arrays)
    if err:
        return err
    widths = sorted(set(latent_widths(s)))
    if shape[1] not in widths:
        return (f"latent codes must be d_latent = {widths} wide ({s.dataset}, {s.n_guests} guest(s), "
                f"input widths {guest_widths(s)} x latent_frac {s.model.latent_frac}), got width {shape[1]}")
    n = expected_common(s)
    if n is not None and shape[0] != n:
        return f"latent codes must cover exactly the {n} intersected rows, got {shape[0]} rows"
    return None


def split_check(arrays: list, cfg: dict) -> str | None:
    """split/activation and split/gradient: float32 (batch <= batch_size, d_latent)."""
    s = settings(cfg)
    if s.variant != "hierarchical":
        return f"split message in a {s.variant!r} run"
    shape, err = _one_f32(arrays)
    if err:
        return err
    widths = sorted(set(latent_widths(s)))
    if shape[1] not in widths:
        return f"split activations/gradients must be d_latent = {widths} wide, got width {shape[1]}"
    if not 1 <= shape[0] <= s.model.batch_size:
        return f"a split batch must hold 1..{s.model.batch_size} rows, got {shape[0]}"
    return None


def _control_check(arrays: list, cfg: dict) -> str | None:
    s = settings(cfg)
    if s.variant != "hierarchical":
        return f"split control message in a {s.variant!r} run"
    return no_arrays(arrays, cfg)


DECLARATIONS = psi.declarations(HOST, GUEST) + [
    declare(K_LATENT, GUEST, HOST, "STFL: a guest's frozen-encoder latent means of the intersected rows, "
            "once: float32 (n_common, d_latent = guest input width * latent_frac)", latent_check,
            payload=sch.Fields({"z": sch.Arr("<f4", (None, None)), "guest_index": sch.Int(lo=0)})),
    declare(K_READY, GUEST, HOST, "hierarchical: a guest's index among the guests; no arrays", _control_check,
            payload=sch.Fields({"guest_index": sch.Int(lo=0)})),
    declare(K_BATCH, HOST, GUEST, "hierarchical: op (train/eval/stop) and the batch's positions in the "
            "common list as a plain list; no arrays", _control_check,
            payload=sch.Fields({"op": sch.Str(choices=("train", "eval", "stop")),
                                "rows": sch.ListOf(sch.Int(lo=0), max_len=1 << 16)})),
    declare(K_ACT, GUEST, HOST, "hierarchical: guest encoder outputs of one batch, plaintext: "
            "float32 (batch, d_latent)", split_check, payload=sch.Fields({"a": sch.Arr("<f4", (None, None))})),
    declare(K_GRAD, HOST, GUEST, "hierarchical: d loss / d activation of one batch, plaintext: "
            "float32 (batch, d_latent)", split_check, payload=sch.Fields({"g": sch.Arr("<f4", (None, None))})),
]


# --------------------------------------------------------------------------------- data


def _own_table(s: Settings, role: str, index: int, data_dir=None) -> tuple[data_fate.PartyTable, int]:
    """This party's own table (its columns; the host's with labels) and the class count (host)."""
    ds = s.dataset
    n_classes = 0
    if ds == "breast_sk":
        # scikit-learn's one bundled table: the loader keeps only this party's part of it.
        full = data_fate.load_sklearn_breast(seed=s.seed)
        table = full.host if role == HOST else full.guests[0]
        n_classes = full.n_classes
    elif ds == "credit":
        # give_credit_homo_test holds both parties' columns in one file (data_fate's docstring).
        p = dataset_path("fate", "give_credit_homo_test.csv.gz", data_dir=data_dir)
        table = data_fate.read_table(p, slice(0, 5) if role == HOST else slice(5, 10), keep_y=role == HOST)
    else:
        stem, ext = _FATE_FILES[ds]
        # FATE calls the label owner "guest": its *_hetero_guest file is the STFL host's.
        fname = f"{stem}_hetero_{'guest' if role == HOST else 'host'}{ext}"
        table = data_fate.read_table(dataset_path("fate", fname, data_dir=data_dir), keep_y=role == HOST)
    if role == HOST:
        if table.y is None:
            raise ValueError(f"stfl: {ds}: the host's table has no label column")
        if ds != "breast_sk":
            table.y, n_classes = data_fate.labels_to_range(table.y)
        table.y = table.y.copy()
    rows, dh, dg = SHAPES[ds]
    want = dh if role == HOST else dg
    if table.x.shape != (rows, want):
        raise ValueError(f"stfl: {ds}: the {role}'s table is {table.x.shape}, expected ({rows}, {want}) "
                         "(the audit's declared widths assume it)")
    if role == GUEST:
        block = np.array_split(np.arange(dg), s.n_guests)[index]
        table = data_fate.PartyTable(table.ids.copy(), table.x[:, block].copy(), [table.columns[i] for i in block])
    return table, n_classes


def load_data(cfg: dict, name: str, role: str, index: int, n_of_role: int, data_dir=None):
    """The host: its labelled train/test rows (self-taught rows dropped), standardised on its train
    rows.  A guest: ALL its rows (IDs + raw columns of its block), unmarked; it finds its
    self-taught rows through PSI."""
    s = settings(cfg)
    if role == HOST:
        if n_of_role != 1:
            raise ValueError(f"stfl: exactly one host (label owner) is supported, the federation has {n_of_role}")
        table, k = _own_table(s, HOST, 0, data_dir)
        # The experiment drops a seeded random part of the host's rows (they become the guests'
        # self-taught rows).  Every guest holds every ID of these data sets, so the split of the
        # host's IDs alone is data_fate.make_split's split (tested).
        own = data_fate.VerticalData(s.dataset, k, table, [])
        split = data_fate.make_split(own, s.seed, s.selftaught_frac, s.test_frac)
        return data_fate.host_view(own, split, with_selftaught=False)
    if role == GUEST:
        if n_of_role != s.n_guests:
            raise ValueError(f"stfl: the federation has {n_of_role} guest(s) but n_guests = {s.n_guests}; "
                             f"set n_guests = {n_of_role} in [algorithm]")
        table, _ = _own_table(s, GUEST, index, data_dir)
        return {"ids": table.ids, "x": table.x, "columns": table.columns, "index": index}
    raise ValueError(f"stfl: unknown role {role!r} (roles: {HOST}, {GUEST})")


def file_data(s: Settings, ctx: PartyContext):
    """A party's own file (dataset "files").  The host: ``id``, ``label`` (with ``classes``) and
    features; its rows are split into train | test (``test_frac``, seeded); it keeps no
    self-taught rows of its own.  A guest: ``id`` and exactly ``guest_features[i]`` feature
    columns; its rows whose IDs the PSI does not match are its unlabelled (self-taught) rows."""
    if ctx.role == HOST:
        t = load_party_table(TableSpec.from_dict(dict(ctx.data or {}), party=ctx.name, base_dir=ctx.base_dir,
                                                 require=("id", "label", "classes")))
        if len(t.classes) != s.n_classes:
            raise DataSpecError(f"party {ctx.name!r}, file '{t.path}': {len(t.classes)} classes declared "
                                f"({list(t.classes)}) but n_classes = {s.n_classes} in [algorithm]",
                                party=ctx.name, path=str(t.path), key="classes")
        table = data_fate.PartyTable(np.asarray(t.ids).astype(str), t.X, list(t.feature_names), t.y)
        own = data_fate.VerticalData(FILES, s.n_classes, table, [])
        return data_fate.host_view(own, data_fate.make_split(own, s.seed, 0.0, s.test_frac), with_selftaught=False)
    if ctx.role == GUEST:
        t = load_party_table(TableSpec.from_dict(dict(ctx.data or {}), party=ctx.name, base_dir=ctx.base_dir,
                                                 require=("id",)))
        check_features(t, guest_widths(s)[ctx.index], "guest_features in [algorithm]")
        return {"ids": np.asarray(t.ids).astype(str), "x": t.X, "columns": list(t.feature_names),
                "index": ctx.index}
    raise ValueError(f"stfl: unknown role {ctx.role!r} (roles: {HOST}, {GUEST})")


def load_party(cfg, ctx: PartyContext):
    """The contract's ``load_data``: the party's own file with dataset "files", else its part of a
    built-in data set."""
    s = settings(cfg)
    if s.dataset == FILES:
        if not ctx.data:
            raise ValueError(f"stfl: dataset 'files' but party {ctx.name!r} names no data file "
                             "(give its [[party]] a data = { path = ..., id = ... })")
        if ctx.role == GUEST and ctx.n_of_role != s.n_guests:
            raise ValueError(f"stfl: the federation has {ctx.n_of_role} guest(s) but n_guests = {s.n_guests}")
        return file_data(s, ctx)
    if ctx.data:
        raise ValueError(f"stfl: party {ctx.name!r} names a data file: set dataset = \"files\" (and "
                         "guest_features, n_classes) in [algorithm]")
    return load_data(cfg, ctx.name, ctx.role, ctx.index, ctx.n_of_role, ctx.data_dir)


# ------------------------------------------------------------------------------ networks


def guest_net(in_dim: int, c: STFLConfig, index: int) -> torch.nn.Module:
    """Hierarchical guest encoder (HierarchicalNet's guest part), its own seed."""
    with seeded(stfl_seed(c.seed, "split", "guest", index)):
        return mlp(in_dim, latent_width(in_dim, c.latent_frac), c.vae_hidden_mult, c.hidden_layers, c.activation)


def host_net(joint_dim: int, n_classes: int, c: STFLConfig) -> torch.nn.Module:
    """Hierarchical host MLP on [own features || activations], its own seed."""
    with seeded(stfl_seed(c.seed, "split", "host")):
        return mlp(joint_dim, logit_width(n_classes), c.host_hidden_mult, c.hidden_layers, c.activation)


def batch_order(seed: int, n_train: int, epoch: int) -> np.ndarray:
    """The host's permutation of its training rows in one epoch (the split driver's schedule key
    ``stfl_seed(seed, "split", "order")``)."""
    return epoch_permutation(stfl_seed(seed, "split", "order"), epoch, n_train)


# -------------------------------------------------------------------------------- roles


def _warm_torch() -> float:
    """Seconds torch's first optimizer takes: it imports ``torch._dynamo`` (several seconds, once per
    process).  Paid before PSI so that ``train_s`` measures training; reported as ``warmup_s``."""
    t = time.perf_counter()
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    return time.perf_counter() - t


def _setup(party, cfg: dict) -> tuple[Settings, STFLConfig, float]:
    s = settings(cfg)
    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)  # small nets: one thread per party is fastest
    c = STFLConfig.from_dict(s.model, device=party.device)
    return s, c, _warm_torch()


def host(party, cfg: dict, data: data_fate.HostView) -> dict:
    t0 = time.perf_counter()
    s, c, warm = _setup(party, cfg)
    guests = party.peers_with_role(GUEST)
    if len(guests) != s.n_guests:
        raise PartyError(f"stfl: the federation has {len(guests)} guest(s) but n_guests = {s.n_guests}")
    ids = np.concatenate([data.ids_train, data.ids_test]).tolist()
    res = psi.psi_label_owner(party, ids, guests, reveal_to_all=True, order=s.psi_order,
                              workers=s.psi_workers, timeout=s.recv_timeout)
    t_psi = time.perf_counter()
    # Our rows some guest lacks are dropped; the rest keep our order, each with its common position.
    rows = align_host_rows(res.rows, data.x_train, data.y_train, data.x_test, data.y_test, order="own")
    tr_pos, te_pos = rows.pos_train, rows.pos_test
    x_tr, y_tr, x_te, y_te = rows.x_train, rows.y_train, rows.x_test, rows.y_test
    if len(tr_pos) < 2 or len(te_pos) < 1:
        raise PartyError(f"stfl: only {len(tr_pos)} training and {len(te_pos)} test rows are common to all parties")
    sizes = {"n_common": rows.n_common, "n_train": int(len(tr_pos)), "n_test": int(len(te_pos)),
             "n_dropped": int(rows.n_dropped), "host_features": int(x_tr.shape[1])}
    party.log.info("PSI: %d common IDs (%d train, %d test) in %.2fs", len(res.rows), len(tr_pos), len(te_pos),
                   t_psi - t0 - warm)
    if s.variant == "stfl":
        out = _host_stfl(party, s, c, guests, len(res.rows), x_tr, y_tr, x_te, y_te, tr_pos, te_pos,
                         data.n_classes)
    else:
        out = _host_split(party, s, c, guests, rows, data.n_classes)
    t_end = time.perf_counter()
    out.update({"variant": s.variant, "dataset": s.dataset, "role": HOST, "epochs": c.epochs,
                "train_s": out["t_trained"] - t_psi, "s_per_epoch": (out["t_trained"] - t_psi) / c.epochs,
                "psi_s": t_psi - t0 - warm, "warmup_s": warm, "total_s": t_end - t0,
                "n_common": sizes["n_common"], "sizes": sizes,
                "bytes_sent": sum(party.bytes_sent.values()),
                "bytes_received": sum(party.bytes_received.values())})
    del out["t_trained"]
    party.metric(test_accuracy=out["test_accuracy"], train_s=out["train_s"], psi_s=out["psi_s"])
    party.log.info("%s: test accuracy %.4f, training %.2fs", s.variant, out["test_accuracy"], out["train_s"])
    return out


def _by_index(msgs: dict, n: int, what: str) -> list[str]:
    """Guest names ordered by the index each reported (its position among the guests)."""
    idx = {}
    for name, m in msgs.items():
        i = m.get("guest_index") if isinstance(m, dict) else None
        if not isinstance(i, int) or not 0 <= i < n or i in idx.values():
            raise PartyError(f"stfl: {what} from {name!r} carries guest_index {i!r}; "
                             f"expected a distinct int in 0..{n - 1}")
        idx[name] = i
    return sorted(idx, key=idx.__getitem__)


def _host_stfl(party, s, c, guests, n_common, x_tr, y_tr, x_te, y_te, tr_pos, te_pos, n_classes) -> dict:
    t_wait = time.perf_counter()
    msgs = party.gather(K_LATENT, frm=guests, timeout=s.recv_timeout)
    t_lat = time.perf_counter()
    order = _by_index(msgs, len(guests), K_LATENT)
    zs = []
    for g, w in zip(order, latent_widths(s)):
        z = msgs[g].get("z")
        if not isinstance(z, np.ndarray) or z.dtype != np.float32 or z.shape != (n_common, w):
            raise PartyError(f"stfl: {K_LATENT} from {g!r} must be float32 ({n_common}, {w}), got "
                             f"{getattr(z, 'dtype', type(z))}{list(getattr(z, 'shape', []))}")
        zs.append(z)

    def on_epoch(ep, total, loss):
        party.round = ep
        party.progress(ep, total, loss=round(loss, 4))

    hf = train_host(x_tr, [z[tr_pos] for z in zs], y_tr, n_classes, c, seed=stfl_seed(c.seed, "host"),
                    on_epoch=on_epoch)
    t_trained = time.perf_counter()
    acc = accuracy(predict_host(hf, x_te, [z[te_pos] for z in zs]), y_te)
    return {"test_accuracy": acc, "t_trained": t_trained, "host_s": hf.seconds,
            "host_s_per_epoch": hf.seconds / c.epochs, "wait_latents_s": t_lat - t_wait,
            "loss_first_last": [hf.history[0], hf.history[-1]], "latent_dims": [int(z.shape[1]) for z in zs],
            "guest_order": order}


SPLIT_KINDS = SplitKinds(K_BATCH, K_ACT, K_GRAD)


def _host_split(party, s, c, guests, rows, n_classes) -> dict:
    """Hierarchical: ``split_driver.train_host`` over clear links, guests in their reported order."""
    ready = party.gather(K_READY, frm=guests, timeout=s.recv_timeout)
    order = _by_index(ready, len(guests), K_READY)
    widths = latent_widths(s)
    net = host_net(rows.x_train.shape[1] + sum(widths), n_classes, c).to(c.torch_device())
    host = HostPart(net, lambda xb, zs: net(torch.cat([xb, *zs], dim=1)),
                    [torch.optim.Adam(net.parameters(), lr=c.lr, weight_decay=c.weight_decay)])
    links = [ClearHostLink(party, g, SPLIT_KINDS, w, timeout=s.recv_timeout, name="stfl")
             for g, w in zip(order, widths)]
    sched = Schedule(c.epochs, c.batch_size, order_key=stfl_seed(c.seed, "split", "order"), round_per="epoch")
    res = split_driver.train_host(host, links, rows, n_classes, sched, party)
    for ln in links:
        ln.stop()
    return {"test_accuracy": res["test_accuracy"], "t_trained": res["t_trained"],
            "eval_s": time.perf_counter() - res["t_trained"],
            "loss_first_last": [res["row_losses"][0], res["row_losses"][-1]], "latent_dims": widths,
            "guest_order": order, "batches_per_epoch": res["batches_per_epoch"],
            **({"host_state": _state(net)} if s.return_weights else {})}


def _state(net: torch.nn.Module) -> dict:
    """Final weights as nested lists (for equality checks; small nets only)."""
    return {k: v.detach().cpu().tolist() for k, v in net.state_dict().items()}


def guest(party, cfg: dict, data: dict) -> dict:
    t0 = time.perf_counter()
    s, c, warm = _setup(party, cfg)
    hosts = party.peers_with_role(HOST)
    if len(hosts) != 1:
        raise PartyError(f"stfl: needs exactly one host, found {hosts}")
    h = hosts[0]
    res = psi.psi_feature_party(party, data["ids"], h, workers=s.psi_workers, timeout=s.recv_timeout)
    t_psi = time.perf_counter()
    if res.rows is None:
        raise PartyError("stfl: the host did not reveal the intersection")
    # Self-taught rows: every row the host has no label for; the scaling uses only them (only the
    # guest's own knowledge, as in data_fate.guest_view).
    rows = align_guest_rows(data["x"], res.rows)
    if not rows.rest.any():
        raise PartyError("stfl: every row of this guest is in the intersection; no self-taught rows to "
                         "standardise on (and, for STFL, to train the VAE on)")
    x_self, x_common, selftaught = rows.x_rest, rows.x_common, rows.rest
    idx = int(data["index"])
    out = {"variant": s.variant, "dataset": s.dataset, "role": GUEST, "guest_index": idx,
           "test_accuracy": None, "epochs": c.epochs, "n_common": int(len(res.rows)),
           "n_selftaught": int(selftaught.sum()), "n_rows": int(len(selftaught)),
           "input_width": int(x_common.shape[1]),
           "psi_s": t_psi - t0 - warm, "warmup_s": warm}
    if s.variant == "stfl":
        def on_epoch(ep, total, loss):
            party.round = ep
            party.progress(ep, total, neg_elbo=round(loss, 3))

        fit = fit_vae(x_self, c, seed=stfl_seed(c.seed, "guest", idx), on_epoch=on_epoch)
        t1 = time.perf_counter()
        z = encode(fit.encoder, x_common)
        enc_s = time.perf_counter() - t1
        party.send(h, K_LATENT, {"z": z, "guest_index": idx})
        out.update({"vae_s": fit.seconds, "encode_s": enc_s, "latent_dim": int(z.shape[1]),
                    "vae_neg_elbo_first_last": [fit.history[0], fit.history[-1]]})
    else:
        out.update(_guest_split(party, s, c, h, x_common, idx))
    t_end = time.perf_counter()
    out.update({"train_s": t_end - t_psi, "s_per_epoch": (t_end - t_psi) / c.epochs, "total_s": t_end - t0,
                "bytes_sent": sum(party.bytes_sent.values()), "bytes_received": sum(party.bytes_received.values())})
    party.metric(train_s=out["train_s"], psi_s=out["psi_s"], n_selftaught=out["n_selftaught"])
    return out


def _guest_split(party, s, c, h, x_common, idx) -> dict:
    """Hierarchical: ``split_driver.serve_guest`` with this guest's encoder over a clear link."""
    net = guest_net(x_common.shape[1], c, idx).to(c.torch_device())
    bottom = GuestBottom(net, x_common, torch.optim.Adam(net.parameters(), lr=c.lr, weight_decay=c.weight_decay))
    party.send(h, K_READY, {"guest_index": idx})
    link = ClearGuestLink(party, h, SPLIT_KINDS, bottom.n_rows, c.batch_size, timeout=s.recv_timeout, name="stfl")
    stats = serve_guest(bottom, link)
    return {**stats, "latent_dim": int(net[-1].out_features),
            **({"guest_state": _state(net)} if s.return_weights else {})}


ROLES = {HOST: host, GUEST: guest}


@dataclass(frozen=True)
class Table(TableView):
    """The ``[algorithm]`` keys, parsed and documented by the one settings parser; the roles derive
    :class:`Settings` (with the model's :class:`STFLConfig`) from it."""

    variant: Literal["stfl", "hierarchical"] = setting("stfl", "stfl (latent codes once) or hierarchical "
                                                       "(split network trained jointly, plaintext)")
    dataset: str = setting("breast_sk", "breast_sk (scikit-learn), cancer, payment, credit, vehicle, or 'files' "
                           "(each party's own table: [[party]] data = {...})")
    n_guests: int = setting(1, "guests (the guest columns are cut into this many blocks)", lo=1)
    selftaught_frac: float = setting(0.4, "built-in sets: share of rows whose host rows are dropped (the guests' "
                                     "unlabelled rows)", lo=0, hi=0.95)
    test_frac: float = setting(0.2, "share of the host's rows held out for testing", lo=0, lo_open=True, hi=0.9)
    guest_features: tuple[int, ...] | None = setting(None, "dataset 'files': each guest's feature count", lo=1)
    n_classes: int | None = setting(None, "dataset 'files': the host's number of classes", lo=2)
    psi_order: Literal["sorted", "label_owner"] = setting("sorted", "order of the common ID list")
    psi_workers: int | None = setting(None, "PSI worker processes (None: automatic)", lo=0)
    recv_timeout: float | None = setting(None, "seconds to wait for one message (None: the federation's)",
                                         lo=0, lo_open=True)
    torch_threads: int = setting(1, "torch.set_num_threads per party (0: torch's default)", lo=0)
    return_weights: bool = setting(False, "return the trained weights (tests)")
    epochs: int = setting(100, "host (or split network) training epochs", lo=1)
    vae_epochs: int = setting(100, "each guest's VAE epochs", lo=1)
    batch_size: int = setting(128, "mini-batch size", lo=1)
    lr: float = setting(1e-3, "Adam's learning rate (host / split network)", lo=0, lo_open=True)
    vae_lr: float = setting(1e-3, "Adam's learning rate of the VAEs", lo=0, lo_open=True)
    weight_decay: float = setting(0.0, "Adam's weight decay", lo=0)
    vae_hidden_mult: float = setting(2.0, "VAE hidden width = input width x this", lo=0, lo_open=True)
    latent_frac: float = setting(0.5, "d_latent = guest input width x this (paper: half)", lo=0, lo_open=True, hi=1)
    host_hidden_mult: float = setting(2.0, "host MLP hidden width = joint width x this", lo=0, lo_open=True)
    central_hidden_mult: float = setting(2.0, "Centralized baseline hidden width multiplier", lo=0, lo_open=True)
    hidden_layers: int = setting(1, "hidden layers of the MLPs", lo=0)
    activation: str = setting("relu", "hidden activation (relu, tanh, sigmoid, elu, leaky_relu)")
    kl_weight: float = setting(1.0, "weight of the VAE's KL term", lo=0)
    seed: int = setting(0, "seeds the split, the models and the batches", lo=0)

    def validate(self):
        settings(self)  # the derived settings' own checks (data set, guests, widths)


ALGORITHM = Algorithm(name=NAME, summary="STFL: self-taught vertical FL (guests send VAE latent codes once), "
                      "and the hierarchical split network", roles=ROLES, load_data=load_party,
                      declarations=lambda cfg: list(DECLARATIONS), settings=Table,
                      headline=("test_accuracy",))
