"""The HE split network's trained parts as they leave the run: each party's own, and nobody's whole.

The interactive layer's weight for guest g is ``W = W_g + eps``: the host holds ``W_g`` (its masked
copy), the guest ``eps`` (its accumulated noise), both on the grid ``2**-w_frac_bits`` as exact
integers (schemes "paillier", "naive") or as floats ("ckks").  NO part holds ``W``: each keeps only
its own share, so neither can compute the layer alone, exactly as in the run.

* **guest** (``"he_split/guest"``): its scaler and bottom model; ``forward(x)`` takes its RAW rows
  (float32, its columns in order) and returns its bottom model's output ``A_g`` (float32, rows x
  ``guest_bottom_width``).  That is all it can score alone.  Its share ``eps`` is in the tensors
  (``share`` or ``share.digits``, see :func:`share`) for the exchange: the layer's output for guest g,
  ``A_g W``, is the interactive product of both shares, computed on the guest's ciphertexts
  (:mod:`fedhet.protocols.he_interactive`'s forward half).  The guest's keys are not in the part: a
  new exchange starts with new keys.
* **host** (``"he_split/host"``): its scaler, bottom model, its own part of the interactive layer
  (``W_h``, ``b``), the top model, and its share ``W_g`` of every guest's weights (for the exchange);
  ``forward(x, z.<guest>...)`` takes its RAW rows (float32) and, per guest, that guest's interactive
  output ``A_g W`` (float32, rows x ``interactive_width``, what the exchange delivers) and returns the
  class probabilities.  Without the guests' outputs it scores nothing: scoring a new row takes the
  same interactive exchange as the run's test pass, i.e. federated prediction (a later item).

Both shares are drawn from the OS CSPRNG (the protocol's masks), so they differ from run to run even
with the same seed (their sum does not, up to one grid unit a step); the meta lists them under
``random_tensors``.  ``check`` holds real rows: the guest's first common rows, the host's first test
rows with the guests' outputs it received for them in the test pass (or, without a test pass, the
last training batch's), and what the trained part gave them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.split_driver import HostLink
from fedhet.algorithms.toolkit import HostRows, Scaler, Standardise, align_host_rows, as_tensor, class_probabilities, seeded
from fedhet.protocols.he_encoding import DIGIT_BITS, digits

from .core import HostModel, bottom_model
from .data import HostData
from .settings import Settings

CHECK_ROWS = 8
# the settings that shape the networks (what load_model rebuilds them from)
NETWORK = ("host_bottom_width", "guest_bottom_width", "bottom_layers", "bottom_hidden_mult", "bottom_activation",
           "interactive_width", "interactive_activation", "top_layers", "top_hidden_mult")


def network_settings(s: Settings) -> dict[str, Any]:
    return {k: getattr(s, k) for k in NETWORK}


def _settings(meta: Mapping[str, Any]) -> Settings:
    known = {f.name for f in fields(Settings)}
    return Settings(**{k: v for k, v in meta["network"].items() if k in known})


# ---------------------------------------------------------------------------------- the shares
def share_tensors(prefix: str, W: np.ndarray) -> dict[str, np.ndarray]:
    """A share as tensors: floats as ``prefix`` (float64), exact integers of any size as
    ``prefix + ".digits"`` (int64 (n, d, K), signed base-2**48 digits: ``sum_t digits[t] * 2**(48 t)``)."""
    if W.dtype != object:
        return {prefix: np.asarray(W, dtype=np.float64)}
    return {prefix + ".digits": np.stack(digits(W)).astype(np.int64)}


def share(tensors: Mapping[str, np.ndarray], prefix: str = "share") -> np.ndarray:
    """The share stored under ``prefix``: exact Python integers (object array, grid ``2**-w_frac_bits``)
    or float64."""
    if prefix in tensors:
        return np.asarray(tensors[prefix], dtype=np.float64)
    d = np.asarray(tensors[prefix + ".digits"])
    out = np.zeros(d.shape[1:], dtype=object)
    for t in range(d.shape[0]):
        out = out + np.array([int(v) << (DIGIT_BITS * t) for v in d[t].ravel().tolist()],
                             dtype=object).reshape(d.shape[1:])
    return out


def _layer_meta(s: Settings, w_frac_bits: int) -> dict[str, Any]:
    return {"scheme": s.he, "w_frac_bits": int(w_frac_bits), "a_int_bits": s.a_int_bits,
            "a_frac_bits": s.a_frac_bits,
            "share": "the true weight W = W_g (host) + eps (guest); integer schemes: exact integers on the "
                     f"grid 2**-w_frac_bits as signed base-2**{DIGIT_BITS} int64 digits"}


# ---------------------------------------------------------------------------------- modules
class GuestScorer(nn.Module):
    """A guest's raw rows -> its bottom model's output ``A_g``."""

    def __init__(self, scaler: Standardise, bottom: nn.Module) -> None:
        super().__init__()
        self.scaler, self.bottom = scaler, bottom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bottom(self.scaler(x))


class HostScorer(nn.Module):
    """The host's raw rows and each guest's interactive output -> class probabilities."""

    def __init__(self, scaler: Standardise, net: HostModel) -> None:
        super().__init__()
        self.scaler, self.net = scaler, net

    def forward(self, x: torch.Tensor, *z_guests: torch.Tensor) -> torch.Tensor:
        n = self.net
        return class_probabilities(n.head(n.inter(n.bottom(self.scaler(x))), list(z_guests)))


def _scaler(sc: Scaler) -> Standardise:
    return Standardise(sc.mean, sc.std)


def _scored(module: nn.Module, *inputs: torch.Tensor) -> np.ndarray:
    """``module``'s outputs in eval mode, without gradients; its mode restored after."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            return module(*inputs).numpy()
    finally:
        module.train(was)


# ---------------------------------------------------------------------------------- check rows
@dataclass
class ForwardTap:
    """A host link that passes everything through and keeps, for the host's check rows, the guest's
    outputs of the first test batch (or, until one comes, of the latest training batch) and their
    positions in the common list.  It changes nothing the run computes."""

    link: HostLink
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    z: np.ndarray | None = None
    _rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _train: bool = True
    _eval_seen: bool = False

    def begin(self, rows: np.ndarray, train: bool, step: int) -> None:
        self._rows, self._train = np.asarray(rows), bool(train)
        self.link.begin(rows, train, step)

    def start_forward(self) -> None:
        self.link.start_forward()

    def finish_forward(self) -> np.ndarray | torch.Tensor:
        z = self.link.finish_forward()
        if not self._eval_seen:
            self._eval_seen = not self._train
            self.rows = self._rows[:CHECK_ROWS].copy()
            # as the driver takes it (split_driver._outputs): float32
            self.z = as_tensor(z.detach() if torch.is_tensor(z) else z)[:CHECK_ROWS].numpy().copy()
        return z

    def send_gradient(self, grad: torch.Tensor) -> None:
        self.link.send_gradient(grad)

    def finish_backward(self) -> None:
        self.link.finish_backward()

    def stop(self) -> None:
        self.link.stop()


def raw_common_rows(data: HostData, hd: HostRows, common_rows: np.ndarray) -> np.ndarray:
    """The host's raw rows at every common position (its train and test rows, as ``hd`` orders them)."""
    raw = align_host_rows(common_rows, data.x_train_raw, data.y_train, data.x_test_raw, data.y_test, order="common")
    out = np.zeros((hd.n_common, raw.x_train.shape[1]), dtype=np.float32)
    out[hd.pos_train], out[hd.pos_test] = raw.x_train, raw.x_test
    return out


# ---------------------------------------------------------------------------------- the parts
def guest_part(s: Settings, bottom: nn.Module, scaler: Scaler, eps: np.ndarray, w_frac_bits: int,
               columns: list[str], check_x: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and meta ``party.save_model`` takes for a guest: bottom model, scaler, share ``eps``."""
    tensors = {f"bottom.{k}": v.detach().cpu().numpy() for k, v in bottom.state_dict().items()}
    tensors.update({"scaler_mean": np.asarray(scaler.mean), "scaler_std": np.asarray(scaler.std)})
    tensors.update(share_tensors("share", eps))
    rows = np.asarray(check_x, dtype=np.float32)[:CHECK_ROWS]
    out = _scored(GuestScorer(_scaler(scaler), bottom), torch.as_tensor(rows))
    meta: dict[str, Any] = {
        "model": "he_split/guest", "feature_names": list(columns), "network": network_settings(s),
        "scaler": {"kind": "z-score", "tensors": ["scaler_mean", "scaler_std"],
                   "fitted_on": "the guest's rows outside the intersection (all its rows if none)"},
        "inputs": [{"name": "x", "shape": [None, len(columns)], "dtype": "float32"}], "outputs": ["bottom"],
        "interactive": _layer_meta(s, w_frac_bits), "random_tensors": [k for k in tensors if k.startswith("share")],
        "scores_alone": "its bottom model's output A_g; the layer's output A_g W needs the host's share W_g "
                        "(the interactive exchange)",
        "check": {"inputs": {"x": rows.tolist()}, "outputs": out.tolist()}}
    return tensors, meta


def host_part(s: Settings, model: HostModel, data: HostData, guests: list[str], shares: list[np.ndarray],
              w_frac_bits: int, check_x: np.ndarray | None, check_z: list[np.ndarray]
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and meta for the host: its network, scaler and share ``W_g`` of each guest's weights."""
    scaler = data.scaler
    if scaler is None:
        raise ValueError("he_split: the host's part needs its scaler (he_split.data.host_data)")
    tensors = {f"net.{k}": v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    tensors.update({"scaler_mean": np.asarray(scaler.mean), "scaler_std": np.asarray(scaler.std)})
    for g, W in zip(guests, shares):
        tensors.update(share_tensors(f"share.{g}", W))
    n_classes = int(data.n_classes)
    meta: dict[str, Any] = {
        "model": "he_split/host", "feature_names": list(data.columns), "network": network_settings(s),
        "n_classes": n_classes, "classes": list(range(n_classes)), "guests": list(guests),
        "scaler": {"kind": "z-score", "tensors": ["scaler_mean", "scaler_std"], "fitted_on": "the host's training rows"},
        "inputs": [{"name": "x", "shape": [None, len(data.columns)], "dtype": "float32"}] + [
            {"name": f"z.{g}", "shape": [None, s.interactive_width], "dtype": "float32",
             "what": f"guest {g}'s interactive output A_g W (the exchange's result)"} for g in guests],
        "outputs": ["probabilities"], "interactive": _layer_meta(s, w_frac_bits),
        "random_tensors": [k for k in tensors if k.startswith("share.")],
        "scores_alone": "nothing: class probabilities need every guest's interactive output A_g W, which takes "
                        "the interactive exchange with that guest (federated prediction)"}
    if check_x is not None and len(check_x):
        x = np.asarray(check_x, dtype=np.float32)
        zs = [np.asarray(z, dtype=np.float32) for z in check_z]
        out = _scored(HostScorer(_scaler(scaler), model), torch.as_tensor(x), *map(torch.as_tensor, zs))
        meta["check"] = {"inputs": {"x": x.tolist(), **{f"z.{g}": z.tolist() for g, z in zip(guests, zs)}},
                         "outputs": out.tolist()}
    return tensors, meta


def _load(module: nn.Module, tensors: Mapping[str, np.ndarray], prefix: str) -> None:
    module.load_state_dict({k[len(prefix):]: torch.as_tensor(np.array(v)) for k, v in tensors.items()
                            if k.startswith(prefix)})


def load_model(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> nn.Module:
    """The scoring module of a host's or a guest's part (see the module docstring)."""
    s = _settings(meta)
    d = len(meta["feature_names"])
    scaler = Standardise(tensors["scaler_mean"], tensors["scaler_std"])
    with seeded(0):   # the weights are loaded over the initialisation; the caller's RNG is untouched
        if meta["model"] == "he_split/guest":
            bottom = bottom_model(s, d, s.guest_bottom_width)
            _load(bottom, tensors, "bottom.")
            return GuestScorer(scaler, bottom).eval()
        if meta["model"] != "he_split/host":
            raise ValueError(f"he_split: unknown part {meta['model']!r}")
        net = HostModel(s, d, int(meta["n_classes"]))
    _load(net, tensors, "net.")
    return HostScorer(scaler, net).eval()
