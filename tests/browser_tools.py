"""The report and board tests' browser: :mod:`benchmarks.browser` (Debian's Chromium through
Playwright), a page that records console errors, and the skip when no browser is here."""
from __future__ import annotations

import pytest

from benchmarks.browser import browser, board_server, chromium_path, nonblank

__all__ = ["Page", "board_server", "browser", "needs_browser", "nonblank"]


def skip_reason() -> str | None:
    if chromium_path() is None:
        return ("no Chromium on this machine: install Debian's `chromium` (apt-get install chromium; .ci/run does) "
                "or point FEDHET_CHROMIUM at one")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (it is in the dev extra: pip install -e '.[dev]')"
    return None


class Page:
    """A page that records console errors and uncaught exceptions."""

    def __init__(self, b, width: int = 1300, height: int = 900) -> None:
        self.page = b.new_page(viewport={"width": width, "height": height})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def close(self) -> None:
        self.page.close()


def needs_browser(test):
    """A test that drives the browser: the system tier (``browser`` marker), skipped with the
    reason when no browser is here."""
    return pytest.mark.browser(pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))(test))
