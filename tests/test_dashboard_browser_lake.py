"""One run log for a team, in a real browser: four engine processes, each in its
own working folder with its own HOME, write one fresh lake (a Postgres catalog and a
Parquet data folder) at once; three short runs finish, the fourth is slowed by its
scripted model and keeps running. The dashboard, started on the lake's URL, lists the
runs of all four processes on its Runs page while the fourth runs, and shows the
fourth's newest step once it commits, through its own live refresh: no reload (same
server, browser and checks as tests/support/browser.py). Screenshot: runs-lake
(test-artifacts/screenshots/, and the test's tmp folder)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.browser import ROOT, SHOTS, expect, no_script_ran, serve, settle
from tests.support.runlog import rows

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

GRAPH = ROOT / "sample_graphs" / "diamond.yaml"
QUICK = ("lake-a", "lake-b", "lake-c")  # run ids: three runs that finish
SLOW = "lake-slow"  # ... and one that is still running
SLOW_STEPS = 60
DELAY = 0.15  # s the slow run's model takes per call (about 3 s a step)
# the slow run's model: the scripted default reply, after a pause (blocking: one call at
# a time)
RESPONDER = f"""
import time

def slow():
    def respond(request):
        time.sleep({DELAY})
        return None
    return respond
"""
SIZES = ["--train", "2", "--val", "2", "--test", "0"]


@dataclass(frozen=True)
class TeamLake:
    db: str  # the lake's URL (what --db and $SEMBACK_DB take)


@pytest.fixture
def server(lake, tmp_path):
    """The dashboard on a fresh lake (conftest's `lake`: PGPASSWORD and SEMBACK_DATA_PATH
    are in this process's environment, which the dashboard inherits)."""
    yield from serve(tmp_path, build=lambda folder: TeamLake(lake))


@pytest.fixture
def writers(lake, tmp_path):
    """start(run_id, *flags) -> a `python -m engine run` process writing into the lake,
    in its own folder with its own HOME and cache; every one is stopped at teardown."""
    started: list[tuple[subprocess.Popen, Path]] = []

    def start(run_id: str, *flags: str) -> subprocess.Popen:
        home = tmp_path / run_id
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"),
               "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        env.pop("SEMBACK_DB", None)
        log = home / "engine.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "engine", "run", str(GRAPH), "--backend", "scripted",
                 "--run-id", run_id, "--db", lake, *SIZES, *flags],
                cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        started.append((proc, log))
        return proc

    start.logs = lambda: "\n".join(f"--- {log}\n{log.read_text()[-3000:]}"
                                   for _, log in started)
    yield start
    for proc, _ in started:
        if proc.poll() is None:
            proc.terminate()  # the engine marks its run 'stopped'
    for proc, _ in started:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def wait_for(what: str, check, timeout: float, logs=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{logs()}")
        time.sleep(0.25)


def newest_step(db: str, run_id: str) -> int | None:
    return rows(db, "SELECT max(step) FROM steps WHERE run_id = ?", run_id)[0][0]


def table(grid) -> dict[str, dict[str, str]]:
    """The Runs table as the page shows it, run id -> {column: cell text}: the grid's
    accessible copy of its canvas (raw values, not the canvas's formatting)."""
    cells = grid.locator("table tr").evaluate_all(
        "rows => rows.map(r => [...r.children].map(c => c.innerText.trim()))")
    if not cells:
        return {}
    head, *body = cells
    return {row[0]: dict(zip(head, row)) for row in body if row}


def test_the_runs_page_over_a_lake_lists_four_writers_and_follows_the_running_one(
        server, page, writers, lake, tmp_path):
    base, _ = server
    responder = tmp_path / "slow_model.py"
    responder.write_text(RESPONDER)
    slow = writers(SLOW, "--steps", str(SLOW_STEPS), "--cache", "off",
                   "--scripted-responder", f"{responder}:slow")
    quick = [writers(run_id, "--steps", "2") for run_id in QUICK]  # all four at once

    wait_for("the three short runs to end", lambda: all(p.poll() is not None for p in quick),
             240, writers.logs)
    assert [p.returncode for p in quick] == [0, 0, 0], writers.logs()
    wait_for("the slow run's first step", lambda: (newest_step(lake, SLOW) or 0) >= 1, 120,
             writers.logs)
    assert slow.poll() is None, writers.logs()
    statuses = dict(rows(lake, "SELECT run_id, status FROM runs"))
    assert statuses == {**dict.fromkeys(QUICK, "finished"), SLOW: "running"}

    page.goto(f"{base}/?run={SLOW}")
    settle(page)
    page.evaluate("window.__same_page = true")
    main = page.locator("[data-testid='stMain']")
    sidebar = page.locator("[data-testid='stSidebar']")
    expect(main.get_by_text(re.compile(r"^4 of 4 runs"))).to_be_visible()
    grid = main.locator("[data-testid='stDataFrame']").first
    wait_for("the table to list the four runs", lambda: set(table(grid)) == {*QUICK, SLOW},
             45)
    listed = table(grid)
    for run_id in QUICK:
        assert (listed[run_id]["status"], listed[run_id]["steps"]) == ("finished", "2")
    assert listed[SLOW]["status"] == "running"
    assert slow.poll() is None, "the slow run ended before the page was read"
    live = sidebar.get_by_text(re.compile(r"live · \d+ of \d+ steps written"))
    expect(live).to_be_visible()
    step_box = sidebar.get_by_role("combobox", name="Step")
    shown = int(step_box.input_value())  # follows the newest step while the run runs
    assert shown >= 1 and int(listed[SLOW]["steps"]) >= shown

    wait_for("the slow run's next step", lambda: newest_step(lake, SLOW) > shown, 60,
             writers.logs)
    newer = newest_step(lake, SLOW)

    def caught_up() -> bool:  # the sidebar's step picker, its live line and the table
        now = [step_box.input_value(), re.search(r"live · (\d+) of", live.inner_text()),
               table(grid).get(SLOW, {}).get("steps", "")]
        now[1] = now[1] and now[1][1]
        return all(str(n or "").isdigit() and int(n) >= newer for n in now)

    # a busy machine (CI, two cores) reruns the page slowly; a page that never follows
    # the lake (a stamp that does not move) fails however long it is given
    wait_for(f"the page to show step {newer} without a reload", caught_up, 45)
    assert page.evaluate("window.__same_page === true"), "the page was reloaded"
    assert slow.poll() is None, "the slow run ended: the page followed a finished run"
    assert table(grid)[SLOW]["status"] == "running"
    assert not page.locator("[data-testid='stException']").count()
    for path in (SHOTS / "runs-lake.png", tmp_path / "runs-lake.png"):
        page.screenshot(path=str(path), full_page=True)
    no_script_ran(page)
