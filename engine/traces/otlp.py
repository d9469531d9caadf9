"""Spans in the OTLP JSON encoding (one `ExportTraceServiceRequest` a line, as the
OpenTelemetry Collector's file exporter writes them, and as `export --format otel` does),
read into the LLM calls they record.

A call is read through its attributes, never through span order: OpenInference's
flattened messages (`llm.input_messages.N.message.*`), else the GenAI conventions'
`gen_ai.input.messages`, else an OpenAI request body in `input.value`; its reply likewise.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.llm.base import tool_call_text
from engine.traces import TraceError
from engine.traces.conventions import GENAI_OPERATION, SPAN_KIND

SYSTEM_ROLES = ("system", "developer")


@dataclass(slots=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start: int
    end: int
    attributes: dict[str, Any]


@dataclass(slots=True)
class Call:
    """One LLM call as a span recorded it."""

    span: Span
    messages: list[tuple[str, str]]
    output: str
    model: str = ""
    temperature: float | None = None
    tokens: tuple[int, int] = (0, 0)
    max_tokens: int | None = None  # the reply's token limit the call asked for
    extra: dict[str, Any] = field(default_factory=dict)
    # OpenInference's prompt template of the call (`llm.prompt_template.*`): the text the
    # user wrote and this call's variables, when the pipeline recorded them
    template: str | None = None
    variables: dict[str, str] = field(default_factory=dict)
    # the tools the call offered ({"tools": [...], "tool_choice": ...}), else None
    tools: dict[str, Any] | None = None

    @property
    def system(self) -> str:
        return next((c for r, c in self.messages if r in SYSTEM_ROLES), "")

    def settled(self) -> Call:
        """The call as its trace keeps it once read: its span, reply, model and settings.
        Its messages, template and tools are read into the trace (engine.traces.infer) and
        not kept: an import holds a trace of every example, never every message of the
        file."""
        return Call(self.span, [], self.output, self.model, self.temperature, self.tokens,
                    self.max_tokens)

    def non_system(self) -> list[tuple[str, str]]:
        """The messages after the first system message: what the node's template keeps."""
        out, dropped = [], False
        for role, content in self.messages:
            if role in SYSTEM_ROLES and not dropped:
                dropped = True
                continue
            out.append((role, content))
        return out


def read_spans(path: str | Path) -> list[Span]:
    """Every span of an OTLP JSON lines file. TraceError (one line) when the file is not
    OTLP JSON."""
    return list(iter_spans(path))


def iter_spans(path: str | Path) -> Iterator[Span]:
    """The spans of an OTLP JSON lines file, read a line at a time (memory holds one line,
    never the file). TraceError (one line) when the file is not OTLP JSON, raised at the
    line that is not."""
    try:
        fh = Path(path).open(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the file ({exc.__class__.__name__})") from None
    any_span = False
    with fh:
        number = 0
        while True:
            try:
                line = fh.readline()
            except (OSError, UnicodeDecodeError) as exc:
                raise TraceError(f"{path}: cannot read the file ({exc.__class__.__name__})"
                                 ) from None
            if not line:
                break
            number += 1
            if not line.strip():
                continue
            try:
                document = json.loads(line)
            except json.JSONDecodeError:
                raise TraceError(f"{path}:{number}: not OTLP JSON (each line must be one JSON "
                                 "ExportTraceServiceRequest, as the Collector's file exporter "
                                 "writes)") from None
            resources = _get(document, "resourceSpans", "resource_spans") \
                if isinstance(document, dict) else None
            if not isinstance(resources, list):
                raise TraceError(f"{path}:{number}: not OTLP JSON (no resourceSpans: expected "
                                 "an ExportTraceServiceRequest a line)")
            try:
                spans = spans_of(resources)
            except (TypeError, ValueError, AttributeError, KeyError) as exc:
                raise TraceError(f"{path}:{number}: not OTLP JSON ({exc.__class__.__name__}: "
                                 f"{exc})") from None
            del document, resources
            any_span = any_span or bool(spans)
            yield from spans
    if not any_span:
        raise TraceError(f"{path}: no spans in the file")


def _get(mapping: dict, *keys: str) -> Any:
    for key in keys:
        if key in mapping:
            return mapping[key]
    return None


def spans_of(resources: list[dict]) -> list[Span]:
    """The spans of an ExportTraceServiceRequest's `resourceSpans` (OTLP JSON, or protobuf's
    JSON mapping: ids in hex or base64). Raises TypeError/ValueError/KeyError on a bad shape."""
    out = []
    for resource in resources:
        for scope in _get(resource, "scopeSpans", "scope_spans") or []:
            for raw in scope.get("spans") or []:
                out.append(Span(
                    trace_id=_hex(_get(raw, "traceId", "trace_id")),
                    span_id=_hex(_get(raw, "spanId", "span_id")),
                    parent_id=_hex(_get(raw, "parentSpanId", "parent_span_id") or ""),
                    name=str(raw.get("name") or ""),
                    start=int(_get(raw, "startTimeUnixNano", "start_time_unix_nano") or 0),
                    end=int(_get(raw, "endTimeUnixNano", "end_time_unix_nano") or 0),
                    attributes={a["key"]: _value(a.get("value") or {})
                                for a in raw.get("attributes") or []}))
    return out


def _hex(value: Any) -> str:
    """An OTLP id as lowercase hex: the Collector writes hex, protobuf's JSON base64."""
    text = str(value or "")
    if not text:
        return ""
    try:
        bytes.fromhex(text)
        return text.lower()
    except ValueError:
        pass
    try:
        return base64.b64decode(text, validate=True).hex()
    except (binascii.Error, ValueError):
        raise ValueError(f"span id {text!r:.40} is neither hex nor base64") from None


def _value(value: dict) -> Any:
    if "stringValue" in value:  # most attributes: first, without the loops below
        return value["stringValue"]
    for key in ("stringValue", "string_value"):
        if key in value:
            return value[key]
    for key in ("intValue", "int_value"):
        if key in value:
            return int(value[key])
    for key in ("doubleValue", "double_value"):
        if key in value:
            return float(value[key])
    for key in ("boolValue", "bool_value"):
        if key in value:
            return bool(value[key])
    array = _get(value, "arrayValue", "array_value")
    if array is not None:
        return [_value(v) for v in array.get("values") or []]
    return None


# --- the LLM calls ---------------------------------------------------------------------


def is_llm_span(span: Span) -> bool:
    kind = str(span.attributes.get(SPAN_KIND) or "").upper()
    operation = span.attributes.get(GENAI_OPERATION)
    return kind == "LLM" or (not kind and operation in ("chat", "text_completion"))


def llm_call(span: Span) -> Call:
    a = span.attributes
    params = json_value(a.get("llm.invocation_parameters"))
    template = a.get("llm.prompt_template.template")
    variables = json_value(a.get("llm.prompt_template.variables"))
    tools = [t for t in (json_value(v) for k, v in sorted(
        ((k, v) for k, v in a.items()
         if k.startswith("llm.tools.") and k.endswith(".tool.json_schema")),
        key=lambda item: _index_key(item[0]))) if isinstance(t, dict)]
    if not tools and isinstance(params, dict) and isinstance(params.get("tools"), list):
        tools = [t for t in params["tools"] if isinstance(t, dict)]
    choice = params.get("tool_choice") if isinstance(params, dict) else None
    temperature = a.get("gen_ai.request.temperature")
    if temperature is None and isinstance(params, dict):
        temperature = params.get("temperature")
    limit = a.get("gen_ai.request.max_tokens")
    if limit is None and isinstance(params, dict):
        limit = params.get("max_completion_tokens") or params.get("max_tokens")
    return Call(span, input_messages(a), output_text(a),
                str(a.get("llm.model_name") or a.get("gen_ai.request.model")
                    or a.get("gen_ai.response.model") or ""),
                float(temperature) if isinstance(temperature, (int, float)) else None,
                (int(a.get("llm.token_count.prompt") or a.get("gen_ai.usage.input_tokens") or 0),
                 int(a.get("llm.token_count.completion")
                     or a.get("gen_ai.usage.output_tokens") or 0)),
                int(limit) if isinstance(limit, (int, float)) and limit > 0 else None,
                template=template if isinstance(template, str) and template.strip() else None,
                variables={str(k): v if isinstance(v, str) else json.dumps(v)
                           for k, v in variables.items()} if isinstance(variables, dict)
                else {},
                tools={"tools": tools, "tool_choice": choice} if tools else None)


def _index_key(key: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in key.split("."))


def input_messages(a: dict[str, Any]) -> list[tuple[str, str]]:
    flat = _flattened(a, "llm.input_messages")
    if flat:
        return flat
    parts = json_value(a.get("gen_ai.input.messages"))
    if isinstance(parts, list):
        return [(str(m.get("role") or "user"), _parts_text(m)) for m in parts
                if isinstance(m, dict)]
    body = json_value(a.get("input.value"))
    messages = body.get("messages") if isinstance(body, dict) else body
    if isinstance(messages, list):
        return [(str(m.get("role") or "user"), _content_text(m.get("content")))
                for m in messages if isinstance(m, dict)]
    return []


def output_text(a: dict[str, Any]) -> str:
    """The reply as text; a tool call is part of it (engine.llm.base.tool_call_text)."""
    flat = _flattened(a, "llm.output_messages")
    if flat:
        return flat[0][1]
    calls = json_value(a.get("gen_ai.output.messages"))
    if isinstance(calls, list) and calls and isinstance(calls[0], dict):
        tool_parts = [p for p in calls[0].get("parts") or [] if isinstance(p, dict)
                      and p.get("type") == "tool_call"]
        if tool_parts:
            return tool_call_text(_parts_text(calls[0]), [
                (str(p.get("name") or ""), p.get("arguments") if isinstance(
                    p.get("arguments"), str) else json.dumps(p.get("arguments") or {}))
                for p in tool_parts])
    parts = json_value(a.get("gen_ai.output.messages"))
    if isinstance(parts, list) and parts and isinstance(parts[0], dict):
        return _parts_text(parts[0])
    value = a.get("output.value")
    body = json_value(value)
    if isinstance(body, dict) and isinstance(body.get("choices"), list) and body["choices"]:
        choice = body["choices"][0] or {}
        return _content_text((choice.get("message") or {}).get("content") or choice.get("text"))
    return "" if value is None else str(value)


def _flattened(a: dict[str, Any], prefix: str) -> list[tuple[str, str]]:
    """OpenInference's `prefix.N.message.role` / `.content` (or `.contents.M...text`)."""
    found: dict[int, dict[str, Any]] = {}
    start = prefix + "."
    for key, value in a.items():
        if not key.startswith(start):
            continue
        index, _, rest = key[len(start):].partition(".")
        if not index.isdigit():
            continue
        message = found.setdefault(int(index), {"parts": {}})
        if rest == "message.role":
            message["role"] = value
        elif rest == "message.content":
            message["content"] = value
        elif rest.startswith("message.contents.") and rest.endswith(".message_content.text"):
            message["parts"][int(rest.split(".")[2])] = value
        elif rest.startswith("message.tool_calls."):
            number, _, what = rest[len("message.tool_calls."):].partition(".")
            if number.isdigit() and what in ("tool_call.function.name",
                                             "tool_call.function.arguments"):
                message.setdefault("calls", {}).setdefault(int(number), {})[
                    what.rpartition(".")[2]] = value
    out = []
    for index in sorted(found):
        m = found[index]
        text = m.get("content")
        if text is None:
            text = "".join(str(m["parts"][i]) for i in sorted(m["parts"]))
        calls = m.get("calls") or {}
        if calls:
            text = tool_call_text(str(text), [(str(calls[i].get("name") or ""),
                                               str(calls[i].get("arguments") or "{}"))
                                              for i in sorted(calls)])
        out.append((str(m.get("role") or "user"), str(text)))
    return out


def _parts_text(message: dict[str, Any]) -> str:
    parts = message.get("parts")
    if isinstance(parts, list):
        return "".join(str(p.get("content") or "") for p in parts if isinstance(p, dict))
    return _content_text(message.get("content"))


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI's content parts
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def json_value(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return None
