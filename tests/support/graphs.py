"""Tiny graphs with their data, and a one-call way to run the engine on them (scripted
backend), for tests and benchmarks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"


def write_graph(tmp_path: Path, yaml_text: str, rows: list[dict] | None = None,
                name: str = "graph.yaml") -> Path:
    """Write a graph file and (if rows are given) its data.jsonl beside it."""
    if rows is not None:
        with open(tmp_path / "data.jsonl", "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    path = tmp_path / name
    path.write_text(yaml_text, encoding="utf-8")
    return path


def arithmetic_rows(n: int = 40) -> list[dict]:
    return [{"id": f"q{i}", "question": f"Tom has {i} apples and buys {i + 3} more. "
             "How many apples does he have?", "answer": str(2 * i + 3)} for i in range(n)]


TWO_HINTS = """
name: two-hints
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
nodes:
  - id: hint_a
    prompt: Work out an intermediate step that helps solve the problem.
    inputs: [question]
  - id: hint_b
    prompt: Work out an intermediate step that helps solve the problem.
    inputs: [question]
  - id: final
    prompt: Solve the problem.
    inputs: [question, hint_a, hint_b]
    output: true
"""

# three root nodes with different prompts feeding one node: a node with three siblings, and
# no two requests identical (identical requests in flight are answered once)
DIAMOND = """
name: diamond
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
nodes:
  - {id: a, prompt: Find the first quantity., inputs: [question]}
  - {id: b, prompt: Find the second quantity., inputs: [question]}
  - {id: c, prompt: Find the operation., inputs: [question]}
  - {id: final, prompt: Solve the problem., inputs: [question, a, b, c], output: true}
"""


def run_engine(graph: Path, db: Path, backend=None, **options):
    """Run the real engine under the scripted backend (or `backend`); returns RunResult."""
    from engine.runs.execute import RunConfig, execute

    settings = {"backend": "scripted", "steps": 2, "train": 6, "val": 6, "test": 0}
    settings.update(options)
    config = RunConfig(graph=str(graph), db=str(db), **settings)
    return asyncio.run(execute(config, forward_backend=backend))
