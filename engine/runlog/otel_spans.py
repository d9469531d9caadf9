"""The spans of a run's OpenTelemetry export (engine/runlog/otel.py sends and writes them):
the tree of run, step, phase, example and call spans, with their GenAI and OpenInference
attributes, in the order a receiver should store them."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections import defaultdict
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from engine.runlog.otel_tree import SpanTree, make_span, ns, otlp_attributes

SCOPE = "engine.runlog.otel"
# GenAI's names for the reasons OpenAI-style servers give.
FINISH_REASONS = {"tool_calls": "tool_call", "function_call": "tool_call"}
# A call logged before the run log recorded finish reasons (schema version 2 and older).
UNKNOWN_REASON = "unknown"
# The gate's two kinds of validation pass: the joint candidate (its calls are the step's
# logged validation activations and losses) and each changed prompt scored alone.
GATE_JOINT, GATE_ALONE = "gate (joint)", "gate (per-node)"
# error.type: a low-cardinality name for what went wrong, read from the logged error text
# (GenAI conventions: the provider's error code or the error's class; `_OTHER` otherwise).
ERROR_TYPES = (
    (re.compile(r"\((\d{3})\)|HTTP (\d{3})"), None),  # None: the status code itself
    (re.compile(r"timed out|timeout", re.I), "timeout"),
    (re.compile(r"cannot connect|connection", re.I), "connection_error"),
    (re.compile(r"empty reply"), "empty_reply"),
    (re.compile(r"local model"), "local_model_error"),
    (re.compile(r"^openai: (\w+Error):"), None),  # the client library's exception class
)


def trace_batches(tables: dict[str, list[dict[str, Any]]], project: str | None = None,
                  content: bool = True) -> list[ResourceSpans]:
    """The run's spans, children first and the run span last: each step's call spans, the
    probes' and diffs' calls, then one batch of the tree's own spans (examples, phases,
    probes, steps, the run), deepest first. Phoenix shows a trace's first 1,000 spans
    newest-stored first, so a trace of any size opens with its root and every step.
    `content=False` leaves out the messages, replies and probe texts."""
    run = tables["runs"][0]
    tree = SpanTree(run["run_id"], project if is_copy(tables, project) else None)
    calls = _CallSpans(tables, tree, content)
    by_step: dict[int, list[Span]] = defaultdict(list)
    aside: list[Span] = []  # probe and diff calls
    for call in tables["llm_calls"]:
        if call["purpose"] in ("probe", "diff"):
            aside.append(calls.aside(call))
        else:
            by_step[call["step"]].append(calls.in_step(call))
    step_rows = {s["step"]: s for s in tables["steps"]}
    for step in sorted(set(step_rows) | set(by_step)):
        tree.step_span(step, step_rows.get(step))
    tree.run_span(run, _test_score(tables), max((s.end_time_unix_nano
                                                 for s in tree.steps.values()), default=0))
    structure = tree.fit_times([*aside, *(s for spans in by_step.values() for s in spans)])
    resource = Resource(attributes=otlp_attributes({
        "service.name": "semback", "semback.run_id": run["run_id"],
        "openinference.project.name": project or run["graph_name"]}))

    def batch(spans: list[Span]) -> ResourceSpans:
        return ResourceSpans(resource=resource, scope_spans=[ScopeSpans(
            scope=InstrumentationScope(name=SCOPE), spans=spans)])

    leaves = [by_step[step] for step in sorted(by_step)] + [aside]
    return [batch(spans) for spans in leaves if spans] + [batch(structure)]


def is_copy(tables: dict[str, list[dict[str, Any]]], project: str | None) -> bool:
    """Whether `project` is not the run's own (its graph's name): its spans then get ids of
    their own, as Phoenix keeps a trace id in the project that first stored it."""
    return project is not None and project != tables["runs"][0]["graph_name"]


def _test_score(tables: dict[str, list[dict[str, Any]]]) -> float | None:
    return next((m["value"] for m in tables["metrics"]
                 if m["key"] == "test_score" and m["step"] is None), None)


class _CallSpans:
    """One span per model call, under the group it belongs to."""

    def __init__(self, tables: dict[str, list[dict[str, Any]]], tree: SpanTree, content: bool):
        self.tree, self.content = tree, content
        self.split_of = {e["example_id"]: e["split"] for e in tables["examples"]}
        self.targets: dict[str, list[str]] = defaultdict(list)
        for g in tables["gradients"]:
            if g["call_id"] and g["node_id"] not in self.targets[g["call_id"]]:
                self.targets[g["call_id"]].append(g["node_id"])
        self.probe_of = {}
        for probe in tables["probes"]:
            for call_id in json.loads(probe["call_ids"] or "[]"):
                self.probe_of[call_id] = probe
        # The joint gate pass's calls: the ones behind a later step's logged validation
        # activations and losses (the per-node passes log calls only).
        self.joint = {row["call_id"] for name in ("node_outputs", "losses")
                      for row in tables[name]
                      if row["call_id"] and row["step"] and row["split"] == "val"}
        self.joint_steps = {row["step"] for name in ("node_outputs", "losses")
                            for row in tables[name] if row["call_id"] in self.joint}
        config = json.loads(tables["runs"][0]["config"] or "{}")
        self.server = _server(config.get("base_url"))
        # The node's own prompt in each call that runs a node: the prompt set renders it
        # inside its messages (the default set's shared system message is not it), so a
        # reader of the spans (import-traces) can tell the trainable text from the frame
        versions = {(v["node_id"], v["version"]): v["prompt"]
                    for v in tables["prompt_versions"]}
        self.prompt_of = {o["call_id"]: versions[(o["node_id"], o["prompt_version"])]
                          for o in tables["node_outputs"]
                          if o["call_id"] and (o["node_id"], o["prompt_version"]) in versions}
        self.prompts: dict[str, list[str]] = defaultdict(list)  # longest first
        for (node, _), prompt in sorted(versions.items(), key=lambda kv: -len(kv[1] or "")):
            if prompt and prompt not in self.prompts[node]:
                self.prompts[node].append(prompt)

    def in_step(self, call: dict[str, Any]) -> Span:
        step, phase = call["step"], self.phase(call)
        parent = self.tree.phase_parent(step, phase, call["example_id"])
        return self.span(call, parent, self.name(call), phase)

    def aside(self, call: dict[str, Any]) -> Span:
        """A probe's call under its probe; a probe's baseline (the example re-run with the
        step's prompts) under the baseline of its example; a diff's call under its diff."""
        if call["purpose"] == "diff":
            parent = self.tree.diff_parent(call["step"], call["example_id"])
        else:
            parent = self.tree.probe_parent(self.probe_of.get(call["call_id"]), call,
                                            self.content)
        name = f"{call['purpose']} {call['node_id'] or ''}".rstrip()
        return self.span(call, parent, name, call["purpose"])

    def phase(self, call: dict[str, Any]) -> str:
        """Where a call belongs in its step: the validation pass of step 0 evaluates the
        initial prompts, of a later step it scores the candidate (the gate's joint pass or
        its per-node passes)."""
        if call["purpose"] in ("backward", "update"):
            return call["purpose"]
        split = self.split_of.get(call["example_id"] or "")
        if split == "val":
            if call["step"] == 0:
                return "forward on val"
            if call["step"] not in self.joint_steps:  # nothing tells the passes apart
                return "gate"
            return GATE_JOINT if call["call_id"] in self.joint else GATE_ALONE
        if split == "test":
            return "test"
        return f"forward on {split}" if split else "forward"

    def name(self, call: dict[str, Any]) -> str:
        node = call["node_id"] or ""
        if call["purpose"] == "backward" and self.targets.get(call["call_id"]):
            return f"backward {node} → {', '.join(self.targets[call['call_id']])}"
        return f"{call['purpose']} {node}".rstrip()

    def span(self, call: dict[str, Any], parent: str, name: str, phase: str) -> Span:
        start = ns(call["started_at"])
        end = start + int(round((call["latency_ms"] or 0.0) * 1e6))
        attributes = {**_gen_ai(call, self.server if call["backend"] == "openai" else None),
                      **_openinference(call),
                      **(_content(call) if self.content else {}),
                      **_semback(call, phase)}
        if self.content:
            attributes["semback.prompt"] = self.node_prompt(call)
        return make_span(self.tree.trace_id, self.tree.call_span_id(call["call_id"]), parent, name,
                     Span.SPAN_KIND_CLIENT, start, end, attributes,
                     Status.STATUS_CODE_ERROR if call["error"] else Status.STATUS_CODE_OK,
                     call["error"])

    def node_prompt(self, call: dict[str, Any]) -> str | None:
        """The prompt of the node a forward, probe or diff call ran: the version its logged
        activation names, else (a per-node gate's or a probe's call, which log no
        activation) the longest of the node's versions that the messages hold; None for a
        call that runs no node (backward, update, a judge) or a prompt no version has."""
        if call["purpose"] not in ("forward", "probe", "diff") or not call["node_id"]:
            return None
        if call["call_id"] in self.prompt_of:
            return self.prompt_of[call["call_id"]]
        sent = "\n".join(str(m.get("content") or "")
                         for m in json.loads(call["messages"] or "[]"))
        return next((p for p in self.prompts[call["node_id"]] if p in sent), None)


def _usage(call: dict[str, Any]) -> tuple[int, int]:
    """(input, output) tokens paid for: a hit in the run's own cache cost nothing."""
    if call["cache_hit"]:
        return 0, 0
    return call["prompt_tokens"] or 0, call["completion_tokens"] or 0


def _gen_ai(call: dict[str, Any], server: tuple[str, int] | None) -> dict[str, Any]:
    """The GenAI conventions' attributes; `gen_ai.response.model` only where the reply
    named a model (never copied from the request)."""
    prompt_tokens, completion_tokens = _usage(call)
    cached = call.get("cached_tokens")
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": call["backend"],
        "gen_ai.request.model": call["model"],
        "gen_ai.response.model": call.get("response_model"),
        "gen_ai.output.type": "json" if call.get("constrained") else None,
        "gen_ai.usage.input_tokens": prompt_tokens,
        "gen_ai.usage.output_tokens": completion_tokens,
        "gen_ai.usage.cache_read.input_tokens":
            None if cached is None or call["cache_hit"] else cached,
        "gen_ai.request.temperature": call["temperature"],
        "gen_ai.request.max_tokens": call["max_tokens"],
        "gen_ai.response.finish_reasons": [_finish_reason(call)],
        "server.address": server[0] if server else None,
        "server.port": server[1] if server else None,
        "error.type": error_type(call["error"]) if call["error"] else None,
    }


def _openinference(call: dict[str, Any]) -> dict[str, Any]:
    prompt_tokens, completion_tokens = _usage(call)
    cached = call.get("cached_tokens")
    return {
        "openinference.span.kind": "LLM",
        "llm.model_name": call["model"],
        "llm.provider": call["backend"],
        "llm.invocation_parameters": json.dumps({"temperature": call["temperature"],
                                                 "max_tokens": call["max_tokens"]}),
        "llm.token_count.prompt": prompt_tokens,
        "llm.token_count.completion": completion_tokens,
        "llm.token_count.total": prompt_tokens + completion_tokens,
        "llm.token_count.prompt_details.cache_read":
            None if cached is None or call["cache_hit"] else cached,
    }


def _content(call: dict[str, Any]) -> dict[str, Any]:
    """The messages sent and the reply: GenAI's structured messages, OpenInference's
    input/output values and flattened message lists."""
    messages = json.loads(call["messages"] or "[]")
    reply = call["response"] or ""
    out: dict[str, Any] = {
        "gen_ai.input.messages": json.dumps(
            [{"role": m.get("role"), "parts": [{"type": "text", "content": m.get("content")}]}
             for m in messages], ensure_ascii=False),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": reply}],
              "finish_reason": _finish_reason(call)}], ensure_ascii=False) if reply else None,
        "input.value": call["messages"] or "[]",
        "input.mime_type": "application/json",
        "output.value": reply,
        "output.mime_type": "text/plain",
    }
    for i, m in enumerate(messages):
        out[f"llm.input_messages.{i}.message.role"] = m.get("role")
        out[f"llm.input_messages.{i}.message.content"] = m.get("content")
    if reply:
        out["llm.output_messages.0.message.role"] = "assistant"
        out["llm.output_messages.0.message.content"] = reply
    return out


def _semback(call: dict[str, Any], phase: str) -> dict[str, Any]:
    cached = bool(call["cache_hit"])
    return {
        "semback.call_id": call["call_id"], "semback.step": call["step"],
        "semback.phase": phase, "semback.purpose": call["purpose"],
        "semback.node_id": call["node_id"], "semback.example_id": call["example_id"],
        "semback.cache_hit": cached,
        "semback.cached_input_tokens": call["prompt_tokens"] if cached else None,
        "semback.cached_output_tokens": call["completion_tokens"] if cached else None,
        "semback.retries": call["retries"], "semback.cost_usd": call["cost_usd"],
        # of the span, the time the call waited for its turn before the model started on it
        "semback.queued_ms": call.get("queued_ms"),
    }


def error_type(error: str) -> str:
    """A failed call's `error.type`: an HTTP status code, `timeout`, `connection_error`,
    `empty_reply`, `local_model_error`, the client library's exception class, or `_OTHER`."""
    for pattern, name in ERROR_TYPES:
        match = pattern.search(error)
        if match:
            return name or next(g for g in match.groups() if g)
    return "_OTHER"


def _server(base_url: str | None) -> tuple[str, int] | None:
    """(server.address, server.port) of --base-url; None without one."""
    if not base_url:
        return None
    parts = urllib.parse.urlsplit(base_url)
    if not parts.hostname:
        return None
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _finish_reason(call: dict[str, Any]) -> str:
    if call["error"] and not call["response"]:
        return "error"
    reason = call.get("finish_reason") or UNKNOWN_REASON
    return FINISH_REASONS.get(reason, reason)
