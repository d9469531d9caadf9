"""The graph drawing, deep links on every page, the What if panel and the Fork button in
a real browser (same server, browser and checks as tests/support/browser.py; this module
gets its own server and run log).

- clicking a node in the drawing selects it (sidebar picker, address, page);
- no two boxes overlap on the canvas, every label is one line inside its box, gradient
  edges carry their labels, a hovered node's tooltip shows model HTML as text;
- a deep link to every page keeps its whole state across a reload;
- the What if panel starts a probe and reports it; Fork from here shows its prompt box;
- a running run is followed to its newest step when the step lands, until one is picked.

Screenshots go to test-artifacts/screenshots/, and to docs/img/ when SEMBACK_DOCS_IMG=1
(how the pictures in docs/dashboard.md are made)."""

from __future__ import annotations

import itertools
import os
from urllib.parse import parse_qs, urlparse

import pytest

from tests.support.browser import ROOT, SHOTS, expect, no_script_ran, serve, settle
from tests.support.dashboard_log import HINT_A_OUTPUT, XSS

pytestmark = pytest.mark.browser
DOCS_IMG = ROOT / "docs" / "img"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("browser-graph"))


def params(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}


def shoot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    if os.environ.get("SEMBACK_DOCS_IMG") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_IMG / f"{name}.png"), full_page=True)


def graph_frame(page):
    """The drawing's frame (the component sets window.network when it has drawn)."""
    page.wait_for_function("""() => [...document.querySelectorAll('iframe')].some(f => {
        try { return f.contentWindow.network && f.contentWindow.graphSpec; }
        catch (e) { return false; } })""", timeout=30_000)
    frame = next(f for f in page.frames if f.evaluate("typeof network") == "object")
    element = page.locator("iframe[title*='semback_graph']").first
    return frame, element


def node_on_page(page, name: str) -> tuple[float, float]:
    frame, element = graph_frame(page)
    element.scroll_into_view_if_needed()
    box = element.bounding_box()
    x, y = frame.evaluate("""(id) => { const p = network.getPositions([id])[id];
                                        const d = network.canvasToDOM(p); return [d.x, d.y]; }""",
                          name)
    return box["x"] + x, box["y"] + y


def test_clicking_a_node_in_the_drawing_selects_it(server, page):
    base, log = server
    page.goto(f"{base}/graph?run={log.semantic}&step=1&example={log.example}&node=hint_a")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("Node hint_a", exact=True)).to_be_visible()
    x, y = node_on_page(page, "final")
    page.mouse.click(x, y)
    expect(main.get_by_text("Node final", exact=True)).to_be_visible(timeout=30_000)
    settle(page)
    picker = page.locator("[data-testid='stSidebar']").get_by_role("combobox", name="Node")
    expect(picker).to_have_value("final")
    assert params(page.url)["node"] == "final"
    frame, _ = graph_frame(page)
    assert frame.evaluate("graphSpec.selected") == "final"  # the outline moved too

    # follow the link to the inspector: the gradient from the loss and the diff
    page.get_by_text("Open in the node inspector").click()
    expect(main.get_by_text("Node final", exact=True)).to_be_visible(timeout=30_000)
    settle(page)
    assert params(page.url)["node"] == "final" and params(page.url)["run"] == log.semantic
    expect(main.get_by_text("Gradient from the loss (output gradient)")).to_be_visible()
    expect(main.locator(".semback-diff ins").first).to_be_visible()
    no_script_ran(page)


def test_the_drawing_has_no_overlap_no_clipped_label_and_labelled_gradients(server, page):
    base, log = server
    page.goto(f"{base}/graph?run={log.semantic}&step=1&example={log.example}&node=hint_a")
    settle(page)
    frame, element = graph_frame(page)
    nodes = frame.evaluate("""() => network.body.nodeIndices.map(id => {
        const b = network.getBoundingBox(id), n = network.body.nodes[id];
        const tl = network.canvasToDOM({x: b.left, y: b.top});
        const br = network.canvasToDOM({x: b.right, y: b.bottom});
        return {id, box: [tl.x, tl.y, br.x, br.y], label: n.options.label,
                text: n.labelModule.size.width, width: n.shape.width}; })""")
    size = element.bounding_box()
    assert len(nodes) == 5  # question, hint_a, hint_b, final, loss
    for a, b in itertools.combinations(nodes, 2):
        (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = a["box"], b["box"]
        assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, (a["id"], b["id"])
    for n in nodes:
        x0, y0, x1, y1 = n["box"]
        assert 0 <= x0 and x1 <= size["width"] and 0 <= y0 and y1 <= size["height"], n
        assert "\n" not in n["label"] and n["text"] <= n["width"], n  # one line, inside
    labels = frame.evaluate("""() => Object.values(network.body.edges)
        .filter(e => e.options.label).map(e => [e.fromId, e.toId, e.options.label])""")
    assert ["final", "hint_a", "1× ∇ 82 chars"] in labels or any(
        f == "final" and t == "hint_a" and "× ∇" in text for f, t, text in labels)
    colours = frame.evaluate("""() => network.body.nodeIndices.map(id => [
        network.body.nodes[id].options.color.background, network.body.nodes[id].options.font.color])""")
    from dashboard.views.graph_spec import contrast

    assert all(contrast(fill, text) >= 4.5 for fill, text in colours)
    shoot(page, "graph")


def test_hovering_a_node_shows_the_payload_as_text(server, page):
    base, log = server
    page.goto(f"{base}/graph?run={log.semantic}&step=1&example={log.example}&node=hint_a")
    settle(page)
    frame, _ = graph_frame(page)
    page.mouse.move(*node_on_page(page, "hint_a"))
    tip = frame.locator("div.vis-tooltip")
    expect(tip).to_be_visible(timeout=10_000)
    assert XSS in tip.inner_text()  # shown literally
    assert tip.locator("img").count() == 0
    page.wait_for_timeout(500)
    no_script_ran(page)


# "" is Runs, the default page, at the root; "runs" its name, which opens it too
PAGES = ["", "runs", "graph", "step", "inspect", "examples", "history", "curves", "compare",
         "learn", "traces"]


@pytest.mark.parametrize("path", PAGES)
def test_a_deep_link_keeps_its_whole_state_across_a_reload(server, page, path):
    base, log = server
    page.goto(f"{base}/{path}?run={log.semantic}&step=0&example={log.example}&node=hint_b")
    settle(page)
    assert not page.get_by_text("Page not found").count()
    if path in ("", "runs"):
        expect(page.locator("h1").first).to_have_text("Runs")
    state = params(page.url)
    assert {k: state.get(k) for k in ("run", "step", "node")} == {
        "run": log.semantic, "step": "0", "node": "hint_b"}, state
    page.reload()
    settle(page)
    assert params(page.url) == state
    sidebar = page.locator("[data-testid='stSidebar']")
    expect(sidebar.get_by_role("combobox", name="Node")).to_have_value("hint_b")
    expect(sidebar.get_by_role("combobox", name="Step")).to_have_value("0")
    assert not page.locator("[data-testid='stException']").count()
    no_script_ran(page)


def test_what_if_and_fork_on_a_deep_link(server, page):
    base, log = server
    page.goto(f"{base}/inspect?run={log.semantic}&step=1&example={log.example}&node=hint_a")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("What if", exact=True)).to_be_visible()
    area = main.get_by_label("Replace this node's output with")
    expect(area).to_have_value(HINT_A_OUTPUT)  # the real output, as text
    expect(main.get_by_role("button", name="Fork from here")).to_be_visible()
    expect(main.get_by_label("Prompt of hint_a in the fork")).not_to_have_value("")
    main.get_by_text("Follow the gradient").first.click()
    settle(page)
    main.get_by_role("button", name="Run the probe").click()
    expect(main.get_by_text("Probe started: engine probe").first).to_be_visible(timeout=30_000)
    # the engine answers in the background: a result row, or its one-line error
    expect(main.get_by_text("score ").or_(main.get_by_text("The last probe ended")).first
           ).to_be_visible(timeout=90_000)
    shoot(page, "inspect-whatif")
    no_script_ran(page)


@pytest.mark.parametrize("name,path", [
    ("runs", "/"), ("step", "/step"), ("curves", "/curves"), ("compare", "/compare"),
    ("examples", "/examples"), ("history", "/history"), ("inspect", "/inspect"),
])
def test_screenshots_of_every_page_show_their_content(server, page, name, path):
    base, log = server
    page.goto(f"{base}{path}?run={log.semantic}&step=1&example={log.example}&node=hint_a")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.locator("h1").first).to_be_visible()
    expected = {"runs": "4 of 4 runs", "step": "1 / 8: Forward: hint_a",
                "curves": "best validation", "compare": f"A = {log.semantic} (solid)",
                "examples": f"run {log.semantic} · step 1", "history": "Prompt history · hint_a",
                "inspect": HINT_A_OUTPUT}[name]
    expect(main.get_by_text(expected).first).to_be_visible()
    assert not page.locator("[data-testid='stException']").count()
    shoot(page, name)
    no_script_ran(page)


def test_learn_stages_on_a_deep_link(server, page):
    base, log = server
    page.goto(f"{base}/learn?run={log.demo}&step=1&tour=Loss")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("Learn: semantic backpropagation in 10 stages")).to_be_visible()
    expect(main.get_by_text("the expected output is").first).to_be_visible()
    shoot(page, "learn")
    page.goto(f"{base}/learn?run={log.demo}&step=1&tour=The+gate")
    settle(page)
    expect(main.get_by_text("This run proposed").first).to_be_visible()
    no_script_ran(page)


def test_a_running_run_is_followed_to_its_newest_step(server, page):
    """Mark a run running and hide its last step; the page follows it when the step
    lands, until a step is picked by hand."""
    from engine.runlog.schema import connect

    base, log = server
    run = log.textgrad
    with connect(log.db) as con:
        saved = con.execute("SELECT * FROM steps WHERE run_id = ? AND step = 2", [run]).df()
        con.execute("UPDATE runs SET status = 'running' WHERE run_id = ?", [run])
        con.execute("DELETE FROM steps WHERE run_id = ? AND step = 2", [run])
    try:
        page.goto(f"{base}/graph?run={run}")
        settle(page)
        sidebar = page.locator("[data-testid='stSidebar']")
        step = sidebar.get_by_role("combobox", name="Step")
        expect(step).to_have_value("1")
        expect(sidebar.get_by_text("Follow the newest step")).to_be_visible()
        expect(sidebar.get_by_text("steps written").first).to_be_visible()
        with connect(log.db) as con:  # the engine writes step 2
            con.register("saved_step", saved)
            con.execute("INSERT INTO steps SELECT * FROM saved_step")
        expect(step).to_have_value("2", timeout=20_000)
        assert params(page.url).get("follow") == "1"
        step.click()
        page.get_by_role("option", name="0", exact=True).click()
        settle(page)
        expect(step).to_have_value("0")
        with connect(log.db) as con:  # another write: the pinned step stays
            con.execute("UPDATE steps SET ended_at = ended_at WHERE run_id = ?", [run])
        page.wait_for_timeout(3_000)
        settle(page)
        expect(step).to_have_value("0")
        assert "follow" not in params(page.url)
        assert not page.locator("[data-testid='stException']").count()
    finally:
        with connect(log.db) as con:
            con.execute("UPDATE runs SET status = 'finished' WHERE run_id = ?", [run])
