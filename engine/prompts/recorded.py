"""The forward messages of a node imported from traces (engine/traces): the call as the
user's pipeline made it, with the node's prompt as its system message and every upstream
output (and the pipeline's input) put back where the trace had it.

A recorded template is the trace's non-system messages with each substitutable text cut
out as a slot: `[{"role": "user", "parts": ["Summary: ", {"slot": "summarize"}, "\n..."]}]`.
Rendering puts a node's current input values into the slots, so a probe that changes an
upstream output changes exactly that text in the downstream call, and rendering the logged
values gives back the recorded messages byte for byte.

What the optimizer is shown of such a call (`marked_read`) is the same messages, each slot
tagged with its input's name: the text the call really read (a retrieved passage, the
pipeline's own wording, only the part of the input it was given) with the inputs a
gradient is asked for marked where they sit.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Collection, Mapping
from typing import Any

# The example field that holds each imported node's template: {node id: template}.
RECORDED_FIELD = "recorded_calls"


def cut_slots(text: str, slots: Mapping[str, str]) -> list[Any]:
    """`text` as parts, each occurrence of a slot's value replaced by {"slot": name}.
    Longer values are cut first, so a value that only occurs inside a longer one is not
    cut there. A value that several slots share (two calls that said the same) is cut in
    turn: its first occurrence is the first of those slots (in `slots`' order), the next
    the next, the last slot taking any further ones."""
    by_value: dict[str, list[str]] = {}
    for name, value in slots.items():
        if value:
            by_value.setdefault(value, []).append(name)
    parts: list[Any] = [text]
    for value, names in sorted(by_value.items(), key=lambda item: -len(item[0])):
        out: list[Any] = []
        seen = 0
        for part in parts:
            if not isinstance(part, str):
                out.append(part)
                continue
            pieces = part.split(value)
            for i, piece in enumerate(pieces):
                if i:
                    out.append({"slot": names[min(seen, len(names) - 1)]})
                    seen += 1
                if piece:
                    out.append(piece)
        parts = out
    return parts


def slots_used(template: list[dict[str, Any]] | dict[str, Any]) -> list[str]:
    """The slot names a template fills (its messages', then its system variables'), in
    order of first use."""
    spec = _spec(template)
    found: dict[str, None] = {}
    for message in spec["messages"]:
        for part in message["parts"]:
            if isinstance(part, dict):
                found.setdefault(part["slot"], None)
    for value in (spec.get("system") or {}).get("variables", {}).values():
        if isinstance(value, dict):
            found.setdefault(value["slot"], None)
    return list(found)


def make_template(messages: list[tuple[str, str]], slots: Mapping[str, str]
                  ) -> list[dict[str, Any]]:
    return [{"role": role, "parts": cut_slots(content, slots)} for role, content in messages]


# A node's template is either the list of its non-system messages (the prompt is the
# whole system message), or a call spec, a dict:
#   "messages": that list;
#   "system":   how the prompt becomes the system message, when it is not all of it:
#               {"variables": {name: text or {"slot": input}}}: the prompt is a template
#               (OpenInference's llm.prompt_template.template) and each `{name}` in it is
#               this trace's variable; or {"before": ..., "indent": ..., "after": ...}:
#               the prompt is the part of a framework's system message the user wrote
#               (DSPy's signature instructions), each of its lines after `indent`;
#   "reply":    how the pipeline read the reply: {"format": "fields", "field": NAME}
#               (DSPy's `[[ ## NAME ## ]]` sections: the value is that field's; "fields":
#               [...] when it read several, as a JSON object), {"format": "strip"}, or
#               {"format": "tool_arguments"} (a forced tool call: its arguments' JSON);
#   "tools":    the tools the call offered ({"tools": [...], "tool_choice": ...}).
def _spec(template: list[dict[str, Any]] | dict[str, Any]) -> dict[str, Any]:
    return template if isinstance(template, dict) else {"messages": template}


def node_spec(template_json: str, node_id: str) -> dict[str, Any] | None:
    """A recorded node's call spec in one example (see above), or None. Read-only: the
    parsed templates are shared by every call that reads the same example's."""
    templates = _templates(template_json or "{}")
    return _spec(templates[node_id]) if node_id in templates else None


@functools.lru_cache(maxsize=4096)
def _templates(template_json: str) -> dict[str, Any]:
    """An example's templates, parsed once for the four reads of each of its calls (its
    messages, tools, output and what the optimizer is shown), not once a read."""
    return json.loads(template_json)


def render_prompt(prompt: str, system: Mapping[str, Any] | None,
                  values: Mapping[str, str]) -> str:
    """The system message a recorded call sends with `prompt` as its trainable part."""
    if not system:
        return prompt
    if "variables" in system:
        text = prompt
        for name, value in system["variables"].items():
            if isinstance(value, dict):
                value = values.get(value["slot"], "")
            text = text.replace("{" + name + "}", str(value))
        return text
    indent = system.get("indent", "")
    body = "".join("\n" + indent + line for line in prompt.splitlines()) if indent \
        else prompt
    return system.get("before", "") + body + system.get("after", "")


TOOL_ARGUMENTS = re.compile(r'<tool_call name="[^"]*">(.*)</tool_call>')
PLACEHOLDER = re.compile(r"\{(\w+)\}")
DROPPED_REASON = "drops the template variables {}"


def dropped_variables(old: str, new: str) -> list[str]:
    """The `{name}` placeholders of an imported call's prompt template that a proposal
    lost (each trace fills them with its own text)."""
    kept = set(PLACEHOLDER.findall(new))
    return [v for v in dict.fromkeys(PLACEHOLDER.findall(old)) if v not in kept]


FIELD_HEADER = re.compile(r"\[\[ ## (\w+) ## \]\]")
JSON_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def reply_fields(reply: str) -> dict[str, str]:
    """The fields of a DSPy reply: ChatAdapter's `[[ ## name ## ]]` sections, each its
    field's value, else JSONAdapter's JSON object (in a code fence or not), its values as
    text; {} for a reply that is neither."""
    pieces = FIELD_HEADER.split(reply)
    if len(pieces) > 1:
        return {pieces[i]: pieces[i + 1].strip() for i in range(1, len(pieces) - 1, 2)
                if pieces[i] != "completed"}
    text = JSON_FENCE.sub("", reply.strip())
    if not text.startswith("{"):
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {str(k): v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
            for k, v in parsed.items()}


def recorded_output(template_json: str, node_id: str, reply: str) -> tuple[str, str | None]:
    """A recorded call's output as the pipeline read its reply: the reply itself, or the
    field(s) its framework parsed out of it; (output, problem) where problem names a reply
    that lacks the field."""
    spec = node_spec(template_json, node_id) or {}
    how = spec.get("reply") or {}
    if how.get("format") == "strip":
        return reply.strip(), None
    if how.get("format") == "tool_arguments":
        match = TOOL_ARGUMENTS.search(reply)
        return (match[1], None) if match else (reply, "the reply calls no tool")
    if how.get("format") != "fields":
        return reply, None
    found = reply_fields(reply)
    if "fields" in how:
        missing = [f for f in how["fields"] if f not in found]
        value = json.dumps({f: found.get(f, "") for f in how["fields"]}, ensure_ascii=False)
    else:
        missing = [] if how["field"] in found else [how["field"]]
        value = found.get(how["field"], "")
    return value, (f"the reply has no field {', '.join(missing)}" if missing else None)


def recorded_tools(template_json: str, node_id: str) -> dict[str, Any] | None:
    spec = node_spec(template_json, node_id) or {}
    return spec.get("tools") or None


READ_MESSAGE = '<message role="{role}">\n{text}\n</message>'
READ_INPUT = '<input name="{name}">{value}</input>'
READ_HIDDEN = '<input name="{name}">(not shown)</input>'


def marked_read(template_json: str, node_id: str, values: Mapping[str, str],
                shown: Collection[str] | None = None) -> str:
    """A recorded node's non-system messages as the call read them, each slot as
    `<input name="...">value</input>`; a slot whose input is not in `shown` (a sibling a
    sibling-blind method must not see) reads "(not shown)". "" when the example holds no
    template for the node."""
    spec = node_spec(template_json, node_id)
    if spec is None:
        return ""
    blocks = []
    for message in spec["messages"]:
        text = "".join(
            part if isinstance(part, str) else
            (READ_INPUT if shown is None or part["slot"] in shown else READ_HIDDEN).format(
                name=part["slot"], value=values.get(part["slot"], ""))
            for part in message["parts"])
        blocks.append(READ_MESSAGE.format(role=message["role"], text=text))
    return "\n".join(blocks)


def recorded_messages(prompt: str, template_json: str, node_id: str,
                      values: Mapping[str, str]) -> list[tuple[str, str]]:
    """A recorded node's forward messages: its prompt as the system message (none when the
    prompt is empty, as the pipeline had none), then the template with `values` in its
    slots. Raises ValueError when the example holds no template for the node."""
    spec = node_spec(template_json, node_id)
    if spec is None:
        raise ValueError(f"no recorded call of node '{node_id}' in this example")
    system = render_prompt(prompt, spec.get("system"), values) if prompt else ""
    messages = [("system", system)] if system else []
    for message in spec["messages"]:
        text = "".join(part if isinstance(part, str) else values.get(part["slot"], "")
                       for part in message["parts"])
        messages.append((message["role"], text))
    return messages
