"""A small run log for the dashboard tests, built by running the real engine.

`build_run_log(folder)` writes a three-node graph (two sibling hints feeding a final
node) and its data, then runs it twice with the scripted backend, once with `semantic`
and once with `textgrad`, same seed. A canned reply puts an HTML payload into every
output of `hint_a`, and a canned update reply gives `hint_a` a known prompt edit, so tests
can check escaping and the diff's added words. Rows of kind 'target' and
'inferred_input' (what a gtbp run writes) are added for one example, to test their
display without depending on that method.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from engine.llm.base import LLMRequest
from engine.llm.scripted import ScriptedBackend
from engine.run import RunConfig, execute
from engine.runlog.schema import connect
from engine.runlog.writer import insert_rows

XSS = '<img src=x onerror="window.__xss=true">'
HINT_A_OUTPUT = f"Looking at {XSS} the numbers"
ADDED_WORDS = "Quote every number exactly and name its unit."
GTBP_TARGET = "The answer is 7 because both hints agree."
GTBP_INFERRED = "A hint that states the sum of the two numbers."

GRAPH = """\
name: tiny
description: Two sibling hints feed a final answer (dashboard test graph).
dataset: tiny.jsonl
input_fields: [question]
target_field: answer
metric: exact_match
answer_format: "Answer with a number only."
splits: {train: 4, val: 4, test: 0}
nodes:
  - id: hint_a
    prompt: Work out an intermediate step.
    inputs: [question]
  - id: hint_b
    prompt: Work out another intermediate step.
    inputs: [question]
  - id: final
    prompt: Solve the problem.
    inputs: [question, hint_a, hint_b]
    output: true
"""


@dataclass(frozen=True)
class RunLog:
    db: Path
    graph: Path
    semantic: str  # run ids
    textgrad: str
    gtbp_example: str  # example with target / inferred_input rows (step 1, node final)


def responder(request: LLMRequest) -> str | None:
    node = request.meta.get("node")
    if request.purpose == "forward" and node == "hint_a":
        return f"Thinking. <output>{HINT_A_OUTPUT}</output>"
    if request.purpose == "update" and node == "hint_a":
        prompt = request.meta.get("prompt", "")
        return f"The hint should be precise. <prompt>{prompt} {ADDED_WORDS}</prompt>"
    return None


def _write_data(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"q{i:02d}", "question": f"What is {i} plus {i + 3}?", "answer": str(2 * i + 3)}
            for i in range(12)]
    (folder / "tiny.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    graph = folder / "tiny.yaml"
    graph.write_text(GRAPH)
    return graph


def _add_gtbp_rows(db: Path, run_id: str) -> str:
    with connect(db, read_only=True) as con:
        example = con.execute(
            "SELECT example_id FROM node_outputs WHERE run_id = ? AND step = 1 AND "
            "split = 'train' ORDER BY example_id LIMIT 1", [run_id]).fetchone()[0]
    rows = [
        {"run_id": run_id, "step": 1, "example_id": example, "node_id": "final",
         "from_node_id": "loss", "method": "gtbp", "content": GTBP_TARGET, "kind": "target"},
        {"run_id": run_id, "step": 1, "example_id": example, "node_id": "final",
         "from_node_id": "hint_a", "method": "gtbp", "content": GTBP_INFERRED,
         "kind": "inferred_input"},
    ]
    with connect(db) as con:
        insert_rows(con, "gradients", rows)
    return example


def build_run_log(folder: Path) -> RunLog:
    graph = _write_data(folder)
    db = folder / "runs.duckdb"
    ids = {}
    for method in ("semantic", "textgrad"):
        config = RunConfig(graph=str(graph), backend="scripted", method=method, steps=2,
                           train=4, val=4, test=0, seed=0, db=str(db), cache="off",
                           run_id=f"tiny-{method}")
        result = asyncio.run(execute(config, forward_backend=ScriptedBackend(responder=responder)))
        assert result.status == "finished"
        ids[method] = result.run_id
    example = _add_gtbp_rows(db, ids["semantic"])
    return RunLog(db, graph, ids["semantic"], ids["textgrad"], example)
