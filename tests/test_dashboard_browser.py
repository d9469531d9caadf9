"""The dashboard in a real browser: Debian's chromium driven by Playwright against
`streamlit run dashboard/app.py` on a free localhost port (tests/support/browser.py: the
server, and the `browser` and `page` fixtures of tests/conftest.py).

Opens deep links to the inspector and Step through (the graph drawing, clicks on it
and every page's deep link are in test_dashboard_browser_graph.py), and checks that the
HTML payload in a model reply did not run (`window.__xss` stays undefined in the page
and in every iframe) while its literal text is visible. Saves a screenshot of every page under test-artifacts/screenshots/.
"""

from __future__ import annotations

import re

import pytest

from tests.support.browser import SHOTS, expect, no_script_ran, serve, settle
from tests.support.dashboard_log import ADDED_WORDS, HINT_A_OUTPUT

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("browser"))


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
