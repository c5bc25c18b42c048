"""``fedhet demo``: the headline comparison on data that ships with scikit-learn.

Vertical FL on the breast-cancer set (FATE's "breast": the host holds the
labels and 10 features, a guest the other 20, rows matched by private set
intersection), trained two ways, each as real party processes over
CURVE-encrypted ZeroMQ:

* **STFL** — the guest trains a VAE on its rows the host does not have, then
  sends only latent codes once; the host trains on [own features || codes].
  No encryption is needed because nothing else crosses.
* **HE split network** — FATE's hetero NN with a packed, batched Paillier
  (2048-bit) interactive layer; activations and gradients cross every batch,
  encrypted or noise-masked.

Both runs are audited (signed transcripts against each protocol's declared
disclosures) and one table shows accuracy, time, bytes and the ratios; the demo
ends with the path of ``stfl/report.html``, the report of both runs side by side
(:mod:`fedhet.parties.ops.report`).  The HE
run does ``he_epochs`` epochs (default 3, to keep the demo near a minute); its
100-epoch time is extrapolated from the measured epochs and marked so.
"""
from __future__ import annotations

import time
from pathlib import Path

EPOCHS = 100


def _bytes_for(summary: dict, res: dict, epochs: int) -> float:
    """Bytes of a full run: one-off traffic (PSI, keys) plus training traffic scaled to EPOCHS."""
    total = float(summary["bytes_total"])
    tb = res.get("train_bytes")
    if not tb or epochs >= EPOCHS:
        return total
    per_run = float(tb["sent"] + tb["received"])  # every training message has the host at one end
    return total - per_run + per_run * EPOCHS / epochs


def _host(summary: dict) -> dict:
    return next(p for p in summary["parties"].values() if p["role"] == "host")


def main(out: str | None = None, progress: bool = True, console=None, he_epochs: int = 3,
         lookup=None) -> int:
    """``lookup`` maps an algorithm name to its Algorithm, for the audits (the CLI hands the
    registry: the demo, like the rest of ``parties/``, knows no algorithm)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from fedhet.parties.ops import presets
    from fedhet.parties.audit import audit
    from fedhet.parties.federation import load
    from fedhet.parties.ops.launcher import RunFailed, launch

    console = console or Console()
    root = Path(out) if out else Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    runs = {
        "STFL": ("stfl", {"epochs": EPOCHS}),
        "HE-Paillier split": ("he_split", {"epochs": he_epochs}),
    }
    console.print(f"[bold]fedhet demo[/bold]: vertical FL on breast cancer (scikit-learn), host + guest as "
                  f"separate processes over CURVE-encrypted ZeroMQ; run folders under {escape(str(root))}")
    rows = []
    for label, (preset, over) in runs.items():
        console.print(f"\n[bold]{label}[/bold] ({preset} preset, {over['epochs']} epochs)")
        try:
            s = launch(load(presets.path(preset)), root / preset, progress=progress, overrides=over)
        except RunFailed as e:
            console.print(f"[bold red]demo failed[/bold red] in {label}: {escape(str(e))}", highlight=False)
            return 1
        rep = audit(root / preset, lookup)
        res = _host(s)["result"]
        s_epoch = float(res["s_per_epoch"])
        rows.append({"label": label, "acc": res.get("test_accuracy"), "epochs": over["epochs"],
                     "s_epoch": s_epoch, "train_100": s_epoch * EPOCHS,
                     "extrapolated": over["epochs"] < EPOCHS or bool(res.get("s_per_epoch_extrapolated")),
                     "bytes": _bytes_for(s, res, over["epochs"]),
                     "audit": rep, "run_dir": root / preset})
    stfl = rows[0]
    t = Table(title=f"Breast cancer, vertical: host 10 features + labels, guest 20 features; {EPOCHS} epochs, "
                    "batch 128, Adam")
    for c in ("method", "test accuracy", "training s", "s / epoch", "MB on the wire", "time x STFL", "audit"):
        t.add_column(c, justify="left" if c in ("method", "audit") else "right")
    for r in rows:
        star = "*" if r["extrapolated"] else ""
        t.add_row(r["label"], "-" if r["acc"] is None else f"{r['acc'] * 100:.2f}%", f"{r['train_100']:.2f}{star}",
                  f"{r['s_epoch']:.3f}", f"{r['bytes'] / 1e6:.2f}{star}",
                  f"{r['train_100'] / stfl['train_100']:.1f}x",
                  "[green]passed[/green]" if r["audit"].ok else f"[red]FAILED ({len(r['audit'].problems)})[/red]")
    console.print()
    console.print(t)
    he = rows[1]
    console.print(f"* HE measured on {he['epochs']} epochs and extrapolated to {EPOCHS}; accuracy is after "
                  f"{he['epochs']} epochs. STFL's time includes the guest's VAE. FATE's published HE time on this "
                  "set: 17.4 s/epoch (STFL paper, Table III). Run folders: "
                  + ", ".join(str(r["run_dir"]) for r in rows) + "; `fedhet audit <folder>` re-checks one.",
                  markup=False)
    for r in rows:
        for p in r["audit"].problems[:5]:
            console.print(f"  - {r['label']}: {p}", markup=False)
    from fedhet.parties.ops.report import write

    page = write(stfl["run_dir"], compare=he["run_dir"], lookup=lookup)
    console.print(f"\nReport of both runs (STFL compared with HE; open it in a browser, it needs no network): {page}",
                  markup=False, highlight=False, soft_wrap=True)
    return 0 if all(r["audit"].ok for r in rows) else 1
