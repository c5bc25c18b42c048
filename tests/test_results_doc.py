"""docs/results.md is generated from the committed results files (``python -m benchmarks.results_doc``):
no figure on it is edited by hand.  Nothing here runs a benchmark."""
from __future__ import annotations

import pytest

import json

from benchmarks import harness, results_doc

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def test_results_page_is_what_the_command_writes_from_the_committed_results():
    assert results_doc.DOC.read_text() == results_doc.render(), (
        "docs/results.md differs from the results files: run `make results-doc` (python -m benchmarks.results_doc)")


def test_every_results_file_records_its_commit_and_machine():
    for p in sorted(harness.RESULTS.glob("*.json")):
        doc = json.loads(p.read_text())
        commit, machine = results_doc.provenance(doc)
        assert commit != "unrecorded" and machine, p.name


def test_every_table_names_its_data_file_commit_and_machine():
    text = results_doc.DOC.read_text()
    for s in results_doc.SECTIONS:
        block = text.split(f"### {s.title}\n", 1)[1].split("\n### ", 1)[0]
        assert s.data.split(":")[0].split(" ")[0] in (results_doc.REAL, results_doc.STAND_IN, results_doc.SYNTHETIC)
        assert "- data: **" in block and f"`{s.files[0]}.json`" in block and "- commit: " in block and "machine: " in block


def test_check_mode_reports_a_stale_page(tmp_path, capsys):
    page = tmp_path / "results.md"
    page.write_text("# Results\n\nhand-edited figure: 99 %\n")
    assert results_doc.main(["--out", str(page), "--check"]) == 1
    assert results_doc.main(["--out", str(page)]) == 0
    assert results_doc.main(["--out", str(page), "--check"]) == 0
