"""A deterministic, offline backend for tests, demos and benchmarks.

It knows each call's purpose (and the template role in `request.meta`) and produces a
well-formed reply for it. Its choices are a function of the request's content only, so
the same run gives the same replies in every process. Canned replies take priority:

- `responder(request) -> str | None`: return a reply, or None for the default;
- `replies`: {(purpose, node_id) or purpose: str | list[str]}; lists are consumed in order.

Default behaviour: a forward call of the output node picks an answer among the labels,
numbers or yes/no that appear in its inputs; an intermediate node writes a short note;
backward calls write one `<gradient input=...>` block per input named in `meta`; update
calls append a refinement to the current prompt; judge calls give `<score>N</score>`.

A request that carries a JSON schema (engine/prompts/structured.py) gets the same default reply
as a JSON object that follows the schema (`constrained` is true); canned replies are
returned as they are (unconstrained), so tests can still feed any text to the parsers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from engine.llm.base import LLMReply, LLMRequest, TransientLLMError, estimate_tokens
from engine.llm.schema import reasoning_key

REFINEMENTS = (
    "Check each intermediate result before using it.",
    "State the quantity being computed before computing it.",
    "Use every input, and say which one each step relies on.",
    "Keep the answer to the exact format requested.",
    "Re-read the question for details that change the answer.",
    "Prefer the simplest reading of the question.",
    "Write the final answer on its own at the end.",
    "Work in small steps and verify the last one.",
)
NOTE_WORDS = ("carry", "compare", "count", "split", "total", "order", "list", "share")


def _digest(*parts: Any) -> int:
    text = "\x1f".join(str(p) for p in parts)
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16)


def _seed(request: LLMRequest) -> int:
    """A digest of the request that ignores the order of the prompt's parts.

    Every sampling-relevant field but the stop sequences counts, and the messages enter as
    the sorted list of
    their non-empty lines (each with its role), so moving a block of a template leaves
    every scripted reply as it was, while changing any line still changes it.
    """
    fields = request.key_fields()
    # a stop sequence only cuts the reply (cut_at_stop), it never changes the words before
    fields["stop"] = []
    fields["messages"] = sorted([role, line.strip()] for role, content in request.messages
                                for line in content.splitlines() if line.strip())
    return _digest(json.dumps(fields, sort_keys=True, ensure_ascii=False,
                              separators=(",", ":")))


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """`text` up to its first stop sequence, which is left out, as real servers do."""
    ends = [text.find(s) for s in stop if s and s in text]
    return text[:min(ends)] if ends else text


class ScriptedBackend:
    name = "scripted"
    supports_schema = True

    def __init__(self, responder: Callable[[LLMRequest], str | None] | None = None,
                 replies: dict[Any, str | list[str]] | None = None, latency: float = 0.0,
                 fail_nodes: tuple[str, ...] = ()):
        self.responder = responder
        self.replies = {k: (list(v) if isinstance(v, list) else v) for k, v in
                        (replies or {}).items()}
        self.latency = latency
        self.fail_nodes = tuple(fail_nodes)
        self.requests: list[LLMRequest] = []

    async def complete(self, request: LLMRequest) -> LLMReply:
        self.requests.append(request)
        if self.latency:
            await asyncio.sleep(self.latency)
        node = request.meta.get("node")
        if node in self.fail_nodes and request.purpose == "forward":
            raise TransientLLMError(f"scripted failure for node {node}")
        text, constrained = self._canned(request), False
        if text is None:
            text = self._default(request)
            if request.schema is not None:
                text, constrained = structured_reply(request, text), True
        text = cut_at_stop(text, request.stop)
        prompt_tokens = sum(estimate_tokens(c) for _, c in request.messages)
        return LLMReply(text=text, prompt_tokens=prompt_tokens,
                        completion_tokens=estimate_tokens(text), model=request.model,
                        constrained=constrained, finish_reason="stop")

    async def aclose(self) -> None:
        return None

    def _canned(self, request: LLMRequest) -> str | None:
        if self.responder is not None:
            reply = self.responder(request)
            if reply is not None:
                return reply
        for key in ((request.purpose, request.meta.get("node")), request.purpose):
            if key in self.replies:
                value = self.replies[key]
                if isinstance(value, list):
                    if value:
                        return value.pop(0)
                    continue
                return value
        return None

    def _default(self, request: LLMRequest) -> str:
        meta = request.meta
        seed = _seed(request)
        if request.purpose == "forward":
            return self._forward(request, seed)
        if request.purpose == "loss":
            score = seed % 11
            return f"The answer misses part of the reference. <score>{score}</score>"
        if request.purpose == "backward":
            return self._backward(meta, seed)
        if request.purpose == "update":
            if meta.get("role") == "gtbp_update":
                return self._gtbp_update(meta, seed)
            prompt = meta.get("prompt", "")
            extra = REFINEMENTS[seed % len(REFINEMENTS)]
            if extra in prompt:
                extra = REFINEMENTS[(seed + 1) % len(REFINEMENTS)]
            return f"The failures suggest a missing check. <prompt>{prompt} {extra}</prompt>"
        return "OK"

    def _forward(self, request: LLMRequest, seed: int) -> str:
        if not request.meta.get("output_node"):
            word = NOTE_WORDS[seed % len(NOTE_WORDS)]
            return f"Looking at the inputs. <output>Step: {word} the relevant items.</output>"
        inputs = "\n".join(re.findall(r'<input name="[^"]*">(.*?)</input>', request.user_text,
                                      flags=re.S))  # the inputs only, wherever they stand
        labels = sorted(set(re.findall(r"\([A-Z]\)", inputs)))
        numbers = sorted(set(re.findall(r"-?\d+(?:\.\d+)?", inputs)), key=lambda s: (len(s), s))
        if labels:
            candidates = labels
        elif numbers:
            candidates = numbers
        else:
            candidates = ["Yes", "No"]
        return f"Reasoning step by step. <output>{candidates[seed % len(candidates)]}</output>"

    def _backward(self, meta: dict[str, Any], seed: int) -> str:
        role = meta.get("role", "")
        names = meta.get("inputs", [])
        if role.startswith("gtbp"):
            if role == "gtbp_combine":  # one target that keeps every successor's, in order
                return "<target>" + " / ".join(meta.get("targets", [])) + "</target>"
            target, fields, values = meta.get("target", ""), meta.get("fields", []), \
                meta.get("values", {})
            return "\n".join(
                f'<input name="{n}">\n'
                + (values.get(n, "") if n in fields else f"A version of {n} that leads to: {target}")
                + "\n</input>" for n in names)
        word = NOTE_WORDS[seed % len(NOTE_WORDS)]
        return "\n".join(
            f'<gradient input="{n}">The input {n} should {word} the quantities the task needs '
            f"and state them plainly.</gradient>" for n in names)

    def _gtbp_update(self, meta: dict[str, Any], seed: int) -> str:
        """One change, always within budget: add a refinement when the step allows a new
        claim, else extend the last claim with one."""
        claims = list(meta.get("claims", []))
        fresh = [r for r in REFINEMENTS if not any(r in c for c in claims)] or list(REFINEMENTS)
        extra = fresh[seed % len(fresh)]
        if meta.get("may_add") or not claims:
            claims.append(extra)
        else:
            claims[-1] = f"{claims[-1]} {extra}"
        return "Adjusting one claim.\n<claims>\n" + "\n".join(f"- {c}" for c in claims) + \
            "\n</claims>"


def structured_reply(request: LLMRequest, text: str) -> str:
    """The default text reply `text` as a JSON object following `request.schema`: the text
    format's parts become the schema's fields, each cut to its maxLength."""
    schema = request.schema or {}
    names = list(request.meta.get("inputs") or [])
    why = reasoning_key(names)
    values: dict[str, object] = {why: re.split(r"<", text, maxsplit=1)[0].strip()}
    for tag, key in (("prompt", "prompt"), ("target", "target")):
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.S)
        if found:
            values[key] = found[-1].strip()
    if "prompt" in values:  # the update's own field (engine/prompts/structured.py)
        values["output_wanted"] = "what the task asks, stated plainly"
    for name, body in re.findall(r'<(?:gradient input|input name)="([^"]+)">(.*?)</', text,
                                 flags=re.S):
        values[name] = body.strip()
    claims = re.findall(r"^- (.+)$", text, flags=re.M)
    if claims:
        values["claims"] = claims
    return json.dumps(_fit(schema, values), ensure_ascii=False)


def _fit(schema: dict, values: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, field in schema.get("properties", {}).items():
        value = values.get(key, FILLER) if field.get("type") == "boolean" else (
            values.get(key) or FILLER)
        if field.get("type") == "boolean":  # the scripted gradients all ask for a change
            out[key] = value if isinstance(value, bool) else True
        elif field.get("type") == "array":
            items = value if isinstance(value, list) else [str(value)]
            out[key] = [_sized(str(v), field["items"]) for v in items][
                : field.get("maxItems", len(items))]
        else:
            out[key] = _sized(str(value), field)
    return out


FILLER = "The feedback says what should change."


def _sized(text: str, field: dict) -> str:
    """`text` padded to the field's minLength and cut to its maxLength."""
    while len(text) < field.get("minLength", 0):
        text = f"{text} {FILLER}".strip()
    return text[: field.get("maxLength", len(text))]
