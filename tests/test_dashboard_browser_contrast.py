"""The demo's sibling stage from the demo run alone, in a real browser: on an empty run log
the Learn page's "Run the demo" starts sample_graphs/demo.yaml as a newcomer does (its
`contrast: semantic-nosibling` makes the run write the sibling-blind gradients beside its
own on the same forward pass); once it has finished, "Without siblings" shows for the tour's
example both gradients `note` received, with siblings and without, each with the backward
prompt that wrote it, and offers no paired run: the log holds one run. Same server, browser
and checks as tests/support/browser.py; the demo button uses the scripted backend
(SEMBACK_DEMO_BACKEND), so the run takes seconds. Screenshot: learn-contrast
(test-artifacts/screenshots/)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.browser import SHOTS, expect, no_script_ran, serve, settle
from tests.support.runlog import rows

pytestmark = pytest.mark.browser

RUN_TIMEOUT = 180.0  # s: the scripted demo, an engine process on two shared cores


@dataclass(frozen=True)
class EmptyLog:
    db: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("browser-contrast"),
                     {"SEMBACK_DEMO_BACKEND": "scripted"},
                     build=lambda folder: EmptyLog(folder / "runs.duckdb"))


def finished_runs(db: Path) -> list[tuple]:
    if not db.exists():
        return []
    try:
        return rows(db, "SELECT run_id, method, status FROM runs")
    except Exception:  # the run's writer holds the file: read it again shortly
        return []


def wait_for_the_demo(db: Path) -> tuple[str, str, str]:
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        runs = finished_runs(db)
        if runs and runs[0][2] != "running":
            return runs[0]
        time.sleep(1.0)
    pytest.fail(f"the demo did not finish within {RUN_TIMEOUT:.0f} s: {finished_runs(db)}")


def test_the_demo_run_alone_shows_both_gradients_in_the_sibling_stage(server, page):
    base, log = server
    page.goto(f"{base}/learn")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    main.get_by_role("button", name="Run the demo").click()
    run, method, status = wait_for_the_demo(log.db)
    assert (method, status) == ("semantic", "finished")
    pairs = rows(log.db, """
        SELECT c.example_id, g.content, c.content, c.method FROM gradients c
        JOIN gradients g ON g.run_id = c.run_id AND g.step = c.step
             AND g.example_id = c.example_id AND g.node_id = c.node_id
             AND g.from_node_id = c.from_node_id AND g.kind = 'gradient'
        WHERE c.run_id = ? AND c.step = 1 AND c.kind = 'contrast' AND c.node_id = 'note'
        ORDER BY c.example_id""", run)
    assert pairs, "the demo run wrote no sibling-blind gradient for note"
    example, mine, theirs, blind = pairs[0]
    assert blind == "semantic-nosibling"

    page.goto(f"{base}/learn?run={run}&step=1&example={example}&tour=Without+siblings")
    settle(page)
    body = main.inner_text()
    assert "No second run: this run made both calls." in body
    assert "right without (semantic-nosibling" in body
    for gradient in (mine, theirs):  # each in its own column, as the run log holds it
        expect(main.locator("code").filter(has_text=gradient.strip()[:60]).first).to_be_visible()
    expect(main.get_by_text("backward prompt with siblings")).to_be_visible()
    expect(main.get_by_text("backward prompt without siblings")).to_be_visible()
    expect(main.get_by_role("button", name="Start the paired run")).to_have_count(0)
    assert rows(log.db, "SELECT count(*) FROM runs") == [(1,)]
    assert not page.locator("[data-testid='stException']").count()
    page.screenshot(path=str(SHOTS / "learn-contrast.png"), full_page=True)
    no_script_ran(page)
