"""FATE-style split network with a homomorphically encrypted interactive layer (the STFL paper's HE baseline).

The STFL paper (Chu & Zhang, arXiv 2102.05883) compares against FATE's heterogeneous NN (§V-A, "FATE":
bottom models per party, an interactive layer, a top model; its refs [10], [11]; Algorithms 1 and 2
of §II-A2 describe the encrypted forward and the noise-masked backward) and reports 1,737 s for 100
epochs on cancer (Table III, about 17 s per epoch) and 92.04% test accuracy (Table I).

Roles use STFL's names: ``host`` = the label owner (trains the interactive layer's own part, the top
model and the loss; FATE calls this party "guest"), ``guest`` = a passive feature party (bottom model
only; FATE's "host").  FATE's names are the reverse.

Network (FATE's hetero NN): each party has a bottom model ``x -> A`` (``bottom_layers`` hidden layers,
then ``Linear -> bottom_activation`` to ``host_bottom_width`` / ``guest_bottom_width`` units); the
interactive layer ``h = act(A_h W_h + b + sum_g A_g W_g)`` of ``interactive_width`` units; the
host's top model ``h -> logits`` (``top_layers`` hidden layers), binary cross-entropy (one logit) or
cross-entropy, mean over the batch.  Bottom and top models train with Adam (``lr``), the interactive
layer with plain SGD (``interactive_lr``; FATE's dense layer update, and the only one the masked
weight update of the protocol supports).  Each guest's part ``W_g`` of the interactive layer is
protected by :mod:`fedhet.protocols.he_interactive` (read it for the per-batch protocol, what each
party learns, and the fixed-point and masking parameters; ``he`` picks the scheme: ``paillier``
(packed, batched, default), ``naive`` (python-paillier one value at a time) or ``ckks``).

Run: IDs are aligned with ECDH PSI (``fedhet.protocols.psi``, host = label owner, sorted common
order); the host's rows are its train and test rows (``data_fate`` split: self-taught rows dropped),
so the common rows are those, and only they are ever used.  Each epoch the host shuffles its training
rows (from the run seed) and sends each guest the positions, in the common list, of the next batch;
after training, the test rows go through the encrypted forward pass and the host reports the test
accuracy.  The guest standardises its columns with statistics of its rows outside the intersection
(its self-taught rows, as ``data_fate`` does), or of all its rows if there are none.  The loops are
``fedhet.algorithms.split_driver``'s: HE links (``HEHostLink`` / ``HEGuestLink`` around
``he_interactive``'s layers) in the federated roles, local links through a ``PlainLinearLayer``
in ``run_reference`` (the same loop, batches and initialisation in one process, in the clear).

Config keys (defaults in ``DEFAULTS``): ``dataset`` (cancer, payment, credit, vehicle, breast_sk or
its alias breast_sklearn), ``selftaught_frac``, ``test_frac``, ``epochs``, ``max_batches`` (stop after
this many training batches; ``s_per_epoch`` is then extrapolated from ``s_per_batch``),
``batch_size``, ``lr``, ``interactive_lr``, the widths above, ``he``, ``key_bits``, and the
protocol's ``slot_bits`` ("auto", the default: sized from the other settings for ``he_max_steps``
training batches, :func:`fedhet.protocols.he_encoding.slot_budget`; or an int), ``he_max_steps``
(default ``max_batches`` when set, else ``epochs * ceil(2**20 / batch_size)``: training sets up to
2**20 rows; the host refuses, before training, a run that would take more batches), ``mask_bits``,
``a_int_bits``, ``a_frac_bits``, ``w_frac_bits``, ``d_int_bits``, ``d_frac_bits``, ``ckks_mask``,
``pool``, ``he_workers``, ``obfuscation``; ``torch_threads``;
``evaluate`` (false: skip the final test pass, ``test_accuracy`` is then None; for timing runs);
``return_params`` (tests: put the trained parameters in the results).

The guest learns which common rows are batched for training and which for evaluation (as in FATE,
where the label owner sends batch indices); the simulated split is computed by each party's
``load_data`` from the whole data set, but a party keeps only its own columns (and the host its labels).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from fedhet.algorithms import data_fate, split_driver
from fedhet.algorithms.split_driver import (GuestBottom, HEGuestLink, HEHostLink, HostPart, LocalLink, PlainLinearLayer,
                                            Schedule, serve_guest)
from fedhet.algorithms.toolkit import (ACTIVATIONS, HostRows, align_guest_rows, align_host_rows, crc32_seed,
                                       logit_width, make_activation, mlp, seeded, sorted_intersection)
from fedhet.parties import schema as sch
from fedhet.parties.contract import Algorithm
from fedhet.parties.settings import TableView, setting
from fedhet.parties.api import PartyError
from fedhet.parties.declare import declare
from fedhet.protocols import he_interactive as hei
from fedhet.protocols import psi

NAME = "he_split"
HOST, GUEST = "host", "guest"
K_BATCH = "hes/batch"
K_WIDTH = "hes/width"

DEFAULTS = {
    "dataset": "breast_sk", "selftaught_frac": 0.4, "test_frac": 0.2,
    "epochs": 100, "max_batches": None, "batch_size": 128,
    "lr": 0.01, "interactive_lr": 0.3,
    "host_bottom_width": 8, "guest_bottom_width": 8, "bottom_layers": 0, "bottom_hidden_mult": 2.0,
    "bottom_activation": "relu", "interactive_width": 8, "interactive_activation": "relu",
    "top_layers": 0, "top_hidden_mult": 2.0,
    "he": "paillier", "key_bits": 2048, "slot_bits": hei.LayerSpec.slot_bits, "he_max_steps": None,
    "mask_bits": hei.LayerSpec.mask_bits, "a_int_bits": hei.LayerSpec.a_int_bits,
    "a_frac_bits": hei.LayerSpec.a_frac_bits, "w_frac_bits": hei.LayerSpec.w_frac_bits,
    "d_int_bits": hei.LayerSpec.d_int_bits, "d_frac_bits": hei.LayerSpec.d_frac_bits,
    "ckks_mask": hei.LayerSpec.ckks_mask, "pool": True, "he_workers": 1,
    "obfuscation": hei.LayerSpec.obfuscation,
    "torch_threads": 1, "psi_timeout": None, "evaluate": True, "return_params": False,
}
ALIASES = {"breast_sklearn": "breast_sk"}


def _settings(cfg: dict) -> dict:
    unknown = sorted(set(cfg) - set(DEFAULTS) - {"seed"})
    if unknown:
        raise ValueError(f"he_split: unknown config keys {unknown}; known: {sorted(DEFAULTS)}")
    c = {k: cfg.get(k, v) for k, v in DEFAULTS.items()}
    c["seed"] = int(cfg.get("seed", 0))
    c["dataset"] = ALIASES.get(c["dataset"], c["dataset"])
    if c["dataset"] not in data_fate.DATASETS:
        raise ValueError(f"he_split: unknown dataset {cfg.get('dataset')!r}; choose one of "
                         f"{', '.join(data_fate.DATASETS)} (or breast_sklearn)")
    for k in ("epochs", "batch_size", "host_bottom_width", "guest_bottom_width", "bottom_layers",
              "interactive_width", "top_layers", "key_bits", "torch_threads", "he_workers"):
        c[k] = int(c[k])
    if c["epochs"] < 1 or c["batch_size"] < 1 or c["interactive_width"] < 1 or c["guest_bottom_width"] < 1 \
            or c["host_bottom_width"] < 1:
        raise ValueError("he_split: epochs, batch_size and the widths must be >= 1")
    if c["max_batches"] is not None:
        c["max_batches"] = int(c["max_batches"])
        if c["max_batches"] < 1:
            raise ValueError(f"he_split: max_batches must be >= 1, got {c['max_batches']}")
    if c["slot_bits"] != "auto":
        if isinstance(c["slot_bits"], bool) or not isinstance(c["slot_bits"], (int, np.integer)):
            raise ValueError(f"he_split: slot_bits must be an int or 'auto', got {c['slot_bits']!r}")
        c["slot_bits"] = int(c["slot_bits"])
    c["he_max_steps"] = default_max_steps(c) if c["he_max_steps"] is None else int(c["he_max_steps"])
    if c["he_max_steps"] < 1:
        raise ValueError(f"he_split: he_max_steps must be >= 1, got {c['he_max_steps']}")
    for k in ("lr", "interactive_lr", "selftaught_frac", "test_frac", "bottom_hidden_mult", "top_hidden_mult"):
        c[k] = float(c[k])
    for k in ("bottom_activation", "interactive_activation"):
        if c[k] not in ACTIVATIONS:
            raise ValueError(f"he_split: {k} must be one of {sorted(ACTIVATIONS)}, got {c[k]!r}")
    c["layer"] = layer_spec(c)
    return c


MAX_ROWS_PLANNED = 1 << 20  # training rows the default he_max_steps covers per epoch


def default_max_steps(c: dict) -> int:
    """Training batches the auto slot width is sized for unless ``he_max_steps`` says: ``max_batches`` when
    set, else ``epochs * ceil(2**20 / batch_size)`` (from the public settings alone, as the declarations need)."""
    if c["max_batches"] is not None:
        return int(c["max_batches"])
    return int(c["epochs"]) * -(-MAX_ROWS_PLANNED // int(c["batch_size"]))


def planned_steps(c: dict, n_train: int) -> int:
    """Training batches this run takes with ``n_train`` training rows."""
    steps = int(c["epochs"]) * -(-int(n_train) // int(c["batch_size"]))
    return steps if c["max_batches"] is None else min(steps, int(c["max_batches"]))


def layer_spec(c: dict) -> hei.LayerSpec:
    return hei.LayerSpec(
        scheme=c["he"], key_bits=int(c["key_bits"]), slot_bits=c["slot_bits"], max_steps=int(c["he_max_steps"]),
        a_int_bits=int(c["a_int_bits"]), a_frac_bits=int(c["a_frac_bits"]), w_frac_bits=int(c["w_frac_bits"]),
        d_int_bits=int(c["d_int_bits"]), d_frac_bits=int(c["d_frac_bits"]), mask_bits=int(c["mask_bits"]),
        lr=float(c["interactive_lr"]), batch_size=int(c["batch_size"]), ckks_mask=float(c["ckks_mask"]),
        pool=bool(c["pool"]), workers=int(c["he_workers"]), obfuscation=str(c["obfuscation"]))


# ------------------------------------------------------------------------------------------ data
def load_data(cfg: dict, name: str, role: str, index: int, n_of_role: int, data_dir=None):
    """The host gets its labelled train/test rows (self-taught rows dropped), a guest its own columns."""
    c = _settings(cfg)
    data = data_fate.load(c["dataset"], data_dir=data_dir, n_guests=max(1, n_of_role) if role == GUEST else 1,
                          seed=c["seed"])
    if role == HOST:
        split = data_fate.make_split(data, c["seed"], c["selftaught_frac"], c["test_frac"])
        hv = data_fate.host_view(data, split, with_selftaught=False)
        return {"ids_train": hv.ids_train, "x_train": hv.x_train, "y_train": hv.y_train,
                "ids_test": hv.ids_test, "x_test": hv.x_test, "y_test": hv.y_test, "n_classes": hv.n_classes}
    if role == GUEST:
        g = data.guests[index]
        return {"ids": g.ids, "x": g.x, "columns": list(g.columns)}
    raise ValueError(f"he_split has roles {sorted(ROLES)}, not {role!r}")


# ------------------------------------------------------------------------------------------ models
def model_seed(seed: int, what: str) -> int:
    """The seed of one model: ``toolkit.crc32_seed`` of ``"{seed}/he_split/{what}"`` (frozen)."""
    return crc32_seed(f"{seed}/he_split/{what}")


def bottom_model(c: dict, d_in: int, width: int) -> nn.Module:
    return nn.Sequential(mlp(d_in, width, c["bottom_hidden_mult"], c["bottom_layers"], c["bottom_activation"]),
                         make_activation(c["bottom_activation"]))


class HostModel(nn.Module):
    """Host bottom, the host's part of the interactive layer (W_h, b), and the top model."""

    def __init__(self, c: dict, d_host: int, n_classes: int):
        super().__init__()
        self.bottom = bottom_model(c, d_host, c["host_bottom_width"])
        self.inter = nn.Linear(c["host_bottom_width"], c["interactive_width"])
        self.act = make_activation(c["interactive_activation"])
        self.top = mlp(c["interactive_width"], logit_width(n_classes), c["top_hidden_mult"], c["top_layers"],
                       c["bottom_activation"])

    def head(self, z_host: torch.Tensor, z_guests: list) -> torch.Tensor:
        z = z_host
        for zg in z_guests:
            z = z + zg
        return self.top(self.act(z))


def build_host(c: dict, d_host: int, guest_widths: list[int], n_classes: int):
    """(HostModel, initial W_g per guest) from the run seed; the interactive layer's fan-in is the
    concatenation of all bottoms, as one Linear over [A_h || A_g1 || ...] would have."""
    with seeded(model_seed(c["seed"], "host")):
        model = HostModel(c, d_host, n_classes)
        fan_in = c["host_bottom_width"] + sum(guest_widths)
        bound = 1.0 / np.sqrt(fan_in)
        with torch.no_grad():
            model.inter.weight.uniform_(-bound, bound)
            model.inter.bias.uniform_(-bound, bound)
        Ws = [torch.empty(w, c["interactive_width"], dtype=torch.float64).uniform_(-bound, bound).numpy()
              for w in guest_widths]
    return model, Ws


def build_guest(c: dict, d_in: int, name: str) -> nn.Module:
    with seeded(model_seed(c["seed"], f"guest/{name}")):
        return bottom_model(c, d_in, c["guest_bottom_width"])


def host_optimizers(c: dict, model: HostModel):
    adam = torch.optim.Adam(list(model.bottom.parameters()) + list(model.top.parameters()), lr=c["lr"])
    sgd = torch.optim.SGD(model.inter.parameters(), lr=c["interactive_lr"])
    return adam, sgd


def schedule(c: dict) -> Schedule:
    """The host's schedule: batch order from ``[seed, 0x4E5]`` per epoch, ``max_batches`` budget,
    ``evaluate``; the envelope round counts batches."""
    return Schedule(c["epochs"], c["batch_size"], [c["seed"], 0x4E5], c["max_batches"], bool(c["evaluate"]),
                    round_per="batch")


def host_part(c: dict, model: HostModel) -> HostPart:
    """The host's side for the driver: bottom -> own part of the interactive layer, plus every
    guest's part (the links' outputs), -> activation -> top model."""
    return HostPart(model, lambda xb, zs: model.head(model.inter(model.bottom(xb)), zs),
                    list(host_optimizers(c, model)))


def guest_bottom(c: dict, x_common: np.ndarray, name: str) -> GuestBottom:
    """A guest's bottom model (its own seed, from its party name) over its common rows, with Adam."""
    model = build_guest(c, x_common.shape[1], name)
    return GuestBottom(model, np.asarray(x_common, dtype=np.float32), torch.optim.Adam(model.parameters(), lr=c["lr"]))


def train_host(c: dict, model: HostModel, links: list, hd: HostRows, n_classes: int, party=None) -> dict:
    """The host's training and test pass (``split_driver.train_host``), shared by the federated
    role (HE links) and the in-process reference (local links)."""
    out = split_driver.train_host(host_part(c, model), links, hd, n_classes, schedule(c), party)
    del out["t_trained"], out["row_losses"]
    return out


# ------------------------------------------------------------------------------------------ roles
def _bytes(party) -> dict:
    sent, recv = dict(party.bytes_sent), dict(party.bytes_received)
    return {"sent": int(sum(sent.values())), "received": int(sum(recv.values())),
            "sent_to": {k: int(v) for k, v in sent.items()}, "received_from": {k: int(v) for k, v in recv.items()}}


def host_role(party, cfg: dict, data: dict) -> dict:
    c = _settings(cfg)
    torch.set_num_threads(c["torch_threads"])
    guests = party.peers_with_role(GUEST)
    if not guests:
        raise PartyError("he_split needs at least one guest")
    t0 = time.perf_counter()
    ids = np.concatenate([data["ids_train"], data["ids_test"]])
    res = psi.psi_label_owner(party, ids.tolist(), guests, timeout=c["psi_timeout"])
    hd = align_host_rows(res.rows, data["x_train"], data["y_train"], data["x_test"], data["y_test"], order="common")
    n_train, n_test = len(hd.pos_train), len(hd.pos_test)
    psi_s = time.perf_counter() - t0
    party.log.info("PSI: %d common rows (%d train, %d test) in %.2fs", hd.n_common, n_train, n_test, psi_s)
    if planned_steps(c, n_train) > c["he_max_steps"]:
        raise PartyError(f"he_split: {planned_steps(c, n_train)} training batches ({c['epochs']} epochs of "
                         f"{n_train} rows) exceed he_max_steps={c['he_max_steps']}, which the HE layer's slot "
                         "width is sized for; raise he_max_steps (or set slot_bits)")
    t1 = time.perf_counter()
    widths = []
    for g in guests:
        m = party.recv(g, K_WIDTH)
        widths.append(int(m["width"]))
    model, Ws = build_host(c, data["x_train"].shape[1], widths, int(data["n_classes"]))
    layers = [hei.host_layer(party, g, c["layer"], W) for g, W in zip(guests, Ws)]
    for ly in layers:
        ly.setup()
    setup_s = time.perf_counter() - t1
    links = [HEHostLink(party, g, ly, K_BATCH) for g, ly in zip(guests, layers)]
    try:
        out = train_host(c, model, links, hd, int(data["n_classes"]), party)
    finally:
        for ln in links:
            ln.stop()
        for ly in layers:
            ly.close()
    if out["test_accuracy"] is not None:
        party.metric(test_accuracy=out["test_accuracy"])
    out.update({"n_common": int(hd.n_common), "n_train": int(n_train), "n_test": int(n_test),
                "he": c["he"], "key_bits": c["key_bits"], "slot_bits": layers[0].spec.slot_bits,
                "slot_bits_setting": c["slot_bits"], "he_max_steps": c["he_max_steps"],
                "mask_bits": c["mask_bits"], "interactive_width": c["interactive_width"],
                "guest_widths": widths, "dataset": c["dataset"], "psi_s": psi_s, "setup_s": setup_s,
                "bytes": _bytes(party), "layer_stats": {g: ly.stats.as_dict() for g, ly in zip(guests, layers)}})
    if c["return_params"]:
        out["params"] = {k: v.tolist() for k, v in model.state_dict().items()}
        out["W_share"] = {g: _exact(ly) for g, ly in zip(guests, layers)}
    return out


def _exact(ly) -> list:
    """The host's W_g share as exact numbers (decimal strings for the integer schemes)."""
    W = ly.W
    return [[str(v) for v in row] for row in W.tolist()] if W.dtype == object else W.tolist()


def guest_role(party, cfg: dict, data: dict) -> dict:
    c = _settings(cfg)
    torch.set_num_threads(c["torch_threads"])
    hosts = party.peers_with_role(HOST)
    if len(hosts) != 1:
        raise PartyError(f"he_split needs exactly one host, found {hosts}")
    host = hosts[0]
    res = psi.psi_feature_party(party, list(np.asarray(data["ids"]).tolist()), host, timeout=c["psi_timeout"])
    if res.rows is None:
        raise PartyError("PSI result was not revealed to the guest")
    x_common = align_guest_rows(data["x"], res.rows).x_common
    bottom = guest_bottom(c, x_common, party.name)
    party.send(host, K_WIDTH, {"width": c["guest_bottom_width"]})
    layer = hei.guest_layer(party, host, c["layer"], c["guest_bottom_width"], c["interactive_width"])
    layer.setup()
    try:
        batches = serve_guest(bottom, HEGuestLink(party, host, layer, K_BATCH, len(x_common)))["train_batches"]
    finally:
        layer.close()
    out = {"n_common": int(len(res.rows)), "batches": batches, "he": c["he"], "bytes": _bytes(party),
           "layer_stats": layer.stats.as_dict()}
    if c["return_params"]:
        out["params"] = {k: v.tolist() for k, v in bottom.model.state_dict().items()}
        eps = layer.eps
        out["eps"] = [[str(v) for v in row] for row in eps.tolist()] if eps.dtype == object else eps.tolist()
    return out


ROLES = {HOST: host_role, GUEST: guest_role}


def run_reference(cfg: dict, n_guests: int = 1, data_dir=None, guest_names: list[str] | None = None) -> dict:
    """The same network, batches and initialisation trained in one process with the interactive layer in
    the clear (a plaintext split network; the tests' oracle).  IDs are aligned as PSI's sorted order does."""
    c = _settings(cfg)
    names = guest_names or [f"guest{i + 1}" for i in range(n_guests)]
    hdat = load_data(cfg, "host", HOST, 0, 1, data_dir)
    gdat = [load_data(cfg, nm, GUEST, i, len(names), data_dir) for i, nm in enumerate(names)]
    ids = np.concatenate([hdat["ids_train"], hdat["ids_test"]])
    _, (rows, *guest_rows) = sorted_intersection(ids.tolist(), *[np.asarray(g["ids"]).tolist() for g in gdat])
    hd = align_host_rows(rows, hdat["x_train"], hdat["y_train"], hdat["x_test"], hdat["y_test"], order="common")
    bottoms = [guest_bottom(c, align_guest_rows(g["x"], r).x_common, nm) for nm, g, r in zip(names, gdat, guest_rows)]
    model, Ws = build_host(c, hdat["x_train"].shape[1], [c["guest_bottom_width"]] * len(names),
                           int(hdat["n_classes"]))
    links = [LocalLink(b, PlainLinearLayer(W, c["interactive_lr"])) for b, W in zip(bottoms, Ws)]
    out = train_host(c, model, links, hd, int(hdat["n_classes"]))
    out.update({"model": model, "W": [ln.layer.W for ln in links], "guest_models": [b.model for b in bottoms],
                "n_common": hd.n_common})
    return out


# ------------------------------------------------------------------------------------------ declarations
def _layer_of(c: dict) -> tuple[hei.LayerSpec, int, int]:
    """The layer's spec and its (guest width, interactive width), as both parties build them."""
    return c["layer"], c["guest_bottom_width"], c["interactive_width"]


def _batch_check(arrays, cfg):
    if not arrays:
        return None
    if len(arrays) != 1 or arrays[0][0] != "<u4" or len(arrays[0][1]) != 1:
        return f"batch positions must be one 1-D uint32 array, got {arrays}"
    if arrays[0][1][0] > int(cfg.get("batch_size", DEFAULTS["batch_size"])):
        return f"a batch of {arrays[0][1][0]} positions exceeds batch_size"
    return None


DECLARATIONS = (
    psi.declarations(HOST, GUEST)
    + [declare(K_BATCH, HOST, GUEST, "positions, in the PSI common list, of the next batch's rows "
               "(uint32, <= batch_size), train/eval flag, or stop", _batch_check,
               payload=sch.OneOf((sch.Fields({"pos": sch.Arr("<u4", (None,)), "train": sch.Bool(),
                                              "stop": sch.Bool(), "round": sch.Int(lo=0)}),
                                  sch.Fields({"stop": sch.Bool()})))),
       declare(K_WIDTH, GUEST, HOST, "the guest's bottom-model output width; no arrays",
               lambda arrays, cfg: None if not arrays else "width message carries arrays",
               payload=sch.Fields({"width": sch.Int(lo=1)}))]
    + hei.declarations(HOST, GUEST, spec_of=lambda cfg: _layer_of(_settings(dict(cfg))))
)


@dataclass(frozen=True)
class Table(TableView):
    """The ``[algorithm]`` keys, parsed and documented by the one settings parser."""

    dataset: str = setting("breast_sk", "breast_sk (scikit-learn), cancer, payment, credit, vehicle")
    selftaught_frac: float = setting(0.4, "share of rows dropped from the host (as STFL's self-taught rows)",
                                     lo=0, hi=0.95)
    test_frac: float = setting(0.2, "share of the host's rows held out for testing", lo=0, lo_open=True, hi=0.9)
    epochs: int = setting(100, "training epochs", lo=1)
    max_batches: int | None = setting(None, "stop after this many batches in all (timing runs)", lo=1)
    batch_size: int = setting(128, "mini-batch size", lo=1)
    lr: float = setting(0.01, "learning rate of the bottom and top models", lo=0, lo_open=True)
    interactive_lr: float = setting(0.3, "learning rate of the interactive layer", lo=0, lo_open=True)
    host_bottom_width: int = setting(8, "output width of the host's bottom model", lo=1)
    guest_bottom_width: int = setting(8, "output width of each guest's bottom model", lo=1)
    bottom_layers: int = setting(0, "hidden layers of the bottom models", lo=0)
    bottom_hidden_mult: float = setting(2.0, "bottom hidden width multiplier", lo=0, lo_open=True)
    bottom_activation: str = setting("relu", "bottom activation", choices=tuple(sorted(ACTIVATIONS)))
    interactive_width: int = setting(8, "output width of the interactive layer", lo=1)
    interactive_activation: str = setting("relu", "activation after the interactive layer",
                                          choices=tuple(sorted(ACTIVATIONS)))
    top_layers: int = setting(0, "hidden layers of the host's top model", lo=0)
    top_hidden_mult: float = setting(2.0, "top hidden width multiplier", lo=0, lo_open=True)
    he: Literal["paillier", "naive", "ckks"] = setting("paillier", "packed Paillier, one value per phe "
                                                      "ciphertext (naive), or CKKS")
    key_bits: int = setting(2048, "Paillier modulus bits", lo=512)
    slot_bits: int | Literal["auto"] = setting(hei.LayerSpec.slot_bits, "bits per packed Paillier slot, or auto: "
                                               "sized from the other settings for he_max_steps batches", lo=8)
    he_max_steps: int | None = setting(None, "training batches an auto slot width is sized for (default: "
                                       "max_batches, else epochs * ceil(2**20 / batch_size))", lo=1)
    mask_bits: int = setting(hei.LayerSpec.mask_bits, "statistical masking bits", lo=0)
    a_int_bits: int = setting(hei.LayerSpec.a_int_bits, "integer bits of activations", lo=0)
    a_frac_bits: int = setting(hei.LayerSpec.a_frac_bits, "fraction bits of activations", lo=0)
    w_frac_bits: int = setting(hei.LayerSpec.w_frac_bits, "fraction bits of the interactive weights", lo=0)
    d_int_bits: int = setting(hei.LayerSpec.d_int_bits, "integer bits of the gradients", lo=0)
    d_frac_bits: int = setting(hei.LayerSpec.d_frac_bits, "fraction bits of the gradients", lo=0)
    ckks_mask: float = setting(hei.LayerSpec.ckks_mask, "CKKS noise mask amplitude", lo=0, lo_open=True)
    pool: bool = setting(True, "precompute Paillier obfuscators in a pool")
    he_workers: int = setting(1, "worker processes for the HE arithmetic", lo=1)
    obfuscation: Literal["short_exponent", "standard"] = setting(
        hei.LayerSpec.obfuscation, "Paillier obfuscators: DJN short exponent h**x (fast) or standard r**n")
    torch_threads: int = setting(1, "torch.set_num_threads per party", lo=0)
    psi_timeout: float | None = setting(None, "seconds to wait for any one PSI message", lo=0, lo_open=True)
    evaluate: bool = setting(True, "evaluate on the test rows after every epoch")
    return_params: bool = setting(False, "return the trained parameters (tests)")
    seed: int = setting(0, "seeds the split, the models, the batches", lo=0)

    def validate(self):
        _settings(dict(self))  # the derived settings' own checks (data set, widths)


ALGORITHM = Algorithm(name=NAME, summary="FATE-style hetero NN: a packed Paillier (or phe, CKKS) interactive "
                      "layer between guests' bottom models and the host's top model", roles=ROLES,
                      load_data=lambda cfg, ctx: load_data(cfg, ctx.name, ctx.role, ctx.index, ctx.n_of_role,
                                                           ctx.data_dir),
                      declarations=lambda cfg: list(DECLARATIONS), settings=Table,
                      headline=("test_accuracy",))
