"""The benchmark figures, drawn from tiny synthetic results documents (no experiment runs).

* HyFEM curves: small multiples, two panels (accuracy, loss) per setting on a grid of
  ``FIG_COLS`` columns, every panel titled and labelled, one legend shared by all of them.
* MMVFL: MMVFL's line is dashed and drawn above supFL's solid one, with other markers, so
  equal curves stay visible; one legend names the three methods.
* F³ Table 2: every bar row is named by its method (letter and name), not by a bare letter.
* HE vs plaintext: exactly the extrapolated rows' bars are hatched, the legend says so, and
  ``--render-only`` redraws the PNG from the JSON alone.
"""
from __future__ import annotations

import json

import pytest

from benchmarks import f3_tables, harness, he_vs_plain, hyfem_curves, mmvfl_figures

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

PNG = b"\x89PNG\r\n\x1a\n"


def curve(n: int, start: float) -> dict:
    return {"mean": [start + 0.1 * i for i in range(n)], "std": [0.01] * n}


def hyfem_doc() -> dict:
    full = {k: curve(4, 0.1) for k in ("global_accuracy", "global_loss", "local_accuracy", "local_loss")}
    central = {k: curve(4, 0.2) for k in ("global_accuracy", "global_loss")}
    return {"rounds": 3, "curves": {
        "fig3": {"clients": 4, "data": "handwritten", "rounds": 3,
                 "methods": {"Centralized": central, "HyFEM-Avg": full}},
        "coil20_v4": {"clients": 4, "data": "coil20", "rounds": 3,
                      "methods": {"Centralized": central, "HyFEM-Prox mu=0.1": full}},
        "fig4_mu_sweep": {"clients": 8, "data": "handwritten", "rounds": 3,
                          "methods": {f"HyFEM-Prox mu={m:g}": full for m in (0.0, 0.1, 1.0)}}}}


def test_hyfem_curves_are_small_multiples_with_one_shared_legend():
    fig = hyfem_curves.figure(hyfem_doc())
    drawn = [ax for ax in fig.axes if ax.axison]
    assert len(fig.axes) == 2 * hyfem_curves.FIG_COLS          # 3 settings x 2 panels on a 2 x 4 grid
    assert [ax.get_subplotspec().colspan.start for ax in drawn] == [0, 1, 2, 3, 0, 1]
    assert [ax.get_title().split("\n")[0] for ax in drawn] == [
        "fig3: test accuracy", "fig3: test loss", "coil20_v4: test accuracy", "coil20_v4: test loss",
        "fig4_mu_sweep: test accuracy", "fig4_mu_sweep: test loss"]
    assert all(ax.get_xlabel() and ax.get_ylabel() for ax in drawn)
    assert all(ax.title.get_fontsize() >= 10 for ax in drawn)
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:3] == ["Centralized", "HyFEM-Avg", "HyFEM-Prox mu=0.1"]
    assert any(t.startswith("global") for t in labels) and any(t.startswith("local") for t in labels)
    assert not any(ax.get_legend() for ax in drawn[:4])     # the curves' panels carry no legend of their own
    harness.pyplot().close(fig)


def mmvfl_doc() -> dict:
    same = [[0.5, 0.7, 0.8]]   # MMVFL and supFL equal: the case where one line hid the other
    return {"settings": {"percents": [10, 50, 100]}, "datasets": {"handwritten": {
        "views": ["pixel"], "summary": {"folds": [0, 1],
                                        "accuracy": {"MMVFL": same, "supFL": same, "supMVLFL": [[0.4, 0.6, 0.7]]}}}}}


def test_mmvfl_lines_stay_visible_when_they_coincide():
    fig = mmvfl_figures.figure(mmvfl_doc())
    (legend,) = fig.legends
    names = [t.get_text() for t in legend.get_texts()]
    assert names == list(mmvfl_figures.METHODS)
    by = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert sorted(by) == sorted(mmvfl_figures.METHODS)
    assert by["MMVFL"].get_linestyle() == "--" and by["supFL"].get_linestyle() == "-"
    assert by["MMVFL"].get_marker() != by["supFL"].get_marker()
    assert by["MMVFL"].get_zorder() > by["supFL"].get_zorder()
    assert [h.get_linestyle() for h in legend.legend_handles] == [by[m].get_linestyle() for m in names]
    harness.pyplot().close(fig)


def test_f3_table2_names_every_row_by_its_method():
    runs = {k: {"0": {"f1": 0.5, "auc": 0.7}} for k in ("A", "B", "G", "gcn:soft:icdf")}
    runs["C"] = {"0": {"na": "binary tasks only"}}
    doc = {"datasets": {"vowels": {"runs": runs, "entropy": [0.1, 0.5]}}}
    figs = f3_tables.figures(doc)
    ax = figs["t2"].axes[0]
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks == [f"{k}  {name}" for k, name in f3_tables.TABLE2]
    assert any(t.get_text() == "binary tasks only" for t in ax.texts)
    (legend,) = figs["t2"].legends
    assert [t.get_text() for t in legend.get_texts()] == ["ours (mean ± std over seeds)"]
    for fig in figs.values():
        harness.pyplot().close(fig)


def he_row(dataset: str, variant: str, extrapolated: bool, train_s: float) -> dict:
    return {"dataset": dataset, "variant": variant, "extrapolated": extrapolated, "train_s": train_s,
            "epochs": 100, "measured_epochs": 0.5 if extrapolated else 100.0, "measured_train_s": 1.0,
            "s_per_epoch": train_s / 100, "test_accuracy": 0.9, "bytes_total": 1e6,
            "bytes_sent_by_party": {"host": 4e5, "guest1": 6e5}, "audit_ok": True}


HE_ROWS = [he_row("cancer", "stfl", False, 1.0), he_row("cancer", "he_paillier", False, 200.0),
           he_row("cancer", "he_naive", True, 9000.0), he_row("credit", "stfl", False, 20.0),
           he_row("credit", "he_paillier", True, 8000.0)]


def test_he_vs_plain_hatches_exactly_the_extrapolated_bars():
    fig = he_vs_plain.plot(HE_ROWS)
    ax = fig.axes[0]
    hatched = sorted(p.get_height() for p in ax.patches if p.get_hatch())
    plain = sorted(p.get_height() for p in ax.patches if not p.get_hatch())
    assert hatched == [8000.0, 9000.0] and plain == [1.0, 20.0, 200.0]
    entries = {t.get_text(): h for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)}
    (key,) = [k for k in entries if k.startswith("extrapolated")]
    assert entries[key].get_hatch() == he_vs_plain.EXTRAPOLATED_HATCH
    assert not any(entries[v].get_hatch() for v in ("stfl", "he_paillier", "he_naive"))
    harness.pyplot().close(fig)


def test_he_vs_plain_render_only_redraws_from_the_json(tmp_path, capsys):
    doc = {"meta": {"machine": "x86_64, 2 cores", "when": "2026-01-01 00:00", "command": "python -m x"},
           "args": {"epochs": 100}, "rows": HE_ROWS}
    (tmp_path / "he_vs_plain.json").write_text(json.dumps(doc))
    assert he_vs_plain.main(["--render-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "he_vs_plain.png").read_bytes()[:8] == PNG
    assert json.loads((tmp_path / "he_vs_plain.json").read_text()) == doc
    assert "9000.0*" in capsys.readouterr().out


@pytest.mark.parametrize("module", [hyfem_curves, mmvfl_figures, f3_tables, he_vs_plain])
def test_every_fixed_figure_can_be_redrawn_without_running(module, capsys):
    """Each script offers ``--render-only`` (redraw from the results JSON alone)."""
    with pytest.raises(SystemExit) as e:
        module.main(["--help"])
    assert e.value.code == 0 and "--render-only" in capsys.readouterr().out


def test_chfl_dp_render_only_draws_accuracy_against_epsilon_from_the_json(tmp_path):
    from benchmarks import chfl_dp

    def run(acc):
        return {"final_test": {"common": acc, "chfl_mu=0.5": acc + 0.1}, "wall_s": 1.0, "epsilon": [],
                "noise_multiplier": []}

    rows = {"non-private": {"runs": [run(0.8), run(0.82)]}}
    rows.update({f"epsilon={e:g}": {"runs": [run(0.3 + 0.05 * e), run(0.31 + 0.05 * e)]} for e in (1, 3, 8)})
    doc = {"preset": "chfl", "seeds": 2, "delta": 1e-5, "rounds": 10, "rows": rows, "data": "covertype, real"}
    (tmp_path / "chfl_dp_chfl.json").write_text(json.dumps(doc))
    assert chfl_dp.main(["--preset", "chfl", "--render-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "chfl_dp_chfl.png").read_bytes()[:8] == PNG
    md = (tmp_path / "chfl_dp_chfl.md").read_text()
    assert "![test accuracy against epsilon](chfl_dp_chfl.png)" in md and "| epsilon=3 | 0.4550 | 0.5550 |" in md
    assert json.loads((tmp_path / "chfl_dp_chfl.json").read_text()) == doc
