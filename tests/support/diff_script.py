"""A scripted model and graphs for run diffs (tests/test_diff.py, the dashboard's diff
tests): middle nodes that get odd-numbered questions wrong unless their prompt says
CAREFULLY, and a fork whose hand-edited prompts say it."""

from __future__ import annotations

import asyncio
import re

from engine.llm.base import LLMRequest
from engine.llm.scripted import ScriptedBackend
from engine.runs.fork import fork
from tests.support.graphs import arithmetic_rows, run_engine, write_graph

CHAIN = """
name: chain
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
nodes:
  - {id: parse, prompt: Read the numbers., inputs: [question]}
  - {id: plan, prompt: Plan the sum., inputs: [question, parse]}
  - {id: final, prompt: Solve the problem., inputs: [question, plan], output: true}
"""

# two middle nodes that must both be careful for the answer to be right
PAIR = """
name: pair
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
nodes:
  - {id: parse, prompt: Read the numbers., inputs: [question]}
  - {id: left, prompt: Check the first number., inputs: [question, parse]}
  - {id: right, prompt: Check the second number., inputs: [question, parse]}
  - {id: final, prompt: Solve the problem., inputs: [question, left, right], output: true}
"""


def responder(request: LLMRequest) -> str | None:
    """A model that obeys its prompts literally: a middle node gets odd-numbered questions
    wrong unless its prompt says CAREFULLY; the final node sums when every check it reads
    says ok, else answers the first number."""
    if request.purpose != "forward":
        return None
    node = request.meta.get("node")
    text = "\n".join(c for _, c in request.messages)
    i = int(re.search(r"Tom has (\d+) apples", text).group(1))
    careful = "CAREFULLY" in text.split("## Inputs")[0] or "CAREFULLY" in \
        "\n".join(c for r, c in request.messages if r == "system")
    if node == "parse":
        return f"<output>{i} and {i + 3}</output>"
    if node in ("plan", "left", "right"):
        good = careful or i % 2 == 0
        return f"<output>{node} {'ok' if good else 'bad'}</output>"
    return f"<output>{2 * i + 3 if 'bad' not in text else i}</output>"


def careful_model(request: LLMRequest) -> str | None:
    """The diff script's model, except that the model named 'careful' checks every number
    whatever its prompt says (its middle nodes always say ok)."""
    node = request.meta.get("node")
    if request.model == "careful" and request.purpose == "forward" and node != "final":
        if node in ("plan", "left", "right"):
            return f"<output>{node} ok</output>"
    return responder(request)


def backend() -> ScriptedBackend:
    return ScriptedBackend(responder=responder)


def forked(tmp_path, graph_text: str, edits: dict[str, str]):
    graph = write_graph(tmp_path, graph_text, arithmetic_rows(24))
    db = tmp_path / "runs.duckdb"
    run_engine(graph, db, backend(), steps=0, run_id="parent")
    asyncio.run(fork(str(db), "parent", 0, set_prompts=edits,
                     overrides={"run_id": "child", "steps": 0}, forward_backend=backend()))
    return db


def on_two_models(tmp_path):
    """CHAIN run twice, with the same prompts, on the models 'plain' and 'careful' (runs
    of those names, step 0 only) of one backend."""
    graph = write_graph(tmp_path, CHAIN, arithmetic_rows(24))
    db = tmp_path / "runs.duckdb"
    for name in ("plain", "careful"):
        run_engine(graph, db, ScriptedBackend(responder=careful_model), steps=0,
                   run_id=name, model=name)
    return db
