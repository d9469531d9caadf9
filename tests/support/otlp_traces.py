"""OTLP JSON lines written by hand, for import-traces tests: LLM spans with OpenInference's
flattened messages, as openinference-instrumentation-openai records them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def hex_id(seed: str, length: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:length]


def _attrs(values: dict) -> list[dict]:
    out = []
    for key, value in values.items():
        if isinstance(value, int):
            out.append({"key": key, "value": {"intValue": str(value)}})
        else:
            out.append({"key": key, "value": {"stringValue": str(value)}})
    return out


def llm_span(trace: str, name: str, system: str, user: str, output: str, start: int,
             parent: str | None = None, extra: dict | None = None) -> dict:
    """One LLM span; `start` in seconds, each call lasting half a second."""
    attributes = {"openinference.span.kind": "LLM", "llm.model_name": "fake-model",
                  "llm.input_messages.0.message.role": "system",
                  "llm.input_messages.0.message.content": system,
                  "llm.input_messages.1.message.role": "user",
                  "llm.input_messages.1.message.content": user,
                  "llm.output_messages.0.message.role": "assistant",
                  "llm.output_messages.0.message.content": output, **(extra or {})}
    span = {"traceId": hex_id(trace, 32), "spanId": hex_id(f"{trace}/{name}/{start}", 16),
            "name": name, "kind": 3, "startTimeUnixNano": str(start * 10**9),
            "endTimeUnixNano": str(start * 10**9 + 5 * 10**8), "attributes": _attrs(attributes)}
    if parent:
        span["parentSpanId"] = parent
    return span


def chain_span(trace: str, name: str, text: str) -> dict:
    return {"traceId": hex_id(trace, 32), "spanId": hex_id(f"{trace}/root", 16), "name": name,
            "kind": 1, "startTimeUnixNano": "0", "endTimeUnixNano": str(10**12),
            "attributes": _attrs({"openinference.span.kind": "CHAIN", "input.value": text})}


def write_lines(path: Path, spans: list[dict]) -> Path:
    """One ExportTraceServiceRequest a line, one span each (as a SimpleSpanProcessor does)."""
    with path.open("w", encoding="utf-8") as fh:
        for span in spans:
            fh.write(json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                                    "scopeSpans": [{"scope": {"name": "t"},
                                                                    "spans": [span]}]}]}) + "\n")
    return path


SYSTEMS = {"count": "You count things. Write twice the number.",
           "topic": "You name topics. Say what the sentence is about.",
           "answer": "You give final answers. Reply with the number only."}


def three_call_trace(n: int, sentence: str, count: str, topic: str, answer: str
                     ) -> list[dict]:
    """The example pipeline's shape: count and topic read the sentence, answer reads both."""
    trace = f"trace-{n}"
    root = chain_span(trace, "pipeline", sentence)
    parent = root["spanId"]
    return [root,
            llm_span(trace, "ChatCompletion", SYSTEMS["count"], f"Sentence: {sentence}", count,
                     1, parent),
            llm_span(trace, "ChatCompletion", SYSTEMS["topic"], f"Sentence: {sentence}", topic,
                     2, parent),
            llm_span(trace, "ChatCompletion", SYSTEMS["answer"],
                     f"Count note: {count}\nTopic: {topic}", answer, 3, parent)]


def exported_diamond_run(tmp_path: Path) -> tuple[Path, Path]:
    """A one-step scripted run of the diamond graph (the hints' notes each distinct, so
    their flows show), exported with `export --format otel`: (graph file, spans file)."""
    from engine.cli.commands import main
    from engine.llm.scripted import ScriptedBackend
    from tests.support.graphs import DIAMOND, arithmetic_rows, run_engine, write_graph

    def responder(request):
        node = request.meta.get("node")
        if request.purpose == "forward" and not request.meta.get("output_node"):
            digest = hashlib.sha256(request.user_text.encode()).hexdigest()[:6]
            return f"Thinking. <output>Note by {node} about {digest}</output>"
        return None

    graph = write_graph(tmp_path, DIAMOND, arithmetic_rows(12))
    db = tmp_path / "orig.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=responder), steps=1, train=4,
                        val=4)
    spans = tmp_path / "run.otel.jsonl"
    assert main(["export", result.run_id, "--db", str(db), "--format", "otel", "--out",
                 str(spans)]) == 0
    return graph, spans
