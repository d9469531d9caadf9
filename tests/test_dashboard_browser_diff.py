"""Compare's "Why do they differ?" in a real browser (same browser and checks as
tests/support/browser.py, on its own server and run log: a fork with one hand-edited
middle prompt beside its parent, tests/support/diff_script.py). A deep link opens the Compare page
on a differing example, the diff button explains it by the edited node, the address still
carries the view, and a reload of that address shows the verdict again (read back from the
log). Screenshot: test-artifacts/screenshots/compare_why.png."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import duckdb
import pytest

from tests.support.browser import SHOTS, expect, no_script_ran, serve, settle
from tests.support.diff_script import CHAIN, forked

EXPLAINS_COLOR = "#5bb85d"  # dashboard/screens/compare.py (a page script: not importable)

pytestmark = pytest.mark.browser


@dataclass(frozen=True)
class ForkLog:
    db: Path
    example: str  # a validation example the fork and its parent score differently


def build_fork_log(folder: Path) -> ForkLog:
    db = forked(folder, CHAIN, {"plan": "Plan the sum CAREFULLY."})
    with duckdb.connect(str(db), read_only=True) as con:
        example = con.execute(
            "SELECT a.example_id FROM losses a JOIN losses b USING (split, example_id, step) "
            "WHERE a.run_id = 'child' AND b.run_id = 'parent' AND a.split = 'val' "
            "AND a.score <> b.score ORDER BY a.example_id").fetchall()[0][0]
    return ForkLog(db, example)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory.mktemp("browser_diff"), build=build_fork_log)


def test_why_do_they_differ_from_a_deep_link(server, page):
    base, log = server
    db, example = log.db, log.example
    page.goto(f"{base}/compare?run=child&other=parent&step=0&pair={example}")
    settle(page, 120_000)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text(f"Why do they differ? · example {example} · step 0")
           ).to_be_visible()
    expect(main.get_by_text("source change").first).to_be_visible()
    main.get_by_role("button", name=f"Why do they differ? Run the diff for {example}").click()
    settle(page, 120_000)
    verdict = main.get_by_text("explained by", exact=False).first
    expect(verdict).to_be_visible()
    assert f"Example {example} scores 1.000 in A and 0.000 in B: explained by plan" in \
        " ".join(main.inner_text().split())
    state = {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}
    assert {k: state.get(k) for k in ("run", "other", "step", "pair")} == {
        "run": "child", "other": "parent", "step": "0", "pair": example}
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT explained_by FROM diffs WHERE example_id = ?",
                           [example]).fetchall() == [('["plan"]',)]
    # the section at the top of the view: the verdict, the graph, the two traces (the
    # drawing's frame loads once it is in view)
    main.get_by_text(f"Why do they differ? · example {example} · step 0").evaluate(
        "e => e.scrollIntoView({block: 'start'})")
    # the section at the top of the view: the verdict, the graph with the explaining node
    # filled in the explaining colour and outlined, the two traces
    main.get_by_text(f"Why do they differ? · example {example} · step 0").evaluate(
        "e => e.scrollIntoView({block: 'start'})")
    drawn = main.locator("svg g#why-plan")
    expect(drawn).to_be_attached(timeout=60_000)
    fills = {n: main.locator(f"svg g#why-{n} path, svg g#why-{n} polygon").first
             .get_attribute("fill") for n in ("plan", "final", "parse")}
    assert fills["plan"].lower() == EXPLAINS_COLOR
    assert fills["final"].lower() != EXPLAINS_COLOR and fills["parse"].lower() == "#ffffff"
    page.wait_for_timeout(500)
    page.screenshot(path=str(SHOTS / "compare_why.png"))
    page.reload()
    settle(page, 120_000)
    assert "explained by plan" in " ".join(main.inner_text().split())
    no_script_ran(page)
