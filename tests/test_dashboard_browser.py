"""The dashboard in a real browser: Debian's chromium driven by Playwright against
`streamlit run dashboard/app.py` on a free localhost port.

Opens deep links to the inspector and Step through (the graph drawing, clicks on it
and every page's deep link are in test_dashboard_browser_graph.py), and checks that the
HTML payload in a model reply did not run (`window.__xss` stays undefined in the page
and in every iframe) while its literal text is visible. Saves a screenshot of every page under test-artifacts/screenshots/.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.dashboard_log import ADDED_WORDS, HINT_A_OUTPUT, build_run_log

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "test-artifacts" / "screenshots"
LOCAL = ("http://localhost", "http://127.0.0.1", "data:", "blob:", "about:")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

pytestmark = pytest.mark.browser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("browser"))


def serve(folder: Path, env: dict[str, str] | None = None, build=build_run_log):
    """Build the run log in `folder` (`build(folder)`, whose result has `.db`), start the
    dashboard on it (with `env` added), yield (base URL, that result), stop the server."""
    log = build(folder)
    port = free_port()
    streamlit = Path(sys.executable).with_name("streamlit")
    cmd = [str(streamlit)] if streamlit.exists() else [sys.executable, "-m", "streamlit"]
    cmd += ["run", "dashboard/app.py", "--server.headless", "true", "--server.port", str(port),
            "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    env = {**os.environ, "SEMBACK_DB": str(log.db), "SEMBACK_JOBS_DIR": str(folder / "jobs"),
           **(env or {})}
    out = open(folder / "server.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://localhost:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as reply:
                if reply.read().decode().strip() == "ok":
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("streamlit did not start:\n" + (folder / "server.log").read_text())
        time.sleep(0.2)
    yield base, log
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    out.close()


@pytest.fixture(scope="module")
def browser(server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1800})
    tab = context.new_page()
    tab.on("dialog", lambda d: d.dismiss())  # an alert() would mean the payload ran
    tab.outside = []  # requests that would leave the machine (offline: there must be none)
    tab.on("request", lambda r: r.url.startswith(LOCAL) or tab.outside.append(r.url))
    yield tab
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


def test_inspector_deep_link_shows_the_payload_as_text(server, page):
    base, log = server
    page.goto(f"{base}/inspect?run={log.semantic}&step=1&example={log.example}"
              "&node=hint_a")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("Node hint_a", exact=True)).to_be_visible()
    body = main.inner_text()
    assert HINT_A_OUTPUT in body  # the literal text, tags and all
    assert "The input hint_a should" in body  # the gradient from `final`
    added = main.locator(".semback-diff ins")
    expect(added.first).to_be_visible()
    assert ADDED_WORDS.split()[0] in " ".join(added.all_inner_texts())
    assert main.locator("img[src='x']").count() == 0
    page.wait_for_timeout(500)  # an onerror handler would have fired by now
    no_script_ran(page)
    page.screenshot(path=str(SHOTS / "inspect.png"))


def test_step_through_next_and_previous(server, page):
    base, log = server
    page.goto(f"{base}/step?run={log.semantic}&step=1&example={log.example}")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("1 / 8: Forward: hint_a")).to_be_visible()
    for label in ("2 / 8: Forward: hint_b", "3 / 8: Forward: final",
                  "4 / 8: Loss on final's output"):
        main.get_by_role("button", name="Next ▶").click()
        expect(main.get_by_text(label)).to_be_visible(timeout=30_000)
        settle(page)
    page.screenshot(path=str(SHOTS / "step.png"))
    main.get_by_role("button", name="◀ Previous").click()
    expect(main.get_by_text("3 / 8: Forward: final")).to_be_visible(timeout=30_000)
    no_script_ran(page)


@pytest.mark.parametrize("name,path", [
    ("runs", "/"), ("curves", "/curves"), ("compare", "/compare"), ("learn", "/learn"),
])
def test_page_screenshots(server, page, name, path):
    base, log = server
    page.goto(f"{base}{path}?run={log.semantic}&step=1&example={log.example}&node=hint_a")
    settle(page)
    expect(page.locator("[data-testid='stMain'] h1").first).to_be_visible()
    assert not page.locator("[data-testid='stException']").count()
    page.screenshot(path=str(SHOTS / f"{name}.png"))
    assert (SHOTS / f"{name}.png").stat().st_size > 10_000
    no_script_ran(page)


def test_enter_in_a_new_run_field_starts_no_run(server, page):
    """Enter in a field of the New-run form neither starts a run nor estimates one: only
    the form's buttons do."""
    base, log = server
    page.goto(f"{base}/?run={log.semantic}")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    for label in ("Data directory", "Model", "Steps"):
        field = main.get_by_label(label, exact=True)
        if not field.is_visible():
            main.get_by_text("New run", exact=True).click()
        field.fill("7" if label == "Steps" else "typed")
        field.press("Enter")
        settle(page)
        page.wait_for_timeout(1500)  # a started job would have written its record by now
        started = list((log.db.parent / "jobs").rglob("*.json"))
        assert not started, f"Enter in {label} started {started}"
    expect(main.get_by_text("Background runs")).to_have_count(0)
    expect(main.get_by_text(re.compile(r"^Started \S+ \(process"))).to_have_count(0)
    expect(main.get_by_role("button", name="Start run")).to_be_visible()
    page.screenshot(path=str(SHOTS / "runs-new-run-enter.png"), full_page=True)


def test_inline_diff_keeps_removed_and_added_words_apart(server, page):
    """gtbp's 'actual → target' diff in the inspector: the struck-out output and the
    target read as two words, not one."""
    import duckdb

    base, log = server
    with duckdb.connect(str(log.db), read_only=True) as con:
        actual, target = con.execute(
            "SELECT o.output_text, g.content FROM node_outputs o JOIN gradients g USING "
            "(run_id, step, example_id, node_id) WHERE o.run_id = ? AND o.step = 1 AND "
            "o.example_id = ? AND o.node_id = 'final' AND g.kind = 'aggregate'",
            [log.gtbp, log.example]).fetchone()
    assert actual.split() and target.split() and actual != target
    page.goto(f"{base}/inspect?run={log.gtbp}&step=1&example={log.example}&node=final")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    diff = main.locator(".semback-diff").filter(has=page.locator("del")).first
    expect(diff).to_be_visible()
    assert diff.locator("del").inner_text() == actual
    assert diff.locator("ins").inner_text() == target
    assert diff.inner_text() == f"{actual} {target}"  # not "{actual}{target}"
    diff.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "inline-diff.png"))


def test_trace_link_opens_the_trace_and_the_address_says_so(server, page):
    """Examples → 'Its trace (every call)': the trace shows and the address carries
    view=trace, so Copy link reopens the trace, not the table."""
    base, log = server
    page.goto(f"{base}/examples?run={log.semantic}&step=1&example={log.example}&view=table")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    main.get_by_role("link", name="Its trace (every call)").click()
    expect(main.get_by_text(f"Trace of example {log.example} at step 1")).to_be_visible(
        timeout=30_000)
    settle(page)
    assert "view=trace" in page.url and "view=table" not in page.url, page.url
    page.reload()  # what a copied link reopens
    settle(page)
    expect(main.get_by_text(f"Trace of example {log.example} at step 1")).to_be_visible()
    page.screenshot(path=str(SHOTS / "examples-trace.png"), full_page=True)
