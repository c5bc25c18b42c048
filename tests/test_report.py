"""``fedhet report`` and ``fedhet board`` on real process runs: the data the page is drawn from
(runview) against the run's own files, and the page itself in headless Chromium (Debian's
chromium through Playwright): no console errors, every chart drawn, the numbers of result.json,
exactly the transcript's kinds in the message map, a tampered transcript in red at its place, and
the board following a run while it goes on (the run paused on cue by FEDHET_PAUSE_AT, an event,
not a race)."""
from __future__ import annotations

import json
import re
import secrets
import shutil
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from browser_tools import Page, board_server, browser, needs_browser, nonblank
from launch_tools import launch_in_background, shared_run
from fedhet.algorithms.registry import get_algorithm
from fedhet.parties.ops import cli, presets
from fedhet.parties.faults import pause_hook
from fedhet.parties.federation import load
from fedhet.parties.ops.launcher import launch
from fedhet.parties.ops.report import render, write
from fedhet.parties.ops.runview import status, view

pytestmark = pytest.mark.processes   # the tier (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


def _fed(name: str):
    return load(ROOT / "algorithms" / name / "smoke.toml")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished process runs: the HE split network's smoke federation and FedAvg's demo, made
    once for all xdist workers (launch_tools.shared_run); the tests only read them (a test that
    tampers works on a copy)."""
    def make(folder):   # the two side by side: the board serves exactly these two runs
        assert launch(replace(_fed("he_split"), hosts=1), folder / "he", progress=False, timeout=300)["ok"]
        assert launch(replace(load(presets.path("demo")), hosts=1), folder / "fedavg", progress=False, timeout=300,
                      overrides={"rounds": 4})["ok"]
    root = shared_run(tmp_path_factory, "report", make)
    return root / "he", root / "fedavg"


def _transcript_kinds(run: Path) -> dict[str, int]:
    """kind -> messages sent, from every party's transcript."""
    out: dict[str, int] = {}
    for t in run.glob("parties/*/transcript.jsonl"):
        for line in t.read_text().splitlines():
            r = json.loads(line)
            if r.get("type", "msg") == "msg" and r["dir"] == "send":
                out[r["kind"]] = out.get(r["kind"], 0) + 1
    return out


def _tamper(run: Path, dst: Path) -> tuple[str, int]:
    """A copy of ``run`` with one byte count changed in the host's transcript (the record stays
    canonical JSON: only the chain and the other end can tell); returns (kind, record index)."""
    shutil.copytree(run, dst)
    t = dst / "parties" / "host" / "transcript.jsonl"
    lines = t.read_bytes().splitlines(keepends=True)
    i = next(n for n, raw in enumerate(lines) if b'"dir":"send"' in raw and b'"kind":"hei/' in raw)
    rec = json.loads(lines[i])
    rec["bytes"] += 1
    lines[i] = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    t.write_bytes(b"".join(lines))
    return rec["kind"], rec["i"]


# ------------------------------------------------------------------ the data (no browser)
def test_view_lists_exactly_the_transcripts_kinds_with_their_counts(runs):
    he, _ = runs
    v = view(he, get_algorithm)
    sent = _transcript_kinds(he)
    assert {k["kind"]: k["count"] for k in v["kinds"]} == sent
    assert v["audit"]["ok"] and v["state"] == "done"
    declared = {k["kind"]: k["protects"] for k in v["kinds"]}
    assert declared["hei/fwd_ct"] == "paillier" and declared["_bye"] == "control"
    assert all(p in v["protections"] for p in declared.values())
    # the flow holds every message once, in its round
    assert sum(s["count"] for f in v["flow"] for s in f["steps"]) == sum(sent.values())
    bytes_sent = sum(b for p in v["phases"]["bytes_sent"].values() for b in p.values())
    assert bytes_sent == sum(k["bytes"] for k in v["kinds"])


def test_view_shows_the_network_and_the_models_lan_and_wan_times(runs):
    """A loopback run: its profile from config.json, and the network cost model's wall time at LAN and
    WAN from its transcripts, never below the measured wall (a link only adds time) and WAN's never
    below LAN's; the page shows both."""
    he, _ = runs
    v = view(he, get_algorithm)
    net = v["network"]
    assert net["profile"] == "loopback" and json.loads((he / "config.json").read_text())["network"]["network"] == "loopback"
    assert set(net["predicted"]) == {"lan", "wan"} and not net["why_not"]
    assert v["wall_s"] <= net["predicted"]["lan"] <= net["predicted"]["wan"]
    page = render(he, lookup=get_algorithm)
    assert "predicted wall time at WAN (s)" in page and 'data-key="predicted_wan_s"' in page


def test_tampered_record_is_marked_where_it_is(runs, tmp_path):
    he, _ = runs
    kind, _ = _tamper(he, tmp_path / "bad")
    v = view(tmp_path / "bad", get_algorithm)
    assert not v["audit"]["ok"]
    bad = [s for f in v["flow"] for s in f["steps"] if s["problems"]]
    assert bad and all(s["kind"] == kind for s in bad), bad
    assert any("hash chain broken" in p for s in bad for p in s["problems"])
    assert next(k for k in v["kinds"] if k["kind"] == kind)["bad"] >= 1


def test_hostile_record_is_listed_undeclared_and_never_markup(runs, tmp_path):
    """A record of the wrong shape with markup for a kind: the view does not raise, the kind is
    undeclared (the audit fails), and the page holds the text only as escaped JSON."""
    he, _ = runs
    bad = tmp_path / "hostile"
    shutil.copytree(he, bad)
    t = bad / "parties" / "guest1" / "transcript.jsonl"
    lines = t.read_bytes().splitlines(keepends=True)
    rec = json.loads(lines[1])
    evil = '<img src=x onerror="alert(1)">'
    rec.update(kind=evil, seq=[1], round={"r": 1})
    lines[1] = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    t.write_bytes(b"".join(lines))
    v = view(bad, get_algorithm)
    assert not v["audit"]["ok"]
    assert next(k for k in v["kinds"] if k["kind"] == evil)["protects"] == "undeclared"
    page = render(bad, lookup=get_algorithm)
    assert evil not in page
    assert r'\u003cimg src=x onerror=\"alert(1)\"\u003e' in page   # only as escaped JSON text


def test_report_is_one_file_that_loads_nothing_from_the_network(runs, tmp_path):
    he, fa = runs
    out = tmp_path / "r.html"
    assert cli.main(["report", str(he), "--compare", str(fa), "--out", str(out)]) == 0
    page = out.read_text()
    assert "Plotly" in page and 'id="run-data"' in page
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=|<link[^>]*\shref=\"(https?:)?//|@import|url\(\s*['\"]?https?:",
                         page, re.I)
    assert cli.main(["report", str(tmp_path)]) == 2   # not a run folder: a clear error, no file


@pytest.mark.unit
def test_status_reads_a_damaged_folder_without_raising(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    st = status(tmp_path)
    assert st["state"] == "starting" and st["parties"] == []


@pytest.mark.unit
def test_pause_hook_waits_for_its_file(tmp_path):
    go = tmp_path / "go"
    hook = pause_hook("a", {"FEDHET_PAUSE_AT": f"a:2:{go}"}, poll_s=0.001)
    assert hook is not None and pause_hook("b", {"FEDHET_PAUSE_AT": f"a:2:{go}"}) is None
    hook({"state": "running", "done": 1})   # before its step: returns at once
    go.touch()
    hook({"state": "running", "done": 2})   # the file exists: returns
    with pytest.raises(ValueError, match="NAME:STEP:FILE"):
        pause_hook("a", {"FEDHET_PAUSE_AT": "a:x"})


def test_board_needs_its_token_and_reads_only_under_its_folder(runs):
    he, _ = runs
    token = secrets.token_urlsafe(8)
    with board_server(he.parent, token) as url:
        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(url + path) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, ""

        assert get("/")[0] == 403 and get("/api/runs?token=wrong")[0] == 403
        code, body = get(f"/api/runs?token={token}")
        assert code == 200 and {r["id"] for r in json.loads(body)["runs"]} == {"he", "fedavg"}
        assert get(f"/report/he?token={token}")[0] == 200
        assert get(f"/report/..%2f..%2fetc?token={token}")[0] == 404
        req = urllib.request.Request(url + f"/api/runs?token={token}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        assert e.value.code == 405


# ------------------------------------------------------------------ in the browser
@pytest.fixture(scope="module")
def chromium():
    with browser() as b:
        yield b


def resolve(res: dict, key: str):
    """A result by the page's name for it: ``k``, ``k.sub`` (a dict's entry) or ``k[i]`` (a list's)."""
    m = re.fullmatch(r"(.+)\[(\d+)\]", key)
    if m:
        return res[m.group(1)][int(m.group(2))]
    if key not in res and "." in key:
        head, sub = key.split(".", 1)
        return res[head][sub]
    return res[key]


def _numbers_on_page(pg) -> list[tuple[str, str, str]]:
    return pg.eval_on_selector_all("td.num[data-party][data-key], b.num[data-party][data-key]",
                                   "els => els.map(e => [e.dataset.party, e.dataset.key, e.textContent])")


@needs_browser
def test_report_in_a_browser(runs, tmp_path, chromium):
    he, fa = runs
    path = write(he, compare=fa, lookup=get_algorithm, out=tmp_path / "report.html")
    p = Page(chromium)
    try:
        p.page.goto(path.as_uri())
        p.page.wait_for_function("window.fedhetReady === true")
        assert p.errors == []
        # the verdict, green
        assert p.page.get_attribute("#verdict", "class").split() == ["verdict", "ok"]
        assert p.page.eval_on_selector("#verdict", "e => getComputedStyle(e).backgroundColor") == "rgb(26, 127, 55)"
        # every chart drawn: a Plotly SVG and a screenshot that is not blank
        charts = p.page.query_selector_all("[data-chart]")
        assert len(charts) >= 5   # curves of both runs, time and bytes of both, the side-by-side
        for c in charts:
            assert c.query_selector(".main-svg") is not None
            assert nonblank(c.screenshot()), c.get_attribute("id")
        for svg in ("#map", "#sequence"):
            assert nonblank(p.page.locator(svg).screenshot()), svg
        # the numbers equal result.json's
        result = json.loads((he / "result.json").read_text())
        shown = _numbers_on_page(p.page)
        assert shown
        seen = set()
        for party, key, text in shown:
            want = resolve(result["parties"][party]["result"], key)
            if isinstance(want, (int, float)) and not isinstance(want, bool):
                assert float(text.replace(",", "")) == pytest.approx(want, rel=1e-5, abs=1e-12), (party, key)
            else:
                assert text == str(want), (party, key)
            seen.add((party, key))
        expected = {(n, k) for n, s in result["parties"].items() for k, v in s["result"].items()
                    if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        assert expected <= seen
        assert float(p.page.text_content('td[data-key="bytes_total"]').replace(",", "")) == result["bytes_total"]
        # the message map lists exactly the transcript's kinds
        kinds = set(p.page.eval_on_selector_all("#map [data-kind]", "els => els.map(e => e.dataset.kind)"))
        assert kinds == set(_transcript_kinds(he))
        # a click shows the kind's declaration and what the audit checked
        p.page.locator('#map [data-kind="hei/fwd_ct"]').first.click()
        detail = p.page.text_content("#kind-detail")
        assert "paillier" in detail and "payload schema" in detail and "The audit found no problem" in detail
        # the comparison shows ratios side by side
        ratio = p.page.text_content('#comparison tr[data-quantity="bytes on the wire"] td.ratio')
        fa_bytes = json.loads((fa / "result.json").read_text())["bytes_total"]
        # shown to 3 significant digits: within half a unit of the third, at most 0.5 % of the ratio
        assert float(ratio.rstrip("×")) == pytest.approx(fa_bytes / result["bytes_total"], rel=5e-3)
        assert p.errors == []
    finally:
        p.close()


@needs_browser
def test_tampered_transcript_shows_the_failed_audit_in_red(runs, tmp_path, chromium):
    he, _ = runs
    kind, _ = _tamper(he, tmp_path / "bad")
    path = write(tmp_path / "bad", lookup=get_algorithm)
    p = Page(chromium)
    try:
        p.page.goto(path.as_uri())
        p.page.wait_for_function("window.fedhetReady === true")
        assert p.errors == []
        assert "fail" in p.page.get_attribute("#verdict", "class").split()
        assert p.page.eval_on_selector("#verdict", "e => getComputedStyle(e).backgroundColor") == "rgb(207, 34, 46)"
        assert "AUDIT FAILED" in p.page.text_content("#verdict")
        # in the map and in the flow, the tampered kind is red
        assert p.page.eval_on_selector(f'#map .row.bad[data-kind="{kind}"]', "e => !!e")
        bad = p.page.query_selector_all('#sequence .row[data-bad="1"]')
        assert bad and {b.get_attribute("data-kind") for b in bad} == {kind}
        stroke = bad[0].eval_on_selector("line, path", "e => e.getAttribute('stroke')")
        assert stroke.lower() == "#cf222e"
        assert "hash chain broken" in p.page.text_content("#sequence")
    finally:
        p.close()


@needs_browser
def test_board_follows_a_run_while_it_goes_on(runs, tmp_path, chromium, monkeypatch):
    root = tmp_path / "board"
    root.mkdir()
    go = tmp_path / "go"
    monkeypatch.setenv("FEDHET_PAUSE_AT", f"client1:2:{go}")
    fed = replace(load(presets.path("demo")), hosts=1)
    th, outcome = launch_in_background(fed, root / "live", overrides={"rounds": 4})
    token = secrets.token_urlsafe(8)
    p = Page(chromium)
    try:
        with board_server(root, token) as url:
            p.page.goto(f"{url}/?token={token}")
            # the run shows as running, client1 at step 2 of 4 or later, while it is paused there
            p.page.wait_for_function("""() => {
                const e = document.querySelector('tr[data-run="live"][data-state="running"] [data-party="client1"]');
                return e !== null && Number(e.dataset.done) >= 2; }""", timeout=120_000)
            shown = int(p.page.get_attribute('[data-party="client1"]', "data-done"))
            assert shown == json.loads((root / "live" / "parties" / "client1" / "status.json").read_text())["done"]
            p.page.evaluate("window.fedhetMarker = 'same page'")
            updates = p.page.evaluate("window.fedhetBoardUpdates")
            go.touch()
            p.page.wait_for_selector('tr[data-run="live"][data-state="done"]', timeout=120_000)
            assert p.page.evaluate("window.fedhetMarker") == "same page"   # updated in place, not reloaded
            assert p.page.evaluate("window.fedhetBoardUpdates") > updates
            assert "100%" in p.page.text_content('tr[data-run="live"]')
            with p.page.expect_popup() as popup:   # the report, rendered on the fly, in a new tab
                p.page.click('tr[data-run="live"] a')
            rep = popup.value
            rep.wait_for_function("window.fedhetReady === true", timeout=120_000)
            assert "fail" not in rep.get_attribute("#verdict", "class")
            assert p.errors == []
        th.join(120)
        assert "error" not in outcome, outcome
    finally:
        go.touch()
        p.close()


@pytest.mark.unit
@pytest.mark.slow
def test_demo_ends_with_the_report_of_both_runs(tmp_path, capsys):
    """The demo's last line is the path of stfl/report.html, which holds the HE run beside it."""
    assert cli.main(["demo", "--out", str(tmp_path / "demo"), "--he-epochs", "1", "--no-progress"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    page = tmp_path / "demo" / "stfl" / "report.html"
    assert last.endswith(str(page)) and page.is_file()
    data = json.loads(re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page.read_text(),
                                re.S).group(1))
    assert data["run"]["algorithm"] == "stfl" and data["compare"]["algorithm"] == "he_split"
