"""The framework examples run through the gateway with only their base URL changed and no
instrumentor: what the gateway records imports as the same pipeline (the same call sites,
prompts and flows) as what their framework's OpenInference instrumentor records."""

from __future__ import annotations

import json

import pytest

from engine.gateway.pipeline import trace_pipeline
from engine.gateway.runner import PipelineSpec
from engine.traces.importer import import_traces
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.pipeline_responders import (
    dspy_responder,
    langchain_responder,
    openai_tools_responder,
)
from tests.test_framework_imports import SAMPLES, load

LIMIT = 6


def by_prompt(pipeline) -> tuple[list[str], set[tuple[str, str]]]:
    """A pipeline as its prompts and its flows between prompts: what it is, whatever its
    nodes are called."""
    prompt = {n.id: n.prompt for n in pipeline.nodes.values()}
    return sorted(prompt.values()), {(prompt[a], prompt[b]) for a, b in pipeline.edges}


@pytest.mark.parametrize("name, responder, fields", [
    ("dspy_pipeline", dspy_responder,
     lambda row: {"sentence": row["text"], "question": row["question"],
                  "target": row["count"]}),
    ("langchain_pipeline", langchain_responder,
     lambda row: {"text": row["text"], "target": row["answer"]}),
    # its order stage's system message is a template filled with the shop and customer:
    # the instrumented run records the template, the gateway finds it from the input
    ("openai_tools_pipeline", openai_tools_responder,
     lambda row: {"text": row["text"], "shop": row["shop"], "customer": row["customer"],
                  "target": row["answer"]})])
def test_the_gateways_recording_imports_as_the_instrumented_one(tmp_path, name, responder,
                                                                fields):
    module = load(name)
    rows = [json.loads(line) for line in module.DATA.read_text().splitlines()][:LIMIT]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(fields(r)) + "\n" for r in rows), encoding="utf-8")
    with FakeOpenAIServer(responder=responder) as server:
        traces, targets = tmp_path / "traces.jsonl", tmp_path / "targets.jsonl"
        module.run(server.base_url, "fake-qwen", traces, LIMIT, targets)
        recorded = import_traces(traces, tmp_path / "instrumented.duckdb", targets=targets)
        instrumented = recorded.pipeline
        through = trace_pipeline(PipelineSpec(f"{SAMPLES / name}.py:answer", None,
                                              str(tmp_path)), data,
                                 tmp_path / "gateway.duckdb", upstream=server.base_url)
    gateway = through.imported.pipeline
    assert through.errors == []
    assert len(gateway.traces) == len(instrumented.traces) == LIMIT
    assert by_prompt(gateway) == by_prompt(instrumented)
    assert len(gateway.edges) == len(instrumented.edges) >= 1
    # graded alike: the same answers, so the same examples fail (the planted faults bite)
    assert through.imported.failing == recorded.failing > 0
