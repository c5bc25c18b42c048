"""The party runtime's own entry point: ``python -m fedhet.parties party|host`` (also ``fedhet party``
and ``fedhet host``, which the operations CLI takes from here).

A party or host process starts here, never in the operations layer (:mod:`fedhet.parties.ops`: the
CLI, the launcher, the report and the board): it imports the runtime, the algorithm its federation
file names (through the ``fedhet_algorithms`` entry points, :func:`~fedhet.parties.contract.installed_algorithm`)
and nothing of the web stack, so a machine that only runs parties installs ``fedhet`` without extras.

    python -m fedhet.parties party FILE --name N [--out RUN] [--run-id ID] [--resume] ...
    python -m fedhet.parties host FILE --host H [--out RUN] [--run-id ID] [--resume] ...

The process exits as soon as its records are written (:func:`~fedhet.parties.runtime.exit_now`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rich.console import Console

from fedhet.parties.progress import LOG_LEVELS
from fedhet.parties.runfolder import error_file

console = Console(stderr=False)


def with_data_dir(fed, data_dir: str | None):
    """The federation with ``--data-dir`` (folder of the built-in data sets) in force."""
    if not data_dir:
        return fed
    p = Path(data_dir).expanduser()
    if not p.is_dir():
        raise ValueError(f"--data-dir {data_dir!r} is not a folder")
    return dataclasses.replace(fed, data_dir=str(p.resolve()))


def _out(fed, out: str | None) -> Path:
    return Path(out) if out else Path("runs") / f"{fed.algorithm_name}-{fed.derived_run_id()}"


def cmd_party(args) -> int:
    from fedhet.parties.contract import installed_algorithm
    from fedhet.parties.federation import load
    from fedhet.parties.runtime import run_party

    fed = with_data_dir(load(args.file, launch=False), args.data_dir)   # a party reads no launch key
    out = _out(fed, args.out)
    if args.insecure:
        console.print("[bold red]WARNING[/bold red]: --insecure: CURVE encryption and sender authentication "
                      "are OFF (only for measuring their cost)", highlight=False)
    if not args.run_id and not fed.run_id:
        console.print("note: no --run-id and no run_id in the file: using the file's hash; give each run a fresh "
                      "--run-id so messages of an earlier run can never be replayed into this one", style="yellow")
    algorithm = installed_algorithm(fed.algorithm_name)
    code = run_party(fed, args.name, out, algorithm, insecure=args.insecure, bind=args.bind,
                     run_id=args.run_id or None, echo=not args.quiet, log_level=args.log_level, resume=args.resume)
    if not args.quiet:
        console.print(f"party {args.name}: {'done' if code == 0 else 'FAILED'}; run folder {out}", markup=False)
        err = error_file(out, args.name)
        if code != 0 and err.exists():
            rec = json.loads(err.read_text())
            who = rec.get("culprit")
            blame = (f"the evidence names {who!r}" if who and who != args.name else
                     "it failed on its own" if who == args.name else "no party is proven at fault")
            console.print(f"  {rec.get('cause')}: {blame}: {rec.get('error')}", markup=False, highlight=False)
    return code


def cmd_host(args) -> int:
    from fedhet.parties.contract import installed_algorithm
    from fedhet.parties.federation import load
    from fedhet.parties.host import run_host

    fed = load(args.file)
    algorithm = installed_algorithm(fed.algorithm_name)
    return run_host(fed, args.host, _out(fed, args.out), algorithm, insecure=args.insecure,
                    run_id=args.run_id or None, echo=not args.quiet, log_level=args.log_level, resume=args.resume)


def add_commands(sub) -> None:
    """The ``party`` and ``host`` commands on an argparse subparsers object."""
    p = sub.add_parser("party", help="run one party of a federation (one per machine)")
    p.add_argument("file")
    p.add_argument("--name", required=True)
    p.add_argument("--out", help="run folder (default runs/ALGORITHM-RUNID)")
    p.add_argument("--run-id", help="the id every party of this run uses (fresh per run)")
    p.add_argument("--bind", help="endpoint to listen on if it differs from the advertised one (tcp://*:5555)")
    p.add_argument("--data-dir", help="folder of the built-in data sets (overrides [federation] data_dir)")
    p.add_argument("--insecure", action="store_true", help="plain TCP, no CURVE: only to measure its cost")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="what log.txt records (and echoes)")
    p.add_argument("--resume", action="store_true",
                   help="go on with the run in --out from the newest checkpoint every party holds")
    p.set_defaults(fn=cmd_party)
    p = sub.add_parser("host", help="run the parties of one host of a federation (`fedhet run` starts these)")
    p.add_argument("file")
    p.add_argument("--host", required=True, help="the host's name ([[party]] host, or host1.. from hosts = N)")
    p.add_argument("--out", help="run folder (default runs/ALGORITHM-RUNID)")
    p.add_argument("--run-id", help="the id every party of this run uses (fresh per run)")
    p.add_argument("--insecure", action="store_true", help="plain TCP, no CURVE: only to measure its cost")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info", help="what each party's log.txt records")
    p.add_argument("--resume", action="store_true", help="resume the run in --out (see `fedhet party --resume`)")
    p.set_defaults(fn=cmd_host)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedhet.parties", description="run a party or a host of parties")
    add_commands(ap.add_subparsers(dest="cmd", required=True))
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, FileExistsError, PermissionError) as e:
        console.print(f"fedhet {args.cmd}: {e}", markup=False, highlight=False)
        return 2
