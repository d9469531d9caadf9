"""The tree of an OpenTelemetry export's own spans (the run, its steps, phases, examples,
probes and diffs) around the call spans of engine/runlog/otel_spans.py: made as calls
need them, with ids derived from what they stand for, and times that cover their
children."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status


class SpanTree:
    """The non-call spans. Ids derive from the run, step, phase, example and probe ids, so
    a re-export after a resume keeps the ids already sent; and from `copy` (a project
    other than the graph's), as Phoenix keeps a trace id in the project that first got
    it: a copy sent to another project is a trace of its own."""

    def __init__(self, run_id: str, copy: str | None = None):
        self.suffix = "" if copy is None else f"@{copy}"
        self.key = run_id + self.suffix  # what every id derives from
        self.trace_id = hex_id(f"trace:{self.key}", 32)
        self.run_span_id = hex_id(f"run:{self.key}", 16)
        self.steps: dict[int, Span] = {}
        self._made: dict[str, Span] = {}  # span id -> group span, in the order made

    def call_span_id(self, call_id: str) -> str:
        return hex_id(f"call:{call_id}{self.suffix}", 16)

    def step_id(self, step: int) -> str:
        return hex_id(f"step:{self.key}:{step}", 16)

    def _group(self, key: str, parent: str, name: str, attributes: dict[str, Any]) -> str:
        span_id = hex_id(f"{key}:{self.key}", 16)
        if span_id not in self._made:
            self._made[span_id] = make_span(
                self.trace_id, span_id, parent, name, Span.SPAN_KIND_INTERNAL, 0, 0,
                {"openinference.span.kind": "CHAIN", **attributes}, Status.STATUS_CODE_OK,
                None)
        return span_id

    def phase_parent(self, step: int, phase: str, example_id: str | None) -> str:
        parent = self._group(f"phase:{step}:{phase}", self.step_id(step), phase,
                             {"semback.step": step, "semback.phase": phase})
        if example_id is None:
            return parent
        return self._group(f"example:{step}:{phase}:{example_id}", parent,
                           f"example {example_id}", {"semback.step": step,
                                                     "semback.phase": phase,
                                                     "semback.example_id": example_id})

    def probe_parent(self, probe: dict[str, Any] | None, call: dict[str, Any],
                     content: bool) -> str:
        """A probe's span; for a probe call no probe lists (blame's baseline: the example
        re-run with the step's prompts, shared by that example's probes), the baseline's."""
        probes = self._group("probes", self.run_span_id, "probes", {})
        if probe is None:
            step, example = call["step"], call["example_id"]
            if example is None:
                return probes
            return self._group(f"baseline:{step}:{example}", probes,
                               f"probe baseline on {example} (step {step})",
                               {"semback.probe_kind": "baseline", "semback.step": step,
                                "semback.example_id": example})
        texts = {"input.value": probe["intervention"], "input.mime_type": "text/plain",
                 "output.value": json.dumps({"before": probe["before_output"],
                                             "after": probe["after_output"],
                                             "before_score": probe["before_score"],
                                             "after_score": probe["after_score"]},
                                            ensure_ascii=False),
                 "output.mime_type": "application/json"} if content else {}
        return self._group(
            f"probe:{probe['probe_id']}", probes,
            f"probe {probe['kind']} {probe['node_id']} on {probe['example_id']} "
            f"(step {probe['step']})",
            {"semback.probe_id": probe["probe_id"], "semback.probe_kind": probe["kind"],
             "semback.step": probe["step"], "semback.node_id": probe["node_id"],
             "semback.example_id": probe["example_id"],
             "semback.before_score": probe["before_score"],
             "semback.after_score": probe["after_score"], **texts})

    def diff_parent(self, step: int, example_id: str | None) -> str:
        diffs = self._group("diffs", self.run_span_id, "diffs", {})
        if example_id is None:
            return diffs
        return self._group(f"diff:{step}:{example_id}", diffs,
                           f"diff on {example_id} (step {step})",
                           {"semback.step": step, "semback.example_id": example_id})

    def step_span(self, step: int, row: dict[str, Any] | None) -> Span:
        attributes = {"openinference.span.kind": "CHAIN", "semback.step": step}
        if row is not None:
            attributes.update({"semback.train_score": row["train_score"],
                               "semback.val_score": row["val_score"],
                               "semback.accepted": row["accepted"]})
        start, end = (ns(row["started_at"]), ns(row["ended_at"])) if row else (0, 0)
        span = make_span(self.trace_id, self.step_id(step), self.run_span_id, f"step {step}",
                         Span.SPAN_KIND_INTERNAL, start, end, attributes,
                         Status.STATUS_CODE_OK, None)
        self._made[span.span_id.hex()] = span
        self.steps[step] = span
        return span

    def run_span(self, run: dict[str, Any], test_score: float | None, steps_end: int
                 ) -> Span:
        start = ns(run["started_at"])
        end = ns(run["ended_at"]) if run["ended_at"] else max(steps_end, start)
        status = {"finished": Status.STATUS_CODE_OK, "failed": Status.STATUS_CODE_ERROR
                  }.get(run["status"], Status.STATUS_CODE_UNSET)
        span = make_span(self.trace_id, self.run_span_id, None, f"run {run['run_id']}",
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
        self._made[self.run_span_id] = span
        return span

    def fit_times(self, leaves: list[Span]) -> list[Span]:
        """Widen every span of the tree to cover its children: a group span runs from its
        first child's start to its last child's end; the run and step spans keep their
        logged times and widen (a resume, the test pass logged at the last step, a blame
        run days later). Returns the tree's spans deepest first, the run span last."""
        children: dict[str, list[Span]] = defaultdict(list)
        for span in [*leaves, *self._made.values()]:
            children[span.parent_span_id.hex()].append(span)
        ordered = sorted(self._made.values(), key=self._depth, reverse=True)
        for span in ordered:
            kids = children.get(span.span_id.hex())
            if not kids:
                continue
            first = min(k.start_time_unix_nano for k in kids)
            if span.start_time_unix_nano == 0 or first < span.start_time_unix_nano:
                span.start_time_unix_nano = first
            span.end_time_unix_nano = max([span.end_time_unix_nano,
                                           *(k.end_time_unix_nano for k in kids)])
        return ordered

    def _depth(self, span: Span) -> int:
        n, parent = 0, span.parent_span_id.hex()
        while parent in self._made:
            n, parent = n + 1, self._made[parent].parent_span_id.hex()
        return n


def make_span(trace_id: str, span_id: str, parent_id: str | None, name: str, kind: int,
              start_ns: int, end_ns: int, attributes: dict[str, Any], status: int,
              message: str | None) -> Span:
    span = Span(trace_id=bytes.fromhex(trace_id), span_id=bytes.fromhex(span_id), name=name,
                kind=kind, start_time_unix_nano=start_ns,
                end_time_unix_nano=max(end_ns, start_ns), attributes=otlp_attributes(attributes),
                status=Status(code=status, message=message or "" if
                              status == Status.STATUS_CODE_ERROR else ""))
    if parent_id:
        span.parent_span_id = bytes.fromhex(parent_id)
    return span


def otlp_attributes(values: dict[str, Any]) -> list[KeyValue]:
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


def hex_id(seed: str, length: int) -> str:
    return hashlib.sha256(seed.encode("utf-8")).hexdigest()[:length]


def ns(seconds: float | None) -> int:
    return int(round((seconds or 0.0) * 1e9))
