"""The dashboard in a real browser, for tests/test_dashboard_browser*.py: Debian's chromium
driven by Playwright against `streamlit run dashboard/app.py` on a free localhost port.

`serve` (or `dashboard`) starts the dashboard on a run log and stops it at teardown; the
`browser` and `page` fixtures (tests/conftest.py) are `chromium()` and `open_page()`; every
page test ends with `no_script_ran`: no HTML from a model ran and nothing was fetched from
outside the machine. Screenshots go to SHOTS (test-artifacts/screenshots/)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.dashboard_log import build_run_log
from tests.support.models import CHROMIUM

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-artifacts" / "screenshots"
LOCAL = ("http://localhost", "http://127.0.0.1", "data:", "blob:", "about:")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
START_SECONDS = 60  # for streamlit to answer its health check

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - the browser marker skips the tests without it
    expect = sync_playwright = None

__all__ = ["CHROMIUM", "FLAGS", "LOCAL", "ROOT", "SHOTS", "Dashboard", "chromium", "dashboard",
           "expect", "free_port", "no_script_ran", "open_page", "serve", "settle"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dashboard:
    """`streamlit run dashboard/app.py` on `db` ($SEMBACK_DB; its jobs in `folder`/jobs, its
    output in `folder`/server.log, `env` added to this process's environment), at `url`
    once it answers; `stop()` ends it (again: nothing)."""

    def __init__(self, db: Path | str, folder: Path, env: Mapping[str, str] | None = None):
        port = free_port()
        streamlit = Path(sys.executable).with_name("streamlit")
        cmd = [str(streamlit)] if streamlit.exists() else [sys.executable, "-m", "streamlit"]
        cmd += ["run", "dashboard/app.py", "--server.headless", "true", "--server.port",
                str(port), "--browser.gatherUsageStats", "false",
                "--server.fileWatcherType", "none"]
        env = {**os.environ, "SEMBACK_DB": str(db), "SEMBACK_JOBS_DIR": str(folder / "jobs"),
               **(env or {})}
        self.log = folder / "server.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT)
        self.url = f"http://localhost:{port}"
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as reply:
                    if reply.read().decode().strip() == "ok":
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail("streamlit did not start:\n" + self.log.read_text())
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()


@contextmanager
def dashboard(db: Path | str, folder: Path, env: Mapping[str, str] | None = None
              ) -> Iterator[Dashboard]:
    """The dashboard on `db` while the block runs (see Dashboard)."""
    app = Dashboard(db, folder, env)
    try:
        yield app
    finally:
        app.stop()


def serve(folder: Path, env: Mapping[str, str] | None = None,
          build: Callable[[Path], Any] = build_run_log) -> Iterator[tuple[str, Any]]:
    """For a fixture's `yield from`: build the run log in `folder` (`build(folder)`, whose
    result has `.db`; by default tests/support/dashboard_log.py's), start the dashboard on
    it (with `env` added), yield (base URL, that result), stop the server."""
    log = build(folder)
    with dashboard(log.db, folder, env) as app:
        yield app.url, log


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium (Debian's, no sandbox, nothing fetched in the background)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@contextmanager
def open_page(browser: Any, width: int = 1400, height: int = 1800) -> Iterator[Any]:
    """A tab in a context of its own: a dialog is dismissed (an alert() would mean a payload
    ran), and `tab.outside` collects the requests that would leave the machine."""
    context = browser.new_context(viewport={"width": width, "height": height})
    tab = context.new_page()
    tab.on("dialog", lambda d: d.dismiss())
    tab.outside = []  # offline: there must be none
    tab.on("request", lambda r: r.url.startswith(LOCAL) or tab.outside.append(r.url))
    try:
        yield tab
    finally:
        context.close()


def settle(page, timeout: float = 30_000) -> None:
    """Wait until the script finished and no placeholder is left."""
    page.wait_for_selector("[data-test-script-state='notRunning']", timeout=timeout)
    page.wait_for_function("!document.querySelector('[data-testid=\"stSkeleton\"]')",
                           timeout=timeout)
    page.wait_for_timeout(300)


def no_script_ran(page) -> None:
    """The payload's onerror never ran, in the page or any iframe; nothing was fetched
    from outside (the dashboard works offline)."""
    for frame in page.frames:
        assert frame.evaluate("typeof window.__xss") == "undefined", frame.url
    assert page.outside == []
