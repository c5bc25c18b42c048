"""Federated STFL and the plaintext Hierarchical split network (``fedhet.algorithms.stfl``).

* Each party's data is only its own: the host its 10 columns + labels of its train/test rows (the
  self-taught rows dropped), a guest all its rows of its own column block, unmarked.
* Federated STFL equals ``stfl.core.stfl`` run on the same rows in the same order (exactly), and
  is close to it on ``data_fate.prepare``'s views, which differ only in the order of the guest's
  self-taught rows (a secret of the experiment's split that a guest cannot know).
* A guest receives nothing but PSI messages and sends nothing but PSI and one latent message of
  shape (n_common, d_latent).
* Federated Hierarchical equals joint backprop in one process (same nets, same batch order).
* Two guests work; the declaration checks reject a raw-width "latent"; a process run of the
  ``stfl`` preset passes ``fedhet audit``.
* The exported parts compose: each guest's part on its raw rows gives the codes the host's part
  takes, and the host's part on its raw rows and those codes scores as the trained host did.
* Hierarchical checkpoints after every training batch (the generic kill-and-resume tests run the
  STFL smoke federation): killed at a batch (host or guest, in memory; every party as processes) and
  resumed, it trains the same networks as an uninterrupted run, and the audit passes.
"""
from __future__ import annotations

import json
import os
from dataclasses import fields

import numpy as np
import pytest
import torch

from fedhet.algorithms import data_fate as D
from fedhet.algorithms import registry
from fedhet.algorithms.scoring import check_part, score
from fedhet.algorithms import stfl as S
from fedhet.algorithms.stfl import core as L
from fedhet.algorithms.stfl.settings import SHAPES, Model
from fedhet.parties import api
from fedhet.parties.ops import presets
from fedhet.parties.audit import audit
from fedhet.parties.checkpoint import Checkpoints
from fedhet.parties.contract import PartyContext
from fedhet.parties.declare import check_record
from fedhet.parties.faults import KILL_ENV
from fedhet.parties.federation import load
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.parties.ops.launcher import RunFailed, launch, resume_federation
from fedhet.protocols import psi

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

FAST = {"epochs": 30, "vae_epochs": 30, "lr": 1e-2, "vae_lr": 1e-2}
PSI_KINDS = {d.kind for d in psi.DECLARATIONS}


def _settings(cfg: dict) -> S.Settings:
    return S.ALGORITHM.parse(cfg)


def _load(cfg: dict, name: str, role: str, index: int, n_of_role: int):
    return S.load_data(_settings(cfg), PartyContext(name, role, index, n_of_role))


@pytest.fixture
def delivered(monkeypatch):
    """Every message delivered to any party's mailbox: (to, from, kind)."""
    log: list[tuple[str, str, str]] = []
    orig = api._Mailbox.put

    def put(self, env):
        log.append((env.to, env.frm, env.kind))
        return orig(self, env)

    monkeypatch.setattr(api._Mailbox, "put", put)
    return log


def _run(cfg, n_guests=1, seed=3, models=None):
    parties = [("host", "host")] + [(f"guest{i + 1}", "guest") for i in range(n_guests)]
    return run_inmemory(S, parties, cfg={**FAST, "n_guests": n_guests, **cfg}, seed=seed, timeout=60, models=models)


# ------------------------------------------------------------------ settings and data


@pytest.mark.unit
def test_settings_reject_bad_config():
    assert _settings({"dataset": "breast_sklearn"}).dataset == "breast_sk"
    with pytest.raises(ValueError, match="unknown setting.*'epoch'"):
        _settings({"epoch": 3})
    with pytest.raises(ValueError, match="variant"):
        _settings({"variant": "fate"})
    with pytest.raises(ValueError, match="dataset"):
        _settings({"dataset": "mnist"})
    with pytest.raises(ValueError, match="n_guests"):
        _settings({"n_guests": 21})
    with pytest.raises(ValueError, match="n_guests = 1"):
        _load({}, "g", "guest", 0, 2)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["breast_sk"] + [pytest.param(n, marks=pytest.mark.data)
                                                  for n in ("cancer", "vehicle", "payment", "credit")])
def test_declared_shapes_and_host_split_match_data_fate(name):
    """The audit's table (rows, widths) is the data's, and the host's split of its own IDs is the
    split of the whole data set (every guest holds every ID)."""
    full = D.load(name, seed=0)
    assert SHAPES[name] == (len(full.host.ids), full.host.x.shape[1], full.guests[0].x.shape[1])
    split = D.make_split(full, 0)
    hv = _load({"dataset": name, "seed": 0}, "host", "host", 0, 1)
    assert np.array_equal(hv.ids_train, split.train) and np.array_equal(hv.ids_test, split.test)
    assert hv.x_selftaught is None and len(hv.ids_selftaught) == 0
    assert len(hv.ids_train) + len(hv.ids_test) == _settings({"dataset": name}).expected_common()


@pytest.mark.unit
def test_each_party_loads_only_its_own_part():
    cfg = {"seed": 0, "n_guests": 2}
    hv = _load(cfg, "host", "host", 0, 1)
    assert hv.x_train.shape[1] == 10 and set(np.unique(hv.y_train)) == {0, 1}
    full = D.load("breast_sk", seed=0, n_guests=2)
    for i in range(2):
        g = _load(cfg, f"g{i}", "guest", i, 2)
        assert {f.name for f in fields(g)} == {"ids", "x", "columns", "index"}  # no labels, no split, nothing marked
        assert g.x.shape == (569, 10) and g.columns == full.guests[i].columns
        assert np.array_equal(g.ids, full.guests[i].ids) and np.array_equal(g.x, full.guests[i].x)


# ------------------------------------------------------------------------ STFL


def _views_in_guest_order(seed):
    """prepare()'s views, but the guest's self-taught rows in the guest's own row order (what the
    federated guest sees after PSI) — the only input difference from the federated run."""
    data = D.load("breast_sk", seed=seed)
    split = D.make_split(data, seed)
    g = data.guests[0]
    st = np.isin(g.ids, split.selftaught)
    un = g.rows(g.ids[st])
    sc = D.Scaler.fit(un.x)
    tr, te = g.rows(split.train), g.rows(split.test)
    gv = D.GuestView(un.ids, sc(un.x), tr.ids, sc(tr.x), te.ids, sc(te.x))
    return D.Views("breast_sk", D.host_view(data, split, with_selftaught=False), [gv], split)


def test_stfl_federated_equals_local_and_guest_gets_only_psi(delivered):
    seed = 3
    res = _run({"variant": "stfl"}, seed=seed)
    h, g = res["host"], res["guest1"]
    assert h["test_accuracy"] > 0.9
    assert h["n_common"] == g["n_common"] == 341 and g["n_selftaught"] == 228
    assert h["sizes"]["n_dropped"] == 0 and h["latent_dims"] == [10]
    # Exactly the in-process method on the same rows in the same order.
    local = L.stfl(_views_in_guest_order(seed), Model(**FAST, seed=seed))
    assert h["test_accuracy"] == local["accuracy"]
    assert g["vae_neg_elbo_first_last"] == pytest.approx(list(local["vae_neg_elbo_first_last"][0]), rel=1e-6)
    # prepare()'s views differ in the self-taught rows' order only: close, not equal.
    ref = L.stfl(D.prepare("breast_sk", seed=seed), Model(**FAST, seed=seed))["accuracy"]
    assert abs(h["test_accuracy"] - ref) <= 0.05
    # What crossed: guests got PSI only; they sent PSI and exactly one latent message.
    to_guest = {k for to, _, k in delivered if to == "guest1"}
    from_guest = [k for _, frm, k in delivered if frm == "guest1"]
    assert to_guest and to_guest <= PSI_KINDS
    assert set(from_guest) <= PSI_KINDS | {S.Kind.LATENT} and from_guest.count(S.Kind.LATENT) == 1


def test_stfl_two_guests(delivered):
    res = _run({"variant": "stfl"}, n_guests=2, seed=1)
    h = res["host"]
    assert h["test_accuracy"] > 0.9 and h["latent_dims"] == [5, 5]
    assert h["guest_order"] == ["guest1", "guest2"]
    for gname in ("guest1", "guest2"):
        assert res[gname]["input_width"] == 10 and res[gname]["n_common"] == 341
        assert {k for to, _, k in delivered if to == gname} <= PSI_KINDS


# ---------------------------------------------------------------- Hierarchical


def _joint_reference(cfg, seed, n_guests):
    """Plain joint backprop in one process: one Adam over every party's network, same init and
    batch order as the federated run."""
    s = _settings({**cfg, "seed": seed})
    c = s.model
    hv = _load({**cfg, "seed": seed}, "host", "host", 0, 1)
    common = sorted(np.concatenate([hv.ids_train, hv.ids_test]).tolist())
    pos = {v: i for i, v in enumerate(common)}
    tr_pos = np.array([pos[v] for v in hv.ids_train.tolist()])
    te_pos = np.array([pos[v] for v in hv.ids_test.tolist()])
    gx = []
    for i in range(n_guests):
        g = _load({**cfg, "seed": seed}, f"g{i}", "guest", i, n_guests)
        row = {v: r for r, v in enumerate(g.ids.tolist())}
        rows = np.array([row[v] for v in common])
        st = np.ones(len(g.x), bool)
        st[rows] = False
        sc = D.Scaler.fit(g.x[st])
        gx.append(torch.as_tensor(sc(g.x[rows])))
    gnets = [L.guest_net(x.shape[1], c, i) for i, x in enumerate(gx)]
    hnet = L.host_net(hv.x_train.shape[1] + sum(s.latent_widths()), 2, c)
    params = [p for n in gnets + [hnet] for p in n.parameters()]
    opt = torch.optim.Adam(params, lr=c.lr, weight_decay=c.weight_decay)
    xh, y = torch.as_tensor(hv.x_train), torch.as_tensor(hv.y_train, dtype=torch.float32)
    for ep in range(c.epochs):
        perm = L.batch_order(seed, len(tr_pos), ep)
        for b in range(0, len(perm), c.batch_size):
            idx = perm[b:b + c.batch_size]
            rows = torch.as_tensor(tr_pos[idx])
            out = hnet(torch.cat([xh[idx]] + [n(x[rows]) for n, x in zip(gnets, gx)], 1))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(1), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        rows = torch.as_tensor(te_pos)
        out = hnet(torch.cat([torch.as_tensor(hv.x_test)] + [n(x[rows]) for n, x in zip(gnets, gx)], 1))
    acc = float(((out.squeeze(1) > 0).long().numpy() == hv.y_test).mean())
    return acc, hnet, gnets


def _close(state: dict, net: torch.nn.Module) -> bool:
    return all(np.allclose(np.array(state[k]), v.detach().numpy(), rtol=1e-5, atol=1e-6)
               for k, v in net.state_dict().items())


@pytest.mark.parametrize("n_guests", [1, 2])
def test_hierarchical_split_equals_joint_backprop(n_guests, delivered):
    seed = 5
    cfg = {**FAST, "variant": "hierarchical", "n_guests": n_guests, "return_weights": True}
    res = _run(cfg, n_guests=n_guests, seed=seed)
    h = res["host"]
    assert h["test_accuracy"] > 0.9
    acc, hnet, gnets = _joint_reference(cfg, seed, n_guests)
    assert h["test_accuracy"] == acc
    assert _close(h["host_state"], hnet)
    for i, gn in enumerate(gnets):
        gres = res[f"guest{i + 1}"]
        assert gres["train_batches"] == FAST["epochs"] * h["batches_per_epoch"]
        assert gres["rows_trained_on"] == h["sizes"]["n_train"]
        assert _close(gres["guest_state"], gn)
    kinds_to_guest = {k for to, _, k in delivered if to == "guest1"}
    assert kinds_to_guest <= PSI_KINDS | {S.Kind.BATCH, S.Kind.GRADIENT} and S.Kind.GRADIENT in kinds_to_guest


def test_hierarchical_is_deterministic():
    cfg = {**FAST, "epochs": 5, "variant": "hierarchical", "return_weights": True}
    a, b = _run(cfg, seed=2), _run(cfg, seed=2)
    assert a["host"]["host_state"] == b["host"]["host_state"]
    assert a["guest1"]["guest_state"] == b["guest1"]["guest_state"]


# ------------------------------------------------------------------------ checkpoints


HIER3 = {**FAST, "epochs": 3, "variant": "hierarchical", "return_weights": True}


def _same_training(got: dict, want: dict) -> None:
    """The results that training decides (weights, losses, accuracy, counts) are equal, bit for bit."""
    for p, w in want.items():
        for k in ("test_accuracy", "loss_first_last", "host_state", "guest_state", "train_batches",
                  "eval_batches", "rows_trained_on", "guest_order", "sizes"):
            assert got[p].get(k) == w.get(k), (p, k)


@pytest.mark.parametrize("victim, at", [("host", 2), ("guest2", 3)])
def test_hierarchical_killed_at_a_batch_resumes_bit_identically(victim, at, tmp_path):
    cfg, parties = {**HIER3, "n_guests": 2}, [("host", "host"), ("guest1", "guest"), ("guest2", "guest")]
    want_parts: dict = {}
    want = run_inmemory(S, parties, cfg, seed=4, run_id="h", timeout=60, models=want_parts)   # no checkpoints
    with pytest.raises(FederationFailed):
        run_inmemory(S, parties, cfg, seed=4, run_id="h", timeout=60, clock="virtual", checkpoint_dir=tmp_path,
                     kill={victim: at})
    assert Checkpoints(tmp_path / victim).steps() == [at - 1, at]   # one checkpoint per training batch
    parts: dict = {}
    resumed: dict = {}
    got = run_inmemory(S, parties, cfg, seed=4, run_id="h", timeout=60, checkpoint_dir=tmp_path, resume=True,
                       resumed=resumed, models=parts)
    assert set(resumed.values()) <= {at - 1, at} and len(set(resumed.values())) == 1, resumed
    _same_training(got, want)
    for p, part in want_parts.items():
        assert all(np.array_equal(parts[p].tensors[k], v) for k, v in part.tensors.items()), p


@pytest.mark.unit
@pytest.mark.slow   # the generic test kills STFL's smoke run as processes; this is the hierarchical variant
def test_hierarchical_killed_as_processes_resumes_and_passes_the_audit(tmp_path):
    fed = load(presets.path("stfl"))
    cfg = {**fed.algorithm_cfg(), **HIER3}
    want = run_inmemory(S, [(p.name, p.role) for p in fed.parties], cfg, seed=fed.seed, timeout=60)
    run_dir = tmp_path / "run"
    with pytest.raises(RunFailed):   # every party killed once the host has checkpointed batch 2
        launch(fed, run_dir, progress=False, timeout=240, overrides=HIER3,
               env=dict(os.environ, **{KILL_ENV: "host:2:all"}))
    summary = launch(resume_federation(run_dir), run_dir, progress=False, timeout=240, resume=True)
    assert len({r.get("resumed_from") for r in summary["parties"].values()}) == 1
    _same_training({p: r["result"] for p, r in summary["parties"].items()}, want)
    rep = audit(run_dir, trust_folder_keys=True)
    assert rep.ok, rep.problems[:5]


# ------------------------------------------------------------------------ trained parts


@pytest.mark.parametrize("variant", ["stfl", "hierarchical"])
def test_exported_parts_compose_guest_codes_into_the_host_score(variant):
    """Guest i's part maps its raw rows to z_i; the host's part takes its raw rows and z_0..z_{G-1}
    of the same IDs and gives exactly the trained host's logits.  No part holds another party's
    rows: a guest's part holds its own columns' weights and scaler only."""
    seed, n_guests = 2, 2
    cfg = {**FAST, "epochs": 3, "vae_epochs": 3, "variant": variant}
    models: dict = {}
    _run(cfg, n_guests=n_guests, seed=seed, models=models)
    algo = registry.get_algorithm("stfl")
    assert set(models) == {"host", "guest1", "guest2"}
    host = models["host"]
    prefix = "stfl" if variant == "stfl" else "stfl-hierarchical"
    assert host.meta["model"] == f"{prefix}/host" and host.meta["classes"] == [0, 1]
    assert [i["name"] for i in host.meta["inputs"]] == ["x", "z0", "z1"]
    hv = _load({**cfg, "seed": seed, "n_guests": n_guests}, "host", "host", 0, 1)
    assert host.meta["feature_names"] == hv.columns and len(hv.columns) == 10
    x_host = np.asarray(host.meta["check"]["inputs"]["x"], dtype=np.float32)
    # every host row is common in breast_sk: its check rows are its first test rows, raw
    assert np.array_equal(x_host, hv.x_test_raw[:len(x_host)])
    ids = hv.ids_test[:len(x_host)]
    rows = {"x": x_host}
    for i in range(n_guests):
        part = models[f"guest{i + 1}"]
        assert part.meta["model"] == f"{prefix}/guest" and "classes" not in part.meta
        g = _load({**cfg, "seed": seed, "n_guests": n_guests}, f"g{i}", "guest", i, n_guests)
        assert part.meta["feature_names"] == g.columns and part.tensors["scaler_mean"].shape == (10,)
        at = {v: r for r, v in enumerate(g.ids.tolist())}
        z = score(algo.load_model(part.meta, part.tensors), part.meta, {"x": g.x[[at[v] for v in ids.tolist()]]})
        assert np.array_equal(z, np.asarray(host.meta["check"]["inputs"][f"z{i}"], dtype=np.float32)), i
        rows[f"z{i}"] = z
    logits = score(algo.load_model(host.meta, host.tensors), host.meta, rows)
    assert np.array_equal(logits, np.asarray(host.meta["check"]["outputs"], dtype=np.float32))
    # the round trip is a real check: a changed weight fails it
    bad = dict(host.tensors, **{"net.0.bias": host.tensors["net.0.bias"] + 1e-3})
    assert "differ" in check_part(algo.load_model(host.meta, bad), host.meta)


# --------------------------------------------------------------- declarations, audit


def _check(cfg: dict, kind: str, *arrays) -> str | None:
    """The receipt schema's and the audit's verdict on a record of ``kind`` holding ``arrays``
    ((field, dtype, shape)) in a run of ``cfg``; "undeclared" for a kind the run does not declare."""
    s = _settings(cfg)
    decls = {d.kind: d for d in S.declarations(s)}
    return check_record(decls[kind], list(arrays)) if kind in decls else "undeclared"


@pytest.mark.unit
def test_declarations_reject_raw_features():
    cfg = {"dataset": "breast_sklearn", "n_guests": 1}
    lat = S.Kind.LATENT
    assert _check(cfg, lat, ("z", "<f4", (341, 10))) is None
    assert "shape" in _check(cfg, lat, ("z", "<f4", (341, 20)))  # the guest's raw columns
    assert "shape" in _check(cfg, lat, ("z", "<f4", (569, 10)))  # self-taught rows too
    assert _check(cfg, lat, ("z", "<f8", (341, 10))) is not None
    assert _check(cfg, lat, ("x", "<f4", (341, 10))) is not None
    assert _check({**cfg, "variant": "hierarchical"}, lat, ("z", "<f4", (341, 10))) == "undeclared"
    two = {**cfg, "n_guests": 2}
    assert _check(two, lat, ("z", "<f4", (341, 5))) is None and _check(two, lat, ("z", "<f4", (341, 10))) is not None
    act = S.Kind.ACTIVATION
    hier = {**cfg, "variant": "hierarchical"}
    assert _check(hier, act, ("a", "<f4", (128, 10))) is None
    assert _check(hier, act, ("a", "<f4", (129, 10))) is not None
    assert _check(hier, act, ("a", "<f4", (128, 20))) is not None
    assert _check(cfg, act, ("a", "<f4", (128, 10))) == "undeclared"  # no split messages in an STFL run
    assert _check(hier, S.Kind.BATCH, ("rows", "<i8", (128,))) is not None


@pytest.mark.processes
@pytest.mark.smoke   # make test's process run of this family
def test_preset_as_processes_passes_audit(tmp_path):
    fed = load(presets.path("stfl"))
    run_dir = tmp_path / "run"
    launch(fed, run_dir, progress=False, timeout=240, overrides=dict(FAST))
    rep = audit(run_dir)
    assert rep.ok, rep.problems
    host = json.loads((run_dir / "parties" / "host" / "result.json").read_text())["result"]
    assert host["test_accuracy"] > 0.9 and host["n_common"] == 341
    rows = [r for r in rep.table if r["party"] == "guest"]
    assert {r["kind"] for r in rows if r["received"]} <= PSI_KINDS | {"_bye"}
    assert {r["kind"] for r in rows if r["sent"]} <= PSI_KINDS | {S.Kind.LATENT, "_bye"}
    recs = [json.loads(line) for line in (run_dir / "parties" / "guest" / "transcript.jsonl").read_text().splitlines()]
    lat = [r for r in recs if r.get("kind") == S.Kind.LATENT and r.get("dir") == "send"]
    assert len(lat) == 1 and [tuple(a[1]) for a in lat[0]["arrays"]] == [(341, 10)]
    assert lat[0]["arrays"][0][0] == "<f4"
