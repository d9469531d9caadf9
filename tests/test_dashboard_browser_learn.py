"""Background work started from the Learn tour and the Graph page, followed in a real
browser to its result with no reload (same server, browser and checks as
tests/support/browser.py; this module gets its own server and run log, and its demo
buttons use the scripted backend so a paired run takes seconds):

- Learn "Check the blame": the stage shows the probes' verdict once the job has ended;
- Learn "Without siblings" → "Start the paired run": the stage fills in with the new run;
- Learn "Fix it yourself": a written prompt is forked and compared with its parent;
- Graph "Check the blame": the job ends on the page and the nodes are coloured by blame;
- Learn "Without siblings" → "Compare the methods on these traces": each method's
  gradient efficacy per node, with its interval, once the job has ended.

A marker set on `window` before each click must still be there when the result shows: a
reload would have dropped it. Screenshots: learn-blame, learn-pair, learn-fix, graph-blame,
learn-compare
(test-artifacts/screenshots/)."""

from __future__ import annotations

import re

import pytest

from tests.support.browser import ROOT, SHOTS, expect, no_script_ran, serve, settle

pytestmark = pytest.mark.browser

JOB_TIMEOUT = 120_000  # ms: an engine process on two shared cores


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("browser-learn"),
                     {"SEMBACK_DEMO_BACKEND": "scripted"})


def mark_page(page) -> None:
    page.evaluate("window.__same_page = true")


def not_reloaded(page) -> None:
    assert page.evaluate("window.__same_page === true"), "the page was reloaded"


def shoot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_learn_check_the_blame_fills_in_without_a_reload(server, page):
    base, log = server
    page.goto(f"{base}/learn?run={log.demo}&step=1&tour=Check+the+blame")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    verdict = main.get_by_text("Following the gradient at").or_(
        main.get_by_text("No single node's gradient fixes this example"))
    expect(verdict).to_have_count(0)  # the table says "not probed yet" (drawn on a canvas)
    mark_page(page)
    main.get_by_role("button", name="Follow the gradient at every node").click()
    expect(main.get_by_text(f"blame {log.demo} running").or_(
        main.get_by_text(f"blame {log.demo} finished in")).first).to_be_visible(timeout=30_000)
    expect(main.get_by_text(f"blame {log.demo} finished in")).to_be_visible(
        timeout=JOB_TIMEOUT)
    expect(verdict.first).to_be_visible(timeout=30_000)  # the probes' verdict, read back
    pooled = main.get_by_text("The probes blame").or_(
        main.get_by_text("The probes name no node yet"))
    expect(pooled.first).to_be_visible()  # and over every example probed at the step
    not_reloaded(page)
    assert not page.locator("[data-testid='stException']").count()
    shoot(page, "learn-blame")
    no_script_ran(page)


def test_learn_check_the_blame_on_the_validation_examples(server, page):
    """Chosen on the page, the blame probes the validation examples (the tour's own
    training example is not among them): the pooled table and its verdict fill in."""
    base, log = server
    page.goto(f"{base}/learn?run={log.demo}&step=1&tour=Check+the+blame")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    main.get_by_text(re.compile(r"failing validation examples \(of \d+\)")).click()
    mark_page(page)
    main.get_by_role("button", name="Follow the gradient at every node").click()
    expect(main.get_by_text(f"blame {log.demo} finished in")).to_be_visible(
        timeout=JOB_TIMEOUT)
    expect(main.get_by_text("Over every failing example probed at step 1")).to_be_visible(
        timeout=30_000)
    expect(main.get_by_text("The probes blame").or_(
        main.get_by_text("The probes name no node yet")).first).to_be_visible()
    not_reloaded(page)
    assert not page.locator("[data-testid='stException']").count()
    shoot(page, "learn-blame-val")
    no_script_ran(page)


def test_learn_paired_run_fills_in_without_a_reload(server, page):
    base, log = server
    page.goto(f"{base}/learn?run={log.demo}&step=1&tour=Without+siblings")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    first = main.get_by_role("button", name="Start the paired run").first
    expect(first).to_contain_text("textgrad")  # the comparison that can differ, first
    mark_page(page)
    first.click()
    expect(main.get_by_text("running").first).to_be_visible(timeout=30_000)
    expect(main.get_by_role("radiogroup", name="Sibling-blind run")).to_be_visible(
        timeout=JOB_TIMEOUT)
    expect(main.get_by_text("(textgrad)").first).to_be_visible()
    not_reloaded(page)
    assert not page.locator("[data-testid='stException']").count()
    shoot(page, "learn-pair")
    no_script_ran(page)


def test_learn_fix_it_yourself_forks_and_compares_without_a_reload(server, page):
    base, log = server
    page.goto(f"{base}/learn?run={log.demo}&step=1&tour=Fix+it+yourself")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("No fork of this run from step 1 yet.")).to_be_visible()
    use = main.get_by_role("button", name="Start from the hand-fixed prompt")
    if use.count():  # the demo graph file has a hand-fixed prompt
        use.click()
        settle(page)
    else:
        box = main.get_by_label("Your prompt for answer")
        box.fill("Read the review. Reply Yes if it praises the product, else No.")
        box.press("Control+Enter")
        settle(page)
    mark_page(page)
    main.get_by_role("button", name="Fork with this prompt").click()
    expect(main.get_by_text("Validation at step 1: this run")).to_be_visible(
        timeout=JOB_TIMEOUT)
    expect(main.get_by_text("fork ").first).to_be_visible()
    expect(main.get_by_role("link", name="Open the fork beside this run on Compare")
           ).to_be_visible()
    not_reloaded(page)
    assert not page.locator("[data-testid='stException']").count()
    shoot(page, "learn-fix")
    no_script_ran(page)


def test_graph_check_the_blame_colours_the_nodes_without_a_reload(server, page):
    base, log = server
    page.goto(f"{base}/graph?run={log.textgrad}&step=1&example={log.example}&node=hint_a")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("No probes at step 1 yet")).to_be_visible()
    mark_page(page)
    main.get_by_role("button", name="Check the blame").click()
    expect(main.get_by_text(f"blame {log.textgrad} finished in")).to_be_visible(
        timeout=JOB_TIMEOUT)
    settle(page)
    expect(main.get_by_text("No probes at step 1 yet")).to_have_count(0)
    sidebar_link = page.url
    assert "color=" in sidebar_link and "flows=" in sidebar_link
    not_reloaded(page)
    assert not page.locator("[data-testid='stException']").count()
    shoot(page, "graph-blame")
    no_script_ran(page)


def test_learn_compare_the_methods_fills_in_without_a_reload(server, page):
    base, log = server
    page.goto(f"{base}/learn?run={log.demo}&step=1&tour=Without+siblings")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    # the comparison's own sentence (get_by_text alone would match "...that mood..." too)
    sentence = main.get_by_text(re.compile(r"^At mood the 90% intervals"))
    expect(sentence).to_have_count(0)
    mark_page(page)
    main.get_by_role("button", name="Compare the methods on these traces").click()
    expect(main.get_by_text(f"compare {log.demo} running").or_(
        main.get_by_text(f"compare {log.demo} finished in")).first).to_be_visible(
        timeout=30_000)
    expect(main.get_by_text("Gradient efficacy per method")).to_be_visible(
        timeout=JOB_TIMEOUT)
    expect(sentence.first).to_be_visible()
    expect(main.get_by_text("n = 2").first).to_be_visible()  # the scripted run's 2 failing
    not_reloaded(page)
    assert not page.locator("[data-testid='stException']").count()
    main.get_by_text("Gradient efficacy per method").scroll_into_view_if_needed()
    shoot(page, "learn-compare")
    no_script_ran(page)


def test_learn_tour_without_a_run_in_the_link_shows_the_sibling_aware_demo_run(server, page):
    """A sibling-blind demo run newer than the sibling-aware one (the paired run): with no
    run in the link the tour still shows the sibling-aware run, and its "Without
    siblings" stage finds the sibling-blind one."""
    import subprocess
    import sys

    base, log = server
    newer = subprocess.run(
        [sys.executable, "-m", "engine", "run", str(log.db.parent / "demo.yaml"), "--backend",
         "scripted", "--method", "textgrad", "--steps", "1", "--train", "4", "--val", "4",
         "--test", "0", "--seed", "0", "--db", str(log.db), "--run-id", "demo-textgrad-newer"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert newer.returncode == 0, newer.stderr
    page.goto(f"{base}/learn")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text(f"Showing demo run {log.demo} (step")).to_be_visible()
    expect(main.get_by_text("demo-textgrad-newer")).to_have_count(0)
    page.goto(f"{base}/learn?tour=Without+siblings")  # still no run in the link
    settle(page)
    expect(main.get_by_text(f"Showing demo run {log.demo} (step")).to_be_visible()
    expect(main.get_by_text("No sibling-blind run of this graph")).to_have_count(0)
    expect(main.get_by_role("radiogroup", name="Sibling-blind run")).to_be_visible()
    expect(main.get_by_text("(textgrad)").first).to_be_visible()
    assert not page.locator("[data-testid='stException']").count()
    shoot(page, "learn-tour-run")
    no_script_ran(page)
