"""Flows found by intervention: the pipeline itself says which call reads which.

The importer finds a flow by content (an earlier reply's text in a later call's messages)
or by structure (a value a framework's unit returned and a later one received). Where
neither shows it (a one-word value that also stands in the input; a tool call's arguments
that the code formats into the next prompt as "1 x apple") the import loses the edge, or
refuses. With the pipeline at hand, the gateway asks it instead, on a few examples:

1. every call site's reply is served from the recorded run (a candidate that patches each
   site with its own recorded reply: no call goes upstream), and each later call's request
   is noted;
2. then once per call site, with that site's reply alone changed to a variant that is
   still well-formed (a number moved, a word added, a tool call's argument values changed
   the same way, inside DSPy's field sections);
3. a later call site whose request changed read the changed site's reply: a flow. Since
   every other reply is held at its recorded text, only a direct reader's request changes.

A call site is known here by its system message, as the importer keys a call site with no
unit; the flows are pairs of system messages, which engine.traces.infer maps to its nodes.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from typing import Any

from engine.gateway.calls import TOOL_CALL, reply_text
from engine.gateway.interventions import Candidate, NodeRule, system_text
from engine.gateway.runner import Runner
from engine.gateway.server import Gateway, Seen
from engine.prompts.recorded import FIELD_HEADER

MARK = "Zq"  # what a variant adds to a text: a word no reply is likely to hold
EXAMPLES = 2  # examples a pipeline is asked on


def variant_value(value: Any) -> Any:
    """A JSON value changed in every leaf, its shape kept."""
    if isinstance(value, dict):
        return {k: variant_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [variant_value(v) for v in value] or [MARK]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7
    if isinstance(value, float):
        return value + 7.5
    if value is None:
        return MARK
    return variant_text(str(value))


def variant_text(text: str) -> str:
    """A text changed so that a reader's request shows it, and still read as before: a
    number stays a number, JSON stays JSON of the same shape."""
    stripped = text.strip()
    try:
        parsed = json.loads(stripped)
    except (json.JSONDecodeError, ValueError):
        parsed = None
    if isinstance(parsed, (dict, list)):
        return json.dumps(variant_value(parsed), ensure_ascii=False)
    if re.fullmatch(r"-?\d+", stripped):
        return str(int(stripped) + 7)
    if re.fullmatch(r"-?\d*\.\d+", stripped):
        return str(float(stripped) + 7.5)
    return f"{stripped} {MARK}" if stripped else MARK


def variant_reply(reply: str) -> str:
    """A reply (as engine.gateway.calls.reply_text writes it) with its value changed:
    each tool call's arguments, each DSPy field's value, else the text."""
    if TOOL_CALL.search(reply):
        return "\n".join(
            f'<tool_call name="{m[1]}">{variant_text(m[2])}</tool_call>'
            if (m := TOOL_CALL.fullmatch(line.strip())) else line
            for line in reply.split("\n"))
    pieces = FIELD_HEADER.split(reply)
    if len(pieces) > 1:
        out = [pieces[0]]
        for i in range(1, len(pieces) - 1, 2):
            name, value = pieces[i], pieces[i + 1]
            changed = value if name == "completed" else \
                f"\n{variant_text(value.strip())}\n\n"
            out.append(f"[[ ## {name} ## ]]{changed}")
        return "".join(out)
    return variant_text(reply)


async def find_flows(gateway: Gateway, runner: Runner,
                     examples: list[tuple[dict[str, Any], list[Seen]]]
                     ) -> set[tuple[str, str]]:
    """(system message from, system message to) of each flow the pipeline shows on
    `examples`: an example's input fields and the calls of its recorded pass."""
    flows: set[tuple[str, str]] = set()
    for fields, seen in examples[:EXAMPLES]:
        replies: dict[str, str] = {}  # call site (its system message) -> its last reply
        for call in seen:
            system = system_text(call.request)
            if system is not None:
                replies[system] = reply_text(call.completion)
        sites = list(dict.fromkeys(s for c in seen if (s := system_text(c.request))
                                   is not None))
        if len(sites) < 2:
            continue
        baseline = await _requests(gateway, runner, fields, sites, replies, None)
        for i, site in enumerate(sites):
            changed = await _requests(gateway, runner, fields, sites, replies, site)
            flows.update((site, later) for later in sites[i + 1:]
                         if changed.get(later) != baseline.get(later))
    return flows


async def _requests(gateway: Gateway, runner: Runner, fields: dict[str, Any],
                    sites: list[str], replies: dict[str, str], changed: str | None
                    ) -> dict[str, list[str]]:
    """Each call site's requests in a pass where every site's reply is its recorded one,
    `changed`'s a variant of it."""
    ids = {system: f"site{i}" for i, system in enumerate(sites)}
    patched = {ids[s]: variant_reply(r) if s == changed else r for s, r in replies.items()}
    name = "flows-" + hashlib.sha256(json.dumps(sorted(patched.items())).encode()
                                     ).hexdigest()[:12]
    gateway.candidates.setdefault(name, Candidate(
        name, [NodeRule(ids[s], s) for s in sites], {}, patched))
    session = f"{name}-{secrets.token_hex(4)}"
    await runner.run(fields, session, name)
    by_id = {v: k for k, v in ids.items()}
    out: dict[str, list[str]] = {}
    for call in gateway.done(session):
        if call.node in by_id:
            out.setdefault(by_id[call.node], []).append(json.dumps(
                call.request.get("messages"), sort_keys=True))
    return out
