"""The browser tests: Playwright (the Python package) driving Debian's Chromium, which ``make test``
installs once (``/usr/bin/chromium``; no browser download), against a real agent
(tests/integration/conftest.py). Screenshots go to ``$GPUFRAC_ARTIFACTS`` when it is set, else to
the test's temporary directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import agent, tenant_agent  # noqa: F401 - fixtures used here

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")  # not longer: Playwright's loop runs while it lives, and
def chromium() -> Iterator[Any]:  # asyncio.run() in later tests refuses to run beside it
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no {CHROMIUM}: make test installs it (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


class Page:
    """A browser tab with what its console and script said."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def _console(self, msg: Any) -> None:
        if msg.type in ("error", "warning"):
            self.errors.append(f"{msg.type}: {msg.text} ({msg.location.get('url', '')})")


@pytest.fixture
def tab(chromium: Any) -> Iterator[Page]:
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = Page(context.new_page())
    page.page.set_default_timeout(20_000)
    yield page
    context.close()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """Where screenshots go: ``$GPUFRAC_ARTIFACTS`` (kept), else the test's temporary directory."""
    where = Path(os.environ.get("GPUFRAC_ARTIFACTS") or tmp_path / "screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where
