"""``fedhet report RUN [--compare RUN2]``: one self-contained HTML file of a run.

The page (``RUN/report.html``) needs no network: Plotly's JavaScript, the styles and the page's
own script are inline, and the run's data (:func:`fedhet.parties.ops.runview.view`) is embedded as
JSON, so the file can be mailed to an auditor and opened anywhere.  It holds the summary with the
audit verdict at the top (green or red), the message map drawn as a diagram with a per-round
sequence view (each kind coloured by what protects it; a record the audit failed in red at its
place in the flow), the training curves, and time and bytes per phase and party, side by side
with a second run and their ratios when ``compare`` names one.
"""
from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from fedhet.parties import runfolder as rf
from fedhet.parties.atomic import write_atomic
from fedhet.parties.ops.runview import view

TEMPLATES = Path(__file__).with_name("templates")


@lru_cache(maxsize=1)
def environment() -> Any:
    """The Jinja2 environment of the report's and the board's templates (autoescaping HTML)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=jinja2.select_autoescape(["html"]), undefined=jinja2.StrictUndefined)
    env.filters["fmt"] = fmt
    return env


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """Plotly's bundle, from the installed package (never a CDN)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def embed_json(obj: Any) -> str:
    """JSON safe inside a ``<script type="application/json">`` element."""
    text = json.dumps(obj, default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _clean(obj: Any) -> Any:
    """NaN and infinities as None (JSON has neither)."""
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def fmt(v: Any) -> str:
    """A number as the page shows it: 6 significant digits (the exact value is in data-value)."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{int(v):,}" if v.is_integer() and abs(v) < 1e15 else f"{v:.6g}"
    return str(v)


def render(run_dir: str | Path, compare: str | Path | None = None, lookup: Callable[[str], Any] | None = None,
           federation: str | Path | None = None) -> str:
    """The report of ``run_dir`` (and ``compare`` beside it) as one HTML string."""
    main = view(run_dir, lookup, federation)
    other = view(compare, lookup) if compare is not None else None
    data = _clean({"run": main, "compare": other, "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
    env = environment()
    return env.get_template("report.html").render(
        run=main, compare=other, data_json=embed_json(data), plotly_js=plotly_js(),
        style=(TEMPLATES / "report.css").read_text(), script=(TEMPLATES / "report.js").read_text(),
        generated=data["generated"])


def write(run_dir: str | Path, compare: str | Path | None = None, lookup: Callable[[str], Any] | None = None,
          federation: str | Path | None = None, out: str | Path | None = None) -> Path:
    """Write ``RUN/report.html`` (or ``out``) atomically; returns its path."""
    run_dir = Path(run_dir)
    if not (run_dir / rf.CONFIG).is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.json)")
    if compare is not None and not (Path(compare) / rf.CONFIG).is_file():
        raise FileNotFoundError(f"--compare {compare} is not a run folder (no config.json)")
    path = Path(out) if out else run_dir / rf.REPORT
    write_atomic(path, render(run_dir, compare, lookup, federation))
    return path
