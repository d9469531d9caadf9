"""Structured replies: one JSON schema per reply role, beside the text templates of
`engine/prompts/templates.py`.

When structured replies are on (`--structured auto|on`), `LLMClient.request` asks
`prepare` for the role named in a request's `meta`: it returns the role's schema and the
messages with the text-format instruction ("Answer with one block per input ...")
restated as a JSON one. Backends that can enforce a schema do (llama.cpp grammars,
`response_format` on OpenAI-compatible servers); the reply is then turned back into
today's text format by `reply_text`, so one set of parsers reads both kinds of reply and
the text rules stay the fallback for replies that are not valid JSON.

Every schema keeps room for reasoning (a `reasoning` field, first, so the model reasons
before it answers) and bounds every string with `maxLength`, so a constrained generation
stays as short as its role needs and fits its token budget (`token_budget`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.llm.schema import reasoning_key
from engine.prompts import templates as P

# The reasoning field of every role. A constrained reply must close the string at this
# bound, mid-sentence if need be, and then writes its answer without the end of the thought:
# at 240 the embedded optimizer (the 1.5B) was cut in 29% of its backward and 57% of its
# update replies on the attribution graphs; at 600 in none (its longest: 345 and 399).
REASONING_CHARS = 600
REASONING_MIN = 20      # ... at least this long: a tiny model otherwise skips it
GRADIENT_CHARS = 320    # one input's gradient (backward roles)
PROMPT_CHARS = 480      # a proposed prompt (update)
WANTED_CHARS = 160      # the output the feedback asks of the step (update)

BACKWARD_ROLES = ("backward_joint", "backward_evaluative", "backward_single",
                  "backward_nosibling")


def is_backward(role: str) -> bool:
    """Every `backward_*` role (a method's own, such as `backward_textgrad_lib`, too) asks
    for one gradient per input."""
    return role.startswith("backward_")


@dataclass(frozen=True)
class ReplyShape:
    """How the reply to one role is asked for as JSON and read back as text. The fields
    come after the reasoning field every schema starts with.

    `fields(names)`: [(field, JSON schema, what the restated instruction says of it)];
    an empty list means the role stays text. `to_text(value_of, data, names, reasoning)`:
    the reply in the role's text format, or None to keep the raw reply. `text_form(names)`:
    the block template the role's text instruction shows, replaced by the field list.
    `asks`: the role's text-format sentences, replaced by the JSON instruction."""

    fields: Callable[[list[str]], list[tuple[str, dict[str, Any], str]]]
    to_text: Callable[[Callable[[str], str], dict[str, Any], list[str], str], str | None]
    text_form: Callable[[list[str]], str | None] = lambda names: None
    asks: tuple[str, ...] = ()


# role -> shape. Every backward_* role shares the backward shape (is_backward); a method
# with roles of its own registers their shapes beside its templates (engine/methods/gtbp).
SHAPES: dict[str, ReplyShape] = {}


def register_shape(role: str, shape: ReplyShape) -> None:
    SHAPES[role] = shape


def shape_for(role: str) -> ReplyShape | None:
    role = base_role(role)
    return SHAPES.get("backward" if is_backward(role) else role)


def text_field(max_chars: int, min_chars: int = 0) -> dict[str, Any]:
    """A string field bounded by maxLength (and minLength)."""
    schema: dict[str, Any] = {"type": "string", "maxLength": max_chars}
    if min_chars:
        schema["minLength"] = min_chars
    return schema


def _object(fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "object", "properties": fields, "required": list(fields),
            "additionalProperties": False}


def base_role(role: str) -> str:
    """`backward_joint_repair` -> `backward_joint`: a repair reply has its role's shape."""
    return role[: -len("_repair")] if role.endswith("_repair") else role


def schema_for(role: str, names: list[str] | None = None) -> dict[str, Any] | None:
    """The JSON schema of the reply to a `role` request (None: the role stays text): a
    reasoning field first, then the role's own fields (`ReplyShape.fields`)."""
    shape, names = shape_for(role), list(names or [])
    fields = shape.fields(names) if shape else []
    if not fields:
        return None
    why = {reasoning_key(names): text_field(REASONING_CHARS, REASONING_MIN)}
    return _object({**why, **{key: schema for key, schema, _ in fields}})


def example_reply(role: str, names: list[str]) -> str:
    """The fields the restated instruction lists, one a line: described, not exemplified,
    because a small model copies an example's placeholder text into its reply."""
    shape = shape_for(role)
    fields = [(reasoning_key(names), "a few sentences of reasoning")]
    fields += [(key, what) for key, _, what in (shape.fields(names) if shape else [])]
    return "\n".join(f"- {json.dumps(k, ensure_ascii=False)}: {what}" for k, what in fields)


JSON_ASK = "Answer with one JSON object and nothing else, with these fields in this order:"


def restate(messages: list[tuple[str, str]], role: str, names: list[str]
            ) -> list[tuple[str, str]]:
    """The messages with the last user message's text-format instruction replaced by the
    JSON one (the rest of the prompt is unchanged)."""
    out = list(messages)
    last = max((i for i, (r, _) in enumerate(out) if r == "user"), default=None)
    if last is None:
        return out
    text = out[last][1]
    shape = shape_for(role)
    form = shape.text_form(names) if shape else None
    asks = [a for s in SHAPES.values() for a in s.asks]
    example = example_reply(role, names)
    if form and form in text:
        text = text.replace(form, example)
        for ask in asks:
            text = text.replace(ask, JSON_ASK)
    else:
        replaced = False
        for ask in asks:
            if ask in text:
                text, replaced = text.replace(ask, f"{JSON_ASK}\n{example}"), True
        if not replaced:
            text = f"{text}\n\n{JSON_ASK}\n{example}"
    out[last] = (out[last][0], text)
    return out


def prepare(messages: list[tuple[str, str]], meta: dict[str, Any]
            ) -> tuple[list[tuple[str, str]], dict[str, Any] | None]:
    """(messages, schema) for a request whose `meta` names its role and inputs; the
    messages unchanged and no schema for roles that stay text (forward, judge, probes)."""
    role, names = str(meta.get("role") or ""), list(meta.get("inputs") or [])
    schema = schema_for(role, names)
    if schema is None:
        return messages, None
    return restate(messages, role, names), schema


def decode(reply: str) -> dict[str, Any] | None:
    """The reply as a JSON object, or None. Tolerates a code fence around it."""
    text = reply.strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text, strict=False)  # tolerate raw newlines inside strings
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def reply_text(reply: str, role: str, names: list[str] | None = None) -> str:
    """A JSON reply to `role` rewritten in the role's text format (what the parsers in
    engine/prompts/templates.py and engine/methods/gtbp/ read without a fallback); any other reply unchanged. A field
    that is missing or empty stays missing, so the parser's own rule for it applies."""
    data = decode(reply)
    if data is None:
        return reply
    names, shape = list(names or []), shape_for(role)
    if shape is None:
        return reply
    why = data.get(reasoning_key(names))
    reasoning = why.strip() if isinstance(why, str) else ""

    def field(key: str) -> str:
        value = data.get(key)
        return value.strip() if isinstance(value, str) else ""

    text = shape.to_text(field, data, names, reasoning)
    return reply if text is None else text


# --- the shapes of the roles every method shares ------------------------------------------

def claim_key(name: str) -> str:
    """The backward reply's boolean field saying whether input `name` should change."""
    return f"asks_change_{name}"


def reply_claims(reply: str, names: list[str]) -> dict[str, bool]:
    """Per input, the `asks_change` field of a JSON backward reply; inputs without a
    boolean there (and every input of a text reply) are left out."""
    data = decode(reply) or {}
    return {n: data[claim_key(n)] for n in names if isinstance(data.get(claim_key(n)), bool)}


register_shape("backward", ReplyShape(
    fields=lambda names: [f for n in names for f in (
        (n, text_field(GRADIENT_CHARS, 1), f"your feedback on {n}"),
        (claim_key(n), {"type": "boolean"},
         f"true if {n} should change, false if it is fine as it is"))],
    to_text=lambda field, data, names, why: "\n".join(
        f'<gradient input="{n}">{field(n)}</gradient>' for n in names if field(n)),
    text_form=P.gradient_blocks,
    asks=("Answer with one block per input, in this form:", "Answer in this form:",
          "Write the missing block(s) now, one per input, about that input only, in this "
          "form:")))
# The update names the output the feedback asks for before it writes the prompt: without
# that field the embedded 1.5B optimizer, told "change the note to the count", kept the
# prompt's own request ("Write one word about the text, but also provide the count");
# with it, replaying the same call gave "Write one number about the text, where the number
# represents the count of something in the text."
register_shape("update", ReplyShape(
    fields=lambda names: [
        ("output_wanted", text_field(WANTED_CHARS, 1),
         "what the feedback says this step's output should be, in a few words"),
        ("prompt", text_field(PROMPT_CHARS, 1), "the complete new prompt, asking for that output")],
    to_text=lambda field, data, names, why: (
        "\n".join(t for t in (why, field("output_wanted") and
                              f"The feedback asks this step for: {field('output_wanted')}") if t)
        + f"\n<prompt>{field('prompt')}</prompt>" if field("prompt") else None),
    asks=("Explain your reasoning in a few sentences, then give the complete new prompt "
          "between <prompt> and </prompt>.",)))
