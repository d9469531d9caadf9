"""The pipeline's graph, found in its traces, read through OpenInference's conventions
(docs/traces.md, "What the importer finds"):

- Nodes are the named units that own an LLM call: the highest span above the call, below
  the trace's root, that holds no other call site (DSPy's `Predict(Signature).forward`,
  a LangChain step's run name, a function the user traced), named by the signature in its
  name or by its own name when that is not a framework's generic one (engine/traces/conventions.py).
  A call with no such unit is named by its span name and its prompt (or by the span
  attribute `node_key` names). A call site called again in one trace (a tool loop) is
  one node: its last call, whose messages hold the loop's earlier turns and tool results.
  A predictor that asked again through another adapter (DSPy's JSONAdapter, when its
  ChatAdapter could not read the reply) is one node too: its last call.
- A node's prompt is what the user wrote: the call's prompt template
  (`llm.prompt_template.template`, re-rendered with each trace's own variables), the part
  of a framework's system message after its instructions marker (the framework profiles' prompt markers: DSPy's
  signature instructions), else the system message, which must then be the same in every
  trace (a system message that varies without a template is refused, never frozen).
- A node's output is the value its unit returned (`output.value`; DSPy's parsed field,
  not its wire format), read again from each re-run's reply the same way; a tool call is
  part of the reply.
- Edges are flows: a value an earlier unit returned that a later unit received
  (`input.value`'s fields: structural, taken even when short or also in the pipeline's
  input, unless two sources gave the same text), else an earlier call's reply that
  appears in a later call's non-system messages (content: a text shorter than
  MIN_EVIDENCE characters, the same text from two calls, or a reply that repeats the
  pipeline's input is reported in `ambiguous`, never taken as an edge).
- Each trace is one example: its input is the root span's `input.value`, else the first
  call's last user message.

How flows are found lives in engine/traces/flows.py, how nodes are named in names.py.

This project's own export (`export --format otel`) holds a whole run in one trace; its
forward calls are grouped into examples by their `semback.*` attributes instead (the
first step's only), and its nodes by `semback.node_id`.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.prompts.recorded import make_template, reply_fields, slots_used
from engine.traces import TraceError
from engine.traces.conventions import (
    GENERIC_NAMES,
    IGNORED_FIELDS,
    PROMPT_MARKERS,
    RETRY_ADAPTERS,
    SPAN_KIND,
    UNIT_KINDS,
    key_name,
    signature_name,
)
from engine.traces.flows import (
    PROMPT_KIND,
    TOOL_CALL,
    Trace,
    check_declared,
    considered_flows,
    declared_edges,
    evidence,
    prompt_inputs,
)
from engine.traces.names import SiteName, node_ids, tool_of
from engine.traces.otlp import SYSTEM_ROLES, Call, Span, is_llm_span, json_value, llm_call

INPUT = "input"  # the example field holding the pipeline's input
OWN_NODE_KEY = "semback.node_id"
OWN_PROMPT = "semback.prompt"  # the node's own prompt, which its messages render inside


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
    # edge -> how it was found ("structure", "content", "intervention"), the first trace's
    found_by: dict[tuple[str, str], str] = field(default_factory=dict)


@dataclass
class Site:
    """Where one LLM call sits: its unit (the span that owns it) and its raw site key."""

    key: tuple
    name: str  # the readable name, before it is made unique
    unit: Span | None
    tool: str | None = None  # the tool the call is made to call, or its only tool


def infer_pipeline(spans: Iterable[Span], node_key: str | None = None,
                   flows: Collection[tuple[str, str]] = (),
                   edges: Collection[tuple[str, str]] = ()) -> Pipeline:
    """The graph of the pipeline whose spans these are; TraceError when there is none.

    `flows`: flows found by intervention (engine/gateway/flows.py), each a pair of call
    sites' system messages, from and to: an edge wherever both call sites are in a trace,
    whatever the content shows (the value is a slot where the messages hold it).
    `edges`: flows the user declared (`--edge FROM:TO`, node ids), taken the same way; one
    that a trace contradicts (TO called before FROM answered) is refused with that trace.

    `spans` is read once, in order (a generator streams a file): each LLM span is read
    into its call as it comes, and of every span only what the inference reads is kept
    (_kept), so memory holds the calls and the spans that may own them, never the file."""
    tree_spans: list[Span] = []
    calls: list[Call] = []
    own_export = False
    same: dict[str, str] = {}  # one copy of a text many spans repeat (ids, names, prompts)
    for span in spans:
        kept = _kept(span, node_key, same)
        tree_spans.append(kept)
        if not is_llm_span(span):
            continue
        a = span.attributes
        if "semback.purpose" in a:
            own_export = True
            if a.get("semback.purpose") != "forward" or not a.get("semback.example_id"):
                continue  # a run of this project's other calls: never an example's
        call = llm_call(span)
        call.span = kept
        call.messages = [(same.setdefault(r, r), same.setdefault(c, c) if r in SYSTEM_ROLES
                          else c) for r, c in call.messages]
        calls.append(call)
    del same
    groups = _call_groups(calls, own_export)
    if not groups:
        raise TraceError("no LLM spans in the file (spans with openinference.span.kind LLM "
                         "or gen_ai.operation.name chat)")
    own = any(OWN_NODE_KEY in c.span.attributes for calls in groups.values() for _, c in calls)
    key = node_key or (OWN_NODE_KEY if own else None)
    tree = _Tree(tree_spans, {c.span.span_id: _raw_key(c) for calls in groups.values()
                              for _, c in calls})
    sites = {c.span.span_id: _site(c, key, tree) for calls in groups.values() for _, c in calls}
    ids = node_ids([SiteName(site.key, site.name, site.key[0] == "unit" or len(site.key) == 1,
                             site.key[1] if len(site.key) > 1 and site.key[0] != "unit"
                             else "", site.tool) for site in sites.values()])
    roots = _roots(tree_spans)
    prompted = prompt_inputs(tree_spans)
    del tree, tree_spans
    declared = declared_edges(edges, set(ids.values()))
    traces, ambiguous = [], []
    for group in list(groups):
        calls = groups.pop(group)  # a trace's calls, read: they are let go as it is built
        trace = _trace(group, calls, ids, sites, roots.get(calls[0][1].span.trace_id), own,
                       ambiguous, frozenset(flows), declared, prompted)
        trace.calls = {node: call.settled() for node, call in trace.calls.items()}
        traces.append(trace)
    _check_one_pipeline(traces)
    check_declared(traces, declared)
    edges = sorted({e for t in traces for e in t.edges})
    _check_acyclic(traces, edges)
    output = _output_node(traces, edges, ambiguous)
    nodes = _nodes(traces, edges)
    models = Counter(c.model for t in traces for c in t.calls.values() if c.model)
    temps = {c.temperature for t in traces for c in t.calls.values()}
    # re-runs ask for as many tokens as the pipeline's most generous call did, never fewer
    limits = [c.max_tokens for t in traces for c in t.calls.values() if c.max_tokens]
    found_by: dict[tuple[str, str], str] = {}
    for t in traces:
        for edge, how in t.found_by.items():
            found_by.setdefault(edge, how)
    return Pipeline(nodes, edges, output, traces, ambiguous,
                    models.most_common(1)[0][0] if models else "",
                    temps.pop() if len(temps) == 1 else None, max(limits, default=None),
                    found_by)


KIND = SPAN_KIND
# what the inference reads of a span once its call (if it is one) has been read: its kind,
# and of a span that may be a unit or a root, the values it received and returned
_ALWAYS = (KIND, "gen_ai.operation.name")
_VALUES = ("input.value", "output.value")


def _kept(span: Span, node_key: str | None, same: dict[str, str]) -> Span:
    """The span with only the attributes the inference reads after llm_call: its kind,
    this project's own `semback.*`, the --node-key attribute, and input.value/output.value
    of a span that may be a unit (UNIT_KINDS) or a trace's root. An LLM call's messages,
    request and reply JSON are dropped (its Call holds what was read of them). `same`
    gives one copy of its trace id, name and kind to all the spans that repeat them."""
    a = span.attributes
    kept = {k: same.setdefault(a[k], a[k]) if isinstance(a[k], str) else a[k]
            for k in _ALWAYS if k in a}
    if not span.parent_id or str(a.get(KIND) or "").upper() in (*UNIT_KINDS, PROMPT_KIND):
        kept.update((k, a[k]) for k in _VALUES if k in a)
    if node_key and node_key in a:
        kept[node_key] = a[node_key]
    kept.update((k, v) for k, v in a.items() if k.startswith("semback."))
    return Span(same.setdefault(span.trace_id, span.trace_id), span.span_id, span.parent_id,
                same.setdefault(span.name, span.name), span.start, span.end, kept)


def _call_groups(calls: list[Call], own: bool) -> dict[tuple, list[tuple[str, Call]]]:
    """LLM calls by example: a trace, or (own export) a trace's step, phase and example.
    `calls` holds every call but a run of this project's non-forward ones; `own`: the spans
    hold such a run (some LLM span has `semback.purpose`)."""
    if own:  # a run of this project: its forward calls at the first step that has them
        forward = [c for c in calls if "semback.purpose" in c.span.attributes]
        first = min((c.span.attributes.get("semback.step") or 0 for c in forward), default=0)
        calls = [c for c in forward if (c.span.attributes.get("semback.step") or 0) == first]
    groups: dict[tuple, list[tuple[str, Call]]] = defaultdict(list)
    for call in sorted(calls, key=lambda c: (c.span.start, c.span.end, c.span.span_id)):
        span = call.span
        a = span.attributes
        group = (span.trace_id, str(a.get("semback.phase") or ""),
                 str(a.get("semback.example_id") or ""))
        groups[group].append((span.span_id, call))
    return dict(groups)


class _Tree:
    """The spans of each trace by id, each with the LLM calls under it."""

    def __init__(self, spans: list[Span], keys: dict[str, tuple]) -> None:
        self.keys = keys  # LLM span id -> its raw site key
        self.by_id = {(s.trace_id, s.span_id): s for s in spans}
        self.below: dict[tuple[str, str], list[Span]] = defaultdict(list)
        for s in spans:
            if not is_llm_span(s):
                continue
            for up in self.ancestors(s):
                self.below[(up.trace_id, up.span_id)].append(s)

    def ancestors(self, span: Span) -> list[Span]:
        """The span's ancestors, nearest first, the trace's root excluded."""
        out, seen = [], set()
        parent = self.by_id.get((span.trace_id, span.parent_id))
        while parent is not None and parent.parent_id and parent.span_id not in seen:
            seen.add(parent.span_id)
            out.append(parent)
            parent = self.by_id.get((parent.trace_id, parent.parent_id))
        return out


def _raw_key(call: Call) -> tuple:
    """A call site without a unit: its span name and its prompt as written."""
    return (call.span.name, call.template if call.template is not None else call.system)


def _site(call: Call, key: str | None, tree: _Tree) -> Site:
    if key:
        if key not in call.span.attributes:
            raise TraceError(f"--node-key {key}: LLM span '{call.span.name}' (trace "
                             f"{call.span.trace_id}) has no attribute '{key}'")
        value = str(call.span.attributes[key])
        return Site((value,), value, None)
    mine = _raw_key(call)
    units = []  # the ancestors that hold no other call site (a retried predictor's
    # calls aside), nearest first
    retried: set[str] | None = None  # the calls of a predictor that asked again
    for up in tree.ancestors(call.span):
        kind = str(up.attributes.get(SPAN_KIND) or "").upper()
        if kind not in UNIT_KINDS:
            break
        below = tree.below[(up.trace_id, up.span_id)]
        if retried is not None:  # above the predictor: units while they hold only its calls
            if {s.span_id for s in below} != retried:
                break
        elif any(tree.keys.get(s.span_id, mine) != mine for s in below):
            if not _adapter_retry(up, below, tree):
                break
            retried = {s.span_id for s in below}  # one node, all its calls
        units.append(up)
    if not units:
        return Site(mine, mine[0], None, tool_of(call))
    # the unit that names the node: one named by a signature, else by its own name; its
    # values are the node's (without a name: the highest unit that returned a value)
    named_units = [(u, n) for u in units if (n := _unit_name(u))]
    unit, named = next(((u, n) for u, n in named_units if signature_name(u.name)),
                       None) or next(iter(named_units), (None, None))
    if unit is None:
        unit = next((u for u in reversed(units) if "output.value" in u.attributes), units[-1])
    if named is None:  # a framework's unit: named by what it returns (DSPy's output fields)
        returned = json_value(str(unit.attributes.get("output.value") or ""))
        fields = [k for k in returned if k not in IGNORED_FIELDS] \
            if isinstance(returned, dict) else []
        if not fields:
            return Site(mine, mine[0], unit)
        named = "_".join(fields)
    return Site(("unit", named), named, unit)


def _adapter_retry(unit: Span, below: list[Span], tree: _Tree) -> bool:
    """Whether the calls under `unit` (a predictor: DSPy's `Predict(Sig).forward`, or the
    `Predict(StringSignature)` inside a ChainOfThought) are one call made again through
    another adapter, each call's parent an adapter span right under the unit: one node,
    its last call the one whose reply the predictor returned."""
    for s in below:
        parent = tree.by_id.get((s.trace_id, s.parent_id))
        if parent is None or not RETRY_ADAPTERS.match(parent.name) \
                or parent.parent_id != unit.span_id:
            return False
    return True


def _unit_name(span: Span) -> str | None:
    """A unit span's name as the code names it: the signature of `Predict(Sig).forward`,
    else its own name, else the key the code gave a framework's step (LangChain's `assign`
    key); None for a framework's own machinery (engine/traces/conventions.py)."""
    if GENERIC_NAMES.match(span.name):
        return key_name(span.name)
    return signature_name(span.name) or span.name


def _roots(spans: list[Span]) -> dict[str, str]:
    """trace id -> its root span's input.value (when the root is not itself a call)."""
    out = {}
    for s in spans:
        value = root_input(s)
        if value is not None:
            out[s.trace_id] = value
    return out


def root_input(span: Span) -> str | None:
    """The input of the trace this span is the root of, as examples are keyed and targets
    matched (its input.value, plain); None when the span is no root, is itself a call, or
    carries no input."""
    if span.parent_id or is_llm_span(span) or "semback.run_id" in span.attributes:
        return None
    value = span.attributes.get("input.value")
    return plain_input(value) if isinstance(value, str) and value.strip() else None


def plain_input(value: str) -> str:
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


def _trace(group: tuple, calls: list[tuple[str, Call]], ids: dict[tuple, str],
           sites: dict[str, Site], root_input: str | None, own: bool, ambiguous: list[dict],
           flows: frozenset[tuple[str, str]] = frozenset(),
           edges: frozenset[tuple[str, str]] = frozenset(),
           prompted: dict[str, list[tuple[str, str]]] | None = None) -> Trace:
    trace_id, _, example = group
    by_node: dict[str, Call] = {}
    units: dict[str, Span] = {}
    loops: Counter = Counter()
    last = ""
    for _, call in calls:
        site = sites[call.span.span_id]
        node = ids[site.key]
        if node in by_node and node != last:
            raise TraceError(f"trace {trace_id}: the call site '{node}' is called again after "
                             f"'{last}', so its content flow has a cycle; a call site called "
                             "again right after itself (a tool loop) is one node, but one "
                             "trace must be one pass through the pipeline (--node-key ATTR "
                             "can tell call sites apart)")
        loops[node] += 1
        by_node.pop(node, None)  # a loop: the node is its last call, ordered as that call
        by_node[node] = call
        last = node
        if site.unit is not None:
            units[node] = site.unit
    first = calls[0][1]
    users = [c for r, c in first.messages if r == "user"]
    source = root_input if (root_input and not own) else (users[-1] if users else "")
    trace = Trace(trace_id, example or trace_id, source, by_node, units=units,
                  loops={n: k for n, k in loops.items() if k > 1})
    order = list(by_node)
    for node in order:
        call = by_node[node]
        system, prompt, problem = _system_spec(call)
        reply, value = _reply_spec(call, units.get(node))
        trace.values[node] = value
        trace.returns[node] = _returned_fields(units.get(node))
        trace.prompts[node] = str(call.span.attributes.get(OWN_PROMPT, prompt))
        if problem:
            ambiguous.append({"trace_id": trace_id, "from": [node], "to": node,
                              "text": "", "reason": problem})
        earlier = order[:order.index(node)]
        shown = [up for up in earlier if (by_node[up].system, call.system) in flows]
        told = [up for up in earlier if (up, node) in edges and up not in shown]
        declared = shown + told
        slots = evidence(trace, earlier, node, ambiguous, declared,
                          (prompted or {}).get(call.span.span_id, []))
        if trace.root_input.strip():
            slots.setdefault(INPUT, trace.root_input)
        spec: dict[str, Any] = {"messages": make_template(call.non_system(), slots)}
        if system is not None:
            if "variables" in system:  # a variable that received an upstream value: a slot
                system["variables"] = {
                    name: next(({"slot": up} for up, text in slots.items()
                                if up != INPUT and text == value), value)
                    for name, value in system["variables"].items()}
            spec["system"] = system
        if reply is not None:
            spec["reply"] = reply
        if call.tools:
            spec["tools"] = call.tools
        trace.templates[node] = spec if len(spec) > 1 else spec["messages"]
        trace.edges.update((up, node) for up in slots_used(spec) if up != INPUT)
        for up in slots_used(spec):  # a template variable's slot: content too
            if up != INPUT and up not in declared:
                trace.found_by.setdefault((up, node), "content")
        for up in shown:
            trace.found_by.setdefault((up, node), "intervention")
        for up in told:
            trace.found_by.setdefault((up, node), "declaration")
        trace.edges.update((up, node) for up in declared)
        # a flow the content left ambiguous that the pipeline itself showed is no longer so
        ambiguous[:] = [a for a in ambiguous if a.get("trace_id") != trace_id
                        or a.get("to") != node or not set(a.get("from") or []) <= set(declared)]
    return trace


def _system_spec(call: Call) -> tuple[dict[str, Any] | None, str, str | None]:
    """How the call's prompt (what the user wrote) sits in its system message: (the spec
    of engine/prompts/recorded.py or None when the prompt is the whole message, the
    prompt, a problem to report)."""
    system = call.system
    if call.template is not None:
        rendered = call.template
        for name, value in call.variables.items():
            rendered = rendered.replace("{" + name + "}", value)
        problem = None
        if system and rendered != system:
            problem = ("the recorded prompt template, rendered with its variables, is not "
                       "the system message the call sent; re-runs send the rendered template")
        return {"variables": dict(call.variables)}, call.template, problem
    for marker, indent in PROMPT_MARKERS:
        at = system.find(marker)
        if at < 0:
            continue
        rest = system[at + len(marker):]
        lines = rest.split("\n")
        if lines[0] == "" and all(line.startswith(indent) or not line.strip()
                                  for line in lines[1:]):
            prompt = "\n".join(line[len(indent):] for line in lines[1:])
            return {"before": system[:at + len(marker)], "indent": indent, "after": ""}, \
                prompt, None
    return None, system, None


def _reply_spec(call: Call, unit: Span | None) -> tuple[dict[str, Any] | None, str]:
    """How the pipeline read the call's reply, and the value it read: the unit's returned
    value (`output.value`) when the reply holds it, else the reply."""
    reply = call.output
    calls = TOOL_CALL.findall(reply)
    if len(calls) == 1 and reply.startswith("<tool_call ") and "\n" not in reply:
        return {"format": "tool_arguments"}, calls[0]  # what a forced tool call passes on
    returned = unit.attributes.get("output.value") if unit is not None else None
    if not isinstance(returned, str):
        return None, reply
    parsed = json_value(returned)
    fields = reply_fields(reply)
    if isinstance(parsed, dict) and fields:
        wanted = [k for k in parsed if k in fields]
        main = [k for k in wanted if k not in IGNORED_FIELDS] or wanted
        if len(main) == 1:
            return {"format": "fields", "field": main[0]}, fields[main[0]]
        if main:
            return {"format": "fields", "fields": main}, json.dumps(
                {k: fields[k] for k in main}, ensure_ascii=False)
    text = parsed if isinstance(parsed, str) else returned
    if text == reply:
        return None, reply
    if text == reply.strip():
        return {"format": "strip"}, text
    return None, reply


def _returned_fields(unit: Span | None) -> list[str]:
    """The names of the fields a unit returned (its output.value's keys), if any."""
    returned = json_value(str(unit.attributes.get("output.value") or "")) if unit else None
    return list(returned) if isinstance(returned, dict) else []


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
        split = all(len(t.calls) == 1 for t in traces)
        raise TraceError(f"spans of several unrelated pipelines are mixed (call sites "
                         f"{shown} never share a trace): import one pipeline's traces at "
                         "a time" + ("; every trace holds a single call, as when two "
                                     "instrumentors (say LangChain's and OpenAI's) each start "
                                     "their own trace: instrument the pipeline with one, or "
                                     "run each pass under one parent span" if split else ""))
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
    unsure = [a for a in ambiguous if set(a["from"]) & set(sinks)]
    considered = considered_flows(unsure, sinks, nodes, len(traces))
    shown = "; ".join(f"{c['from']} -> {c['to']}: {c['reason']}"
                      + (f" ('{c['text']}')" if c["text"] else "")
                      + f" in {c['traces']} of {len(traces)} traces" for c in considered[:4])
    more = f"; {len(considered) - 4} more" if len(considered) > 4 else ""
    raise TraceError(f"the calls {', '.join(sinks)} feed no later call that the content "
                     f"shows, so the pipeline's final call is not one. Flows considered and "
                     f"not taken: {shown}{more}. Declare a flow the content cannot show with "
                     "--edge FROM:TO", {"ambiguous": unsure, "candidates": considered})


def _nodes(traces: list[Trace], edges: list[tuple[str, str]]) -> dict[str, NodeInfo]:
    """Each node's prompt (the same in every trace, or refused) and inputs."""
    nodes = {}
    for node in traces[0].calls:
        prompts = Counter(t.prompts[node] for t in traces)
        if len(prompts) > 1:
            (one, n1), (other, _) = prompts.most_common(2)
            at = [t.trace_id for t in traces if t.prompts[node] == other][0]
            raise TraceError(
                f"call '{node}': its prompt differs across traces ({n1} traces send "
                f"{_short(one)}, trace {at} sends {_short(other)}) and no prompt template "
                "was recorded, so no one text is its prompt: record the template with "
                "OpenInference's using_prompt_template(template=..., variables=...) so each "
                "trace's own variables are sent again (docs/traces.md), or --node-key ATTR "
                "to tell call sites apart")
        uses_input = any(INPUT in slots_used(t.templates[node]) for t in traces)
        ups = [a for a, b in edges if b == node]
        inputs = ([INPUT] if uses_input or not ups else []) + ups
        nodes[node] = NodeInfo(node, next(iter(prompts)), len(traces), inputs)
    return nodes


def _short(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= 60 else text[:57] + "...")
