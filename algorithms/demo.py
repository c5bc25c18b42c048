"""``fedhet demo``: the headline job on data that ships with scikit-learn.

Runs the ``demo`` preset (FedAvg logistic regression, a server and three
clients, each its own process over CURVE-encrypted ZeroMQ), audits the run and
prints one results table.
"""
from __future__ import annotations

import time
from pathlib import Path


def main(out: str | None = None, progress: bool = True, console=None) -> int:
    from rich.console import Console
    from rich.table import Table

    from fedhet.parties import presets
    from fedhet.parties.audit import audit
    from fedhet.parties.federation import load
    from fedhet.parties.launcher import RunFailed, launch

    console = console or Console()
    fed = load(presets.path("demo"))
    run_dir = Path(out) if out else Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(f"[bold]fedhet demo[/bold]: {fed.algorithm_name}, {len(fed.parties)} party processes "
                  f"over CURVE-encrypted ZeroMQ, run folder {run_dir}")
    try:
        s = launch(fed, run_dir, progress=progress)
    except RunFailed as e:
        console.print(f"[bold red]demo failed[/bold red]: {e}", highlight=False)
        return 1
    rep = audit(run_dir)
    t = Table(title="FedAvg logistic regression, breast cancer (scikit-learn), 1 server + 3 clients")
    for c in ("party", "role", "test accuracy", "bytes sent", "bytes received", "wall s"):
        t.add_column(c, justify="left" if c in ("party", "role") else "right")
    for name, p in s["parties"].items():
        tr = p["traffic"]
        acc = p["result"].get("test_accuracy")
        t.add_row(name, p["role"], f"{acc:.4f}" if acc is not None else "-", f"{tr['bytes_sent_total']:,}",
                  f"{tr['bytes_received_total']:,}", f"{p['wall_s']:.2f}")
    console.print(t)
    console.print(f"total wall time {s['wall_s']:.2f}s, {s['bytes_total']:,} bytes on the wire; audit: "
                  + ("[green]passed[/green]" if rep.ok else f"[red]FAILED[/red] ({len(rep.problems)} problems)"))
    for p in rep.problems[:10]:
        console.print(f"  - {p}", markup=False)
    return 0 if rep.ok else 1
