"""Debian's Chromium, driven by Playwright (never a browser Playwright downloads), and the board
served on a port the OS picks: what ``report_screens.py`` takes its screenshots with and the
report and board tests (tests/test_report.py) load their pages in."""
from __future__ import annotations

import io
import os
import shutil
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# Without the background-networking flags Chromium keeps dialling Google's hosts, which a closed
# network refuses (noise, and seconds of start-up).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def chromium_path() -> str | None:
    """The system's Chromium: $FEDHET_CHROMIUM, else `chromium` / `chromium-browser` on PATH."""
    for c in (os.environ.get("FEDHET_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser"),
              "/usr/bin/chromium"):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


@contextmanager
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def nonblank(png: bytes, min_fraction: float = 0.01) -> bool:
    """True when at least ``min_fraction`` of the image's pixels differ from its commonest colour."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    colours = img.getcolors(maxcolors=img.width * img.height) or []
    if not colours:
        return False
    commonest = max(colours)[0]
    return 1 - commonest / (img.width * img.height) >= min_fraction


@contextmanager
def board_server(runs_dir: Path, token: str, refresh_s: float = 0.25) -> Iterator[str]:
    """The board's ASGI app under uvicorn in a thread, on a port the OS picked; yields its base URL."""
    import uvicorn

    from fedhet.algorithms.registry import get_algorithm
    from fedhet.parties.ops.board import app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app(runs_dir, token, get_algorithm, refresh_s=refresh_s),
                                           log_level="warning", access_log=False))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    while not server.started:   # an event of the server, not a deadline
        if not t.is_alive():
            raise RuntimeError("the board's server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(30)
        sock.close()
