"""How a flow from one call of a trace to a later one is found (docs/traces.md, "What the
importer finds"): by structure (a value an earlier unit returned that the later unit, or
the prompt template that rendered its messages, received), by content (an earlier reply's
text in the later call's messages, unless it is short, repeated by two calls or also the
pipeline's input: then `ambiguous`), by intervention (engine/gateway/flows.py) or by
declaration (`--edge FROM:TO`); and, when a call feeds nothing, the flows considered and
why each was not taken. `Trace` is one trace as the inference builds it."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from engine.prompts import templates as P
from engine.traces import TraceError
from engine.traces.conventions import SPAN_KIND
from engine.traces.names import slug
from engine.traces.otlp import Call, Span, is_llm_span, json_value

KIND = SPAN_KIND
PROMPT_KIND = "PROMPT"  # OpenInference's kind of a prompt template's span


MIN_EVIDENCE = 8  # characters: a shorter text in a later call is no evidence of flow


@dataclass
class Trace:
    """One trace: one example of the pipeline."""

    trace_id: str
    example_id: str
    root_input: str
    calls: dict[str, Call]  # node id -> its call (a loop's last)
    templates: dict[str, Any] = field(default_factory=dict)  # engine/prompts/recorded.py
    edges: set[tuple[str, str]] = field(default_factory=set)
    values: dict[str, str] = field(default_factory=dict)  # node id -> the value it returned
    units: dict[str, Span] = field(default_factory=dict)  # node id -> the span that owns it
    prompts: dict[str, str] = field(default_factory=dict)  # node id -> its prompt here
    loops: dict[str, int] = field(default_factory=dict)  # node id -> its calls, when > 1
    returns: dict[str, list[str]] = field(default_factory=dict)  # node -> its unit's fields
    # how each edge was found: "structure", "content" or "intervention"
    found_by: dict[tuple[str, str], str] = field(default_factory=dict)

    def final_output(self, node_id: str) -> str:
        return self.values.get(node_id, self.calls[node_id].output)


TOOL_CALL = re.compile(r'<tool_call name="[^"]*">(.*)</tool_call>')


def names_source(field_name: str, up: str, trace: Trace) -> bool:
    """Whether a received field's name says where it came from: the upstream node's id,
    or a field the upstream unit returned (DSPy's `note` from NoteSentence)."""
    return field_name != "" and (slug(field_name) == up or field_name in trace.returns[up])


def unit_received(unit: Span | None) -> list[tuple[str, str]]:
    """The values a unit received: (field, text) of its `input.value` (a JSON object's
    string fields, or the whole text)."""
    if unit is None:
        return []
    value = unit.attributes.get("input.value")
    if not isinstance(value, str):
        return []
    parsed = json_value(value)
    if isinstance(parsed, dict):
        out = []
        for name, v in parsed.items():
            if isinstance(v, str):
                out.append((name, v))
            elif isinstance(v, dict):  # DSPy and LangChain nest keyword arguments
                out.extend((k, x) for k, x in v.items() if isinstance(x, str))
        return out
    return [("", parsed if isinstance(parsed, str) else value)]


def evidence(trace: Trace, earlier: list[str], node: str, ambiguous: list[dict],
              declared: list[str] = (), prompted: list[tuple[str, str]] = ()
              ) -> dict[str, str]:
    """upstream node -> the text of its value found in `node`'s messages: structural
    (the node's unit received it, or the prompt template that rendered its messages:
    `prompted`), found by intervention or declared (`declared`: where the messages hold
    the value), or by content."""
    call = trace.calls[node]
    body = "\n".join(c for _, c in call.non_system())
    system_text = call.system if call.template is not None else ""
    slots: dict[str, str] = {}
    # what the unit received, and what the call's template variables received
    received = unit_received(trace.units.get(node)) + list(call.variables.items()) + \
        list(prompted)
    structural: dict[str, str] = {}
    for name, text in received:
        text = text.strip()
        if not text:
            continue
        sources = [up for up in earlier if trace.values[up].strip() == text]
        if len(sources) > 1:
            named = [up for up in sources if names_source(name, up, trace)]
            sources = named or sources
        if len(sources) > 1:
            ambiguous.append({"trace_id": trace.trace_id, "from": sources, "to": node,
                              "text": text[:80], "reason": f"the value of '{name}' came "
                              f"from {len(sources)} calls"})
        elif sources and (text != trace.root_input.strip()
                          or names_source(name, sources[0], trace)):
            # a value the unit received from an earlier one: a flow however short, unless
            # it is the pipeline's whole input and the field does not name its source
            if text in body or text in system_text:
                structural[sources[0]] = text
            else:
                ambiguous.append({"trace_id": trace.trace_id, "from": sources, "to": node,
                                  "text": text[:80], "reason": f"'{node}' received the "
                                  f"value as '{name}' but its call's messages do not hold it"})
    slots.update(structural)
    for up in structural:
        trace.found_by[(up, node)] = "structure"
    found: dict[str, str] = {}
    for up in earlier:
        if up in structural:
            continue
        upstream = trace.calls[up]
        if upstream.span.end > call.span.start and upstream.span.end and call.span.start:
            continue  # still running when this call began: its reply cannot be in it
        for text in reply_texts(trace.values[up]):
            if text in body or text in system_text:
                found[up] = text
                break
    by_text: dict[str, list[str]] = defaultdict(list)
    for up, text in found.items():
        by_text[text].append(up)
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
            trace.found_by.setdefault((ups[0], node), "content")
    for up in declared:  # the pipeline showed the flow: the value is a slot where it sits
        text = trace.values[up].strip()
        if up not in slots and text and (text in body or text in system_text):
            slots[up] = text
    return slots


def prompt_inputs(spans: list[Span]) -> dict[str, list[tuple[str, str]]]:
    """LLM span id -> the values the prompt template that rendered its messages received:
    the PROMPT span beside it (LangChain's ChatPromptTemplate, under the same parent), the
    last to start before it. OpenInference records the variables there, not on the call."""
    templates: dict[tuple[str, str], list[Span]] = defaultdict(list)
    for s in spans:
        if str(s.attributes.get(KIND) or "").upper() == PROMPT_KIND:
            templates[(s.trace_id, s.parent_id)].append(s)
    out = {}
    for s in spans:
        before = [t for t in templates.get((s.trace_id, s.parent_id), ()) if t.start <= s.start]
        if before and is_llm_span(s):
            out[s.span_id] = unit_received(max(before, key=lambda t: t.start))
    return out


def declared_edges(edges: Collection[tuple[str, str]], nodes: set[str]
              ) -> frozenset[tuple[str, str]]:
    """The flows the user declared (--edge FROM:TO), each naming two call sites."""
    for a, b in edges:
        for name in (a, b):
            if name not in nodes:
                raise TraceError(f"--edge {a}:{b}: no call site is named '{name}' (the call "
                                 f"sites: {', '.join(sorted(nodes))})")
        if a == b:
            raise TraceError(f"--edge {a}:{b}: a call cannot feed itself")
    return frozenset(edges)


def check_declared(traces: list[Trace], edges: frozenset[tuple[str, str]]) -> None:
    """A declared flow that a trace contradicts is refused: there, TO was called before
    FROM answered, so it cannot have read FROM's reply."""
    for a, b in sorted(edges):
        for t in traces:
            up, down = t.calls[a].span, t.calls[b].span
            if down.start < up.end or list(t.calls).index(b) < list(t.calls).index(a):
                raise TraceError(f"--edge {a}:{b}: trace {t.trace_id} contradicts it: '{b}' "
                                 f"was called before '{a}' answered, so it cannot read "
                                 "that reply")


def reply_texts(reply: str) -> list[str]:
    """What of a reply may be passed on: the reply itself, the text in its output tags, or
    a tool call's arguments, whole or each value (longest first: code that formats a
    forced call's arguments into the next prompt passes on only the values)."""
    out = [reply.strip()]
    inner, _ = P.parse_output(reply)
    called = TOOL_CALL.fullmatch(reply.strip())
    arguments = json_value(called[1] if called else reply)
    parts = [inner.strip()]
    if called:
        parts.append(called[1].strip())
    if isinstance(arguments, dict):
        parts += sorted((str(v).strip() for v in arguments.values()
                         if isinstance(v, (str, int, float)) and not isinstance(v, bool)),
                        key=len, reverse=True)
    out += [p for p in parts if p and p not in out]
    return [t for t in out if t]


def considered_flows(unsure: list[dict], sinks: list[str], nodes: list[str], traces: int
                ) -> list[dict[str, Any]]:
    """The flows out of the calls that feed nothing that the import considered, and why
    each was not taken, one entry a flow and reason (`traces`: in how many traces;
    `text`: the first trace's text): the ambiguous ones, and for a call none of whose
    reply's text is in any later call, each later call it might have fed."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for a in unsure:
        for up in a["from"]:
            if up in sinks:
                entry = out.setdefault((up, a["to"], a["reason"]), {
                    "from": up, "to": a["to"], "text": a["text"], "reason": a["reason"],
                    "traces": 0, "trace_ids": set()})
                entry["trace_ids"].add(a["trace_id"])
    for up in sinks:
        if any(k[0] == up for k in out):
            continue
        for down in nodes[nodes.index(up) + 1:]:
            out[(up, down, "")] = {"from": up, "to": down, "text": "", "reason": (
                "no text of its reply (whole, in output tags, or a tool call's arguments) is "
                f"in the messages of '{down}'"), "traces": traces, "trace_ids": set()}
    for entry in out.values():
        entry["traces"] = len(entry.pop("trace_ids")) or entry["traces"]
    return list(out.values())

