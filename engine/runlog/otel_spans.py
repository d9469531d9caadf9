"""The spans of a run's OpenTelemetry export (engine/runlog/otel.py sends and writes them):
the tree of run, step, phase, example and call spans, with their GenAI and OpenInference
attributes."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

SCOPE = "engine.runlog.otel"
# GenAI's names for the reasons OpenAI-style servers give.
FINISH_REASONS = {"tool_calls": "tool_call", "function_call": "tool_call"}
# A call logged before the run log recorded finish reasons (schema version 2 and older).
UNKNOWN_REASON = "unknown"


def trace_batches(tables: dict[str, list[dict[str, Any]]], project: str | None = None
                  ) -> list[ResourceSpans]:
    """The run's spans in batches: the run span and the probes, then one batch per step."""
    run = tables["runs"][0]
    tree = _Tree(run["run_id"])
    split_of = {e["example_id"]: e["split"] for e in tables["examples"]}
    targets: dict[str, list[str]] = defaultdict(list)
    for g in tables["gradients"]:
        if g["call_id"] and g["node_id"] not in targets[g["call_id"]]:
            targets[g["call_id"]].append(g["node_id"])
    probe_of = {}
    for probe in tables["probes"]:
        for call_id in json.loads(probe["call_ids"] or "[]"):
            probe_of[call_id] = probe

    step_rows = {s["step"]: s for s in tables["steps"]}
    by_step: dict[int, list[Span]] = defaultdict(list)  # group and call spans of a step
    head: list[Span] = []  # the probes' spans
    for call in tables["llm_calls"]:
        if call["purpose"] == "probe":
            parent = tree.probe_parent(probe_of.get(call["call_id"]), head)
            name = f"probe {call['node_id'] or ''}".rstrip()
            head.append(_call_span(tree, call, parent, name, "probe"))
            continue
        step, phase = call["step"], _phase(call, split_of)
        parent = tree.phase_parent(step, phase, call["example_id"], by_step[step])
        by_step[step].append(_call_span(tree, call, parent, _call_name(call, targets), phase))
    steps = [tree.step_span(step, step_rows.get(step))
             for step in sorted(set(step_rows) | set(by_step))]
    tree.fit_times(head + steps + [s for spans in by_step.values() for s in spans])

    ends = [s.end_time_unix_nano for s in steps]
    test_score = next((m["value"] for m in tables["metrics"]
                       if m["key"] == "test_score" and m["step"] is None), None)
    start = _ns(run["started_at"])
    end = _ns(run["ended_at"]) if run["ended_at"] else max(ends, default=start)
    status = {"finished": Status.STATUS_CODE_OK, "failed": Status.STATUS_CODE_ERROR
              }.get(run["status"], Status.STATUS_CODE_UNSET)
    root = _span(tree.trace_id, tree.run_span_id, None, f"run {run['run_id']}",
                 Span.SPAN_KIND_INTERNAL, start, end, {
                     "openinference.span.kind": "CHAIN",
                     "input.value": run["config"], "input.mime_type": "application/json",
                     "output.value": json.dumps({"status": run["status"],
                                                 "test_score": test_score,
                                                 "error": run["error"]}),
                     "output.mime_type": "application/json",
                     "semback.run_id": run["run_id"], "semback.graph": run["graph_name"],
                     "semback.method": run["method"], "semback.status": run["status"],
                     "semback.backend": run["backend"], "semback.model": run["model"],
                     "semback.optimizer_model": run["optimizer_model"]},
                 status, run["error"])
    resource = Resource(attributes=_attributes({
        "service.name": "semback", "semback.run_id": run["run_id"],
        "openinference.project.name": project or run["graph_name"]}))

    def batch(spans: list[Span]) -> ResourceSpans:
        return ResourceSpans(resource=resource, scope_spans=[ScopeSpans(
            scope=InstrumentationScope(name=SCOPE), spans=spans)])

    return [batch([root, *head])] + [batch([tree.steps[step], *by_step[step]])
                                     for step in sorted(tree.steps)]


PHASE_OF_PURPOSE = {"backward": "backward", "update": "update"}


def _phase(call: dict[str, Any], split_of: dict[str, str]) -> str:
    """Where a call belongs in its step: the validation pass of step 0 evaluates the
    initial prompts, of a later step it scores the candidate (the gate)."""
    if call["purpose"] in PHASE_OF_PURPOSE:
        return PHASE_OF_PURPOSE[call["purpose"]]
    split = split_of.get(call["example_id"] or "")
    if split == "val":
        return "forward on val" if call["step"] == 0 else "gate"
    if split == "test":
        return "test"
    return f"forward on {split}" if split else "forward"


def _call_name(call: dict[str, Any], targets: dict[str, list[str]]) -> str:
    node = call["node_id"] or ""
    if call["purpose"] == "backward" and targets.get(call["call_id"]):
        return f"backward {node} → {', '.join(targets[call['call_id']])}"
    return f"{call['purpose']} {node}".rstrip()


class _Tree:
    """The non-call spans (run, steps, phases, examples, probes), made as calls need them,
    with ids derived from what they stand for."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.trace_id = _hex_id(f"trace:{run_id}", 32)
        self.run_span_id = _hex_id(f"run:{run_id}", 16)
        self.steps: dict[int, Span] = {}
        self._made: dict[str, Span] = {}  # span id -> group span

    def step_id(self, step: int) -> str:
        return _hex_id(f"step:{self.run_id}:{step}", 16)

    def _group(self, key: str, parent: str, name: str, attributes: dict[str, Any],
               out: list[Span]) -> str:
        span_id = _hex_id(f"{key}:{self.run_id}", 16)
        if span_id not in self._made:
            span = _span(self.trace_id, span_id, parent, name, Span.SPAN_KIND_INTERNAL, 0, 0,
                         {"openinference.span.kind": "CHAIN", **attributes},
                         Status.STATUS_CODE_OK, None)
            self._made[span_id] = span
            out.append(span)
        return span_id

    def phase_parent(self, step: int, phase: str, example_id: str | None,
                     out: list[Span]) -> str:
        parent = self._group(f"phase:{step}:{phase}", self.step_id(step), phase,
                             {"semback.step": step, "semback.phase": phase}, out)
        if example_id is None:
            return parent
        return self._group(f"example:{step}:{phase}:{example_id}", parent,
                           f"example {example_id}", {"semback.step": step,
                                                     "semback.phase": phase,
                                                     "semback.example_id": example_id}, out)

    def probe_parent(self, probe: dict[str, Any] | None, out: list[Span]) -> str:
        probes = self._group("probes", self.run_span_id, "probes", {}, out)
        if probe is None:
            return probes
        return self._group(
            f"probe:{probe['probe_id']}", probes,
            f"probe {probe['kind']} {probe['node_id']} on {probe['example_id']} "
            f"(step {probe['step']})",
            {"semback.probe_id": probe["probe_id"], "semback.probe_kind": probe["kind"],
             "semback.step": probe["step"], "semback.node_id": probe["node_id"],
             "semback.example_id": probe["example_id"],
             "input.value": probe["intervention"], "input.mime_type": "text/plain",
             "output.value": json.dumps({"before": probe["before_output"],
                                         "after": probe["after_output"],
                                         "before_score": probe["before_score"],
                                         "after_score": probe["after_score"]},
                                        ensure_ascii=False),
             "output.mime_type": "application/json"}, out)

    def step_span(self, step: int, row: dict[str, Any] | None) -> Span:
        attributes = {"openinference.span.kind": "CHAIN", "semback.step": step}
        if row is not None:
            attributes.update({"semback.train_score": row["train_score"],
                               "semback.val_score": row["val_score"],
                               "semback.accepted": row["accepted"]})
        start, end = (_ns(row["started_at"]), _ns(row["ended_at"])) if row else (0, 0)
        span = _span(self.trace_id, self.step_id(step), self.run_span_id, f"step {step}",
                     Span.SPAN_KIND_INTERNAL, start, end, attributes, Status.STATUS_CODE_OK,
                     None)
        self._made[span.span_id.hex()] = span
        self.steps[step] = span
        return span

    def fit_times(self, spans: list[Span]) -> None:
        """A group span runs from its first child's start to its last child's end; a step
        span keeps its logged times and widens to cover its children (the test pass is
        logged at the last step, after that step ended)."""
        children: dict[str, list[Span]] = defaultdict(list)
        for span in spans:
            children[span.parent_span_id.hex()].append(span)

        def depth(span: Span) -> int:
            n, parent = 0, span.parent_span_id.hex()
            while parent in self._made:
                n, parent = n + 1, self._made[parent].parent_span_id.hex()
            return n

        for span in sorted(self._made.values(), key=depth, reverse=True):
            kids = children.get(span.span_id.hex())
            if not kids:
                continue
            first = min(k.start_time_unix_nano for k in kids)
            if span.start_time_unix_nano == 0 or first < span.start_time_unix_nano:
                span.start_time_unix_nano = first
            span.end_time_unix_nano = max([span.end_time_unix_nano,
                                           *(k.end_time_unix_nano for k in kids)])


def _call_span(tree: _Tree, call: dict[str, Any], parent: str, name: str, phase: str
               ) -> Span:
    start = _ns(call["started_at"])
    end = start + int(round((call["latency_ms"] or 0.0) * 1e6))
    messages = json.loads(call["messages"] or "[]")
    reply = call["response"] or ""
    reason = _finish_reason(call)
    # A cache hit cost nothing: its provider usage is zero, what it would have cost apart.
    cached = bool(call["cache_hit"])
    prompt_tokens = 0 if cached else call["prompt_tokens"] or 0
    completion_tokens = 0 if cached else call["completion_tokens"] or 0
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": call["backend"],
        "gen_ai.request.model": call["model"],
        "gen_ai.response.model": call["model"],
        "gen_ai.usage.input_tokens": prompt_tokens,
        "gen_ai.usage.output_tokens": completion_tokens,
        "gen_ai.request.temperature": call["temperature"],
        "gen_ai.request.max_tokens": call["max_tokens"],
        "gen_ai.input.messages": json.dumps(
            [{"role": m.get("role"), "parts": [{"type": "text", "content": m.get("content")}]}
             for m in messages], ensure_ascii=False),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": reply}],
              "finish_reason": reason}], ensure_ascii=False) if reply else None,
        "gen_ai.response.finish_reasons": [reason],
        "error.type": "llm_error" if call["error"] else None,
        "openinference.span.kind": "LLM",
        "input.value": call["messages"] or "[]",
        "input.mime_type": "application/json",
        "output.value": reply,
        "output.mime_type": "text/plain",
        "llm.model_name": call["model"],
        "llm.provider": call["backend"],
        "llm.invocation_parameters": json.dumps({"temperature": call["temperature"],
                                                 "max_tokens": call["max_tokens"]}),
        "llm.token_count.prompt": prompt_tokens,
        "llm.token_count.completion": completion_tokens,
        "llm.token_count.total": prompt_tokens + completion_tokens,
        "semback.call_id": call["call_id"],
        "semback.step": call["step"],
        "semback.phase": phase,
        "semback.purpose": call["purpose"],
        "semback.node_id": call["node_id"],
        "semback.example_id": call["example_id"],
        "semback.cache_hit": cached,
        "semback.cached_input_tokens": call["prompt_tokens"] if cached else None,
        "semback.cached_output_tokens": call["completion_tokens"] if cached else None,
        "semback.retries": call["retries"],
        "semback.cost_usd": call["cost_usd"],
    }
    for i, m in enumerate(messages):  # OpenInference's flattened message list
        attributes[f"llm.input_messages.{i}.message.role"] = m.get("role")
        attributes[f"llm.input_messages.{i}.message.content"] = m.get("content")
    if reply:
        attributes["llm.output_messages.0.message.role"] = "assistant"
        attributes["llm.output_messages.0.message.content"] = reply
    return _span(tree.trace_id, _hex_id(f"call:{call['call_id']}", 16), parent, name,
                 Span.SPAN_KIND_CLIENT, start, end, attributes,
                 Status.STATUS_CODE_ERROR if call["error"] else Status.STATUS_CODE_OK,
                 call["error"])


def _finish_reason(call: dict[str, Any]) -> str:
    if call["error"] and not call["response"]:
        return "error"
    reason = call.get("finish_reason") or UNKNOWN_REASON
    return FINISH_REASONS.get(reason, reason)


def _span(trace_id: str, span_id: str, parent_id: str | None, name: str, kind: int,
          start_ns: int, end_ns: int, attributes: dict[str, Any], status: int,
          message: str | None) -> Span:
    span = Span(trace_id=bytes.fromhex(trace_id), span_id=bytes.fromhex(span_id), name=name,
                kind=kind, start_time_unix_nano=start_ns,
                end_time_unix_nano=max(end_ns, start_ns), attributes=_attributes(attributes),
                status=Status(code=status, message=message or "" if
                              status == Status.STATUS_CODE_ERROR else ""))
    if parent_id:
        span.parent_span_id = bytes.fromhex(parent_id)
    return span


def _attributes(values: dict[str, Any]) -> list[KeyValue]:
    """OTLP key-values; None is left out, a list becomes an array of strings."""
    out = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            typed = AnyValue(bool_value=value)
        elif isinstance(value, int):
            typed = AnyValue(int_value=value)
        elif isinstance(value, float):
            typed = AnyValue(double_value=value)
        elif isinstance(value, list):
            typed = AnyValue()
            typed.array_value.values.extend(AnyValue(string_value=str(v)) for v in value)
        else:
            typed = AnyValue(string_value=str(value))
        out.append(KeyValue(key=key, value=typed))
    return out


def _hex_id(seed: str, length: int) -> str:
    return hashlib.sha256(seed.encode("utf-8")).hexdigest()[:length]


def _ns(seconds: float | None) -> int:
    return int(round((seconds or 0.0) * 1e9))
