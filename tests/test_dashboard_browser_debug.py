"""The debugging pages in a real browser (same server, browser and checks as
tests/support/browser.py): deep links to Examples, the trace, Prompt history and Compare
survive a reload with their full state in the address; a link to an unknown run warns;
Copy link copies the address; model text with HTML in it shows as text in the trace.
Screenshots go to test-artifacts/screenshots/."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

from tests.support.browser import SHOTS, expect, no_script_ran, serve, settle
from tests.support.dashboard_log import XSS

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("browser-debug"))


def params(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}


def test_examples_deep_link_survives_a_reload(server, page):
    base, log = server
    page.goto(f"{base}/examples?run={log.semantic}&step=1&split=train&failing=1")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("examples match at step 1")).to_be_visible()
    state = params(page.url)
    assert {k: state.get(k) for k in ("run", "step", "split", "failing")} == {
        "run": log.semantic, "step": "1", "split": "train", "failing": "1"}
    assert state.get("example") and state.get("node")  # the full state, not only changes
    page.screenshot(path=str(SHOTS / "examples.png"))
    page.reload()
    settle(page)
    assert params(page.url) == state
    expect(main.get_by_text("examples match at step 1")).to_be_visible()
    no_script_ran(page)


def test_trace_shows_html_in_a_reply_as_text(server, page):
    base, log = server
    page.goto(f"{base}/examples?run={log.semantic}&step=1&example={log.example}&view=trace")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text(f"Trace of example {log.example} at step 1")).to_be_visible()
    main.get_by_text("forward · hint_a").first.click()
    settle(page)
    expect(main.get_by_text(XSS).first).to_be_visible()
    page.screenshot(path=str(SHOTS / "trace.png"))
    no_script_ran(page)


def test_history_and_compare_deep_links(server, page):
    base, log = server
    page.goto(f"{base}/history?run={log.semantic}&node=hint_a")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("Prompt history · hint_a")).to_be_visible()
    expect(main.get_by_text("accepted").first).to_be_visible()
    page.screenshot(path=str(SHOTS / "history.png"))
    page.goto(f"{base}/compare?run={log.semantic}&other={log.textgrad}&step=1")
    settle(page)
    expect(main.get_by_text("A gradient (semantic)").first).to_be_visible()
    assert params(page.url)["other"] == log.textgrad
    page.screenshot(path=str(SHOTS / "compare-examples.png"))
    no_script_ran(page)


def test_unknown_run_warns_and_copy_link_copies_the_address(server, page):
    base, log = server
    page.goto(f"{base}/graph?run=no-such-run")
    settle(page)
    expect(page.get_by_text("not in this run log").first).to_be_visible()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"],
                                   origin=base)
    page.goto(f"{base}/inspect?run={log.semantic}&step=1&example={log.example}&node=hint_a")
    settle(page)
    frame = next(f for f in page.frames if f.locator("#copy").count())
    frame.locator("#copy").click()
    expect(frame.locator("#done")).not_to_have_text("", timeout=5_000)
    if frame.locator("#done").inner_text() == "copied":
        copied = page.evaluate("navigator.clipboard.readText()")
    else:  # the browser refused the clipboard: the address is shown instead
        copied = frame.locator("#url").input_value()
    assert params(copied) == params(page.url)
    assert params(copied)["node"] == "hint_a"



def test_clicking_an_example_row_selects_it(server, page):
    base, log = server
    page.goto(f"{base}/examples?run={log.semantic}&step=1&split=train&failing=1")
    settle(page)
    grid = page.locator("[data-testid='stDataFrame']").first
    box = grid.bounding_box()
    # the row-selection column, second data row (rows are 35 px under a 35 px header)
    page.mouse.click(box["x"] + 12, box["y"] + 35 + 35 + 17)
    settle(page)
    second = params(page.url)["example"]
    assert second != log.example
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text(f"Example {second} at step 1")).to_be_visible()
    link = main.get_by_role("link", name="Open in the node inspector")
    assert f"example={second}" in link.get_attribute("href")
