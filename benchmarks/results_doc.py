"""``docs/results.md`` from the committed results: ``python -m benchmarks.results_doc`` (``make results-doc``).

Every figure on that page is read here from a results file under ``benchmarks/results/``; the page
is never edited by hand (``tests/test_results_doc.py`` checks that it is what this command writes
from the committed JSON, without running any benchmark).  Each table says what data it rests on
(real, a stand-in for the paper's data, or synthetic), which results file it reads, and the commit
and machine that file came from: the run's own record (``environment``, written by
:class:`benchmarks.harness.Session`), or for files older than that record their ``origin`` entry
(the commit that last wrote the file, the machine unrecorded).

    python -m benchmarks.results_doc            # writes docs/results.md
    python -m benchmarks.results_doc --check    # exit 1 when docs/results.md is not what it would write
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks import harness
from benchmarks import network_matrix as network_matrix_bench
from fedhet.parties.atomic import write_atomic

DOC = harness.REPO / "docs" / "results.md"
REAL, STAND_IN, SYNTHETIC = "real", "stand-in", "synthetic"

Rows = list[list[str]]


# ------------------------------------------------------------------------------ reading

def load(name: str, results: Path = harness.RESULTS) -> dict:
    return json.loads((Path(results) / f"{name}.json").read_text())


def environment(doc: dict) -> dict | None:
    """The run's own record (the harness's ``environment``), wherever the script keeps it."""
    for env in (doc.get("environment"), (doc.get("meta") or {}).get("environment")):
        if isinstance(env, dict) and env.get("git_commit"):
            return env
    return None


def provenance(doc: dict) -> tuple[str, str]:
    """(commit, machine) of a results document, as markdown."""
    env = environment(doc)
    if env is not None:
        dirty = " (with uncommitted changes)" if env.get("git_dirty") else ""
        mem = env.get("memory_gib")
        machine = (f"{env.get('cpu_count')} CPUs ({env.get('cpu_model')})" + (f", {mem:g} GiB" if mem else "")
                   + f", Python {env.get('python')}")
        return f"`{env['git_commit'][:10]}`{dirty}", machine
    o = doc.get("origin")
    if isinstance(o, dict):
        noted = o.get("machine_as_the_run_noted_it")
        return (f"`{o['commit'][:10]}` (the commit that wrote the file; the run recorded none)",
                "unrecorded" + (f" (the run noted: {noted})" if noted else ""))
    return "unrecorded", "unrecorded"


def get(doc: Any, *path: Any) -> Any:
    """``doc[k1][k2]...``; a dict key selects, in a list, the first element whose items match it."""
    for k in path:
        if isinstance(k, dict):
            doc = next(r for r in doc if all(r.get(kk) == v for kk, v in k.items()))
        else:
            doc = doc[k]
    return doc


# ------------------------------------------------------------------------------ numbers

def f(x: Any, digits: int = 3) -> str:
    """A number as the page prints it (``-`` where there is none)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}"


def pct(x: Any, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f} %"


def pm(mean: Any, std: Any, digits: int = 3) -> str:
    return f"{f(mean, digits)} ± {f(std, digits)}"


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and population standard deviation."""
    mean = sum(xs) / len(xs)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def rate(x: Any) -> str:
    """A rate with a thousands separator or an M suffix."""
    if x is None:
        return "-"
    return f"{x / 1e6:.1f} M" if x >= 1e6 else f"{x:,.0f}"


def file_notes(notes: Any) -> list[str]:
    """A results file's own notes (a string or a list of them), quoted as the run wrote them."""
    notes = [notes] if isinstance(notes, str) else list(notes or [])
    return [line for n in notes for line in (f"> {n}", "")]


def table(header: list[str], rows: Rows) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            + ["| " + " | ".join(r) + " |" for r in rows])


# ------------------------------------------------------------------------------ sections

@dataclass(frozen=True)
class Section:
    title: str
    command: str
    files: tuple[str, ...]          # results files read (the first gives commit and machine)
    data: str                       # REAL / STAND_IN / SYNTHETIC, then what the data are
    body: Callable[..., list[str]]  # the loaded documents, in `files` order -> markdown lines
    note: str = ""                  # what the figures show, in words (no figure here)


def stfl_table1(d: dict, he: dict) -> list[str]:
    rows = []
    for ds, r in d["datasets"].items():
        m, paper = r["methods"], d["paper"].get(ds, {})
        accuracy: dict[str, Any] = {k: (v or {}).get("accuracy") for k, v in m.items()}
        rows.append([ds] + [pm(a["mean"] * 100, a["std"] * 100, 1) if (a := accuracy.get(k)) else "-"
                            for k in ("stfl", "centralized", "hierarchical")]
                    + [f(paper.get("stfl"), 1), f(paper.get("centralized"), 1)])
    out = table(["data set", "STFL %", "centralized %", "hierarchical split %", "paper STFL %",
                 "paper centralized %"], rows)
    he_rows = []
    for r in he["rows"]:
        acc = [e["accuracy"] for e in r["encrypted"]]
        if acc:
            he_rows.append([r["dataset"], f"{len(acc)} × {he['meta']['key_bits']}-bit {he['meta']['he']}",
                            pm(*mean_std(acc), 2), " / ".join(f(a, 2) for a in r["reference"]), f(r.get("paper"), 2)])
    return out + ["", "HE split network (`he_split_table1.json`, encrypted runs as party processes):", ""] + table(
        ["data set", "runs", "encrypted accuracy %", "plaintext reference per seed %", "paper %"], he_rows)


def he_vs_plain(d: dict) -> list[str]:
    packed = {r["dataset"]: r["s_per_epoch"] for r in d["rows"] if r["variant"] == "he_paillier"}
    rows = [[r["dataset"], r["variant"], f(r.get("s_per_epoch"), 3),
             f(r["s_per_epoch"] / packed[r["dataset"]], 2) if r.get("s_per_epoch") and r["dataset"] in packed else "-",
             pct(r.get("test_accuracy")), f((r.get("bytes_total") or 0) / 1e6, 2),
             "extrapolated" if r.get("extrapolated") else "measured"] for r in d["rows"]]
    return table(["data set", "variant", "s / epoch", "x packed Paillier", "test accuracy", "MB on the wire", "time"],
                 rows)


def chfl_tables(d: dict) -> list[str]:
    rows = []
    names = ("common", "local", "chfl_mu0", "chfl_mu>0")
    for ds, r in d["summary"]["table2"].items():
        paper = d["paper"]["table2"].get(ds)
        rows.append([ds, f"{r['splits']} × {r['seeds']}"] + [pm(*r["cells"][k]) for k in names]
                    + [" / ".join(f(p[0]) for p in paper) if paper else "-"])
    return table(["data set (Table II)", "splits × seeds", "Common", "Local", "CHFL μ=0", "CHFL μ>0",
                  "paper (same order)"], rows)


def chfl_secagg(d: dict) -> list[str]:
    rows = [[k, f(v["round_s"], 2), f(v["x_plain"]["round_s"], 2), f(v["x_plain"]["bytes_up"], 2),
             str(v.get("audit_ok"))] for k, v in d["timing"]["rows"].items()]
    t2 = d["table2"]["rows"]
    acc = [[k, f(t2[k]["chfl_round_s"], 2)] + [f(t2[k]["groups"][g].get("mean_test")) for g in
                                               ("common", "local", "chfl_mu0", "chfl_mu>0")] for k in t2]
    return (table(["aggregation", "s / round", "x plain round", "x plain bytes up", "audit"], rows) + [""]
            + table(["Table II row as processes", "s / round", "Common", "Local", "CHFL μ=0", "CHFL μ>0"], acc))


def transport(d: dict) -> list[str]:
    rows = [[r["layer"], str(r["size_mb"]), f(r["plain_MBps"], 0), f(r["curve_MBps"], 0), f(r["curve_over_plain"], 2)]
            for r in d["throughput"]]
    rtt = [[r["layer"], f(r["plain_us"], 0), f(r["curve_us"], 0), f(r["curve_over_plain"], 2)] for r in d["rtt"]]
    return (table(["layer", "MiB", "plain TCP MB/s", "CURVE MB/s", "CURVE / plain"], rows) + [""]
            + table(["layer", "plain round trip µs", "CURVE µs", "CURVE / plain"], rtt))


def crypto(d: dict, shamir: dict, he: dict) -> list[str]:
    rows = [[r["group"], r["name"], f(r["rate"], 2), r["unit"], f(r.get("ratio"), 2), r.get("baseline") or ""]
            for r in d["rows"]]
    sh = [[r["name"], f(r["rate"], 1), f(r.get("median_rate"), 1), r["unit"]] for r in shamir["rows"]]
    hr = [[r["primitive"], r["variant"], str(r["n_values"]), f(r["values_per_s"], 1), f(r.get("ratio_speed"), 1)]
          for r in he["rows"]]
    return (table(["group", "operation", "rate", "unit", "x baseline", "baseline"], rows)
            + ["", "Shamir 3-of-5 by wall time, best of the repeats (`crypto_shamir.json`):", ""]
            + table(["operation", "best", "median", "unit"], sh)
            + ["", "Homomorphic encryption (`crypto_he.json`):", ""]
            + table(["scheme", "variant", "values", "values / s", "x baseline"], hr))


def psi(d: dict, idle: dict, kkrt: dict) -> list[str]:
    rows = [[f"2^{s['log2n']}", f(s["psi_s"], 1), f(s.get("process_wall_s"), 1), f(s["bytes_total"] / 1e6, 1)]
            for s in d["sizes"]]
    quiet = [[f"2^{s['log2n']}", f(s["psi_s"], 1)] for s in idle["sizes"]]
    k = [[r["backend"], f"2^{r['log2n']}", f(r["psi_s"], 1), f(r.get("cpu_s_children"), 1),
          f(r["bytes_total"] / 1e6, 1), "extrapolated" if r.get("extrapolated") else "measured"] for r in kkrt["rows"]]
    return (table(["n × n", "PSI s", "process wall s", "MB"], rows)
            + ["", f"On a quieter machine (`psi_idle.json`, {idle.get('time')}):", ""] + table(["n × n", "PSI s"], quiet)
            + ["", "KKRT16 against ECDH (`psi_kkrt.json`):", ""]
            + table(["backend", "n × n", "PSI s", "CPU s of both processes", "MB", "time"], k))


def psi_rr22(d: dict, fail: dict, peer: dict) -> list[str]:
    rows = []
    for r in d["rows"]:
        rss = r.get("rss_mib") or {}
        name = r["backend"] + (f" ({r['threads']} thread)" if r.get("threads") else "")
        rows.append([f"2^{r['log2n']}", name, f(r.get("median_protocol_s", r["protocol_s"]), 2), f(r["cpu_s"], 1),
                     f(r["bytes_total"] / 1e6, 1),
                     " / ".join(f(rss.get(p), 0) for p in ("label_owner", "feature"))])
    j = fail["judged"]
    quoted = "; ".join(f"{k}: {v['protocol_s']} s, {v['mb']} MB" for k, v in d["issue_figures"].items())
    return (table(["n × n", "backend", "protocol s", "CPU s (PSI calls)", "MB", "peak RSS MiB (L / F)"], rows)
            + ["", f"Goals at 2^20 × 2^20: ≤ {d['goal_mb']:.0f} MB and ≤ {d['goal_s']} s protocol time "
               f"(`psi_rr22.md` says which are met and where the time goes). Quoted by issue 33 (earlier, same "
               f"machine, not in this run): {quoted}.",
               "", f"OKVS encoding failures (`okvs_failure.json`): at the widths where they can be counted the measured "
               f"rate is at most {f(j['max_excess_bits'], 2)} bits above the stated bound log2 n − θw/ln 2 + 1 "
               f"(negative: below it) over {j['points_judged']} points; at the width in use (w = "
               f"{fail['band_width']}) the bound is 2^{f(fail['bound_2_20'], 1)} at 2^20 keys and "
               f"2^{f(fail['bound_2_28'], 1)} at 2^28."]
            + ["", "Against SecretFlow SPU in one run (`peers_psi.json`; SPU's time is `psi_execute`, which also reads "
               "its input CSV and writes its result, and its bytes are everything on the loopback interface):", ""]
            + table(["library", "protocol", "n × n", "s", "MB"],
                    [[r["library"], r["protocol"], f"2^{r['log2n']}", f(r.get("seconds"), 2),
                      f(r.get("mb"), 1) if "mb" in r else r.get("note", "")] for r in peer["psi"]]))


def psi_speed(d: dict) -> list[str]:
    rows = [[f"2^{r['log2n']}", "this branch" if r["code"] == "this" else f"baseline ({d['baseline']})",
             f(r.get("median_protocol_s", r["protocol_s"]), 2), f(r["cpu_s"], 1), f(r["bytes_total"] / 1e6, 1),
             f(r["label_owner_stages_s"].get("hash"), 2), f(r["label_owner_stages_s"].get("order"), 2),
             f"{r['loadavg_before']:.1f}"] for r in d["speed"]]
    cross = f"{d['crossing']:,} IDs" if d.get("crossing") else "none within the sizes measured"
    auto = [[f"2^{r['log2n']}", r["backend"], f(r["protocol_s"], 3), f(r["start_s"], 2), f(r["with_start_s"], 3),
             f"{r['loadavg_before']:.1f}"] for r in d["auto"]]
    return (table(["n × n", "RR22 code", "protocol s", "CPU s (PSI calls)", "MB", "label owner hash s",
                   "label owner order s", "load"], rows)
            + ["", f"Goals of issue 49 at 2^20 × 2^20: ≤ {d['goal_s']} s and ≤ {d['goal_mb']:.0f} MB (`psi_speed.md` "
               f"says which are met). auto's threshold (`AUTO_RR22_FROM` = {d['auto_rr22_from']:,}): ECDH against "
               f"RR22 with its one-time start in a fresh party process; measured crossing: {cross}.", ""]
            + table(["n × n", "backend", "protocol s", "start s", "protocol + start s", "load"], auto))


def secagg(d: dict) -> list[str]:
    g = [[k, f(v["measured"], 2), f(v["goal"], 2), "yes" if v["met"] else "no",
          f(v.get("floor"), 2) if v.get("floor") else ""] for k, v in d["goals"].items()]
    fits = [[r["method"], str(r["m"]), ", ".join(map(str, r["ks"])), f(r["wall"], 1), f(r["overhead_bytes"], 1)]
            for r in d["scaling"]["fits"]]
    return (file_notes(d.get("notes")) + table(["secure / plain, K = 10, m = 10^6, as processes", "measured", "goal", "met",
                   "floor (mask keystreams alone)"], g) + ["", "Growth with K in memory (exponent of a power fit; "
                   "as processes, from 50 to 1,000 clients: the next section):", ""]
            + table(["method", "m", "K", "CPU ~ K^", "bytes per client ~ K^"], fits))


def secagg_scale(d: dict) -> list[str]:
    rows = []
    for r in d["rows"]:
        if not r.get("wall_s"):
            rows.append([str(r["K"]), r["graph"], str(r["m"]), str(r["hosts"]), "failed: " + r.get("error", "")[:120]]
                        + [""] * 10)
            continue
        w, t = r["warmup"], r["timed"]
        rows.append([str(r["K"]), r["graph"], str(r["m"]), str(r["hosts"]),
                     "yes" if r["ok"] else "NO", f(r["wall_s"], 0), f(w["wall_s"], 1),
                     f"{f(t['wall_s'], 1)} ({f(r['dropout_waits_s'], 0)})", f"{t['contributors']} of {r['K']}",
                     f(1000 * w["client_cpu_s"], 1), f"{f(w['client_up_bytes'] / 1024, 1)} / {f(w['client_down_bytes'] / 1024, 1)}",
                     f(w["server_cpu_s"], 2), str(r["tcp_connections_peak"]),
                     f"{r['handshake_retries']} / {r['guard_cuts']} / {harness.dash(r.get('resent'), '{}')} / {r['messages_lost']}",
                     f"{f(r['peak_total_rss_mib'], 0)} / {r['fds_max']} / {r['threads_max']}"])
    out = file_notes(d.get("note")) + table(
        ["K", "graph", "m", "hosts", "ok (exact, audited)", "run s", "round s, all clients",
         "round s, 10 % dropping (waits)", "counted", "client CPU ms", "client KiB up / down", "server CPU s",
         "TCP connections (peak)", "retries / guard cuts / resent / lost", "RSS MiB all / fds / threads (max)"], rows)
    if d.get("fits"):
        fits = [[str(x["m"]), ", ".join(map(str, x["ks"])), f(x["client_cpu"], 2), f(x["client_bytes"], 2),
                 f(x["server_cpu"], 2), f(x["server_bytes"], 2),
                 ", ".join(f"{k}: {v}" for k, v in x["degree"].items())] for x in d["fits"]]
        out += ["", "SecAgg+ cost against K, a in cost ~ K^a (the first round, every client; bytes down also in the "
                "timed round, where the client list is named by its digest):", ""] + table(
            ["m", "K", "client CPU", "client bytes up", "client bytes down", "... in the timed round", "server CPU",
             "server bytes in", "neighbours k"],
            [row[:4] + [f(x.get("client_down_bytes"), 2), f(x.get("client_down_bytes_later"), 2)] + row[4:]
             for row, x in zip(fits, d["fits"])])
        per_k = [[str(x["m"]), ", ".join(map(str, x["ks"]))]
                 + [f(x["vs_degree"].get(k), 2)
                    for k in ("client_cpu", "client_bytes", "client_down_bytes", "client_down_bytes_later")]
                 for x in d["fits"] if x.get("vs_degree")]
        if per_k:
            out += ["", "A client's cost against its neighbours k, b in cost ~ k^b (SecAgg+ promises b ≤ 1: a "
                    "client's work is per neighbour, whatever K):", ""] + table(
                ["m", "K", "client CPU", "client bytes up", "client bytes down", "... in the timed round"], per_k)
    if d.get("flower"):
        by = {(r["K"], r["m"]): r for r in d["rows"] if r.get("ok") and r["graph"] == "harary"}
        fl = []
        for x in d["flower"]:
            mine = by.get((x["K"], x["m"]), {})
            fl.append([str(x["K"]), str(x["m"]), "yes" if x.get("ok") else "failed: " + str(x.get("error", ""))[:80],
                       f(x.get("round_s"), 2), f(x.get("wall_s"), 1),
                       f(get(mine, "warmup", "wall_s"), 2),
                       f(mine["wall_s"] - mine["dropout_waits_s"], 1) if mine else "-"])
        out += ["", "Against Flower's SecAgg+ in its own simulation engine (Ray), same K, m, neighbours and "
                "threshold, in the same run; one round with every client:", ""] + table(
            ["K", "m", "Flower ok", "Flower round s", "Flower run s", "fedhet round s",
             "fedhet run s, less the dropout round's waits"], fl)
    return out


def hyfem(d: dict) -> list[str]:
    rows = []
    for name, c in d["curves"].items():
        for m, v in c["methods"].items():
            ga, la = v.get("global_accuracy"), v.get("local_accuracy")
            rows.append([name, m, f(ga["mean"][-1]) if ga else "-", f(la["mean"][-1]) if la else "-"])
    return table(["setting", "method", "final global accuracy", "final local accuracy"], rows)


def mmvfl(d: dict) -> list[str]:
    rows = []
    for ds, r in d["datasets"].items():
        gap = r["summary"]["gap"]
        rows.append([ds, r.get("kind") or "-", str(len(r.get("views") or []))]
                    + [f"{' / '.join(f(x) for x in gap[b]['mean_abs_per_view'])} (max {f(gap[b]['max_abs'])}; "
                       f"above / below {gap[b]['mmvfl_above']} / {gap[b]['mmvfl_below']})" for b in ("supFL", "supMVLFL")])
    p = d["processes"]
    proc = [[k, f(v.get("agg_z_s_per_iter"), 3), f(mean_std(list(v["bytes_sent_per_participant_per_iter"].values()))[0] / 1e3, 1),
             str(v.get("audit_ok"))] for k, v in p.items() if isinstance(v, dict) and "agg_z_s_per_iter" in v]
    return (table(["data set", "data", "views", "MMVFL − supFL: mean abs gap per view (cells above / below)",
                   "MMVFL − supMVLFL: the same"], rows)
            + ["", "As party processes (Handwritten, audited):", ""]
            + table(["aggregation of Z", "s / iteration", "kB per participant per iteration", "audit"], proc))


F3_ROWS = {"K": "gcn:soft:icdf", "H": "gcn:none:icdf", "J": "gcn:tied:icdf", "D": "D", "E": "E", "F": "F",
           "G": "G", "L": "L", "M": "M"}


def f3_tables(d: dict) -> list[str]:
    rows = []
    for row, key in F3_ROWS.items():
        cells = []
        for ds, r in d["datasets"].items():
            runs = r["runs"].get(key, {})
            vals = [v["f1"] for v in runs.values() if isinstance(v, dict) and "f1" in v]
            cells.append(pm(*mean_std(vals)) + f" ({len(vals)})" if vals else "-")
        rows.append([row] + cells)
    head = ["row (Table 2)"] + [f"{ds} ({r['provenance'].split(' (')[0]}): macro F1 (seeds)" for ds, r in d["datasets"].items()]
    return table(head, rows)


LEAK_REAL = ("optimise", "learned", "learned_optimise")     # the attacks without an oracle
LEAK_MODES = (("trusted", None), ("shamir_linear", "shamir_linear"), ("mpc", "mpc"), ("mpc, align tied", "mpc_tied"))


def _leak_best(leak: dict, key: str | None) -> tuple[float, float | None]:
    """(largest R² max over owners of the mode's best attack, over every size and width; its share beyond labels)."""
    if key is None:
        return 1.0, None
    best, beyond = -math.inf, None
    for per in leak["sizes"].values():
        for run in per.get(key, {}).values():
            names = ("one_step", "whole_run") if key == "shamir_linear" else LEAK_REAL
            for a in names:
                if run[a]["max"] > best:
                    best = run[a]["max"]
                    base = run.get("label_only")
                    beyond = None if base is None else max(
                        1 - (1 - x) / max(1 - b, 1e-12) for x, b in zip(run[a]["per_owner"], base["per_owner"]))
    return best, beyond


def f3_modes(leak: dict, acc: dict, scale: dict) -> list[str]:
    """One table of the three fusion modes (leakage, accuracy, cost), then each benchmark's own rows."""
    vow = acc["datasets"].get("vowels", {}).get("summary", {}).get("modes", {})
    runs207 = {r["fusion"]: r for r in scale["runs"] if r["n_owners"] == 207}
    t207 = runs207.get("trusted", {}).get("train_s_per_epoch")
    head = []
    for mode, key in LEAK_MODES:
        best, beyond = _leak_best(leak, key)
        fusion = mode.split(",")[0]
        fm = vow.get(fusion, {})
        sc = runs207.get(fusion, {})
        head.append([mode, f(best, 3), f(beyond, 3),
                     pm(fm["f1_mean"], fm["f1_std"]) + f" ({fm['n']})" if fm and mode != "mpc, align tied" else "-",
                     f(sc["train_s_per_epoch"], 1) if sc and mode != "mpc, align tied" else "-",
                     f(sc["train_s_per_epoch"] / t207, 1) if sc and t207 and mode != "mpc, align tied" else "-"])
    labels = {f"{k} (labels only)": v for k, v in (
        (size, max(run["label_only"]["max"] for run in per["mpc"].values())) for size, per in leak["sizes"].items())}
    out = table(["fusion", "coordinator's best attack: R² max over owners", "share beyond labels",
                 "Japanese Vowels test F1 (seeds)", "s / epoch, 207 owners as processes", "x trusted"], head)
    out += ["", "What labels alone give the coordinator (class means of shadow representations, no message): "
            + ", ".join(f"{k} R² max {f(v, 3)}" for k, v in labels.items()) + ".", ""]
    rows = []
    for size, per in leak["sizes"].items():
        for key in ("mpc", "mpc_tied", "shamir_linear"):
            for hidden, run in per.get(key, {}).items():
                names = ("one_step", "whole_run") if key == "shamir_linear" else ("label_only", "oracle_dc", *LEAK_REAL)
                for a in names:
                    rows.append([f"{per['data']}: {size}", key, hidden, a, f(run[a]["max"], 3), f(run[a]["mean"], 3)])
    out += ["Every attack (`f3_leakage.json`; oracle_dc is given the true ReLU bits: a bound, not an attack):", ""]
    out += table(["data", "mode", "hidden", "attack", "R² max", "R² mean"], rows)
    arows = []
    for name, ds in acc["datasets"].items():
        sm = ds.get("summary") or {}
        for m, x in sm.get("modes", {}).items():
            arows.append([f"{ds['data']}: {name}", str(ds["n_owners"]), m, pm(x["f1_mean"], x["f1_std"]), str(x["n"]),
                          f(sm.get("max_abs_delta_f1"), 4) if m == "mpc" else "-"])
    out += ["", "Accuracy (`f3_mpc_accuracy.json`; mpc's graph: none on Vowels, the given road graph on METR-LA; "
            "trusted_icdf is the learned graph, which mpc does not offer):", ""]
    out += table(["data", "owners", "mode", "test macro F1", "seeds", "max |ΔF1| mpc - trusted"], arows)
    srows = [[str(r["n_owners"]), r["fusion"], f(r["train_s_per_epoch"], 2), f(r.get("holder_bytes_sent_per_step", 0) / 2 ** 20, 1),
              f(r.get("holder_rounds_per_step"), 0), str(r["audit_ok"])] for r in scale["runs"]]
    out += ["", "Cost as processes (`f3_scale_given.json`, graph given):", ""]
    out += table(["owners", "fusion", "train s / epoch", "MiB / holder / step", "rounds / step", "audit"], srows)
    return out


def f3_shares(d: dict) -> list[str]:
    """F³ fusion "shares" (f3_shares.json): accuracy against trusted, leakage against the label-only bound, cost."""
    out: list[str] = []
    if d.get("accuracy"):
        rows = [[a["size"], a["data"], str(a["seeds"]),
                 f(mean_std([r["trusted"]["test"]["f1"] for r in a["runs"]])[0], 4), opt, f(a[opt]["f1_mean"], 4),
                 f(a[opt]["mean_delta_f1"], 4), f(a[opt]["max_abs_delta_f1"], 4), "yes" if a[opt]["met"] else "**no**"]
                for a in d["accuracy"] for opt in ("sgd", "lion") if opt in a]
        out += ["Accuracy (test macro F1; shares: the optimiser on shares, trusted: Adam in the clear; the same "
                "pre-trained local models and batches):", ""] + \
            table(["set", "data", "seeds", "trusted F1", "optimiser", "shares F1", "mean ΔF1", "max |ΔF1|",
                   "within 0.02"], rows) + [""]
    if d.get("leakage"):
        rows = [[r["size"], r["data"], str(r["hidden"]), f(r["bound_true_class_means"]["max"]),
                 f(r["label_only"]["max"]), f(r["learned_counts"]["max"]), f(r["beyond_labels_max"]),
                 "yes" if r["met"] else "**no**"] for r in d["leakage"]]
        out += ["The coordinator's attacks (R² of h^i on the training rows, max over owners; the bound: each row's h "
                "predicted by its true class mean, what the labels give at best):", ""] + \
            table(["set", "data", "hidden", "bound (true class means)", "label only (shadow)",
                   "learned from the opened counts", "beyond the bound (max over owners)", "within 0.02"], rows) + [""]
    if d.get("cost"):
        rows = [[str(p["owners"]), f(p["shares_step_s"], 2), f(p["trusted_step_s"] * 1e3, 1), f(p["ratio"], 0) + "×",
                 f(p["rounds_per_step"], 0), f(p["bytes_per_holder_per_step"] / 1e6, 2), f(p["loadavg"], 1)]
                for p in d["cost"]["points"]]
        out += ["Cost per training step in one process (batch 100, hidden 16; synthetic h):", ""] + \
            table(["owners", "shares s/step", "trusted ms/step", "ratio", "rounds/step", "MB per holder per step",
                   "load"], rows)
    return out


def f3_scale_products(scale: dict, fm: dict) -> list[str]:
    trusted = {r["n_owners"]: r for r in scale["runs"] if r["fusion"] == "trusted"}
    sc = [[str(r["n_owners"]), r["fusion"], f(r["epoch_s"], 2),
           f(r["epoch_s"] / trusted[r["n_owners"]]["epoch_s"], 2) if r["n_owners"] in trusted else "-",
           f(r["bytes_per_owner"] / 1e3, 1),
           f(r["bytes_per_owner"] / trusted[r["n_owners"]]["bytes_per_owner"], 3) if r["n_owners"] in trusted else "-",
           str(r.get("audit_ok"))] for r in scale["runs"]]
    b = [[r["what"], f(r["ratio_median"], 2)] for r in fm["batched"]]
    return (table(["owners", "fusion", "s / epoch", "x trusted", "kB per owner", "x trusted bytes", "audit"], sc)
            + ["", "Share × public products against float64 matmul (`field_matmul.json`, batched products of one "
               "step):", ""] + table(["product", "throughput / float64"], b))


def paillier_speed(d: dict, slots: dict) -> list[str]:
    enc = [[r["who"], r["variant"], f(r["ct_per_core_s"], 0)] for r in d["encryption"]]
    he = [[r["dataset"], r["variant"], f(r["s_per_epoch"], 2), f(r["speedup_vs_old"], 2)] for r in d["he_split"]]
    sl = [[r["dataset"], r["variant"], str(r["slot_bits"]), f(r["ct_ratio_vs_160"], 2), f(r["s_per_epoch"], 2),
           f(r["speedup_vs_160"], 2)] for r in slots["rows"]]
    return (file_notes(d.get("note")) + table(["who encrypts", "variant", "ciphertexts / s per core"], enc) + [""]
            + table(["data set", "tree", "s / epoch", "x old tree"], he)
            + ["", "Slot width from the public bounds (`he_slots.json`):", ""]
            + table(["data set", "slots", "slot bits", "ciphertexts x 160-bit", "s / epoch", "x 160-bit"], sl))


def hosts_scale(d: dict) -> list[str]:
    rows = [[str(r.get("parties")), str(r.get("hosts")), f(r.get("wall_s"), 1), f(r.get("peak_rss_mib_sum"), 0),
             str(r.get("fds_max")), str(r.get("audit_ok"))] for r in d["rows"]]
    return file_notes(d.get("note")) + table(["parties", "host processes (0: one per party)", "wall s",
                                              "peak RSS MiB, all", "fds (max)", "audit"], rows)


def ray_overhead(d: dict) -> list[str]:
    c = d.get("cluster", {})
    rows = []
    for case in d["cases"]:
        local = next((r for r in case["runs"] if r["engine"] == "local"), {})
        for r in case["runs"]:
            ratio = r["wall_s"] / local["wall_s"] if r.get("ok") and local.get("ok") else None
            rows.append([case["case"], case["data"], r["engine"],
                         "yes" if r.get("ok") else "failed: " + str(r.get("error", "audit")).split(" (logs in")[0],
                         f(r.get("startup_s"), 1), f(r.get("wall_s"), 1), "-" if ratio is None else f(ratio, 2) + "x",
                         f(r.get("parties_peak_rss_mib"), 0),
                         f(r.get("actors_peak_rss_mib"), 0) if r["engine"] == "ray" else "-",
                         f(r.get("daemons_peak_rss_mib"), 0) if r["engine"] == "ray" else "-",
                         str(r.get("nodes", 1 if r["engine"] == "local" else "-"))])
    head = [f"A cluster of {c.get('nodes')} nodes on this machine, each its own `ray start`, started in "
            f"{f(c.get('start_s'), 1)} s (once per cluster, not per run); its daemons idle at "
            f"{f(c.get('idle_daemons_rss_mib'), 0)} MiB.", ""]
    return head + (file_notes(d["note"]) if d.get("note") else []) + table(
        ["case", "data", "engine", "ok (audited)", "start-up s", "wall s", "wall / local", "parties' RSS MiB",
         "Ray actors MiB", "Ray daemons MiB", "nodes"], rows)


def checkpoint_overhead(d: dict) -> list[str]:
    rows = [[r["algorithm"], r["federation"], "failed: " + r["error"], "", "", "", ""] if "error" in r else
            [r["algorithm"], r["federation"], str(r["steps"]), f(r["checkpoint_bytes"] / 1024, 1),
             f"{r['worst_party']}: {f(r['checkpoint_s'], 3)} of {f(r['role_s'], 2)}", pct(r["overhead"]),
             f(r["role_s_without"], 2)] for r in d["rows"]]
    return file_notes(d.get("note")) + table(["algorithm", "federation (data)", "steps", "KiB / checkpoint",
                                              "party: checkpoint s of role s", "overhead", "role s, none"], rows)


def psi_ran(r: dict) -> str:
    """A prediction run's PSI: the backend that ran, after its setting where that was "auto" (ECDH before the setting)."""
    setting, ran = r.get("psi_backend_setting"), r.get("psi_backend") or "ecdh"
    return ran if setting in (None, ran) else f"{setting}: {ran}"


def predict_throughput(d: dict) -> list[str]:
    rows = [[r["algorithm"] + (f" ({r['he']}, {r['key_bits']}-bit)" if r.get("he") else ""),
             psi_ran(r), f(r.get("label_psi_s"), 2), f"{r['rows_per_party']:,}",
             f"{r['n_predicted']:,}", f"{r['n_missing']:,}", rate(r["federated_rows_per_s"]),
             rate(r["label_role_rows_per_s"]), rate(r["plaintext_rows_per_s"]), f(r["slowdown_wall"], 0) + "x",
             "yes" if r["identical"] else "NO", "ok" if r["audit_ok"] else "FAILED"] for r in d["runs"]]
    return file_notes(d.get("note")) + table(["algorithm", "PSI", "label PSI s", "rows / party", "predicted", "missing",
                                              "job rows/s",
                                              "label role rows/s", "plaintext rows/s", "job / plaintext",
                                              "same predictions", "audit"], rows)


def loaded_demo(d: dict) -> list[str]:
    rows = [[str(i), str(r["rc"]), f(r.get("wall_s"), 0), f(r["peak_load"], 1), f"`{r['weights_sha256'][:16]}`",
             str(sum(r["guard_cuts"].values())), str(sum(r["listed_cuts"].values())),
             str(sum(r["rounds_with_exclusions"].values()))] for i, r in enumerate(d["runs"], 1)]
    same = len({r["weights_sha256"] for r in d["runs"]}) == 1
    return [f"{d['rounds']:,} rounds beside {d['busy_loops']} busy loops; runs made at commit `{d['runs_commit']}`; "
            f"weights bit-identical across runs: {'yes' if same else 'NO'}.", ""] + table(
        ["run", "exit", "wall s", "peak load", "weights (sha256)", "connections cut", "listed peers' cut",
         "rounds with exclusions"], rows)


def network_matrix(d: dict) -> list[str]:
    rows: Rows = []
    for r in d["rows"]:
        label = f"{r['algorithm']}: {r['protection']} ({r['data']})"
        if "error" in r:
            rows.append([label, "failed: " + r["error"], "", "", "", "", "", ""])
        for net in ("loopback", "lan", "wan"):
            m = r["runs"].get(net)
            if m is None:
                continue
            pred = r["predicted"].get(net) or {}
            share = pred["added_s"] / pred["span_s"] if pred.get("span_s") else None
            err = m.get("model_error")
            rows.append([label, net, f(m["wall_s"], 2), f(m["span_s"], 2), f(pred.get("span_s"), 2),
                         "-" if err is None else f"{err:+.0%}", pct(share, 0), f(m["bytes"] / 1e6, 3),
                         str(m["messages"]), f(m["loadavg"][0], 1)])
    errs = [abs(m["model_error"]) for r in d["rows"] for m in r["runs"].values() if m.get("model_error") is not None]
    head = ([f"The model's error against the emulator: at most {max(errs):.0%} over {len(errs)} cells "
             f"(median {sorted(errs)[len(errs) // 2]:.0%}). " + network_matrix_bench.over_bound_line(d), ""]
            if errs else [])
    skipped = ["", "Cells not run: " + ", ".join(d["not_run"]) + "."] if d.get("not_run") else []
    pick = ["", "#### What to pick", "", *network_matrix_bench.pick_lines(d, only_crossing=True)] if d.get("sweep") else []
    return head + table(["cell (data)", "network", "wall s", "span s", "model's span s", "model error",
                         "network share (model)", "MB", "messages", "load"], rows) + skipped + [
        "", "![span per algorithm at loopback, LAN and WAN: measured (bars) and the model's (black marks); the "
        "model's sweep per task](../benchmarks/results/network_matrix.png)"] + pick


def network_kernel(d: dict) -> list[str]:
    rows = [[f"{r['bytes'] / 2**20:g}", f(r["model_s"], 3), f(r.get("kernel_s"), 3), f(r["emulator_s"], 3),
             "-" if r.get("kernel_s") is None else f"{(r['emulator_s'] - r['kernel_s']) / r['kernel_s']:+.1%}"]
            for r in d["bandwidth"]]
    base = (d.get("loopback_rtt_ms") or {}).get("median_ms", 0.0)
    rtts = [[f"{r['rtt_ms']:g}", f(r["median_ms"], 2), f"{(r['median_ms'] - r['rtt_ms']) / r['rtt_ms']:+.1%}",
             f"{(r['median_ms'] - base - r['rtt_ms']) / r['rtt_ms']:+.1%}"] for r in d["rtt"]]
    skipped = [f"Kernel rows not run: {d['kernel_not_run']}.", ""] if d.get("kernel_not_run") else []
    return skipped + table([f"MB at {d['mbit']} Mbit/s", "model s", "kernel (tbf) s", "emulator s",
                            "emulator vs kernel"], rows) + [
        "", f"Ping-pong round trips under the emulator (no `netem` here: no kernel row); without a simulated link "
        f"the same ping-pong takes {f(base, 2)} ms (the parties' own cost; added = median - that):", ""] + table(
        ["configured RTT ms", "median ms", "median vs configured", "added vs configured"], rtts)


def dp(d: dict) -> list[str]:
    acc = d["accuracy"]
    rows = [[k, f"{r['seeds']}", pm(r["mean"], r["std"], 4),
             "-" if r["runs"][0]["noise_multiplier"] is None else f(r["runs"][0]["noise_multiplier"], 3)]
            for k, r in acc["rows"].items()]
    dist = [[str(r["k"]), r["variant"], f"{r['seeds']}", pm(r["mean"], r["std"], 4),
             "-" if r["runs"][0]["server_epsilon"] is None else f(r["runs"][0]["server_epsilon"], 3),
             f(statistics.fmean(x["wall_s"] for x in r["runs"]), 1)] for r in d["distributed"]["rows"].values()]
    rows_c = d["cost"]["rows"]
    ref = {k: rows_c["mlp: plain SGD" if k.startswith("mlp") else "logreg: plain GD, 100 steps"]["cpu_s"]
           for k in rows_c}
    cost = [[k, f(r["wall_s"], 4), f(r["cpu_s"], 4), f(r["cpu_s"] / ref[k], 1)] for k, r in rows_c.items()]
    return (table(["FedAvg demo task, record level (delta 1e-5)", "seeds", "test accuracy", "noise multiplier"], rows)
            + ["", f"Client level at epsilon {d['distributed']['settings']['dp_epsilon']:g} (delta 1e-5) per client, "
               "the same noise multiplier for both mechanisms:", ""]
            + table(["K", "variant", "seeds", "test accuracy", "epsilon the server's noise gives", "run wall s"], dist)
            + ["", f"Cost ({d['cost']['data']}, {d['cost']['threads']} thread):", ""]
            + table(["variant", "wall s", "CPU s", "x plain (CPU)"], cost))


def chfl_dp(d: dict) -> list[str]:
    cols = list(next(iter(d["rows"].values()))["runs"][0]["final_test"])
    rows = [[k, str(len(r["runs"]))] + [pm(*mean_std([x["final_test"][c] for x in r["runs"]]), 4) for c in cols]
            + [", ".join(f(z, 2) for z in r["runs"][0]["noise_multiplier"]) or "-"] for k, r in d["rows"].items()]
    rounds = f"{d['rounds']} rounds" if d.get("rounds") else "the preset's rounds"
    png = "chfl_dp.png" if d["preset"] == "chfl_small" else f"chfl_dp_{d['preset']}.png"
    return table([f"CHFL, {d['preset']} ({rounds}), record level", "seeds"] + [f"{c} (test)" for c in cols]
                 + ["noise multiplier per client"], rows) + [
        "", f"![CHFL test accuracy against epsilon, {d['preset']}](../benchmarks/results/{png})"]


def stfl_dp(d: dict) -> list[str]:
    keys = ["non-private", "epsilon=1", "epsilon=4", "epsilon=16"]
    rows = [[name, str(v["seeds"])] + [pm(v["rows"][k]["mean"], v["rows"][k]["std"], 4) for k in keys]
            for name, v in d["datasets"].items() if "skipped" not in v]
    z = next(v for v in d["datasets"].values() if "skipped" not in v)["rows"]
    return table(["data set", "seeds", "non-private"] + [f"epsilon = {k.split('=')[1]} (z = "
                                                        f"{f(z[k]['noise_multiplier'], 2)})" for k in keys[1:]], rows)


SECTIONS = (
    Section("STFL Table I (accuracy) and the HE split network", "python -m benchmarks.stfl_table1; "
            "python -m benchmarks.he_split_table1", ("stfl_table1", "he_split_table1"),
            f"{REAL}: FATE's breast, default-credit ('payment'), give-credit and vehicle tables", stfl_table1,
            "The HE split network's encrypted runs give its plaintext reference's accuracy on every seed "
            "(`he_split_table1.md`)."),
    Section("STFL Table III (time, encrypted vs plaintext)", "python -m benchmarks.he_vs_plain", ("he_vs_plain",),
            f"{REAL}: the same FATE tables", he_vs_plain,
            "On payment and credit the HE layers are measured on a few batches and extrapolated "
            "(`--he-batches 0` runs them whole); STFL's time includes its VAE. FATE's own HE split network "
            "(its published time for breast) is slower per epoch than the packed Paillier layer here."),
    Section("CHFL Table II", "python -m benchmarks.chfl_tables (`--resume`, `--import-runs`, `--feature-splits` "
            "share the work between processes)", ("chfl_tables",), f"{REAL}: the paper's tabular sets", chfl_tables,
            "Table III and Fig. 4 (in `chfl_tables.md`) follow the paper's shape. Fig. 4's points are 3 splits × 1 "
            "seed; the large sets use the lr grid {1e-3} and μ grid {0.5, 1}; the paper's full grid, run on "
            "sensorless and vehicle (`chfl_tables_fullgrid.md`), barely moves a cell."),
    Section("CHFL secure vs plain aggregation", "python -m benchmarks.chfl_secagg", ("chfl_secagg",),
            f"{REAL}: covertype", chfl_secagg, "The same Table II row as CHFL's in-memory tables, run as party "
            "processes with plain and with secure aggregation of the common part."),
    Section("Differential privacy: accuracy against epsilon, distributed against local noise, cost",
            "python -m benchmarks.dp", ("dp",),
            f"{REAL}: scikit-learn's breast-cancer set (FedAvg's demo task) and digits (the cost's MLP)", dp,
            "Every epsilon is dp-accounting's RDP accountant's for the ledger's mechanism and steps; record level "
            "calibrates the noise per client for 20 rounds x 5 local steps (Poisson rate 0.25). Distributed noise: "
            "Skellam shares under secure aggregation, each client adding 1/t of the variance, so a round with more "
            "than t contributors carries more noise than accounted (the server's column). Local: each client adds "
            "the full Gaussian noise. CHFL's own tables (digits, and covertype in the paper's setting) follow."),
    Section("CHFL with record-level DP", "python -m benchmarks.chfl_dp", ("chfl_dp",),
            f"{REAL}: scikit-learn's digits (the chfl_small preset)", chfl_dp,
            "DP-SGD of the common column only (the part a client sends), delta 1e-5, last round's test accuracy. "
            "The Common baseline is the common column alone and collapses under the noise; CHFL's unique column "
            "and laterals (local, never sent, so trained without noise) keep most of the accuracy."),
    Section("CHFL with record-level DP on covertype (the paper's setting)",
            "python -m benchmarks.chfl_dp --preset chfl --rounds 10 --seeds 3", ("chfl_dp_chfl",),
            f"{REAL}: covertype (the chfl preset: 5 clients, 30 % common features, mu 0.5, E = 5, batch 64)", chfl_dp,
            "As above on the paper's data set and federation, with 10 of its 20 rounds (the DP-SGD runs take "
            "minutes each on this machine); last round's test accuracy, mean ± std over the seeds."),
    Section("STFL with DP latents (Table I's sets)", "python -m benchmarks.stfl_dp", ("stfl_dp",),
            f"{REAL}: FATE's breast ('cancer'), default-credit ('payment') and give-credit ('credit') tables",
            stfl_dp, "Per row, delta 1e-5: each guest clips every latent row it sends once to L2 norm "
                     "sqrt(d_latent) and adds Gaussian noise z * clip (one release per row, accounted by the ledger). "
                     "payment and credit: 1 seed (their VAE and host take minutes per seed on this machine)."),
    Section("Transport: CURVE against plain TCP", "python -m benchmarks.transport", ("transport",),
            f"{SYNTHETIC}: random bytes", transport),
    Section("Cryptographic primitives", "python -m benchmarks.crypto; python -m benchmarks.crypto_he",
            ("crypto", "crypto_shamir", "crypto_he"), f"{SYNTHETIC}: random field elements and integers", crypto),
    Section("PSI: ECDH and KKRT16", "python -m benchmarks.psi; python -m benchmarks.psi_kkrt",
            ("psi", "psi_idle", "psi_kkrt"), f"{SYNTHETIC}: generated ID sets", psi),
    Section("PSI: RR22 class (OKVS + silent VOLE) against KKRT16 and SecretFlow SPU", "python -m benchmarks.psi_rr22; "
            "python -m benchmarks.okvs_failure; python -m benchmarks.peers --only psi --spu-python PY",
            ("psi_rr22", "okvs_failure", "peers_psi"),
            f"{SYNTHETIC}: generated ID sets; random OKVS bands", psi_rr22,
            "Both backends as audited party processes in one run, interleaved. RR22 sends far fewer bytes than "
            "KKRT; its time is spread over the hashing of the IDs (a Python loop per ID), the code's random "
            "memory reads (the expander) and the OKVS."),
    Section("PSI: RR22 before and after issue 49, and auto's ECDH/RR22 threshold", "python -m benchmarks.psi_speed "
            "(--baseline REF: the code compared against, default main)", ("psi_speed",),
            f"{SYNTHETIC}: generated ID sets", psi_speed,
            "Both codes as audited party processes in one run, interleaved; the baseline runs from its own exported "
            "files. The machine is shared: the load average is recorded with every row."),
    Section("Secure aggregation", "python -m benchmarks.secagg", ("secagg",), f"{SYNTHETIC}: uniform random vectors",
            secagg, "The all-party CPU goal is out of reach for any complete-graph round: the mask keystreams "
            "alone, timed in the same run, set the floor."),
    Section("Secure aggregation from 50 to 1,000 clients", "python -m benchmarks.secagg_scale "
            "--flower PY", ("secagg_scale",), f"{SYNTHETIC}: uniform random vectors", secagg_scale,
            "Every party a real party in host processes over CURVE; every run audited. A client dials only the "
            "server, and the server dials each client (one connection each way); a 10 % dropping round waits the "
            "server's step timeout once per step with a dropout (`waits`). Lost messages: a sequence gap fails a "
            "run and its audit, so every passed row lost none; `resent`: messages sent again after a connection "
            "broke (- where the transport does not resend)."),
    Section("HyFEM Figs. 3 and 4", "python -m benchmarks.hyfem_curves (`--settings` runs some settings and merges)",
            ("hyfem_curves",), f"{STAND_IN}: Handwritten and COIL-20 stand in for ModelNet40", hyfem,
            "Fig. 3's setting: HyFEM-Avg's global model is close to centralized training. Fig. 4's μ trade-off is "
            "**not** reproduced: local and global accuracy rise and fall together, peaking at a small μ "
            "(`fig4_mu_sweep`; see `hyfem_curves_probe.md`). On COIL-20 the evaluation split is by whole image "
            "sets, so no evaluation image is ever trained on, and the data term is summed as eq. (6) writes it, "
            "which is what lets Prox learn there. With V = 4 views the plateau is the paper's lr decay (×0.2 "
            "every 8 rounds): without it (`coil20_v4_nodecay`) HyFEM-Avg comes close to centralized. With "
            "V = 12, Prox raises the global accuracy with no local cost (the global half of Fig. 4's shape), "
            "and without the decay the picture is the same, so there the schedule is not what holds HyFEM back."),
    Section("MMVFL Figs. 3-6", "python -m benchmarks.mmvfl_figures --resume --jobs 2", ("mmvfl_figures",),
            f"{REAL} and {STAND_IN}: Handwritten, Isolet, Relathe; MSRC-v5 stands in for Caltech7", mmvfl,
            "5 folds × 7 betas per data set. MMVFL pulls its pseudo-labels Z onto Y (ζ = η = 1000), so it tracks "
            "supFL closely on every view, and it is above supMVLFL in most cells with few features (p ≤ 10 %). "
            "The gap columns are mean absolute accuracy differences per view over every beta and fold."),
    Section("F³ Tables 2 and 3, Fig. 3", "python -m benchmarks.f3_tables (resumes)", ("f3_table2",),
            f"{REAL} (Japanese Vowels) and {SYNTHETIC} (traffic simulated on the real METR-LA and PEMS-BAY road "
            "graphs)", f3_tables,
            "Rows as in the paper's Table 2: K F³ with alignment and the ICDF graph, H F³ without alignment, J F³ "
            "with parameter tying, D the best local model, E mean pooling, F a set transformer, G concatenation, "
            "L VFL with graph and alignment trained end to end, M VFL without pre-trained local models; traffic "
            "runs have a budget of 20 global epochs. Vowels: K ≥ H and "
            "K ≥ E hold, **K ≥ G and M < K do not**, ICDF ≥ no graph only with alignment. METR-LA: K ≥ H, E hold, "
            "K ≥ G and M < K only within one std, L ≈ K, ICDF ≥ no graph without alignment but **not with it**. "
            "PEMS-BAY: K ≥ H, E, G hold, ICDF ≥ no graph without alignment only, **M < K does not hold** "
            "(end-to-end training from scratch beats the frozen 10-epoch local models on this simulator). "
            "Baseline F (set transformer) trains at lr 1e-3: at 1e-2 it collapsed to one class on the traffic "
            "sets. Which orderings hold, per run, is in `f3_table2.md`."),
    Section("F³ fusion modes: what the coordinator learns, accuracy, cost", "python -m benchmarks.f3_leakage; "
            "python -m benchmarks.f3_mpc_accuracy; python -m benchmarks.f3_scale --owners 207 325 --graph given",
            ("f3_leakage", "f3_mpc_accuracy", "f3_scale_given"),
            f"{REAL} (Japanese Vowels) and {SYNTHETIC} (traffic simulated on the real METR-LA / PEMS-BAY road graphs)",
            f3_modes,
            "The first table is the one comparison of the modes: the coordinator's best attack over a whole run "
            "(R² of every owner's h on the training rows, the largest over owners, sizes and widths; target for "
            "mpc ≤ 0.1), the share of the label-only baseline's remaining error it removes, Vowels accuracy and "
            "the time per epoch at 207 owners as processes. The coordinator holds the labels in every mode, and on "
            "Japanese Vowels the class means alone already explain much of h's variance, so no mode can meet an "
            "absolute R² target there; the share beyond labels is what the messages add. Time ratios come from "
            "one run of the three modes on a machine that may be loaded (see the load average in the file)."),
    Section("F³ trained on shares (fusion \"shares\")", "python -m benchmarks.f3_shares --parts accuracy --sets f3_small "
            "--seeds 3; python -m benchmarks.f3_shares --parts accuracy --sets f3 --seeds 5; "
            "python -m benchmarks.f3_shares --parts leakage,cost --sets f3_small,f3 --draws 10", ("f3_shares",),
            f"{REAL} (Japanese Vowels), {SYNTHETIC} (traffic simulated on the real METR-LA road graph; the cost rows "
            "on random h)", f3_shares,
            "The coordinator opens per training batch one count (its correct predictions) and per evaluation a "
            "confusion matrix summed over the split; its attacks are measured against the label-only bound. The "
            "holders run in threads of one process here (the cost as processes is not measured). \"within 0.02\" "
            "asks it of every seed's ΔF1 (the initial weights on shares are drawn from the OS, so a seed pairs the "
            "data split, not the start); the mean over the seeds is the \"mean ΔF1\" column."),
    Section("F³ scale (learned graph) and field products", "python -m benchmarks.f3_scale; "
            "python -m benchmarks.field_matmul", ("f3_scale", "field_matmul"),
            f"{SYNTHETIC} (simulated traffic) for the scale; random matrices for the products", f3_scale_products,
            "Shamir fusion's holders work on t = 2 "
            "of 3 per step in turn (setting `ask`); a busy machine hurts shamir mode more than trusted. The "
            "products with inner dimension 16 (the per-owner C_i) stay at or below the goal of 0.25 of float64: "
            "with K = 16 the two digit gemms cost no more than the elementwise split, conversion and Mersenne "
            "passes around them and numpy's per-call cost, which only a fused compiled kernel would remove."),
    Section("Paillier short exponent and HE slot width", "python -m benchmarks.paillier_speed; "
            "python -m benchmarks.he_slots", ("paillier_speed", "he_slots"),
            f"{SYNTHETIC} integers for the encryption rates; {REAL} (FATE tables) for the HE split network",
            paillier_speed, "Auto-sized slots still refuse an overflow (`SlotOverflowError`); only the forward "
            "packing gains from them, and per-epoch differences of a few percent are the noise of a shared machine."),
    Section("Many parties in host processes", "python -m benchmarks.hosts_scale", ("hosts_scale",),
            f"{SYNTHETIC}: the shamir job's seeded random matrices", hosts_scale),
    Section("The Ray engine against local host processes", "python -m benchmarks.ray_overhead", ("ray_overhead",),
            f"{SYNTHETIC} (fedavg_logreg, shamir, secagg_bench) and the {REAL} METR-LA road graph with simulated "
            "windows (f3_metr_la), as each row says", ray_overhead,
            "Start-up: until every party has reported; under Ray that takes placing one actor per unit and the "
            "engine's polls. RSS: the peak of the summed resident memory of the parties' processes, and under Ray "
            "of the actors and the cluster's daemons. How to run across machines: [ray.md](ray.md)."),
    Section("Checkpoint overhead", "python -m benchmarks.checkpoint_overhead", ("checkpoint_overhead",),
            f"{REAL} (scikit-learn's packaged sets) and {SYNTHETIC}, as each row says", checkpoint_overhead,
            "Each party checkpoints every step; the overhead is what the most burdened party's role waited for "
            "(encoding the state; the write and its fsync run on a writer thread) as a share of its role's time. "
            "The bound is 5 % of a round."),
    Section("The demo on a loaded machine", "python -m benchmarks.loaded_demo", ("loaded_demo",),
            f"{REAL}: scikit-learn's breast-cancer set split over three clients (FedAvg, secure aggregation)",
            loaded_demo, "Every party is its own process over CURVE. A connection cut by a party's own guard would "
            "show in the cut columns (issue 43: none of a listed peer's may be). The five run folders also passed "
            "`fedhet audit --trust-folder-keys`, run apart from the benchmark."),
    Section("Encrypted against plaintext on simulated networks", "python -m benchmarks.network_matrix",
            ("network_matrix",), f"{REAL} (scikit-learn's breast-cancer set), {STAND_IN} (scikit-learn's digits for "
            f"CHFL, HyFEM and MMVFL) and {SYNTHETIC} (PSI's IDs, F³'s simulated traffic, the Shamir and secure-aggregation "
            "jobs' random inputs), as each row says", network_matrix,
            "Each smoke federation runs as processes over CURVE on loopback, then with `[federation] network = "
            "\"lan\"` (0.5 ms round trip, 1 Gbit/s) and `\"wan\"` (50 ms, 100 Mbit/s): every message crosses an "
            "emulated link (`fedhet.parties.netlink`). The model (`fedhet.parties.ops.netmodel`) replays the "
            "loopback run's transcripts with the link's delays. span: from the moment every party's role ran to the "
            "last party's end (wall adds process start-up, which no link changes); error = (model - measured) / "
            "measured span; network share: the model's added time over its span. The compute inside a span moves "
            "with the shared machine's load as much as a LAN moves it. What to pick: every crossover is computed "
            "from the model's spans over a grid of round trips and bandwidths stored per cell in the JSON "
            "(`sweep_span_s`; `netmodel.sweep`, `netmodel.crossover`), linear between grid points; the smoke "
            "federations are small, so a protection whose cost grows with the data (PSI at 2^20 IDs, the HE split "
            "network over many batches) ranks differently at full size."),
    Section("The link emulator against the kernel", "python -m benchmarks.network_kernel (root: network "
            "namespaces)", ("network_kernel",), f"{SYNTHETIC}: zero-filled messages", network_kernel,
            "Two CURVE parties; a message from a to b timed to b's 1-byte answer. kernel: two network namespaces "
            "over a veth pair shaped by `tbf` on both ends; emulator: loopback with `network = \"0,100\"`. The "
            "kernel also carries TCP/IP headers (about 4 % at a 1500-byte MTU), which the emulator does not count. "
            "Each ping-pong hop through the emulator costs one more thread wake-up, which shows at 1 ms."),
    Section("Prediction throughput (vertical, as processes)", "python -m benchmarks.predict_throughput "
            "--rows 131072 1000 --psi-backends ecdh auto",
            ("predict_throughput",), f"{SYNTHETIC}: new rows drawn around each smoke model's check rows",
            predict_throughput, "The job's time is mostly process start-up and the PSI over the new rows' IDs; "
            "plaintext is the same rows scored in one process with the exported modules."),
)


# ---------------------------------------------------------------------------- peers

PEER_LIBS = ("fedhet", "phe", "fate_utils (FATE 2.x)", "HEU (SecretFlow)", "pypaillier", "Flower SecAgg+", "MPyC")


def peers_table(d: dict) -> list[str]:
    """The one-line-per-measure grid of fedhet against the peers installed in the same run."""
    def cell(rows, lib, fmt, **match):
        r = [x for x in rows if x["library"].startswith(lib.split(" (")[0]) and not x.get("note")
             and all(x.get(k) == v for k, v in match.items())]
        return fmt(r) if r else ""

    pa, la, sa, sh = d.get("paillier", []), d.get("layer", []), d.get("secagg", []), d.get("shamir", [])
    enc = [cell(pa, lib, lambda r: " / ".join(rate(x["ct_per_core_s"]) for x in r
                                                  if "standard" not in x["variant"] and "packed" not in x["variant"]),
                op="encrypt") for lib in PEER_LIBS]
    dec = [cell(pa, lib, lambda r: rate(r[0]["ct_per_core_s"]), op="decrypt") for lib in PEER_LIBS]
    lay = [cell(la, lib, lambda r: f"{r[0]['cpu_s']:.2f} ({r[0]['x_fedhet_owner']:.0f}x)") for lib in PEER_LIBS]
    sec = [cell(sa, lib, lambda r, lib=lib: f"{r[0]['cpu_s']:.2f} / {r[0]['bytes_per_client'] / 1e6:.3f} MB ("
                + (f"{r[0]['x_plain_cpu']:.1f}x plain CPU)" if lib == "fedhet" else f"{r[0]['x_fedhet_cpu']:.1f}x fedhet)"),
                **({"variant": "secure, complete graph"} if lib == "fedhet" else {})) for lib in PEER_LIBS]
    sham = [cell(sh, lib, lambda r: " / ".join(
        rate(max((x["elements_per_core_s"] for x in r if any(w in x["op"] for w in words)), default=None))
        for words in (("share", "split"), ("reconstruct", "recombine")))) for lib in PEER_LIBS]
    versions = {v["distribution"]: v.get("version") for v in d["peers"].values()}
    head = ["what"] + [lib if lib == "fedhet" else f"{lib} {versions.get(_dist(d, lib)) or ''}".strip()
                       for lib in PEER_LIBS]
    return table(head, [
        ["Paillier encryptions / s per core (fedhet: public key / key owner, short exponent)"] + enc,
        ["Paillier decryptions / s per core"] + dec,
        [f"{d['layer'][0]['shape']} encrypt, matmul, decrypt: CPU s (x fedhet)" if d.get("layer") else "layer"] + lay,
        ["secure aggregation K = 10, m = 10^6: CPU s all parties / bytes per client"] + sec,
        ["Shamir 3-of-5: share / reconstruct, elements / s per core"] + sham])


def _dist(d: dict, lib: str) -> str | None:
    for name, v in d["peers"].items():
        if name.split(" (")[0] == lib.split(" (")[0]:
            return v["distribution"]
    return None


# ------------------------------------------------------------------------------ the page

HEAD = """# Results

Generated by `python -m benchmarks.results_doc` (`make results-doc`) from the results files under
`benchmarks/results/`; do not edit it by hand (`tests/test_results_doc.py` checks that it is what the
command writes from the committed files). Each benchmark writes `benchmarks/results/NAME.{json,md}`
(and a PNG where there is a plot) through `benchmarks/harness.py`; `--quick` writes `NAME_quick.*`.
`NAME.md` holds the full tables of each run; this page holds the headline figures.

Every table names the data it rests on (**real**: the paper's data or the same public data;
**stand-in**: real data standing in for a set that is not stored; **synthetic**: generated), the
results file, and the commit and machine the file came from. The machines are shared 2-core
machines unless a file says otherwise: timings move with their load (each run's load average is in
its `NAME.md`).
"""


def section_lines(s: Section, results: Path) -> list[str]:
    docs = [load(n, results) for n in s.files]
    commit, machine = provenance(docs[0])
    files = ", ".join(f"`{n}.json`" for n in s.files)
    out = [f"### {s.title}", "", f"- data: **{s.data}**", f"- command: `{s.command}`" if "`" not in s.command
           else f"- command: {s.command}", f"- results: {files} (full tables in " + ", ".join(f"`{n}.md`" for n in s.files)
           + ")", f"- commit: {commit}; machine: {machine}"]
    for n, d in zip(s.files[1:], docs[1:]):
        c, m = provenance(d)
        out.append(f"- `{n}.json`: commit {c}; machine: {m}")
    out += ["", *s.body(*docs)]
    if s.note:
        out += ["", s.note]
    return out + [""]


def render(results: Path = harness.RESULTS) -> str:
    out = [HEAD, "## Reproductions and benchmarks", ""]
    for s in SECTIONS:
        out += section_lines(s, results)
    p = load("peers", results)
    commit, machine = provenance(p)
    out += ["## fedhet against the libraries users would pick instead", "",
            "`python -m benchmarks.peers` runs fedhet and each peer that is installed in the same script on the "
            "same machine, checks every result against a plain computation before timing, and reports per-core "
            "rates from process CPU time (variants interleaved, medians). Peers are optional: "
            "`pip install phe fate_utils sf-heu pypaillier flwr mpyc` to measure them; none is a dependency, and a "
            "missing one is reported as \"not installed\". 2048-bit keys.", "",
            f"- data: **{SYNTHETIC}**: random integers and vectors",
            "- results: `peers.json` (every variant in `peers.md`)",
            f"- commit: {commit}; machine: {machine}", "", *peers_table(p), "",
            "Decryption costs the same everywhere (two 1024-bit-exponent powmods per ciphertext, CRT); fedhet's "
            "lead comes from short-exponent encryption, packing many values per ciphertext and batching; with the "
            "standard `r^n` obfuscation fedhet encrypts at phe's rate (`peers.md`). `peers.json` times Shamir "
            "sharing by process CPU time on a busy machine; `crypto_shamir.json` by wall time on a quiet one.", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=harness.RESULTS, help="the results folder to read")
    ap.add_argument("--out", type=Path, default=DOC, help=f"the page to write (default {DOC.relative_to(harness.REPO)})")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page differs")
    a = ap.parse_args(argv)
    text = render(a.results)
    if a.check:
        same = a.out.exists() and a.out.read_text() == text
        print(f"{a.out}: {'up to date' if same else 'differs from the results: run python -m benchmarks.results_doc'}")
        return 0 if same else 1
    write_atomic(a.out, text)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
