"""The HE split network's roles: the host (label owner) and the guests (passive feature parties).

Run: IDs are aligned with ECDH PSI (``fedhet.protocols.psi``, host = label owner, sorted common
order); the host's rows are its train and test rows, so the common rows are those, and only they are
ever used.  Each epoch the host shuffles its training rows (from the run seed) and sends each guest
the positions, in the common list, of the next batch (``hes/batch``); after training, the test rows
go through the encrypted forward pass and the host reports the test accuracy.  The guest
standardises its columns with statistics of its rows outside the intersection (``align_guest_rows``),
or of all its rows if there are none.  The loops are ``split_driver``'s, over HE links
(``HEHostLink`` / ``HEGuestLink`` around ``he_interactive``'s layers).

Checkpoint step k: k training batches done; the host keeps its network and optimisers, its place in
the batch order, the losses so far and its share W_g of each guest's weights, a guest its bottom model,
optimiser, counters and its share eps (both shares as they are, though drawn from the OS CSPRNG, so a
resumed run goes on with the same ones).  PSI and the guest's key pair are made afresh on a resumed run.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from fedhet.algorithms.data_fate import PartyTable
from fedhet.algorithms.dp_sgd import noised_release
from fedhet.algorithms.split_driver import HEGuestLink, HEHostLink, serve_guest
from fedhet.algorithms.toolkit import align_guest_rows, align_host_rows
from fedhet.parties.api import PartyError
from fedhet.parties.contract import PartyLike
from fedhet.protocols import he_interactive as hei
from fedhet.protocols import psi
from fedhet.protocols.dp_settings import RowReleases

from . import model as part
from .core import build_host, guest_bottom
from .data import GUEST, HOST, HostData
from .messages import Kind
from .settings import Settings
from .training import train_host


def traffic(party: PartyLike) -> dict[str, Any]:
    """Bytes this party sent and received, in all and per peer."""
    sent, recv = dict(party.bytes_sent), dict(party.bytes_received)
    return {"sent": int(sum(sent.values())), "received": int(sum(recv.values())),
            "sent_to": {k: int(v) for k, v in sent.items()}, "received_from": {k: int(v) for k, v in recv.items()}}


def exact(W: np.ndarray) -> list:
    """A layer's integer share as exact numbers (decimal strings for the integer schemes), floats as they are."""
    return [[str(v) for v in row] for row in W.tolist()] if W.dtype == object else W.tolist()


def align_by_psi(party: PartyLike, s: Settings, data: HostData, guests: list[str]):
    """Step 1: the rows every guest holds too (PSI, the label owner's side), aligned in PSI's common
    order; refused when training on them would take more batches than the HE layer is sized for."""
    t0 = time.perf_counter()
    ids = np.concatenate([data.ids_train, data.ids_test])
    res = psi.psi_label_owner(party, ids.tolist(), guests, timeout=s.psi_timeout, backend=s.psi_backend)
    if res.rows is None:
        raise PartyError("PSI gave the label owner no common rows")
    hd = align_host_rows(res.rows, data.x_train, data.y_train, data.x_test, data.y_test, order="common")
    n_train, n_test = len(hd.pos_train), len(hd.pos_test)
    psi_s = time.perf_counter() - t0
    party.log.info("PSI: %d common rows (%d train, %d test) in %.2fs", hd.n_common, n_train, n_test, psi_s)
    if s.planned_steps(n_train) > s.max_steps:
        raise PartyError(f"he_split: {s.planned_steps(n_train)} training batches ({s.epochs} epochs of "
                         f"{n_train} rows) exceed he_max_steps={s.max_steps}, which the HE layer's slot "
                         "width is sized for; raise he_max_steps (or set slot_bits)")
    return res, hd, psi_s


def host(party: PartyLike, s: Settings, data: HostData) -> dict[str, Any]:
    torch.set_num_threads(s.torch_threads)
    guests = party.peers_with_role(GUEST)
    if not guests:
        raise PartyError("he_split needs at least one guest")
    start, saved = party.restore()
    res, hd, psi_s = align_by_psi(party, s, data, guests)
    n_train, n_test = len(hd.pos_train), len(hd.pos_test)
    t1 = time.perf_counter()
    widths = [int(party.recv(g, Kind.WIDTH)["width"]) for g in guests]
    model, Ws = build_host(s, data.x_train.shape[1], widths, int(data.n_classes))
    spec = s.layer
    layers = [hei.host_layer(party, g, spec, W) for g, W in zip(guests, Ws)]
    if start:   # the shares W_g the run had when it was stopped
        for g, ly in zip(guests, layers):
            ly.W = part.share(saved["shares"], f"share.{g}")
    for ly in layers:
        ly.setup()
    setup_s = time.perf_counter() - t1
    links = [HEHostLink(party, g, ly, Kind.BATCH) for g, ly in zip(guests, layers)]
    taps = [part.ForwardTap(ln) for ln in links]   # the guests' outputs for the part's check rows
    for tap, kept in zip(taps, saved.get("taps", [])):
        tap.rows, tap.z = kept["rows"], kept["z"]

    def checkpoint(k: int, driver: dict[str, Any]) -> None:
        shares = {n: a for g, ly in zip(guests, layers) for n, a in part.share_tensors(f"share.{g}", ly.W).items()}
        party.checkpoint(k, {"driver": driver, "shares": shares, "taps": [{"rows": t.rows, "z": t.z} for t in taps]})

    try:
        out = train_host(s, model, taps, hd, int(data.n_classes), party, saved.get("driver"), checkpoint)
    finally:
        for ln in links:
            ln.stop()
        for ly in layers:
            ly.close()
    if out["test_accuracy"] is not None:
        party.metric(test_accuracy=out["test_accuracy"])
    out.update({"n_common": int(hd.n_common), "n_train": int(n_train), "n_test": int(n_test),
                "he": s.he, "key_bits": s.key_bits, "slot_bits": layers[0].spec.slot_bits,
                "slot_bits_setting": s.slot_bits, "he_max_steps": s.max_steps,
                "mask_bits": s.mask_bits, "interactive_width": s.interactive_width,
                "guest_widths": widths, "dataset": s.dataset, "psi_backend": res.stats["backend"], "psi_s": psi_s, "setup_s": setup_s,
                "bytes": traffic(party), "layer_stats": {g: ly.stats.as_dict() for g, ly in zip(guests, layers)}})
    if s.return_params:
        out["params"] = {k: v.tolist() for k, v in model.state_dict().items()}
        out["W_share"] = {g: exact(ly.W) for g, ly in zip(guests, layers)}
    raw = part.raw_common_rows(data, hd, np.asarray(res.rows))
    party.save_model(*part.host_part(s, model, data, guests, [ly.W for ly in layers], layers[0].spec.w_frac_bits,
                                     raw[taps[0].rows], [t.z for t in taps if t.z is not None]))
    return out


def guest(party: PartyLike, s: Settings, data: PartyTable) -> dict[str, Any]:
    torch.set_num_threads(s.torch_threads)
    host_name = party.peer_with_role(HOST)
    start, saved = party.restore()
    res = psi.psi_feature_party(party, list(np.asarray(data.ids).tolist()), host_name, timeout=s.psi_timeout,
                                 backend=s.psi_backend)
    if res.rows is None:
        raise PartyError("PSI result was not revealed to the guest")
    rows = align_guest_rows(data.x, res.rows)
    x_common = rows.x_common
    bottom = guest_bottom(s, x_common, party.name)
    releases = RowReleases(s.release, len(x_common), s.dp_passes, party.name) if s.release.on else None
    if releases is not None:
        bottom.release = noised_release(releases)
        if start:
            releases.load(saved["dp"])
    party.send(host_name, Kind.WIDTH, {"width": s.guest_bottom_width})
    layer = hei.guest_layer(party, host_name, s.layer, s.guest_bottom_width, s.interactive_width)
    if start:   # the share eps the run had when it was stopped
        layer.eps = part.share(saved["share"])
    # A new key pair on every start, resumed or not: no ciphertext outlives its batch, so a checkpoint
    # holds no key (and a resumed run reuses none).
    layer.setup()

    def checkpoint(k: int, driver: dict[str, Any]) -> None:
        party.checkpoint(k, {"driver": driver, "share": part.share_tensors("share", layer.eps),
                             **({"dp": releases.state()} if releases is not None else {})})

    try:
        batches = serve_guest(bottom, HEGuestLink(party, host_name, layer, Kind.BATCH, len(x_common)), saved.get("driver"),
                              checkpoint)["train_batches"]
    finally:
        layer.close()
    out: dict[str, Any] = {"n_common": int(len(res.rows)), "psi_backend": res.stats["backend"], "batches": batches, "he": s.he, "bytes": traffic(party),
           "layer_stats": layer.stats.as_dict()}
    if releases is not None:
        out["privacy"] = releases.ledger.as_dict()
        party.metric(dp_epsilon=releases.ledger.spent)
    if s.return_params:
        out["params"] = {k: v.tolist() for k, v in bottom.model.state_dict().items()}
        out["eps"] = exact(layer.eps)
    party.save_model(*part.guest_part(s, bottom.model, rows.scaler, layer.eps, layer.spec.w_frac_bits,
                                      list(data.columns), np.asarray(data.x)[np.asarray(res.rows)]))
    return out


ROLES: dict[str, Callable[..., dict[str, Any]]] = {HOST: host, GUEST: guest}
