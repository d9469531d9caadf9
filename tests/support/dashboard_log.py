"""A small run log for the dashboard tests, built by running the real engine.

`build_run_log(folder)` writes a three-node graph (two sibling hints feeding a final
node) and its data, then runs it with the scripted backend and methods `gtbp`,
`semantic` and `textgrad` (same seed, so the same examples), plus a run of a two-node
graph named "demo" for the Learn page. A canned reply puts an HTML payload into every
output of `hint_a`, and a canned update reply gives `hint_a` a known prompt edit, so tests
can check escaping and the diff's added words.

The wording of hint_b's and final's prompts is chosen so that the scripted replies give
the scenario the tests read: the semantic run accepts step 1's candidate and keeps its
hint_b and final edits (hint_a's is dropped: its output is canned, so the gain does not
need it), rejects the edits of step 2, q01 and q09 fail at step 1 and are
back-propagated there (q09 by textgrad too), some example flips between steps 0 and 1,
and gtbp back-propagates the same first example. A change to the scripted backend or the templates can break that; then pick
another wording that gives it back.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.llm.base import LLMRequest
from engine.llm.scripted import ScriptedBackend
from engine.runlog.schema import connect
from engine.runs.execute import RunConfig, execute

XSS = '<img src=x onerror="window.__xss=true">'
HINT_A_OUTPUT = f"Looking at {XSS} the numbers"
ADDED_WORDS = "Quote every number exactly and name its unit."

GRAPH = """\
name: tiny
description: Two sibling hints feed a final answer (dashboard test graph).
dataset: tiny.jsonl
input_fields: [question]
target_field: answer
metric: exact_match
answer_format: "Answer with the larger number only."
splits: {train: 4, val: 4, test: 0}
nodes:
  - id: hint_a
    prompt: Work out an intermediate step.
    inputs: [question]
  - id: hint_b
    prompt: Work out a second step.
    inputs: [question]
  - id: final
    prompt: Solve it carefully.
    inputs: [question, hint_a, hint_b]
    output: true
"""


DEMO_GRAPH = """\
name: demo
description: Same shape as sample_graphs/demo.yaml (dashboard test copy).
dataset: reviews.jsonl
input_fields: [review]
target_field: positive
metric: yes_no
splits: {train: 4, val: 4, test: 0}
nodes:
  - id: mood
    prompt: Write one word about the text.
    inputs: [review]
  - id: answer
    prompt: Answer Yes or No.
    inputs: [review, mood]
    output: true
"""
REVIEWS = [("The coffee tastes amazing.", "Yes"), ("It broke after a week.", "No"),
           ("Fast delivery, happy with it.", "Yes"), ("Too loud and too slow.", "No"),
           ("Lovely colour and soft fabric.", "Yes"), ("The battery died at once.", "No"),
           ("Works exactly as promised.", "Yes"), ("Never buying this again.", "No"),
           ("Great value for the price.", "Yes"), ("Stopped charging on day two.", "No")]


@dataclass(frozen=True)
class RunLog:
    db: Path
    graph: Path
    semantic: str  # run ids
    textgrad: str
    example: str  # back-propagated at step 1 by both the semantic and the gtbp run
    demo: str
    gtbp: str


def responder(request: LLMRequest) -> str | None:
    node = request.meta.get("node")
    if request.purpose == "forward" and node == "hint_a":
        return f"Thinking. <output>{HINT_A_OUTPUT}</output>"
    if request.purpose == "update" and node == "hint_a":
        prompt = request.meta.get("prompt", "")
        return f"The hint should be precise. <prompt>{prompt} {ADDED_WORDS}</prompt>"
    return None


def write_data(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pairs = [(3, 9), (12, 5), (7, 8), (21, 4), (6, 2), (15, 30), (11, 10), (1, 13),
             (40, 17), (9, 16), (25, 24), (5, 50)]
    rows = [{"id": f"q{i:02d}", "question": f"Which is larger, {a} or {b}?",
             "answer": str(max(a, b))} for i, (a, b) in enumerate(pairs)]
    (folder / "tiny.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    graph = folder / "tiny.yaml"
    graph.write_text(GRAPH)
    (folder / "reviews.jsonl").write_text("\n".join(
        json.dumps({"id": f"rv{i}", "review": r, "positive": p})
        for i, (r, p) in enumerate(REVIEWS)) + "\n")
    (folder / "demo.yaml").write_text(DEMO_GRAPH)
    return graph


def with_second_candidate(source: Path, target: Path, run_id: str, suffix: str,
                          reason: str) -> Path:
    """A copy of the run log `source` at `target` in which `run_id`'s step 1 wrote two
    candidate prompt sets (--proposals 2): its proposals as the first, and a rejected
    second whose prompts end with `suffix`, with `reason`."""
    import shutil

    shutil.copy(source, target)
    with connect(target) as con:
        con.execute("UPDATE updates SET candidate = 0 WHERE run_id = ?", [run_id])
        con.execute("""INSERT INTO updates SELECT * REPLACE (1 AS candidate, false AS accepted,
                           new_prompt || ? AS new_prompt, ? AS reject_reason)
                       FROM updates WHERE run_id = ? AND step = 1""", [suffix, reason, run_id])
    return target


def _first_backpropagated(db: Path, run_id: str, step: int) -> str:
    with connect(db, read_only=True) as con:
        return con.execute(
            "SELECT min(example_id) FROM gradients WHERE run_id = ? AND step = ? AND "
            "kind IN ('gradient', 'target')", [run_id, step]).fetchone()[0]


def build_run_log(folder: Path) -> RunLog:
    graph = write_data(folder)
    db = folder / "runs.duckdb"
    ids = {}
    for method, path in (("demo", folder / "demo.yaml"), ("gtbp", graph),
                         ("semantic", graph), ("textgrad", graph)):
        config = RunConfig(graph=str(path), backend="scripted",
                           method="semantic" if method == "demo" else method, steps=2,
                           train=4, val=4, test=0, seed=0, db=str(db), cache="off",
                           run_id="demo-run" if method == "demo" else f"tiny-{method}")
        result = asyncio.run(execute(config, forward_backend=ScriptedBackend(responder=responder)))
        assert result.status == "finished"
        ids[method] = result.run_id
    example = _first_backpropagated(db, ids["semantic"], 1)
    assert example == _first_backpropagated(db, ids["gtbp"], 1)
    return RunLog(db, graph, ids["semantic"], ids["textgrad"], example, ids["demo"],
                  ids["gtbp"])


@contextmanager
def like_a_live_server():
    """Make AppTest run pages the way a live server does.

    AppTest forgets before every run that the app uses st.navigation and, seeing the
    `dashboard/pages/` folder, starts the run in the old folder-based multipage mode: a
    page other than the entry file is then executed on its own first, and its guard (see
    dashboard/pages/*.py) reruns the app, which drops a button click of that run. A live
    server leaves that mode for good at its first st.navigation call; so does this."""
    from streamlit.runtime.pages_manager import PagesManager

    original = PagesManager.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    PagesManager.__init__ = init
    try:
        yield
    finally:
        PagesManager.__init__ = original


APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


def open_page(db: str | Path, page: str, **query: object):
    """An AppTest of `page` (e.g. "screens/graph.py") on the run log `db`, with the address
    `query`, run once as a live server would, and no exception shown. Sets SEMBACK_DB (a
    test's fixture restores it)."""
    import os

    from streamlit.testing.v1 import AppTest

    os.environ["SEMBACK_DB"] = str(db)
    with like_a_live_server():
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params.update({k: str(v) for k, v in query.items()})
        at.run()
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at
