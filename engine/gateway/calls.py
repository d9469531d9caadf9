"""Chat completions as the gateway handles them: a request's cache key, a streamed reply
assembled into one completion and a completion streamed again as server-sent events, a
reply's text (a tool call as engine.llm.base.tool_call_text writes it) and back, the
template a system message was filled from (the example's own input values in it), and the
OpenInference attributes of the LLM span that records one call.

Every function here is pure: JSON in, JSON (or bytes) out."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator
from typing import Any

from engine.llm.base import tool_call_text
from engine.prompts.recorded import PLACEHOLDER

# request fields that do not change what the model is asked: left out of the cache key
# (a streamed and a plain request share their reply; metadata only names the node)
NOT_ASKED = ("stream", "stream_options", "metadata", "user")
TOOL_CALL = re.compile(r'<tool_call name="([^"]*)">(.*)</tool_call>')
# an input value shorter than this is not taken for a filled-in variable ("1", "no")
SHORTEST_VARIABLE = 3


def request_key(body: dict[str, Any]) -> str:
    """The reply cache's key of a chat request: SHA-256 of what it asks, canonically."""
    asked = {k: v for k, v in body.items() if k not in NOT_ASKED}
    text = json.dumps(asked, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def error_body(message: str, kind: str = "invalid_request_error",
               code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# --- replies ---------------------------------------------------------------------------


def message_text(message: dict[str, Any]) -> str:
    """An assistant message as text: its content, then its tool calls."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    calls = [(str((c.get("function") or {}).get("name") or ""),
              str((c.get("function") or {}).get("arguments") or "{}"))
             for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    return tool_call_text(str(content or ""), calls) if calls else str(content or "")


def reply_text(completion: dict[str, Any]) -> str:
    """The first choice's reply as text ("" when there is none)."""
    choices = completion.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    return message_text(choices[0].get("message") or {})


def completion_of(text: str, model: str, key: str = "") -> dict[str, Any]:
    """A well-formed chat.completion whose reply is `text`: a tool call where the text
    holds `<tool_call name=...>` lines (finish_reason tool_calls), else plain content."""
    content_lines, calls = [], []
    for line in text.split("\n"):
        match = TOOL_CALL.fullmatch(line.strip())
        if match:
            digest = hashlib.sha256(f"{key}{len(calls)}{line}".encode()).hexdigest()[:16]
            calls.append({"id": f"call_{digest}", "type": "function",
                          "function": {"name": match[1], "arguments": match[2]}})
        else:
            content_lines.append(line)
    content = "\n".join(content_lines).strip("\n")
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return {"id": f"chatcmpl-{key[:24] or 'patched'}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


def assemble(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat.completion that a stream of chat.completion.chunk objects makes."""
    choices: dict[int, dict[str, Any]] = {}
    first = chunks[0] if chunks else {}
    usage = None
    for chunk in chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for part in chunk.get("choices") or []:
            choice = choices.setdefault(int(part.get("index") or 0), {
                "role": "assistant", "content": "", "calls": {}, "finish_reason": None})
            delta = part.get("delta") or {}
            if delta.get("content"):
                choice["content"] += delta["content"]
            for call in delta.get("tool_calls") or []:
                slot = choice["calls"].setdefault(int(call.get("index") or 0), {
                    "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            if part.get("finish_reason"):
                choice["finish_reason"] = part["finish_reason"]
    out = []
    for index in sorted(choices):
        c = choices[index]
        message: dict[str, Any] = {"role": "assistant", "content": c["content"] or None}
        if c["calls"]:
            message["tool_calls"] = [c["calls"][i] for i in sorted(c["calls"])]
        out.append({"index": index, "message": message, "finish_reason": c["finish_reason"]})
    return {"id": first.get("id", "chatcmpl-stream"), "object": "chat.completion",
            "created": first.get("created", int(time.time())), "model": first.get("model", ""),
            "choices": out, **({"usage": usage} if usage else {})}


def sse_events(completion: dict[str, Any]) -> Iterator[bytes]:
    """A whole completion as the server-sent events of a stream: a role chunk, the
    content, the tool calls, the finish, `[DONE]`."""
    base = {"id": completion.get("id", "chatcmpl"), "object": "chat.completion.chunk",
            "created": completion.get("created", int(time.time())),
            "model": completion.get("model", "")}

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + json.dumps({**base, "choices": choices, **extra}).encode() + b"\n\n"

    for choice in completion.get("choices") or []:
        index, message = choice.get("index", 0), choice.get("message") or {}
        yield event([{"index": index, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None}])
        if message.get("content"):
            yield event([{"index": index, "delta": {"content": message["content"]},
                          "finish_reason": None}])
        for i, call in enumerate(message.get("tool_calls") or []):
            yield event([{"index": index, "delta": {"tool_calls": [
                {"index": i, "id": call.get("id"), "type": "function",
                 "function": call.get("function")}]}, "finish_reason": None}])
        yield event([{"index": index, "delta": {},
                      "finish_reason": choice.get("finish_reason") or "stop"}])
    if completion.get("usage"):
        yield event([], usage=completion["usage"])
    yield b"data: [DONE]\n\n"


# --- the span of one call ----------------------------------------------------------------


def _content(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _message_attributes(prefix: str, message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {f"{prefix}.message.role": str(message.get("role") or "user"),
                           f"{prefix}.message.content": _content(message.get("content"))}
    if message.get("tool_call_id"):
        out[f"{prefix}.message.tool_call_id"] = str(message["tool_call_id"])
    for j, call in enumerate(message.get("tool_calls") or []):
        function = (call or {}).get("function") or {}
        at = f"{prefix}.message.tool_calls.{j}.tool_call"
        out[f"{at}.id"] = str(call.get("id") or "")
        out[f"{at}.function.name"] = str(function.get("name") or "")
        out[f"{at}.function.arguments"] = str(function.get("arguments") or "{}")
    return out


def template_of(system: str, fields: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
    """The template `system` was filled from, when the example's own input values stand in
    it, with the variables each filled: "You are the assistant of Green Basket." with
    shop="Green Basket" is "You are the assistant of {shop}." (what OpenInference's
    using_prompt_template records). None when no value stands in it as a whole word, when
    the message already holds a `{name}` (it would read as a variable), or when the values
    are all of it (no prompt is left)."""
    if PLACEHOLDER.search(system):
        return None
    values = sorted(((str(v), str(k)) for k, v in fields.items()
                     if isinstance(v, (str, int, float)) and not isinstance(v, bool)
                     and len(str(v).strip()) >= SHORTEST_VARIABLE and str(k).isidentifier()),
                    key=lambda pair: -len(pair[0]))
    variables: dict[str, str] = {}
    template = system
    for value, name in values:
        pattern = re.compile(rf"(?<!\w){re.escape(value)}(?!\w)")
        if not pattern.search(template):
            continue
        template = pattern.sub(lambda _, slot="{" + name + "}": slot, template)
        variables[name] = value
    if not variables or not PLACEHOLDER.sub("", template).strip():
        return None
    return template, variables


def span_attributes(body: dict[str, Any], completion: dict[str, Any], *,
                    node: str | None = None, cache_hit: bool = False,
                    patched: bool = False, candidate: str | None = None,
                    fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """The OpenInference attributes of one forwarded call (an LLM span), as the `openai`
    instrumentor writes them; `semback.gateway.*` says what the gateway did. `fields`: the
    input of the example the call was made for (a runner's session): a system message
    filled from them is recorded with its template, as using_prompt_template would."""
    params = {k: v for k, v in body.items() if k not in ("messages", "tools", "model",
                                                        "stream_options", "metadata")}
    if body.get("tool_choice") is not None:
        params["tools"] = body.get("tools") or []
    a: dict[str, Any] = {
        "openinference.span.kind": "LLM", "llm.system": "openai", "llm.provider": "openai",
        "llm.model_name": str(body.get("model") or completion.get("model") or ""),
        "llm.invocation_parameters": json.dumps(params, ensure_ascii=False),
        "input.value": json.dumps(body, ensure_ascii=False),
        "input.mime_type": "application/json",
        "output.value": json.dumps(completion, ensure_ascii=False),
        "output.mime_type": "application/json",
    }
    for i, message in enumerate(body.get("messages") or []):
        if isinstance(message, dict):
            a.update(_message_attributes(f"llm.input_messages.{i}", message))
    choices = completion.get("choices") or []
    if choices and isinstance(choices[0], dict):
        a.update(_message_attributes("llm.output_messages.0",
                                     choices[0].get("message") or {"role": "assistant"}))
    system = next((m for m in body.get("messages") or [] if isinstance(m, dict)
                   and m.get("role") in ("system", "developer")), None)
    filled = template_of(_content(system.get("content")), fields) if system and fields \
        else None
    if filled:
        a["llm.prompt_template.template"] = filled[0]
        a["llm.prompt_template.variables"] = json.dumps(filled[1], ensure_ascii=False)
    for i, tool in enumerate(body.get("tools") or []):
        a[f"llm.tools.{i}.tool.json_schema"] = json.dumps(tool, ensure_ascii=False)
    usage = completion.get("usage") or {}
    for ours, theirs in (("prompt", "prompt_tokens"), ("completion", "completion_tokens"),
                         ("total", "total_tokens")):
        if isinstance(usage.get(theirs), int):
            a[f"llm.token_count.{ours}"] = usage[theirs]
    if node:
        a["semback.gateway.node"] = node
    if cache_hit:
        a["semback.gateway.cache_hit"] = True
    if patched:
        a["semback.gateway.patched"] = True
    if candidate:
        a["semback.gateway.candidate"] = candidate
    return a
