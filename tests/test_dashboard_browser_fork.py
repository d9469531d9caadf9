"""The demo fixed by hand, in a real browser: the inspector's "Fork from here" panel on the
demo run (sample_graphs/demo.yaml), the hand-fixed `note` prompt typed in
(sample_graphs/data/demo_fixed_prompts.yaml), the fork followed to its end with no reload,
then Compare (parent against fork) showing the fork's validation above the parent's, each
with its examples and interval (same server, browser and checks as
tests/support/browser.py).

The model is sample_graphs/demo_responder.py, a scripted model that obeys prompts
literally: the starting prompts get every answer wrong, the fixed `note` prompt every one
right. The demo run records it (--scripted-responder), so the fork the page starts in the
background answers with it too, in seconds. Screenshots: inspect-fork, compare-fork
(test-artifacts/screenshots/)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from engine.runs.execute import RunConfig, execute
from tests.support.browser import ROOT, SHOTS, expect, no_script_ran, serve, settle
from tests.support.runlog import rows

pytestmark = pytest.mark.browser

DEMO = ROOT / "sample_graphs" / "demo.yaml"
DEMO_MODEL = f"{ROOT / 'sample_graphs' / 'demo_responder.py'}:demo_responder"
FIXED = yaml.safe_load((ROOT / "sample_graphs" / "data" / "demo_fixed_prompts.yaml")
                       .read_text(encoding="utf-8"))
JOB_TIMEOUT = 120_000  # ms: an engine process on two shared cores
SCORE = r"(\d\.\d{3}) on (\d+) examples \(95% interval (\d\.\d\d)–(\d\.\d\d)\)"


@dataclass(frozen=True)
class DemoLog:
    db: Path
    run: str
    example: str  # a training example of step 1


def build_demo_log(folder: Path) -> DemoLog:
    db = folder / "runs.duckdb"
    config = RunConfig(graph=str(DEMO), backend="scripted", scripted_responder=DEMO_MODEL,
                       steps=1, db=str(db), run_id="demo-run")
    assert asyncio.run(execute(config)).status == "finished"
    (example,) = rows(db, "SELECT min(example_id) FROM node_outputs WHERE run_id = 'demo-run' "
                          "AND step = 1 AND split = 'train'")[0]
    return DemoLog(db, "demo-run", example)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("browser-fork"), build=build_demo_log)


def shown_score(text: str, who: str) -> tuple[float, int, float, float]:
    """(value, n, low, high) of the score the page states after `who`."""
    found = re.search(who + r"[^;]*? " + SCORE, text)
    assert found, f"no score for {who!r} in: {text[:2000]}"
    value, n, low, high = found.groups()
    return float(value), int(n), float(low), float(high)


def test_forking_the_demo_with_the_fixed_prompt_raises_validation_on_compare(server, page):
    base, log = server
    page.goto(f"{base}/inspect?run={log.run}&step=1&example={log.example}&node=note")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    box = main.get_by_label("Prompt of note in the fork")
    expect(box).to_have_value("Write one word about the text.")  # the demo's starting prompt
    box.fill(FIXED["note"])
    box.press("Control+Enter")
    settle(page)
    page.evaluate("window.__same_page = true")
    main.get_by_role("button", name="Fork from here").click()
    compare = main.get_by_role("link", name=re.compile(r"^Compare .* with this run$"))
    expect(compare).to_be_visible(timeout=JOB_TIMEOUT)
    assert page.evaluate("window.__same_page === true"), "the page was reloaded"
    expect(main.get_by_text(re.compile(r"fork \S+ finished in \d+ s"))).to_be_visible()
    fork = re.search(r"Compare (\S+) with this run", compare.inner_text())[1]
    assert rows(log.db, "SELECT parent_run_id, fork_step, status FROM runs WHERE run_id = ?",
                fork) == [(log.run, 1, "finished")]
    # the job's conclusion, where it was started: both scores with n and intervals
    panel = main.inner_text()
    assert shown_score(panel, "Validation at step 1: this run")[:2] == (0.0, 24)
    assert shown_score(panel, f"; fork {fork}")[:2] == (1.0, 24)
    expect(main.get_by_text("Validation rose (0.000 → 1.000) on 24 examples; 95% intervals "
                            "0.00–0.14 and 0.86–1.00, which do not overlap.")).to_be_visible()
    assert not page.locator("[data-testid='stException']").count()
    compare.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "inspect-fork.png"))

    compare.click()
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_role("heading", name="Compare")).to_be_visible()
    statement = main.get_by_text(re.compile(r"^Validation at step 1: parent B"))
    expect(statement).to_be_visible()
    text = statement.inner_text()
    parent_value, parent_n, _, parent_high = shown_score(text, f"parent B \\({log.run}\\)")
    fork_value, fork_n, fork_low, _ = shown_score(text, f"fork A \\({fork}\\)")
    assert (parent_n, fork_n) == (24, 24)  # every validation example of the demo
    assert fork_value > parent_value and fork_low > parent_high
    logged = dict(rows(log.db, "SELECT run_id, val_score FROM steps WHERE step = 1"))
    assert (parent_value, fork_value) == (logged[log.run], logged[fork])
    expect(main.get_by_text("Validation rose (0.000 → 1.000) on 24 examples")).to_be_visible()
    best = main.get_by_text(re.compile(r"^Best validation: A "))
    assert shown_score(best.inner_text(), ": A")[:2] == (1.0, 24)
    assert shown_score(best.inner_text(), "; B")[:2] == (0.0, 24)
    assert not page.locator("[data-testid='stException']").count()
    page.screenshot(path=str(SHOTS / "compare-fork.png"))
    no_script_ran(page)
