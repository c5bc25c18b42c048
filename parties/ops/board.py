"""``fedhet board [--runs DIR]``: a read-only local web page of the runs under DIR.

It lists every run folder with its live state (each party's ``status.json``: state, step, current
metrics, elapsed time and ETA), refreshing itself while runs go on, and links each run to its
report (:mod:`fedhet.parties.ops.report`), rendered on the fly.

Safety: the server binds 127.0.0.1 unless told otherwise, answers only GET, never writes, and
every request must carry the random token printed at start (``?token=...``; the page passes it on
to its own requests).  A run path in a URL must name a run folder under DIR: nothing outside DIR is
ever read.
"""
from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Callable

from fedhet.parties import runfolder as rf
from fedhet.parties.ops.runview import find_runs, status

REFRESH_S = 1.0   # how often the page asks for the runs' state


def app(runs_dir: str | Path, token: str, lookup: Callable[[str], Any] | None = None,
        refresh_s: float = REFRESH_S) -> Any:
    """The board as an ASGI application (Starlette)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    from fedhet.parties.ops.report import embed_json, environment, render

    root = Path(runs_dir).resolve()

    def allowed(request: Request) -> bool:
        return secrets.compare_digest(request.query_params.get("token", ""), token)

    def denied() -> Response:
        return PlainTextResponse("forbidden: open the address `fedhet board` printed (it carries the token)",
                                 status_code=403)

    def run_path(rel: str) -> Path | None:
        p = (root / rel).resolve()
        if (p == root or root in p.parents) and (p / rf.CONFIG).is_file():
            return p
        return None

    def runs() -> list[dict]:
        out = []
        for d in find_runs(root):
            st = status(d)
            st["id"] = d.relative_to(root).as_posix()
            st.pop("run", None)
            out.append(st)
        out.sort(key=lambda s: -s["mtime"])
        return out

    async def index(request: Request) -> Response:
        if not allowed(request):
            return denied()
        page = environment().get_template("board.html").render(
            root=str(root), config_json=embed_json({"token": token, "refresh_ms": int(refresh_s * 1000)}))
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def api_runs(request: Request) -> Response:
        if not allowed(request):
            return denied()
        return JSONResponse({"root": str(root), "runs": runs()}, headers={"Cache-Control": "no-store"})

    async def report(request: Request) -> Response:
        if not allowed(request):
            return denied()
        p = run_path(request.path_params["run"])
        if p is None:
            return PlainTextResponse("no such run folder under the board's folder", status_code=404)
        cmp = request.query_params.get("compare")
        q = run_path(cmp) if cmp else None
        if cmp and q is None:
            return PlainTextResponse("no such run folder to compare with", status_code=404)
        return HTMLResponse(render(p, q, lookup), headers={"Cache-Control": "no-store"})

    return Starlette(routes=[Route("/", index), Route("/api/runs", api_runs),
                             Route("/report/{run:path}", report)])


def serve(runs_dir: str | Path, host: str = "127.0.0.1", port: int = 8765, lookup: Callable[[str], Any] | None = None,
          token: str | None = None, announce: Callable[[str], None] = print) -> None:
    """Run the board until interrupted; ``announce`` gets the address with its token."""
    import uvicorn

    token = token or secrets.token_urlsafe(18)
    config = uvicorn.Config(app(runs_dir, token, lookup), host=host, port=port, log_level="warning",
                            access_log=False)
    server = uvicorn.Server(config)
    announce(f"fedhet board: runs under {Path(runs_dir).resolve()}; open http://{host}:{port}/?token={token} "
             "(read-only; Ctrl-C stops it)")
    server.run()
