"""The drawing agrees with the verdict, in a real browser (same server, browser and checks
as tests/support/browser.py, with a run log of its own).

The run: tests/support/tie_demo.yaml (the demo before its rebuild, where `note` and
`thing` both read the sentence) on tests/support/tie_script.py, a scripted model whose
updates repair `note` and `thing` each in part. On the validation examples no gradient
fixes anything and the two nodes' edits alone each fix some: blame ties on them, from the
edit probes (the issue's case: the banner said "tie on note and thing" while every node
read "fixes 0/23", the gradient count, and the drawing zoomed in on the same update).

After a blame job started from the Graph page ends, the drawing's node labels and colours
(read from the vis DataSet inside the component's frame) are the ones `engine blame
--json` gives for the run, the two tied nodes share the one tie colour, and the drawing's
view (scale and centre) is what it was before the job: the update changed no zoom; nor
does the update a second blame job ends with, the page already drawing the blame (where
the old drawing zoomed in by itself). The Learn tour's blame stage draws the same labels. Screenshots: graph-blame-tie-before,
graph-blame-tie, learn-blame-tie (test-artifacts/screenshots/)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from dashboard.views.colors import BLAMED, TIED, reds
from tests.support.browser import ROOT, SHOTS, expect, no_script_ran, serve, settle

pytestmark = pytest.mark.browser

RUN = "tie"
MODEL = f"{ROOT / 'tests' / 'support' / 'tie_script.py'}:tie_responder"
JOB_TIMEOUT = 120_000  # ms: an engine process on two shared cores


@dataclass(frozen=True)
class TieLog:
    db: Path


def build_tie_log(folder: Path) -> TieLog:
    db = folder / "runs.duckdb"
    done = subprocess.run(
        [sys.executable, "-m", "engine", "run",
         str(ROOT / "tests" / "support" / "tie_demo.yaml"),
         "--backend", "scripted", "--scripted-responder", MODEL, "--db", str(db),
         "--run-id", RUN], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return TieLog(db)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("browser-blame-drawing"), build=build_tie_log)


def ended_blames(db: Path) -> int:
    """Blame jobs the page started that have ended (their records, beside the run log)."""
    records = [json.loads(p.read_text()) for p in (db.parent / "jobs").rglob("*.json")]
    return sum(r.get("kind") == "blame" and r.get("returncode") is not None for r in records)


def blame_json(db: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "engine", "blame", RUN, "--db", str(db),
                           "--step", "1", "--examples", "val", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def expected_nodes(report: dict) -> dict[str, tuple[str, str]]:
    """node -> (label, fill) that the drawing must show, from `blame --json` alone: the
    count of the probes the verdict weighed (`evidence`), the verdict's word for the node,
    and its colour (named: deep red; tied: the tie colour; else a rose as pale as its
    share)."""
    kind = report["evidence"]
    verdict = report["verdict"]
    shown = {}
    for n in report["nodes"]:
        if kind == "edit":
            e = n["edit"]
            flips, counted = e["flips"], e["probed"] - e["errors"] - e["seen"]
            what = "edit fixes"
        else:
            flips, counted = n["flips"], n["probed"] - n["errors"]
            what = "∇ fixes"
        word, fill = "", reds(0.5 * flips / counted)
        if n["node"] == verdict["node"]:
            word, fill = "blamed · ", BLAMED
        elif n["node"] in verdict["tied"]:
            word, fill = "tie · ", TIED
        shown[n["node"]] = (f"{n['node']} · {word}{what} {flips}/{counted}", fill)
    return shown


def drawing(page):
    """The component's frame (window.network is set once it has drawn)."""
    page.wait_for_function("""() => [...document.querySelectorAll('iframe')].some(f => {
        try { return f.contentWindow.network && f.contentWindow.graphSpec; }
        catch (e) { return false; } })""", timeout=30_000)
    return next(f for f in page.frames if f.evaluate("typeof network") == "object")


def drawn_nodes(frame) -> dict[str, tuple[str, str]]:
    """node -> (label, fill) as vis-network holds them."""
    return {n["id"]: (n["label"], n["color"]["background"]) for n in frame.evaluate(
        "() => network.body.data.nodes.get()") if not n["id"].startswith("__")}


def view(frame) -> tuple[float, float, float]:
    return tuple(frame.evaluate("""() => { const p = network.getViewPosition();
                                           return [network.getScale(), p.x, p.y]; }"""))


def inside(frame) -> list[str]:
    """Nodes whose box lies wholly inside the canvas (none cut off)."""
    return frame.evaluate("""() => network.body.nodeIndices.filter(id => {
        const b = network.getBoundingBox(id), c = network.canvas.frame.canvas;
        const tl = network.canvasToDOM({x: b.left, y: b.top});
        const br = network.canvasToDOM({x: b.right, y: b.bottom});
        return tl.x >= 0 && tl.y >= 0 && br.x <= c.clientWidth && br.y <= c.clientHeight;
    })""")


def test_after_a_blame_job_the_drawing_matches_blame_json_and_keeps_its_view(server, page):
    base, log = server
    page.goto(f"{base}/graph?run={RUN}&step=1")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("No probes at step 1 yet")).to_be_visible()
    frame = drawing(page)
    before = view(frame)
    assert all("fixes" not in label for label, _ in drawn_nodes(frame).values())
    assert len(inside(frame)) == 5  # text, note, thing, answer, loss
    page.screenshot(path=str(SHOTS / "graph-blame-tie-before.png"), full_page=True)

    main.get_by_text("failing validation examples").click()
    settle(page)
    page.evaluate("window.__same_page = true")
    main.get_by_role("button", name="Check the blame").click()
    expect(main.get_by_text(f"blame {RUN} finished in")).to_be_visible(timeout=JOB_TIMEOUT)
    settle(page)
    expect(main.get_by_text("The probes tie on")).to_be_visible(timeout=30_000)
    frame.wait_for_function("() => network.body.data.nodes.get().some("
                            "n => n.label.includes('fixes'))", timeout=30_000)
    page.wait_for_timeout(1_000)  # any later rerun has drawn by now
    settle(page)
    assert page.evaluate("window.__same_page === true"), "the page was reloaded"
    assert drawing(page) == frame  # the same drawing, updated in place

    report = blame_json(log.db)
    assert report["evidence"] == "edit" and report["verdict"]["tied"] == ["note", "thing"]
    assert all(n["flips"] == 0 for n in report["nodes"])  # no gradient fixed one
    expected = expected_nodes(report)
    drawn = drawn_nodes(frame)
    assert drawn == expected
    tie = {node for node, (_, fill) in drawn.items() if fill == TIED}
    assert tie == {"note", "thing"}  # a tie, drawn as a tie
    banner = main.get_by_text("The probes tie on").inner_text()
    for node, n in ((n["node"], n) for n in report["nodes"] if n["node"] in tie):
        assert f"{node} {n['edit']['flips']}/{n['edit']['probed']}" in banner

    after = view(frame)
    assert after == pytest.approx(before, rel=1e-9, abs=1e-6), (before, after)
    assert len(inside(frame)) == 5  # the longer labels still show whole

    # a second blame job while the page already draws the blame: the update it ends with
    # (where the old drawing zoomed in on its own, cutting boxes off) keeps the view too
    main.get_by_text("failing validation examples").click()
    settle(page)
    main.get_by_role("button", name="Check the blame").click()
    deadline = time.monotonic() + JOB_TIMEOUT / 1000
    while ended_blames(log.db) < 2:
        assert time.monotonic() < deadline, "the second blame job did not end"
        page.wait_for_timeout(200)
    expect(main.get_by_text(f"blame {RUN} running")).to_have_count(0, timeout=30_000)
    settle(page)
    page.wait_for_timeout(1_000)
    settle(page)
    assert drawn_nodes(frame) == expected  # the same probes again: the same counts
    again = view(frame)
    assert again == pytest.approx(before, rel=1e-9, abs=1e-6), (before, again)
    assert len(inside(frame)) == 5
    assert not page.locator("[data-testid='stException']").count()
    frame.locator("canvas").scroll_into_view_if_needed()
    page.mouse.move(1390, 1790)  # off every widget: no help tooltip over the picture
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "graph-blame-tie.png"), full_page=True)

    page.goto(f"{base}/learn?run={RUN}&step=1&tour=Check+the+blame")
    settle(page)
    expect(main.get_by_text("The probes tie on")).to_be_visible()
    assert drawn_nodes(drawing(page)) == expected
    page.screenshot(path=str(SHOTS / "learn-blame-tie.png"), full_page=True)
    no_script_ran(page)
