"""The ``fedhet`` command line.

    fedhet presets                      list the federations that ship with fedhet
    fedhet keys FILE [--name N]         make key pairs for the parties of FILE, print public keys
    fedhet party FILE --name N          run one party (one per machine)
    fedhet run FILE_OR_PRESET [--out D] run every party as a local process (or in host processes)
    fedhet host FILE --host H           run the parties of one host in one process (`run` starts it)
    fedhet audit RUN_DIR [--federation F] verify transcripts and declared disclosures
    fedhet predict FILE --model RUN --out PRED  score new rows with RUN's trained parts (a federation job)
    fedhet messages ALGO                every message kind: sender, receiver, protection, payload schema
    fedhet presets --describe ALGO      every [algorithm] setting with type, default and meaning
    fedhet report RUN [--compare RUN2]  RUN/report.html: one self-contained page of a run
    fedhet board [--runs DIR]           a read-only local web page of the runs under DIR, live
    fedhet demo [--out D]               the headline job, end to end
    fedhet --version                    the installed version

Every message printed through rich is escaped (:func:`rich.markup.escape`) or printed as a
``Text``: the messages quote TOML sections (``[[party]] #1``, ``[algorithm]``), which rich
would otherwise read as markup and drop.

With the rest of the operations layer, the one part of ``parties/`` that imports ``fedhet.algorithms``: it resolves
algorithm names through the registry and hands the Algorithm to the runtime and the audit.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape  # messages quote [sections] and schemas [item]: rich would eat them
from rich.text import Text

from fedhet.parties import runfolder as rf
from fedhet.parties import entry
from fedhet.parties.netlink import parse_network
from fedhet.parties.progress import LOG_LEVELS

console = Console(stderr=False)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedhet")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _load_federation(spec: str):
    from fedhet.parties.ops import presets
    from fedhet.parties.federation import load

    p = Path(spec)
    if p.is_dir():
        if spec in presets.names():
            raise ValueError(f"{spec!r} is both a preset and a folder here ({p.resolve()}): to run the preset, "
                             f"rename the folder or run from another folder; to run a federation file, "
                             f"give its path (a run folder holds one: {spec}/federation.toml)")
        raise ValueError(f"{spec!r} is a folder, not a federation file or a preset (a run folder holds its "
                         f"federation file: {spec}/federation.toml; presets: {', '.join(presets.names())})")
    if p.exists():
        return load(p)
    if spec in presets.names():
        return load(presets.path(spec))
    raise SystemExit(f"fedhet: {spec!r} is neither a federation file nor a preset "
                     f"(presets: {', '.join(presets.names())})")


def _parse_overrides(items: list[str]) -> dict:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise SystemExit(f"fedhet: --set expects KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def _registry():
    from fedhet.algorithms import registry

    return registry


def cmd_presets(args) -> int:
    from fedhet.parties.ops import presets

    if args.describe:
        return _describe_settings(args.describe)
    for n in presets.names():
        console.print(f"[bold]{escape(f'{n:<22}')}[/bold] {escape(presets.describe(n))}", highlight=False)
    return 0


def _algorithm_of(spec: str):
    """An algorithm name, or a preset / federation file whose algorithm is meant."""
    reg = _registry()
    if spec in reg.names() or spec.endswith(".predict"):   # an algorithm's prediction job: ALGO.predict
        return reg.get_algorithm(spec), None
    fed = _load_federation(spec)
    return reg.get_algorithm(fed.algorithm_name), fed


def _describe_settings(spec: str) -> int:
    from rich.table import Table

    algo, fed = _algorithm_of(spec)
    rows = algo.describe_settings()
    console.print(f"[bold]{escape(algo.name)}[/bold]: {escape(algo.summary)}", highlight=False)
    if not rows:
        console.print("(this algorithm has no typed settings yet: its module docstring lists its keys)")
        return 0
    t = Table(title=Text(f"[algorithm] settings of {algo.name}", style="italic"))
    for c in ("key", "type", "default", "range", "meaning"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*(Text(str(v)) for v in (r["key"], r["type"], json.dumps(r["default"]), r["range"], r["doc"])))
    console.print(t)
    for line in psi_backend_lines(rows, fed.algorithm_cfg() if fed is not None else None):
        console.print(escape(line), highlight=False)
    return 0


def psi_backend_lines(rows: list[dict], table: dict | None) -> list[str]:
    """For an algorithm with a PSI backend key: which backend a preset (its ``[algorithm]`` ``table``; None: the
    algorithm's defaults) runs, and why (:func:`fedhet.protocols.psi.describe_backend`)."""
    from fedhet.protocols import psi

    out = []
    for r in rows:
        if r["key"] in ("psi_backend", "predict_psi_backend"):
            given = table is not None and r["key"] in table
            value = table[r["key"]] if table is not None and given else r["default"]
            out.append(f"PSI ({r['key']}, {'set by this preset' if given else 'the default'}): "
                       f"{psi.describe_backend(value, r['key'])}")
    return out


def cmd_messages(args) -> int:
    from rich.table import Table

    from fedhet.parties.contract import prepare
    from fedhet.parties.declare import NOT_STATED

    algo, fed = _algorithm_of(args.algorithm)
    table = dict(fed.algorithm_cfg()) if fed is not None else {}
    table.update(_parse_overrides(args.set))
    settings, declared, sizes = prepare(algo, table)
    if declared is None:
        raise ValueError(f"{algo.name} declares no message kinds")
    if args.json:
        print(json.dumps({k: {"sender": list(d.sender), "receiver": list(d.receiver), "what": d.what,
                              "payload": d.payload.render() if d.payload is not None else None,
                              "protects": d.protects}   # a key of declare.PROTECTIONS; null: not stated
                          for k, d in declared.items()}, indent=2))
        return 0
    t = Table(title=Text(f"message kinds of {algo.name}" + (f" ({args.algorithm})" if fed is not None else ""),
                         style="italic"))
    for c in ("kind", "sender", "receiver", "protects", "payload", "what"):
        t.add_column(c, overflow="fold")
    for k, d in declared.items():
        t.add_row(*(Text(v) for v in (k, ", ".join(d.sender), ", ".join(d.receiver), d.protects or NOT_STATED,
                                      d.payload.render() if d.payload is not None else "(arrays checked by the audit)",
                                      d.what)))
    console.print(t)
    if sizes:
        console.print("sizes: " + ", ".join(f"{k}={v}" for k, v in sizes.items()), highlight=False, markup=False)
    return 0


def cmd_keys(args) -> int:
    from fedhet.parties import keys as keyfiles
    from fedhet.parties.federation import load, update_public_keys

    fed = load(args.file)
    if fed.key_dir is None:
        raise SystemExit(f"fedhet: {args.file}: set key_dir in [federation] (where secret keys are kept)")
    names = [args.name] if args.name else [p.name for p in fed.parties]
    for n in names:
        fed.party(n)  # validates the name
    console.print(f"# keys in {fed.key_dir} (secret files mode 0600)", markup=False, highlight=False)
    made = {}
    for n in names:
        if args.update and not args.force and keyfiles.exists(fed.key_dir, n):
            pub = keyfiles.load_public(fed.key_dir, n)  # --update writes the keys this machine already has
            note = " (existing keys)"
        else:
            pub = keyfiles.generate(fed.key_dir, n, overwrite=args.force)
            note = ""
        made[n] = pub
        console.print(f"# party {n}{note}\npublic_key = \"{pub.curve}\"\nsign_key = \"{pub.sign}\"", markup=False)
    if args.update:
        update_public_keys(args.file, {n: pub.as_dict() for n, pub in made.items()})
        console.print(f"# wrote the public keys into {args.file} (the rest of the file is unchanged)",
                      markup=False, highlight=False)
    return 0


def _show_value(v: Any) -> str:
    """A result value in full: floats to 4 places, tables and lists spelled out."""
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_show_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show_value(x) for x in v) + "]"
    return str(v)


def _print_summary(summary: dict, title: str, headline: tuple[str, ...] = ()) -> None:
    """The end-of-run table: per party its headline results (the algorithm's declared
    ``headline`` keys) in full, never cut, then its other scalar results as room allows
    (all of them are in the run folder's result.json)."""
    from rich.table import Table

    rows = []
    for name, p in summary["parties"].items():
        res = p.get("result")
        res = res if isinstance(res, dict) else {}
        tr = p.get("traffic", {})
        head = [f"{k}={_show_value(res[k])}" for k in headline if res.get(k) is not None]
        priv = res.get("privacy")
        if isinstance(priv, dict) and isinstance(priv.get("epsilon"), (int, float)):   # a DP ledger: its spend
            head.append(f"epsilon={priv['epsilon']:.3g} (delta {priv.get('delta', '?')}, {priv.get('unit', '?')})")
        rows.append({
            "party (role)": f"{name} ({p.get('role', '?')})",
            "headline": "\n".join(head) or "-",
            "other results": ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()
                                       if k not in headline and isinstance(v, (int, float, str))
                                       and not isinstance(v, bool)) or str(p.get("error") or ""),
            "sent/recv MB": f"{tr.get('bytes_sent_total', 0) / 1e6:.1f}/{tr.get('bytes_received_total', 0) / 1e6:.1f}",
            "wall s": f"{p.get('wall_s', 0):.1f}"})
    cols = ["party (role)"] + (["headline"] if headline else []) + ["other results", "sent/recv MB", "wall s"]
    # Every column but "other results" at its full width; that one gets what is left of the
    # console (each column costs its text plus 3 for padding and rule), or is left out.
    need = {c: max([len(c)] + [len(line) for r in rows for line in r[c].splitlines()]) for c in cols}
    room = console.width - 1 - sum(need[c] + 3 for c in cols if c != "other results") - 3
    if room < 12:
        cols.remove("other results")
    t = Table(title=Text(title, style="italic"))
    for c in cols:
        t.add_column(c, justify="right" if c in ("sent/recv MB", "wall s") else "left",
                     no_wrap=c != "other results", overflow="ellipsis" if c == "other results" else "fold",
                     max_width=room if c == "other results" else None)
    for r in rows:
        t.add_row(*(Text(r[c], no_wrap=c == "other results", overflow="ellipsis" if c == "other results" else "fold")
                    for c in cols))
    console.print(t)


def cmd_run(args) -> int:
    from fedhet.parties.ops.launcher import RunFailed, launch, resume_federation

    if args.resume:
        if args.federation or args.out or args.set or args.network:
            console.print("error: --resume RUN goes on with RUN's own federation, settings and folder: give no "
                          "federation file, --out, --set or --network with it", markup=False)
            return 2
        args.out = args.resume
        fed = entry.with_data_dir(resume_federation(args.resume), args.data_dir)
    elif not args.federation:
        console.print("error: give a federation file or preset name (or --resume RUN)", markup=False)
        return 2
    else:
        fed = entry.with_data_dir(_load_federation(args.federation), args.data_dir)
    if args.engine:
        fed = dataclasses.replace(fed, engine=args.engine)
    if args.network:
        try:
            parse_network(args.network)
        except ValueError as e:
            console.print(f"error: --network: {e}", markup=False)
            return 2
        fed = dataclasses.replace(fed, network=args.network.strip().lower())
    if args.address:
        if fed.engine != "ray":
            console.print("error: --address is the Ray cluster's: give it with --engine ray (or [federation] "
                          "engine = \"ray\")", markup=False)
            return 2
        fed = dataclasses.replace(fed, ray_address=args.address)
    algorithm = _registry().get_algorithm(fed.algorithm_name)
    if args.insecure:
        console.print("[bold red]WARNING[/bold red]: --insecure: CURVE is OFF for every party", highlight=False)
    try:
        summary = launch(fed, args.out, insecure=args.insecure, timeout=args.timeout,
                         progress=not args.no_progress, overrides=_parse_overrides(args.set), algorithm=algorithm,
                         log_level=args.log_level, resume=bool(args.resume))
    except RunFailed as e:
        console.print(f"[bold red]run failed[/bold red]: {escape(str(e))}", highlight=False)
        return 1
    _print_summary(summary, f"{fed.algorithm_name}: {len(fed.parties)} parties, {summary['wall_s']:.1f}s",
                   algorithm.headline)
    run_dir = Path(args.out) if args.out else None
    console.print(f"run folder: {run_dir or '(see runs/)'}; check it with `fedhet audit <run folder>`", markup=False)
    return 0


def cmd_audit(args) -> int:
    from fedhet.parties.audit import audit, render

    rep = audit(args.run_dir, _registry().get_algorithm, federation=args.federation,
                trust_folder_keys=args.trust_folder_keys)
    render(rep, console)
    if args.json:
        print(json.dumps({"ok": rep.ok, "unverified": rep.unverified, "problems": rep.problems,
                          "warnings": rep.warnings, "table": rep.table}, indent=2))
    return rep.exit_code


def cmd_export(args) -> int:
    from fedhet.algorithms.scoring import ExportError
    from fedhet.parties.ops.export import export_run
    from fedhet.parties.model_store import ModelFileError

    out = Path(args.out) if args.out else Path(args.run_dir) / "export"
    try:
        done = export_run(args.run_dir, out, _registry().get_algorithm, party=args.party, onnx=not args.no_onnx)
    except (ExportError, ModelFileError) as e:
        console.print(f"fedhet export: {e}", style="red", markup=False)
        return 2
    for name, folder in done.items():
        files = ", ".join(sorted(p.name for p in folder.iterdir()))
        console.print(f"{name}: {folder} ({files})", markup=False)
    return 0


def cmd_predict(args) -> int:
    from fedhet.parties.ops.predict import job_federation
    from fedhet.parties.ops.launcher import RunFailed, launch

    fed = entry.with_data_dir(_load_federation(args.federation), args.data_dir)
    out = Path(args.out)
    job = job_federation(fed, args.model, out)
    algorithm = _registry().get_algorithm(job.algorithm_name)
    try:
        summary = launch(job, out, timeout=args.timeout, progress=not args.no_progress, algorithm=algorithm)
    except RunFailed as e:
        console.print(f"[bold red]predict failed[/bold red]: {escape(str(e))}", highlight=False)
        return 1
    _print_summary(summary, f"{job.algorithm_name}: {len(fed.parties)} parties, {summary['wall_s']:.1f}s",
                   algorithm.headline)
    for name in summary["parties"]:
        if (rf.party_dir(out, name) / "predictions.csv").exists():
            console.print(f"{name}: {out / 'parties' / name / 'predictions.csv'}", markup=False, highlight=False)
    return 0


def cmd_report(args) -> int:
    from fedhet.parties.ops.report import write

    path = write(args.run_dir, compare=args.compare, lookup=_registry().get_algorithm, federation=args.federation,
                 out=args.out)
    console.print(f"report: {path}", markup=False, highlight=False)
    return 0


def cmd_board(args) -> int:
    from fedhet.parties.ops.board import serve

    if not Path(args.runs).is_dir():
        raise FileNotFoundError(f"--runs {args.runs}: no such folder")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[bold red]WARNING[/bold red]: the board listens on {escape(args.host)}: anyone who can "
                      "reach it and has the token can read the runs' results", highlight=False)
    serve(args.runs, host=args.host, port=args.port, lookup=_registry().get_algorithm,
          announce=lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True))
    return 0


def cmd_demo(args) -> int:
    from fedhet.parties.ops import demo

    return demo.main(out=args.out, progress=not args.no_progress, console=console, he_epochs=args.he_epochs,
                     lookup=_registry().get_algorithm)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fedhet", description="secure multi-party federated learning "
                                 "across parties that hold different features")
    ap.add_argument("--version", action="version", version=f"fedhet {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("presets", help="list the federation presets that ship with fedhet")
    p.add_argument("--describe", metavar="ALGO_OR_PRESET",
                   help="list every [algorithm] setting of an algorithm with type, default and meaning")
    p.set_defaults(fn=cmd_presets)
    p = sub.add_parser("messages", help="list an algorithm's message kinds with sender, receiver, what protects "
                       "them and schema")
    p.add_argument("algorithm", help="algorithm name, preset or federation file (its settings size the schemas)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override an [algorithm] setting")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_messages)
    p = sub.add_parser("keys", help="create CURVE and Ed25519 key pairs for the parties of a federation file")
    p.add_argument("file")
    p.add_argument("--name", help="only this party (on its own machine)")
    p.add_argument("--force", action="store_true", help="replace existing keys")
    p.add_argument("--update", action="store_true",
                   help="write the public keys into FILE (only those values change; keys this machine already "
                        "has are reused unless --force)")
    p.set_defaults(fn=cmd_keys)
    entry.add_commands(sub)   # `fedhet party` and `fedhet host`: the runtime's own (python -m fedhet.parties)
    p = sub.add_parser("run", help="run every party of a federation as a local process")
    p.add_argument("federation", nargs="?", help="federation file or preset name")
    p.add_argument("--resume", metavar="RUN",
                   help="go on with the killed or failed run in folder RUN from the newest checkpoint every party holds")
    p.add_argument("--out", help="run folder (default runs/ALGORITHM-TIME-ID)")
    p.add_argument("--insecure", action="store_true", help="plain TCP, no CURVE: only to measure its cost")
    p.add_argument("--network", metavar="PROFILE", help="a simulated link between every pair of parties: loopback, "
                   "lan, wan or RTT_MS,MBIT (overrides [federation] network)")
    p.add_argument("--timeout", type=float, help="fail the run if it takes longer (seconds)")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="what each party's log.txt records")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override an [algorithm] parameter")
    p.add_argument("--data-dir", help="folder of the built-in data sets (overrides [federation] data_dir)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--engine", choices=("local", "ray"),
                   help="local: every party or host a process of this machine (default); ray: the hosts on a Ray "
                        "cluster (overrides [federation] engine; docs/ray.md)")
    p.add_argument("--address", help="with --engine ray: the cluster's address, HOST:PORT (default: RAY_ADDRESS, "
                                     "or a cluster started on this machine)")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("audit", help="verify a run's transcripts against the declared disclosures")
    p.add_argument("run_dir")
    p.add_argument("--federation", metavar="FED_TOML",
                   help="the federation file whose signing keys you trust (without it the audit is unverified)")
    p.add_argument("--trust-folder-keys", action="store_true",
                   help="accept the signing keys in the run folder's own config.json (else, without "
                   "--federation, the audit is unverified and exits 1)")
    p.add_argument("--json", action="store_true", help="also print the report as JSON")
    p.set_defaults(fn=cmd_audit)
    p = sub.add_parser("export", help="write each party's trained part as safetensors, ONNX and metadata")
    p.add_argument("run_dir")
    p.add_argument("--party", help="only this party's part (default: every party that saved one)")
    p.add_argument("--out", help="folder of the exports, a subfolder per party (default RUN/export)")
    p.add_argument("--no-onnx", action="store_true", help="weights and metadata only")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("predict", help="score each party's new rows with a run's trained parts (a federation job)")
    p.add_argument("federation", help="federation file of the training run's parties; their data = the new rows")
    p.add_argument("--model", required=True, metavar="RUN", help="the training run folder (its parties/NAME/model/)")
    p.add_argument("--out", required=True, metavar="PRED", help="the prediction run folder")
    p.add_argument("--timeout", type=float, help="fail the job if it takes longer (seconds)")
    p.add_argument("--data-dir", help="folder of the built-in data sets (overrides [federation] data_dir)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(fn=cmd_predict)
    p = sub.add_parser("report", help="write RUN/report.html: summary, audit, message map, curves, time and bytes")
    p.add_argument("run_dir")
    p.add_argument("--compare", metavar="RUN2", help="a second run shown side by side, with ratios")
    p.add_argument("--federation", metavar="FED_TOML",
                   help="the federation file whose signing keys the audit trusts (else the folder's own)")
    p.add_argument("--out", help="the HTML file to write (default RUN/report.html)")
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("board", help="a read-only local web page of the runs under a folder, live while they run")
    p.add_argument("--runs", default="runs", help="folder of run folders (default runs)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(fn=cmd_board)
    p = sub.add_parser("demo", help="run the headline job on bundled data, all parties as local processes")
    p.add_argument("--out", help="run folder (default runs/demo-TIME)")
    p.add_argument("--he-epochs", type=int, default=3,
                   help="epochs of the HE baseline actually run (its 100-epoch time is extrapolated)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(fn=cmd_demo)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.fn(args)
    except KeyboardInterrupt:
        code = 130
    except (ValueError, FileNotFoundError, FileExistsError, PermissionError) as e:
        console.print(f"[bold red]fedhet {args.cmd}[/bold red]: {escape(str(e))}", highlight=False)
        code = 2
    if argv is None and args.cmd in ("party", "host"):   # the `fedhet` command itself runs a party
        from fedhet.parties.runtime import exit_now
        exit_now(code)   # its records are written: exit now, not after freeing its heap
    return code


if __name__ == "__main__":
    sys.exit(main())
