"""The Runs page at 1,400 px while a run started from the dashboard runs, in a real
browser (same server, browser and checks as tests/support/browser.py):
the running job's progress is on the first screen, above the runs table, and the table's
calls, tokens and cost columns are in view beside the demo's generated run id and its
models, with no sideways scrolling. Screenshot: runs-1400 (test-artifacts/screenshots/,
and the test's tmp folder)."""

from __future__ import annotations

import io
import re
import time

import pytest

from dashboard import jobs
from tests.support.browser import SHOTS, expect, no_script_ran, open_page, serve, settle

pytestmark = pytest.mark.browser

WIDTH, HEIGHT = 1400, 900  # a laptop's window
HEADER = 35  # px: the grid's header row
# the demo's model: the scripted default reply, slowly (blocking: one call at a time), so
# that the run is still running while the page is read
RESPONDER = """
import time

def slow():
    def respond(request):
        time.sleep(0.3)
        return None
    return respond
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("browser-runs"))


@pytest.fixture
def page(browser):
    with open_page(browser, WIDTH, HEIGHT) as tab:
        yield tab


@pytest.fixture
def running_demo(server, monkeypatch, tmp_path):
    """The demo graph started as the Runs page starts a run (a background job of the
    server's run log), with the embedded pair's model names and a generated run id, on a
    slow scripted model; stopped at teardown."""
    _, log = server
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(log.db.parent / "jobs"))  # the server's
    responder = tmp_path / "slow_model.py"
    responder.write_text(RESPONDER)
    job = jobs.start(jobs.RunSpec(
        graph=str(jobs.DEMO_GRAPH), db=str(log.db), backend="scripted", steps=3,
        model="qwen2.5-coder-0.5b", optimizer_model="qwen2.5-coder-1.5b",
        extra=["--scripted-responder", f"{responder}:slow"]))
    yield job
    jobs.stop(job)
    jobs.wait(job, 30)


def listed_runs(grid) -> list[str]:
    """The run ids in the grid's accessible copy of its canvas."""
    return grid.locator("table tbody tr").evaluate_all(
        "rows => rows.map(r => r.children[0] ? r.children[0].innerText.trim() : '')")


def wait_listed(page, grid, run_id: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while run_id not in listed_runs(grid):
        assert time.monotonic() < deadline, f"{run_id} is not in the runs table"
        page.wait_for_timeout(500)


def header_boxes(page, grid) -> dict[str, tuple[float, float]]:
    """Each column header in view, name -> (left, right) in page pixels. The grid draws on
    a canvas: its accessible copy names the columns in view, in order, and the header's
    column separators (drawn in the grid's border colour across the whole header row) are
    read from a screenshot of that row. A column cut off by the grid's edge ends there."""
    from PIL import Image

    names = grid.locator("table thead th").all_inner_texts()
    box = grid.bounding_box()
    frame = grid.locator("[data-testid='stDataFrameResizable']")
    border = tuple(int(v) for v in re.findall(r"\d+", frame.evaluate(
        "e => getComputedStyle(e).borderTopColor"))[:3])
    shot = Image.open(io.BytesIO(page.screenshot(clip={
        "x": box["x"], "y": box["y"], "width": box["width"], "height": HEADER}))).convert("RGB")
    # a separator: the border colour from top to bottom of the header row (the frame's own
    # left border and the row-selection column's right edge come first)
    lines = [x for x in range(1, shot.width - 1)
             if all(shot.getpixel((x, y)) == border for y in range(4, HEADER - 3))]
    assert len(lines) >= len(names), (lines, names)
    edges = [box["x"] + x for x in lines[:len(names) + 1]]  # each column's left, then right
    edges += [box["x"] + box["width"] - 1] * (len(names) + 1 - len(edges))  # cut off
    return {name: (edges[i], edges[i + 1]) for i, name in enumerate(names)}


def test_runs_page_at_1400_px_shows_the_running_demo_and_the_cost_columns(
        server, page, running_demo, tmp_path):
    base, log = server
    job = running_demo
    page.goto(f"{base}/?run={job.run_id}")  # the page selects a run it starts
    settle(page)
    main = page.locator("[data-testid='stMain']")
    grid = main.locator("[data-testid='stDataFrame']").first
    wait_listed(page, grid, job.run_id, 60)  # in the run log once its process starts
    page.reload()  # the page opened while the demo runs: the grid sizes its columns to it
    settle(page)
    wait_listed(page, grid, job.run_id, 30)
    card = main.get_by_text(re.compile(rf"^{re.escape(job.run_id)} · running"))
    expect(card).to_be_visible(timeout=30_000)
    progress = main.locator("[data-testid='stProgress']").first
    expect(progress).to_be_visible()
    assert jobs.poll(job), "the demo ended before the page was read"
    settle(page)

    # the progress: on the first screen, above the table
    bar, table = progress.bounding_box(), grid.bounding_box()
    assert bar["y"] + bar["height"] <= HEIGHT, (bar, "below the fold")
    assert bar["y"] + bar["height"] <= table["y"], (bar, table)
    # calls, tokens and cost: whole, inside the table's visible width, unscrolled
    assert grid.locator(".dvn-scroller").evaluate("s => s.scrollLeft") == 0
    heads = header_boxes(page, grid)
    for name in ("calls", "tokens", "cost (USD)"):
        assert name in heads, f"the {name} column is out of view: {list(heads)}"
        left, right = heads[name]
        assert table["x"] < left < right < table["x"] + table["width"] - 1, (name, heads)
        assert right - left >= 40, (name, heads)  # wide enough to read
    assert list(heads)[0] == "run"
    assert not page.locator("[data-testid='stException']").count()
    for path in (SHOTS / "runs-1400.png", tmp_path / "runs-1400.png"):
        page.screenshot(path=str(path))
    no_script_ran(page)
