"""OpenTelemetry export of a run: GenAI-convention spans, one trace per run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from engine.runlog.export import file_stem, read_run, write_atomically

SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT = 1, 3
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2


def export_otel(db: str | Path, run_id: str, out: str | Path | None = None) -> Path:
    """OTLP/JSON lines: one `TracesData` object per line (the OpenTelemetry Collector's
    file format), the run span first, then one line per step with its call spans."""
    lines = otel_lines(read_run(db, run_id))
    path = Path(out or f"{file_stem(run_id)}.otel.jsonl")
    write_atomically(path, "".join(json.dumps(line, ensure_ascii=False) + "\n"
                                    for line in lines))
    return path


def otel_lines(tables: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Spans of one run: trace id per run, a root span for the run, a span per step, and
    a GenAI client span (gen_ai.* attributes) per call under its step's span."""
    run = tables["runs"][0]
    run_id = run["run_id"]
    trace_id = _hex_id(f"trace:{run_id}", 32)
    run_span_id = _hex_id(f"run:{run_id}", 16)
    step_ids = {s["step"]: _hex_id(f"step:{run_id}:{s['step']}", 16) for s in tables["steps"]}
    calls_by_step: dict[int, list[dict]] = {}
    for call in tables["llm_calls"]:
        calls_by_step.setdefault(call["step"], []).append(call)
    call_spans = {step: [_call_span(c, trace_id, step_ids.get(step, run_span_id))
                         for c in calls] for step, calls in calls_by_step.items()}
    ends = [int(s["endTimeUnixNano"]) for spans in call_spans.values() for s in spans]
    run_start = _ns(run["started_at"])
    run_end = _ns(run["ended_at"]) if run["ended_at"] else max(ends, default=run_start)
    lines = [_traces_data(run, [_span(
        trace_id, run_span_id, None, f"run {run_id}", SPAN_KIND_INTERNAL,
        run_start, run_end,
        {"semback.run_id": run_id, "semback.graph": run["graph_name"],
         "semback.method": run["method"], "semback.status": run["status"],
         "gen_ai.provider.name": run["backend"], "gen_ai.request.model": run["model"]},
        {"finished": STATUS_OK, "failed": STATUS_ERROR}.get(run["status"], STATUS_UNSET),
        run["error"])])]
    for step in tables["steps"]:
        spans = [_span(trace_id, step_ids[step["step"]], run_span_id, f"step {step['step']}",
                       SPAN_KIND_INTERNAL, _ns(step["started_at"]), _ns(step["ended_at"]),
                       {"semback.step": step["step"], "semback.train_score": step["train_score"],
                        "semback.val_score": step["val_score"],
                        "semback.accepted": step["accepted"]}, STATUS_OK, None)]
        lines.append(_traces_data(run, spans + call_spans.pop(step["step"], [])))
    for step in sorted(call_spans):  # calls of a step without a step row (none expected)
        lines.append(_traces_data(run, call_spans[step]))
    return lines


def _call_span(call: dict[str, Any], trace_id: str, parent_id: str) -> dict[str, Any]:
    start = _ns(call["started_at"])
    end = start + int(round((call["latency_ms"] or 0.0) * 1e6))
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": call["backend"],
        "gen_ai.request.model": call["model"],
        "gen_ai.response.model": call["model"],
        "gen_ai.usage.input_tokens": call["prompt_tokens"],
        "gen_ai.usage.output_tokens": call["completion_tokens"],
        "gen_ai.request.temperature": call["temperature"],
        "gen_ai.request.max_tokens": call["max_tokens"],
        "gen_ai.input.messages": _input_messages(call["messages"]),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": call["response"]}]}],
            ensure_ascii=False) if call["response"] else None,
        "error.type": "llm_error" if call["error"] else None,
        "semback.call_id": call["call_id"],
        "semback.step": call["step"],
        "semback.purpose": call["purpose"],
        "semback.node_id": call["node_id"],
        "semback.example_id": call["example_id"],
        "semback.cache_hit": call["cache_hit"],
        "semback.retries": call["retries"],
        "semback.cost_usd": call["cost_usd"],
    }
    return _span(trace_id, _hex_id(f"call:{call['call_id']}", 16), parent_id,
                 f"chat {call['model']}", SPAN_KIND_CLIENT, start, end, attributes,
                 STATUS_ERROR if call["error"] else STATUS_OK, call["error"])


def _input_messages(messages: str | None) -> str | None:
    if not messages:
        return None
    return json.dumps([{"role": m.get("role"), "parts": [{"type": "text",
                                                          "content": m.get("content")}]}
                       for m in json.loads(messages)], ensure_ascii=False)


def _span(trace_id: str, span_id: str, parent_id: str | None, name: str, kind: int,
          start_ns: int, end_ns: int, attributes: dict[str, Any], status: int,
          message: str | None) -> dict[str, Any]:
    span = {"traceId": trace_id, "spanId": span_id, "name": name, "kind": kind,
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(max(end_ns, start_ns)),
            "attributes": _attributes(attributes), "status": {"code": status}}
    if parent_id:
        span["parentSpanId"] = parent_id
    if message and status == STATUS_ERROR:
        span["status"]["message"] = message
    return span


def _traces_data(run: dict[str, Any], spans: list[dict[str, Any]]) -> dict[str, Any]:
    resource = {"service.name": "semback", "semback.run_id": run["run_id"]}
    return {"resourceSpans": [{
        "resource": {"attributes": _attributes(resource)},
        "scopeSpans": [{"scope": {"name": "engine.runlog.export"}, "spans": spans}],
    }]}


def _attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    """OTLP/JSON key-value list; None values are left out, int64 is a decimal string."""
    out = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            typed = {"boolValue": value}
        elif isinstance(value, int):
            typed = {"intValue": str(value)}
        elif isinstance(value, float):
            typed = {"doubleValue": value}
        else:
            typed = {"stringValue": str(value)}
        out.append({"key": key, "value": typed})
    return out


def _hex_id(seed: str, length: int) -> str:
    return hashlib.sha256(seed.encode("utf-8")).hexdigest()[:length]


def _ns(seconds: float | None) -> int:
    return int(round((seconds or 0.0) * 1e9))
