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

import json
from collections.abc import Collection, Mapping
from typing import Any

# The example field that holds each imported node's template: {node id: template}.
RECORDED_FIELD = "recorded_calls"


def cut_slots(text: str, slots: Mapping[str, str]) -> list[Any]:
    """`text` as parts, each occurrence of a slot's value replaced by {"slot": name}.
    Longer values are cut first, so a value that only occurs inside a longer one is not
    cut there."""
    parts: list[Any] = [text]
    for name, value in sorted(slots.items(), key=lambda item: -len(item[1])):
        if not value:
            continue
        out: list[Any] = []
        for part in parts:
            if not isinstance(part, str):
                out.append(part)
                continue
            pieces = part.split(value)
            for i, piece in enumerate(pieces):
                if i:
                    out.append({"slot": name})
                if piece:
                    out.append(piece)
        parts = out
    return parts


def slots_used(template: list[dict[str, Any]]) -> list[str]:
    """The slot names a template fills, in order of first use."""
    found: dict[str, None] = {}
    for message in template:
        for part in message["parts"]:
            if isinstance(part, dict):
                found.setdefault(part["slot"], None)
    return list(found)


def make_template(messages: list[tuple[str, str]], slots: Mapping[str, str]
                  ) -> list[dict[str, Any]]:
    return [{"role": role, "parts": cut_slots(content, slots)} for role, content in messages]


READ_MESSAGE = '<message role="{role}">\n{text}\n</message>'
READ_INPUT = '<input name="{name}">{value}</input>'
READ_HIDDEN = '<input name="{name}">(not shown)</input>'


def marked_read(template_json: str, node_id: str, values: Mapping[str, str],
                shown: Collection[str] | None = None) -> str:
    """A recorded node's non-system messages as the call read them, each slot as
    `<input name="...">value</input>`; a slot whose input is not in `shown` (a sibling a
    sibling-blind method must not see) reads "(not shown)". "" when the example holds no
    template for the node."""
    templates = json.loads(template_json or "{}")
    if node_id not in templates:
        return ""
    blocks = []
    for message in templates[node_id]:
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
    templates = json.loads(template_json or "{}")
    if node_id not in templates:
        raise ValueError(f"no recorded call of node '{node_id}' in this example")
    messages = [("system", prompt)] if prompt else []
    for message in templates[node_id]:
        text = "".join(part if isinstance(part, str) else values.get(part["slot"], "")
                       for part in message["parts"])
        messages.append((message["role"], text))
    return messages
