"""STFL's party roles: ``host`` (the label owner with some feature columns) and ``guest`` (a
feature party, >= 1).

Alignment (every variant): the host runs ``fedhet.protocols.psi`` as label owner on the IDs of
its labelled rows, the guests as feature parties on all their IDs; the common list is revealed to
all.  A guest's *self-taught* rows are its rows whose IDs are NOT in the intersection; it learns
that set only from PSI.

``variant = "stfl"``: each guest fits its VAE on its self-taught rows (``core.fit_vae``) and sends
ONCE the latent means of the intersected rows (``stfl/latent``); the host trains its MLP on
[own features || z_1 || ... || z_G] (``core.train_host``).  Nothing but PSI goes back to a guest.

``variant = "hierarchical"``: the same network trained jointly by backprop as a plaintext split
network: ``split_driver.train_host`` / ``serve_guest`` over clear links (``messages.SPLIT_KINDS``).
Separate Adams over disjoint parameters equal one joint Adam, so the run equals in-process joint
training with the same initial weights and batch order (tested).

Checkpoint step k: STFL, k = 1 only: PSI and the latent codes are over (the host keeps the PSI rows
and the codes and trains its MLP again from its seed; a guest keeps the PSI rows, its results and
its trained part); Hierarchical, k = training batches done (``split_driver``'s checkpoints, a true
boundary on both sides): each party keeps the PSI rows and the driver's state (its network, Adam,
counters; the host its place in the epoch order and losses), the host also the guests' order.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np
import torch

from fedhet.algorithms import split_driver
from fedhet.algorithms.split_driver import ClearGuestLink, ClearHostLink, GuestBottom, HostPart, Schedule, serve_guest
from fedhet.algorithms.stfl import model
from fedhet.algorithms.stfl.core import (encode, fit_vae, guest_net, host_net, order_key, predict_host,
                                         train_host)
from fedhet.algorithms.stfl.data import GuestData, HostData
from fedhet.algorithms.stfl.messages import SPLIT_KINDS, Kind
from fedhet.algorithms.stfl.models import latent_width
from fedhet.protocols.dp_settings import release_rows
from fedhet.algorithms.stfl.settings import GUEST, HOST, Settings
from fedhet.algorithms.toolkit import (GuestRows, HostRows, accuracy, align_guest_rows, align_host_rows, frozen_seed,
                                       resolve_device)
from fedhet.parties.api import PartyError, PeerFault
from fedhet.parties.contract import PartyLike
from fedhet.protocols import psi


def _warm_torch() -> float:
    """Seconds torch's first optimizer takes: it imports ``torch._dynamo`` (several seconds, once per
    process).  Paid before PSI so that ``train_s`` measures training; reported as ``warmup_s``."""
    t = time.perf_counter()
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    return time.perf_counter() - t


def _setup(s: Settings) -> float:
    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)  # small nets: one thread per party is fastest
    return _warm_torch()


def host(party: PartyLike, s: Settings, data: HostData) -> dict:
    t0 = time.perf_counter()
    warm = _setup(s)
    c = s.model
    guests = party.peers_with_role(GUEST)
    if len(guests) != s.n_guests:
        raise PartyError(f"stfl: the federation has {len(guests)} guest(s) but n_guests = {s.n_guests}")
    ids = np.concatenate([data.ids_train, data.ids_test]).tolist()
    run = _psi_or_restore(party, t0 + warm, "PSI returned no rows to the label owner",
                          lambda: psi.psi_label_owner(party, ids, guests, reveal_to_all=True, order=s.psi_order,
                                                      workers=s.psi_workers, timeout=s.recv_timeout,
                                                      backend=s.psi_backend))
    t_psi, common, psi_s = time.perf_counter(), run.common, run.psi_s
    # Our rows some guest lacks are dropped; the rest keep our order, each with its common position.
    rows = align_host_rows(common, data.x_train, data.y_train, data.x_test, data.y_test, order="own")
    if len(rows.pos_train) < 2 or len(rows.pos_test) < 1:
        raise PartyError(f"stfl: only {len(rows.pos_train)} training and {len(rows.pos_test)} test rows are "
                         "common to all parties")
    sizes = {"n_common": rows.n_common, "n_train": int(len(rows.pos_train)), "n_test": int(len(rows.pos_test)),
             "n_dropped": int(rows.n_dropped), "host_features": int(rows.x_train.shape[1])}
    party.log.info("PSI: %d common IDs (%d train, %d test) in %.2fs", len(common), len(rows.pos_train),
                   len(rows.pos_test), psi_s)
    if data.x_test_raw is None:
        raise PartyError("stfl: the host's data lacks its raw test rows (stfl.data.host_data builds them)")
    # the same common test rows unscaled, for the part it exports
    raw_test = align_host_rows(common, data.x_train, data.y_train, data.x_test_raw, data.y_test, order="own").x_test
    if s.variant == "stfl":
        out = _host_stfl(party, s, guests, rows, data, raw_test, run)
    else:
        out = _host_split(party, s, guests, rows, data, raw_test, run)
    t_end = time.perf_counter()
    out.update({"variant": s.variant, "dataset": s.dataset, "role": HOST, "epochs": c.epochs,
                "train_s": out["t_trained"] - t_psi, "s_per_epoch": (out["t_trained"] - t_psi) / c.epochs,
                "psi_backend": run.backend, "psi_s": psi_s, "warmup_s": warm, "total_s": t_end - t0,
                "n_common": sizes["n_common"], "sizes": sizes,
                "bytes_sent": sum(party.bytes_sent.values()),
                "bytes_received": sum(party.bytes_received.values())})
    del out["t_trained"]
    party.metric(test_accuracy=out["test_accuracy"], train_s=out["train_s"], psi_s=out["psi_s"])
    party.log.info("%s: test accuracy %.4f, training %.2fs", s.variant, out["test_accuracy"], out["train_s"])
    return out


@dataclasses.dataclass
class _Resume:
    """A role's ``party.restore()`` (``start``, ``saved``) and the PSI rows, time and backend in force,
    which every checkpoint of it keeps (``keep``)."""

    start: int
    saved: dict
    common: np.ndarray
    psi_s: float
    backend: str

    @property
    def keep(self) -> dict:
        return {"common": self.common, "psi_s": self.psi_s, "psi_backend": self.backend}


def _psi_or_restore(party: PartyLike, t_start: float, none: str, run_psi: Callable[[], psi.PSIResult]) -> _Resume:
    """``party.restore()`` and the common rows: a resumed run's from its checkpoint, else ``run_psi()``'s
    (``none``: the error if it gives no rows; ``t_start``: when PSI began)."""
    start, saved = party.restore()
    if start:
        return _Resume(start, saved, saved["common"], saved["psi_s"], saved["psi_backend"])
    res = run_psi()
    if res.rows is None:
        raise PartyError(f"stfl: {none}")
    return _Resume(0, saved, res.rows, time.perf_counter() - t_start, res.stats["backend"])


def _by_index(msgs: dict, what: str) -> list[str]:
    """Guest names ordered by the index each reported (its position among the guests; the schema
    bounds it to 0..n_guests-1)."""
    idx = {name: m["guest_index"] for name, m in msgs.items()}
    if len(set(idx.values())) != len(idx):
        raise PartyError(f"stfl: two guests report the same guest_index in {what}: {idx}")
    return sorted(idx, key=idx.__getitem__)


def _save_host(party: PartyLike, s: Settings, data: HostData, net: torch.nn.Module, rows: HostRows,
               raw_test: np.ndarray, codes: list[np.ndarray]) -> None:
    """The host's part: its trained network behind its scaler; ``codes`` are the guests' codes of
    its first test rows (its check)."""
    if data.scaler is None or data.columns is None:
        raise PartyError("stfl: the host's data lacks its scaler (stfl.data.host_data builds it)")
    party.save_model(*model.part(HOST, s.variant, model.cpu_copy(net), data.scaler, activation=s.model.activation,
                                 feature_names=data.columns, raw_rows=raw_test, scaled_rows=rows.x_test,
                                 codes=codes, n_classes=data.n_classes))


def _host_stfl(party: PartyLike, s: Settings, guests: list[str], rows: HostRows, data: HostData,
               raw_test: np.ndarray, run: _Resume) -> dict:
    c = s.model
    if run.start:
        zs, order, wait_s = run.saved["zs"], run.saved["order"], run.saved["wait_latents_s"]
    else:
        t_wait = time.perf_counter()
        msgs = party.gather(Kind.LATENT, frm=guests, timeout=s.recv_timeout)
        wait_s = time.perf_counter() - t_wait
        order = _by_index(msgs, Kind.LATENT)
        zs = []
        for g, w in zip(order, s.latent_widths()):
            z = msgs[g]["z"]
            if z.shape != (rows.n_common, w):
                raise PeerFault(party.name, g, Kind.LATENT, f"must be float32 ({rows.n_common}, {w}), got "
                                f"{list(z.shape)}")
            zs.append(z)
        party.checkpoint(1, {**run.keep, "zs": zs, "order": order, "wait_latents_s": wait_s})

    def on_epoch(ep, total, loss):
        party.round = ep
        party.progress(ep, total, loss=round(loss, 4))

    tr_pos, te_pos = rows.pos_train, rows.pos_test
    hf = train_host(rows.x_train, [z[tr_pos] for z in zs], rows.y_train, data.n_classes, c,
                    seed=frozen_seed(c.seed, "host"), device=party.device, on_epoch=on_epoch)
    t_trained = time.perf_counter()
    acc = accuracy(predict_host(hf, rows.x_test, [z[te_pos] for z in zs]), rows.y_test)
    _save_host(party, s, data, hf.model, rows, raw_test, [z[te_pos[:model.CHECK_ROWS]] for z in zs])
    return {"test_accuracy": acc, "t_trained": t_trained, "host_s": hf.seconds,
            "host_s_per_epoch": hf.seconds / c.epochs, "wait_latents_s": wait_s,
            "loss_first_last": [hf.history[0], hf.history[-1]], "latent_dims": [int(z.shape[1]) for z in zs],
            "guest_order": order}


class _CheckedLink(ClearHostLink):
    """A clear link that keeps the guest's first ``model.CHECK_ROWS`` outputs of the test pass (the
    codes of the host's first test rows: its part's check)."""

    def __init__(self, party: PartyLike, guest: str, width: int, timeout: float | None) -> None:
        super().__init__(party, guest, SPLIT_KINDS, width, timeout=timeout, name="stfl")
        self.test_codes: list[np.ndarray] = []
        self.testing = False

    def begin(self, rows: np.ndarray, train: bool, step: int) -> None:
        self.testing = not train
        super().begin(rows, train, step)

    def finish_forward(self) -> np.ndarray:
        a = super().finish_forward()
        if self.testing and sum(map(len, self.test_codes)) < model.CHECK_ROWS:
            self.test_codes.append(a.copy())
        return a


def _host_split(party: PartyLike, s: Settings, guests: list[str], rows: HostRows, data: HostData,
                raw_test: np.ndarray, run: _Resume) -> dict:
    """Hierarchical: ``split_driver.train_host`` over clear links, guests in their reported order."""
    c = s.model
    if run.start:
        order = run.saved["order"]
    else:
        ready = party.gather(Kind.READY, frm=guests, timeout=s.recv_timeout)
        order = _by_index(ready, Kind.READY)
    widths = s.latent_widths()
    net = host_net(rows.x_train.shape[1] + sum(widths), data.n_classes, c).to(resolve_device(party.device))
    opt = torch.optim.Adam(net.parameters(), lr=c.lr, weight_decay=c.weight_decay)
    top = HostPart(net, lambda xb, zs: net(torch.cat([xb, *zs], dim=1)), [opt])
    links = [_CheckedLink(party, g, w, s.recv_timeout)
             for g, w in zip(order, widths)]
    sched = Schedule(c.epochs, c.batch_size, order_key=order_key(c.seed), round_per="epoch")

    def checkpoint(k: int, driver: dict) -> None:
        party.checkpoint(k, {**run.keep, "order": order, "driver": driver})

    res = split_driver.train_host(top, links, rows, data.n_classes, sched, party,
                                  resume=run.saved["driver"] if run.start else None, checkpoint=checkpoint)
    for ln in links:
        ln.stop()
    _save_host(party, s, data, net, rows, raw_test,
               [np.concatenate(ln.test_codes)[:model.CHECK_ROWS] for ln in links])
    return {"test_accuracy": res["test_accuracy"], "t_trained": res["t_trained"],
            "eval_s": time.perf_counter() - res["t_trained"],
            "loss_first_last": [res["row_losses"][0], res["row_losses"][-1]], "latent_dims": widths,
            "guest_order": order, "batches_per_epoch": res["batches_per_epoch"],
            **({"host_state": _state(net)} if s.return_weights else {})}


def _state(net: torch.nn.Module) -> dict:
    """Final weights as nested lists (for equality checks; small nets only)."""
    return {k: v.detach().cpu().tolist() for k, v in net.state_dict().items()}


def guest(party: PartyLike, s: Settings, data: GuestData) -> dict:
    t0 = time.perf_counter()
    warm = _setup(s)
    c = s.model
    h = party.peer_with_role(HOST)
    run = _psi_or_restore(party, t0 + warm, "the host did not reveal the intersection",
                          lambda: psi.psi_feature_party(party, data.ids, h, workers=s.psi_workers,
                                                        timeout=s.recv_timeout, backend=s.psi_backend))
    t_psi, common, psi_s = time.perf_counter(), run.common, run.psi_s
    # Self-taught rows: every row the host has no label for; the scaling uses only them (only the
    # guest's own knowledge, as in data_fate.guest_view).
    rows = align_guest_rows(data.x, common)
    if not rows.rest.any():
        raise PartyError("stfl: every row of this guest is in the intersection; no self-taught rows to "
                         "standardise on (and, for STFL, to train the VAE on)")
    idx = int(data.index)
    out = {"variant": s.variant, "dataset": s.dataset, "role": GUEST, "guest_index": idx,
           "test_accuracy": None, "epochs": c.epochs, "n_common": int(len(common)),
           "n_selftaught": int(rows.rest.sum()), "n_rows": int(len(rows.rest)),
           "input_width": int(rows.x_common.shape[1]),
           "psi_backend": run.backend, "psi_s": psi_s, "warmup_s": warm}
    if s.variant == "stfl":
        out.update(_guest_stfl(party, s, h, data, rows, common, run))
    else:
        out.update(_guest_split(party, s, h, data, rows, common, run))
    t_end = time.perf_counter()
    out.update({"train_s": t_end - t_psi, "s_per_epoch": (t_end - t_psi) / c.epochs, "total_s": t_end - t0,
                "bytes_sent": sum(party.bytes_sent.values()), "bytes_received": sum(party.bytes_received.values())})
    party.metric(train_s=out["train_s"], psi_s=out["psi_s"], n_selftaught=out["n_selftaught"])
    return out


def _guest_part(s: Settings, data: GuestData, rows: GuestRows, common: np.ndarray,
                net: torch.nn.Module) -> tuple[dict[str, np.ndarray], dict]:
    """A guest's part (``party.save_model``'s arguments): its trained network (a CPU copy) behind
    its scaler, checked on its first common rows."""
    raw = np.asarray(data.x[np.asarray(common)[:model.CHECK_ROWS]], dtype=np.float32)
    return model.part(GUEST, s.variant, net, rows.scaler, activation=s.model.activation,
                      feature_names=data.columns, raw_rows=raw, scaled_rows=rows.x_common)


def _guest_stfl(party: PartyLike, s: Settings, h: str, data: GuestData, rows: GuestRows, common: np.ndarray,
                run: _Resume) -> dict:
    """STFL: the VAE on the self-taught rows, the latent means of the common rows sent once."""
    c, idx = s.model, int(data.index)
    if run.start:
        done = run.saved["stfl"]
    else:
        def on_epoch(ep, total, loss):
            party.round = ep
            party.progress(ep, total, neg_elbo=round(loss, 3))

        fit = fit_vae(rows.x_rest, c, seed=frozen_seed(c.seed, "guest", idx), device=party.device,
                      on_epoch=on_epoch)
        t1 = time.perf_counter()
        z = encode(fit.encoder, rows.x_common)
        enc_s = time.perf_counter() - t1
        privacy = {}
        if s.release.on:  # each latent row clipped and noised once, before the one send (one release per row)
            z, ledger = release_rows(s.release, z, party.name)
            privacy = {"privacy": ledger.as_dict()}
            party.metric(dp_epsilon=ledger.spent)
        party.send(h, Kind.LATENT, {"z": z, "guest_index": idx})
        done = {**privacy, "part": _guest_part(s, data, rows, common, model.encoder_mean_net(fit.encoder)),
                "vae_s": fit.seconds, "encode_s": enc_s, "latent_dim": int(z.shape[1]),
                "vae_neg_elbo_first_last": [fit.history[0], fit.history[-1]]}
        party.checkpoint(1, {**run.keep, "stfl": done})
    party.save_model(*done["part"])
    return {k: v for k, v in done.items() if k != "part"}


def _guest_split(party: PartyLike, s: Settings, h: str, data: GuestData, rows: GuestRows, common: np.ndarray,
                 run: _Resume) -> dict:
    """Hierarchical: ``split_driver.serve_guest`` with this guest's encoder over a clear link."""
    c = s.model
    x_common, idx = rows.x_common, int(data.index)
    net = guest_net(x_common.shape[1], c, idx).to(resolve_device(party.device))
    opt = torch.optim.Adam(net.parameters(), lr=c.lr, weight_decay=c.weight_decay)
    bottom = GuestBottom(net, x_common, opt)
    if not run.start:
        party.send(h, Kind.READY, {"guest_index": idx})

    def checkpoint(k: int, driver: dict) -> None:
        party.checkpoint(k, {**run.keep, "driver": driver})

    link = ClearGuestLink(party, h, SPLIT_KINDS, bottom.n_rows, c.batch_size, timeout=s.recv_timeout, name="stfl")
    stats = serve_guest(bottom, link, run.saved["driver"] if run.start else None, checkpoint)
    party.save_model(*_guest_part(s, data, rows, common, model.cpu_copy(net)))
    return {**stats, "latent_dim": latent_width(x_common.shape[1], c.latent_frac),
            **({"guest_state": _state(net)} if s.return_weights else {})}


ROLES: dict[str, Callable[..., dict]] = {HOST: host, GUEST: guest}
