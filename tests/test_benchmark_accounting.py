"""What the benchmark scripts compute from their runs: extrapolated bytes on
the wire (he_vs_plain), auto's ECDH/RR22 crossing (psi_speed), the CHFL tables' grouping of finished runs, and that the
CHFL tables' runs (the federated roles in memory) give ``chfl.experiments.sweep``'s numbers."""
from __future__ import annotations

import json

import pytest

from benchmarks import chfl_tables
from benchmarks import he_vs_plain
from benchmarks import psi_speed

from fedhet.algorithms import chfl, he_split
from fedhet.algorithms.chfl.experiments import sweep
from fedhet.parties.inmemory import run_inmemory

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)


def _he_run(batches: int) -> dict:
    cfg = dict(dataset="breast_sklearn", he="paillier", key_bits=512, slot_bits=128, mask_bits=32, pool=False,
               epochs=1, batch_size=32, max_batches=batches, evaluate=False, guest_bottom_width=3,
               interactive_width=2, seed=3)
    res = run_inmemory(he_split, [("host", "host"), ("guest1", "guest")], cfg=cfg)
    return {"total": sum(r["bytes"]["sent"] for r in res.values()), "host": res["host"]}


def test_extrapolated_bytes_scale_only_the_training_traffic():
    short, long_ = _he_run(1), _he_run(4)
    h = short["host"]
    assert h["batches"] == 1 and long_["host"]["batches"] == 4
    est = he_vs_plain.full_run_bytes(short["total"], h["train_bytes"], h["batches"], 4, 1, 1 / 4)
    whole = he_vs_plain.full_run_bytes(short["total"], None, None, None, 1, 1 / 4)
    # PSI and key set-up are paid once: scaling only training bytes predicts the 4-batch run
    assert est == pytest.approx(long_["total"], rel=0.02)
    assert whole > 1.2 * long_["total"]  # the old estimate, scaling everything, overstates
    with pytest.raises(ValueError, match="training bytes"):
        he_vs_plain.full_run_bytes(10, {"sent": 8, "received": 8}, 1, 4, 1, 0.25)


def _fake_run(acc: dict, **job) -> tuple[str, dict]:
    rid = chfl_tables.run_id(job)
    return rid, {"results": {m: {"mean_test": acc[m]} for m in chfl_tables.METHODS},
                 "settings": {"rounds": 1}}


@pytest.mark.unit
def test_chfl_tables_rows_come_from_every_finished_run():
    acc = {"common": 0.5, "local": 0.6, "chfl_mu0": 0.7, "chfl_mu>0": 0.75}
    runs = dict([
        _fake_run(acc, dataset="covertype", K=5, ratio=0.3, feature_seed=0, seed=1000),
        _fake_run({**acc, "chfl_mu>0": 0.65}, dataset="covertype", K=5, ratio=0.3, feature_seed=1, seed=1000),
        _fake_run(acc, dataset="covertype", K=2, ratio=0.3, feature_seed=0, seed=1000),
        _fake_run(acc, dataset="covertype", K=5, ratio=0.1, feature_seed=0, seed=1001),
        _fake_run(acc, dataset="vehicle", K=5, ratio=0.3, feature_seed=0, seed=1000),
    ])
    s = chfl_tables.summarize(runs, {"helena": "not available"})
    assert set(s["table2"]) == {"covertype", "vehicle", "helena"}
    assert s["table2"]["helena"]["error"] == "not available" and not s["table2"]["helena"]["runs"]
    cov = s["table2"]["covertype"]
    assert len(cov["runs"]) == 2 and cov["splits"] == 2 and cov["seeds"] == 1
    assert cov["cells"]["chfl_mu>0"][0] == pytest.approx(0.70)
    assert cov["claim"]["mu>0 >= mu=0"] is True and cov["claim"]["mu=0 > max(Common, Local)"] is True
    assert list(s["table3"]) == ["2", "5"] and len(s["table3"]["5"]["runs"]) == 2
    assert list(s["fig4"]) == ["0.1", "0.3"] and s["fig4"]["0.1"]["seeds"] == 1
    # only default-setting runs: no Table III / Fig. 4 section at all
    only = {k: v for k, v in runs.items() if "K=5|r=0.3" in k}
    assert chfl_tables.summarize(only, {})["table3"] == {} and chfl_tables.summarize(only, {})["fig4"] == {}


@pytest.mark.processes
def test_chfl_tables_refuses_to_drop_runs_made_with_other_settings(tmp_path, capsys):
    rid, run = _fake_run({m: 0.5 for m in chfl_tables.METHODS}, dataset="vehicle", K=5, ratio=0.3,
                         feature_seed=0, seed=1000)
    path = tmp_path / "chfl_tables.json"
    path.write_text(json.dumps({"runs": {rid: run}}))
    before = path.read_bytes()
    with pytest.raises(SystemExit):
        chfl_tables.main(["--only", "table2", "--datasets", "vehicle", "--resume", "--out-dir", str(tmp_path)])
    assert "other settings" in capsys.readouterr().err
    assert path.read_bytes() == before
    other = tmp_path / "elsewhere.json"
    with pytest.raises(SystemExit):
        chfl_tables.main(["--only", "table2", "--datasets", "vehicle", "--import-runs", str(other),
                          "--out-dir", str(tmp_path), "--name", "x"])
    assert "cannot read finished runs" in capsys.readouterr().err


def test_chfl_tables_runs_the_roles_and_matches_the_in_process_sweep():
    table = chfl.load_table("digits")
    kw = dict(K=3, common_ratio=0.3, rounds=2, seed=7, feature_seed=1, lr_grid=[0.01, 0.001], mu_grid=[0.5, 1.0],
              epochs=1, hidden=[32, 16])
    got = chfl_tables.sweep_roles(table, **kw)
    ref = sweep(table, **kw)
    assert set(got["results"]) == set(chfl_tables.METHODS)
    for m in chfl_tables.METHODS:
        assert got["results"][m]["test"] == ref["results"][m]["test"], m
        assert got["results"][m]["chosen"] == ref["results"][m]["chosen"], m
        assert got["results"][m]["mean_test"] == ref["results"][m]["mean_test"], m
    assert got["n_common"] == ref["n_common"] and got["n_unique"] == ref["n_unique"]
    with pytest.raises(ValueError, match="mu_grid"):
        chfl_tables.sweep_roles(table, **{**kw, "mu_grid": [0.0]})


@pytest.mark.unit
def test_psi_speed_crossing_is_where_rr22_wins_at_every_larger_size():
    def rows(times):
        return [{"log2n": e, "backend": b, "with_start_s": t} for e, pair in times.items()
                for b, t in zip(("ecdh", "rr22"), pair)]

    assert psi_speed.crossing(rows({8: (0.1, 0.9), 10: (0.5, 0.9), 12: (2.0, 1.0), 14: (8.0, 1.5)})) == 1 << 12
    # a loss at 2^12 after a win at 2^10 (noise): the crossing is where the wins hold from on
    assert psi_speed.crossing(rows({8: (0.1, 0.9), 10: (1.0, 0.9), 12: (1.5, 1.6), 14: (8.0, 1.5)})) == 1 << 14
    assert psi_speed.crossing(rows({8: (0.1, 0.9), 10: (0.2, 0.9)})) is None
