"""The pipeline's graph, found in its traces.

- Nodes are call sites: LLM calls grouped across traces by span name and system message
  (or by the span attribute `node_key` names); a node's prompt is its system message.
- Edges are content flow: an earlier call's reply (or the text between its <output>
  tags) that appears in a later call's non-system messages, in the same trace. A text
  shorter than MIN_EVIDENCE characters, the same text from two calls, or a reply that
  repeats the pipeline's input (the later call may have it from there) is reported in
  `ambiguous`, never taken as an edge.
- Each trace is one example: its input is the root span's `input.value`, else the first
  call's last user message.

This project's own export (`export --format otel`) holds a whole run in one trace; its
forward calls are grouped into examples by their `semback.*` attributes instead (the
first step's only), and its nodes by `semback.node_id`.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from engine.prompts import templates as P
from engine.prompts.recorded import make_template, slots_used
from engine.traces import TraceError
from engine.traces.otlp import Call, Span, is_llm_span, llm_call

MIN_EVIDENCE = 8  # characters: a shorter text in a later call is no evidence of flow
INPUT = "input"  # the example field holding the pipeline's input
OWN_NODE_KEY = "semback.node_id"


@dataclass
class Trace:
    """One trace: one example of the pipeline."""

    trace_id: str
    example_id: str
    root_input: str
    calls: dict[str, Call]  # node id -> its call
    templates: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    edges: set[tuple[str, str]] = field(default_factory=set)

    def final_output(self, node_id: str) -> str:
        return self.calls[node_id].output


@dataclass
class NodeInfo:
    id: str
    prompt: str
    calls: int
    inputs: list[str] = field(default_factory=list)


@dataclass
class Pipeline:
    nodes: dict[str, NodeInfo]
    edges: list[tuple[str, str]]
    output: str
    traces: list[Trace]
    ambiguous: list[dict[str, Any]]
    model: str
    temperature: float | None
    max_tokens: int | None = None  # the largest reply limit the calls asked for


def infer_pipeline(spans: list[Span], node_key: str | None = None) -> Pipeline:
    """The graph of the pipeline whose spans these are; TraceError when there is none."""
    groups = _call_groups(spans)
    if not groups:
        raise TraceError("no LLM spans in the file (spans with openinference.span.kind LLM "
                         "or gen_ai.operation.name chat)")
    own = any(OWN_NODE_KEY in c.span.attributes for calls in groups.values() for _, c in calls)
    key = node_key or (OWN_NODE_KEY if own else None)
    ids = _node_ids([c for calls in groups.values() for _, c in calls], key)
    roots = _roots(spans)
    traces, ambiguous = [], []
    for group, calls in groups.items():
        traces.append(_trace(group, calls, ids, key, roots.get(calls[0][1].span.trace_id),
                             own, ambiguous))
    _check_one_pipeline(traces)
    edges = sorted({e for t in traces for e in t.edges})
    _check_acyclic(traces, edges)
    output = _output_node(traces, edges, ambiguous)
    nodes = _nodes(traces, edges)
    models = Counter(c.model for t in traces for c in t.calls.values() if c.model)
    temps = {c.temperature for t in traces for c in t.calls.values()}
    # re-runs ask for as many tokens as the pipeline's most generous call did, never fewer
    limits = [c.max_tokens for t in traces for c in t.calls.values() if c.max_tokens]
    return Pipeline(nodes, edges, output, traces, ambiguous,
                    models.most_common(1)[0][0] if models else "",
                    temps.pop() if len(temps) == 1 else None, max(limits, default=None))


def _call_groups(spans: list[Span]) -> dict[tuple, list[tuple[str, Call]]]:
    """LLM calls by example: a trace, or (own export) a trace's step, phase and example."""
    llm = [s for s in spans if is_llm_span(s)]
    own = [s for s in llm if "semback.purpose" in s.attributes]
    if own:  # a run of this project: its forward calls at the first step that has them
        forward = [s for s in own if s.attributes.get("semback.purpose") == "forward"
                   and s.attributes.get("semback.example_id")]
        first = min((s.attributes.get("semback.step") or 0 for s in forward), default=0)
        llm = [s for s in forward if (s.attributes.get("semback.step") or 0) == first]
    groups: dict[tuple, list[tuple[str, Call]]] = defaultdict(list)
    for span in sorted(llm, key=lambda s: (s.start, s.end, s.span_id)):
        a = span.attributes
        group = (span.trace_id, str(a.get("semback.phase") or ""),
                 str(a.get("semback.example_id") or ""))
        groups[group].append((span.span_id, llm_call(span)))
    return dict(groups)


def _roots(spans: list[Span]) -> dict[str, str]:
    """trace id -> its root span's input.value (when the root is not itself a call)."""
    out = {}
    for s in spans:
        if not s.parent_id and not is_llm_span(s) and "semback.run_id" not in s.attributes:
            value = s.attributes.get("input.value")
            if isinstance(value, str) and value.strip():
                out[s.trace_id] = _plain_input(value)
    return out


def _plain_input(value: str) -> str:
    """A chain span's input.value: a JSON object of one text argument is that text."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return value
    if isinstance(parsed, dict) and len(parsed) == 1:
        only = next(iter(parsed.values()))
        if isinstance(only, str):
            return only
    return parsed if isinstance(parsed, str) else value


def _slug(text: str) -> str:
    words = re.findall(r"[A-Za-z0-9]+", text.lower())
    return "_".join(words)[:40].strip("_") or "call"


def _node_ids(calls: list[Call], key: str | None) -> dict[tuple, str]:
    """(span name, system message) or (attribute value,) -> a readable, unique node id."""
    sites: dict[tuple, None] = {}
    for c in calls:
        if key:
            if key not in c.span.attributes:
                raise TraceError(f"--node-key {key}: LLM span '{c.span.name}' (trace "
                                 f"{c.span.trace_id}) has no attribute '{key}'")
            sites.setdefault((str(c.span.attributes[key]),), None)
        else:
            sites.setdefault((c.span.name, c.system), None)
    names = Counter(_slug(site[0]) for site in sites)
    ids: dict[tuple, str] = {}
    taken: set[str] = set()
    for site in sites:
        base = _slug(site[0])
        if names[base] > 1 and len(site) > 1:  # the same span name: the system message says
            base = _distinct_words(site[1], [s[1] for s in sites if _slug(s[0]) == base]) \
                or base
        node_id, n = base, 2
        while node_id in taken or node_id == INPUT:
            node_id, n = f"{base}_{n}", n + 1
        taken.add(node_id)
        ids[site] = node_id
    return ids


def _distinct_words(text: str, others: list[str], most: int = 6) -> str:
    """The shortest start of `text` (1 to `most` words) that no other text starts with."""
    words = re.findall(r"[A-Za-z0-9]+", text.lower())
    rest = [re.findall(r"[A-Za-z0-9]+", o.lower()) for o in others if o != text]
    for n in range(1, min(most, len(words)) + 1):
        if all(o[:n] != words[:n] for o in rest):
            return "_".join(words[:n])
    return "_".join(words[:most])


def site_of(call: Call, key: str | None) -> tuple:
    return (str(call.span.attributes[key]),) if key else (call.span.name, call.system)


def _trace(group: tuple, calls: list[tuple[str, Call]], ids: dict[tuple, str],
           key: str | None, root_input: str | None, own: bool, ambiguous: list[dict]
           ) -> Trace:
    trace_id, _, example = group
    by_node: dict[str, Call] = {}
    for _, call in calls:
        node = ids[site_of(call, key)]
        if node in by_node:
            raise TraceError(f"trace {trace_id}: the call site '{node}' is called twice in "
                             "one trace, so its content flow has a cycle or a loop; one trace "
                             "must be one pass through the pipeline (--node-key ATTR can tell "
                             "call sites apart)")
        by_node[node] = call
    first = calls[0][1]
    users = [c for r, c in first.messages if r == "user"]
    source = root_input if (root_input and not own) else (users[-1] if users else "")
    trace = Trace(trace_id, example or trace_id[:16], source, by_node)
    order = list(by_node)
    for j, node in enumerate(order):
        call = by_node[node]
        slots = _evidence(trace, order[:j], node, ambiguous)
        if trace.root_input.strip():
            slots.setdefault(INPUT, trace.root_input)
        template = make_template(call.non_system(), slots)
        trace.templates[node] = template
        trace.edges.update((up, node) for up in slots_used(template) if up != INPUT)
    return trace


def _evidence(trace: Trace, earlier: list[str], node: str, ambiguous: list[dict]
              ) -> dict[str, str]:
    """upstream node -> the text of its reply found in `node`'s messages."""
    call = trace.calls[node]
    body = "\n".join(c for _, c in call.non_system())
    found: dict[str, str] = {}
    for up in earlier:
        upstream = trace.calls[up]
        if upstream.span.end > call.span.start and upstream.span.end and call.span.start:
            continue  # still running when this call began: its reply cannot be in it
        for text in _texts(upstream.output):
            if text in body:
                found[up] = text
                break
    by_text: dict[str, list[str]] = defaultdict(list)
    for up, text in found.items():
        by_text[text].append(up)
    slots = {}
    for text, ups in by_text.items():
        if len(ups) > 1:
            ambiguous.append({"trace_id": trace.trace_id, "from": ups, "to": node,
                              "text": text[:80], "reason": "the same text came from "
                              f"{len(ups)} calls"})
        elif trace.root_input and text in trace.root_input:
            ambiguous.append({"trace_id": trace.trace_id, "from": ups, "to": node,
                              "text": text[:80], "reason": "the text is also in the "
                              "pipeline's input"})
        elif len(text) < MIN_EVIDENCE:
            ambiguous.append({"trace_id": trace.trace_id, "from": ups, "to": node,
                              "text": text, "reason": f"a text shorter than {MIN_EVIDENCE} "
                              "characters is no evidence of flow"})
        else:
            slots[ups[0]] = text
    return slots


def _texts(reply: str) -> list[str]:
    """What of a reply may be passed on: the reply itself, or the text in its output tags."""
    out = [reply.strip()]
    inner, _ = P.parse_output(reply)
    if inner.strip() and inner.strip() not in out:
        out.append(inner.strip())
    return [t for t in out if t]


def _check_one_pipeline(traces: list[Trace]) -> None:
    sets = {frozenset(t.calls) for t in traces}
    if len(sets) == 1:
        return
    parts: list[set[str]] = []  # call sites that share a trace, merged
    for s in sets:
        joined = [p for p in parts if p & s]
        merged = set(s).union(*joined)
        parts = [p for p in parts if p not in joined] + [merged]
    if len(parts) > 1:
        shown = "; ".join(", ".join(sorted(p)) for p in parts)
        raise TraceError(f"spans of several unrelated pipelines are mixed (call sites "
                         f"{shown} never share a trace): import one pipeline's traces at "
                         "a time")
    every = set().union(*sets)
    for t in traces:
        if set(t.calls) != every:
            missing = ", ".join(sorted(every - set(t.calls)))
            raise TraceError(f"trace {t.trace_id} does not call {missing}: every trace must "
                             "make the pipeline's calls (--node-key ATTR groups call sites)")


def _check_acyclic(traces: list[Trace], edges: list[tuple[str, str]]) -> None:
    succ: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        succ[a].add(b)
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> list[str] | None:
        state[n] = 1
        for m in sorted(succ[n]):
            if state.get(m) == 1:
                return path + [n, m]
            if m not in state:
                found = visit(m, path + [n])
                if found:
                    return found
        state[n] = 2
        return None

    for n in sorted(succ):
        if n not in state:
            cycle = visit(n, [])
            if cycle:
                start = cycle.index(cycle[-1])
                loop = cycle[start:]
                trace = next(t.trace_id for t in traces if (loop[-2], loop[-1]) in t.edges)
                raise TraceError(f"trace {trace}: content flows in a cycle "
                                 f"({' → '.join(loop)}): a pipeline's calls must form a DAG")


def _output_node(traces: list[Trace], edges: list[tuple[str, str]],
                 ambiguous: list[dict]) -> str:
    nodes = list(traces[0].calls)
    sinks = [n for n in nodes if not any(a == n for a, _ in edges)]
    if len(sinks) == 1:
        return sinks[0]
    unsure = sorted({u for a in ambiguous for u in a["from"]} & set(sinks))
    note = f" (ambiguous flows from {', '.join(unsure)}: see --json)" if unsure else ""
    raise TraceError(f"the calls {', '.join(sinks)} feed no later call that the content "
                     f"shows, so the pipeline's final call is not one{note}")


def _nodes(traces: list[Trace], edges: list[tuple[str, str]]) -> dict[str, NodeInfo]:
    nodes = {}
    for node in traces[0].calls:
        prompts = Counter(t.calls[node].system for t in traces)
        uses_input = any(any(isinstance(p, dict) and p["slot"] == INPUT
                             for m in t.templates[node] for p in m["parts"]) for t in traces)
        ups = [a for a, b in edges if b == node]
        inputs = ([INPUT] if uses_input or not ups else []) + ups
        nodes[node] = NodeInfo(node, prompts.most_common(1)[0][0], len(traces), inputs)
    return nodes
