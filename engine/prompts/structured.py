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
from typing import Any

from engine.llm.schema import reasoning_key
from engine.prompts import templates as P

REASONING_CHARS = 240   # the reasoning field of every role
REASONING_MIN = 20      # ... at least this long: a tiny model otherwise skips it
GRADIENT_CHARS = 320    # one input's gradient (backward roles)
PROMPT_CHARS = 480      # a proposed prompt (update)
TARGET_CHARS = 320      # a gtbp target or inferred input
CLAIM_CHARS = 200       # one gtbp claim
MAX_CLAIMS = 8

BACKWARD_ROLES = ("backward_joint", "backward_evaluative", "backward_single",
                  "backward_nosibling")
ROLES = (*BACKWARD_ROLES, "update", "gtbp_combine", "gtbp_input", "gtbp_update")


def is_backward(role: str) -> bool:
    """Every `backward_*` role (a method's own, such as `backward_textgrad_lib`, too) asks
    for one gradient per input."""
    return role.startswith("backward_")


def _text(max_chars: int, min_chars: int = 0) -> dict[str, Any]:
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
    """The JSON schema of the reply to a `role` request (None: the role stays text).

    Backward roles: a reasoning field and one field per input name, in the given order.
    `update`: reasoning and prompt. `gtbp_combine`: reasoning and target. `gtbp_input`:
    reasoning and one field per input. `gtbp_update`: reasoning and a list of claims."""
    role, names = base_role(role), list(names or [])
    why = {reasoning_key(names): _text(REASONING_CHARS, REASONING_MIN)}
    if is_backward(role):
        if not names:
            return None
        return _object({**why, **{n: _text(GRADIENT_CHARS, 1) for n in names}})
    if role == "update":
        return _object({**why, "prompt": _text(PROMPT_CHARS, 1)})
    if role == "gtbp_combine":
        return _object({**why, "target": _text(TARGET_CHARS, 1)})
    if role == "gtbp_input":
        if not names:
            return None
        return _object({**why, **{n: _text(TARGET_CHARS, 1) for n in names}})
    if role == "gtbp_update":
        return _object({**why, "claims": {"type": "array", "items": _text(CLAIM_CHARS, 1),
                                          "minItems": 1, "maxItems": MAX_CLAIMS}})
    return None


def example_reply(role: str, names: list[str]) -> str:
    """The fields the restated instruction lists, one a line: described, not exemplified,
    because a small model copies an example's placeholder text into its reply."""
    role = base_role(role)
    fields = [(reasoning_key(names), "a few sentences of reasoning")]
    if is_backward(role):
        fields += [(n, f"your feedback on {n}") for n in names]
    elif role == "update":
        fields.append(("prompt", "the complete new prompt"))
    elif role == "gtbp_combine":
        fields.append(("target", "the one output this step should have produced"))
    elif role == "gtbp_input":
        fields += [(n, f"the input {n} as it should be") for n in names]
    elif role == "gtbp_update":
        fields.append(("claims", "the complete new list of claims, one string per claim"))
    return "\n".join(f"- {json.dumps(k, ensure_ascii=False)}: {what}" for k, what in fields)


# The text-format instructions of each role, as rendered in engine/prompts/templates.py and engine/methods/gtbp/templates.py, and
# what replaces them when the reply is JSON.
_TEXT_ASKS = (
    "Answer with one block per input, in this form:",
    "Answer in this form:",
    "Write the missing block(s) now, one per input, about that input only, in this form:",
    "Explain your reasoning in a few sentences, then give the complete new prompt between "
    "<prompt> and </prompt>.",
    "Answer with the output between <target> and </target>.",
    "Explain your reasoning in a few sentences, then give the complete new list between "
    "<claims> and </claims>, one claim per line starting with \"- \".",
)
JSON_ASK = "Answer with one JSON object and nothing else, with these fields in this order:"


def _text_form(role: str, names: list[str]) -> str | None:
    """The rendered block template a role's text instruction shows, if it has one."""
    role = base_role(role)
    if is_backward(role):
        return P.gradient_blocks(names)
    if role == "gtbp_input":
        return "\n".join(P.INPUT_BLOCK.format(name=n, value=f"the input {n} as it should be")
                         for n in names)
    return None


def restate(messages: list[tuple[str, str]], role: str, names: list[str]
            ) -> list[tuple[str, str]]:
    """The messages with the last user message's text-format instruction replaced by the
    JSON one (the rest of the prompt is unchanged)."""
    out = list(messages)
    last = max((i for i, (r, _) in enumerate(out) if r == "user"), default=None)
    if last is None:
        return out
    text = out[last][1]
    form, example = _text_form(role, names), example_reply(role, names)
    if form and form in text:
        text = text.replace(form, example)
        for ask in _TEXT_ASKS:
            text = text.replace(ask, JSON_ASK)
    else:
        replaced = False
        for ask in _TEXT_ASKS:
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
    names, role = list(names or []), base_role(role)
    why = data.get(reasoning_key(names))
    reasoning = why.strip() if isinstance(why, str) else ""

    def field(key: str) -> str:
        value = data.get(key)
        return value.strip() if isinstance(value, str) else ""

    if is_backward(role):
        return "\n".join(f'<gradient input="{n}">{field(n)}</gradient>' for n in names
                         if field(n))
    if role == "gtbp_input":
        return "\n".join(f'<input name="{n}">\n{field(n)}\n</input>' for n in names
                         if field(n))
    if role == "update" and field("prompt"):
        return f"{reasoning}\n<prompt>{field('prompt')}</prompt>"
    if role == "gtbp_combine" and field("target"):
        return f"{reasoning}\n<target>{field('target')}</target>"
    if role == "gtbp_update":
        claims = [c.strip() for c in data.get("claims") or [] if isinstance(c, str)
                  and c.strip()]
        if claims:
            return reasoning + "\n<claims>\n" + "\n".join(f"- {c}" for c in claims) + \
                "\n</claims>"
    return reply
