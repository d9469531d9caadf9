"""Backend for OpenAI and any OpenAI-compatible chat-completions server (vLLM, Ollama,
LM Studio, llama.cpp server), through the official `openai` SDK.

The SDK's own retries are off: `LLMClient` retries, so that every attempt is counted
and logged. A request with a JSON schema is sent with `response_format` {"type":
"json_schema", ...} (OpenAI structured outputs, vLLM, llama.cpp server); a 400 or 422 that
names it becomes `SchemaRefused`, on which the client falls back to text formats. SDK errors become `TransientLLMError` (worth retrying) or `LLMError` (not),
with one-line messages from which the API key is scrubbed.
"""

from __future__ import annotations

import email.utils
import itertools
import os
import re
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from engine.llm.base import (
    LLMError,
    LLMReply,
    LLMRequest,
    MissingCredentials,
    SchemaRefused,
    TransientLLMError,
    estimate_tokens,
    sampling_options,
    tool_call_text,
)

TOOL_CALL_LINE = re.compile(r'^<tool_call name="([^"]+)">(.*)</tool_call>$')


def wire_messages(messages: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Chat messages as the API takes them. A tool loop imported from traces holds an
    assistant turn as text with `<tool_call …>` lines (engine.llm.base.tool_call_text) and
    each tool's result as a `tool` message: these go out as the API's own assistant
    `tool_calls` and `tool` messages, joined by ids in order."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for role, content in messages:
        if role == "assistant" and "<tool_call " in content:
            text, calls = [], []
            for line in content.split("\n"):
                match = TOOL_CALL_LINE.match(line)
                if match:
                    calls.append({"id": f"call_{len(out)}_{len(calls)}", "type": "function",
                                  "function": {"name": match[1], "arguments": match[2]}})
                else:
                    text.append(line)
            pending = [c["id"] for c in calls]
            out.append({"role": "assistant", "content": "\n".join(text) or None,
                        "tool_calls": calls})
        elif role == "tool":
            out.append({"role": "tool", "content": content,
                        "tool_call_id": pending.pop(0) if pending else "call_0"})
        else:
            out.append({"role": role, "content": content})
    return out


PLACEHOLDER_KEY = "not-needed"  # local OpenAI-compatible servers ignore the key
MISSING_CREDENTIALS = (
    "no OpenAI credentials: set OPENAI_API_KEY (or OPENAI_BASE_URL for a local "
    "OpenAI-compatible server)"
)
_MAX_MESSAGE_CHARS = 300
POOLS = 8  # SDK clients (connection pools) a backend spreads its requests over
# Words by which a 400/422 shows that the server refused the response_format, not the rest
_SCHEMA_WORDS = ("response_format", "json_schema", "schema", "structured", "guided", "grammar")
# Length limits are left to max_tokens: OpenAI's strict mode rejects these keywords
_LENGTH_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems")


class OpenAIBackend:
    """Chat completions over HTTP. `base_url` and `api_key` default to OPENAI_BASE_URL
    and OPENAI_API_KEY; with a base URL but no key a placeholder key is sent."""

    name = "openai"
    supports_schema = True  # until a server refuses it (LLMClient then stops asking)

    def __init__(self, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 120.0, extra_headers: dict[str, str] | None = None):
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        api_key = api_key or os.environ.get("OPENAI_API_KEY") or None
        if not api_key and not base_url:
            raise MissingCredentials(MISSING_CREDENTIALS)
        try:
            import openai
        except ImportError:
            raise LLMError("the openai package is missing: pip install openai") from None
        self._sdk = openai
        from openai.types.chat import ChatCompletion

        self._completion_type = ChatCompletion
        self.base_url = base_url
        self._secret = api_key or ""
        settings = {"api_key": api_key or PLACEHOLDER_KEY, "base_url": base_url,
                    "timeout": timeout, "max_retries": 0, "default_headers": extra_headers}
        aiohttp_client = _aiohttp_client(openai, base_url)
        if aiohttp_client is not None:
            # The SDK's aiohttp transport (its `aiohttp` extra, which requirements.txt
            # installs): about half the CPU per request of the default one, which is what
            # a round of 32 concurrent requests waits for (benchmarks/step_cost.py).
            self.transport = "aiohttp"
            self._clients = [openai.AsyncOpenAI(**settings, http_client=aiohttp_client)]
        else:
            # Several SDK clients, each with its own connection pool, used in turn: the
            # HTTP pool scans every open connection whenever a request starts or ends, so
            # one pool of many connections costs CPU that grows with the square of the
            # concurrency.
            self.transport = "httpx"
            self._clients = [openai.AsyncOpenAI(**settings) for _ in range(POOLS)]
        self._turn = itertools.count()

    def __repr__(self) -> str:
        return f"OpenAIBackend(base_url={self.base_url!r})"

    def request_body(self, request: LLMRequest) -> dict[str, Any]:
        """The JSON body of the chat-completions request `request` becomes."""
        kwargs: dict[str, Any] = {
            "model": request.model,
            "messages": wire_messages(request.messages),
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
        }
        kwargs.update(sampling_options(request))
        if request.schema is not None:
            kwargs["response_format"] = response_format(request)
        if request.tools:
            kwargs.update({k: v for k, v in request.tools.items() if v is not None})
        return kwargs

    async def complete(self, request: LLMRequest) -> LLMReply:
        kwargs = self.request_body(request)
        try:
            client = self._clients[next(self._turn) % len(self._clients)]
            # The SDK's generic `post` (its documented way to reach any endpoint) sends the
            # same request as `chat.completions.create` without re-validating our already
            # plain parameters against the typed schema, which costs ~2 ms of CPU per call.
            response = await client.post("/chat/completions", body=kwargs,
                                         cast_to=self._completion_type)
        except self._sdk.OpenAIError as exc:
            # `from None`: the SDK error holds the request, which holds the key.
            if request.schema is not None and self._refuses_schema(exc):
                raise SchemaRefused(f"openai: the server refused response_format "
                                    f"({self._one_line(exc)})") from None
            raise self._map_error(exc) from None
        reply = self._reply(request, response)
        reply.constrained = request.schema is not None
        return reply

    def _refuses_schema(self, exc: Exception) -> bool:
        status = getattr(exc, "status_code", None)
        text = str(exc).lower()
        return status in (400, 422) and any(word in text for word in _SCHEMA_WORDS)

    def _reply(self, request: LLMRequest, response: Any) -> LLMReply:
        choices = getattr(response, "choices", None) or []
        text, finish_reason = "", None
        if choices:
            finish_reason = getattr(choices[0], "finish_reason", None)
        if choices and choices[0].message is not None:
            text = choices[0].message.content or ""
            calls = getattr(choices[0].message, "tool_calls", None) or []
            if calls:
                text = tool_call_text(text, [(c.function.name, c.function.arguments)
                                             for c in calls if getattr(c, "function", None)])
        usage = getattr(response, "usage", None)
        prompt_tokens = getattr(usage, "prompt_tokens", None)
        completion_tokens = getattr(usage, "completion_tokens", None)
        if prompt_tokens is None:
            prompt_tokens = estimate_tokens("".join(c for _, c in request.messages))
        if completion_tokens is None:
            completion_tokens = estimate_tokens(text)
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        return LLMReply(text=text, prompt_tokens=prompt_tokens,
                        completion_tokens=completion_tokens,
                        model=getattr(response, "model", None) or request.model,
                        finish_reason=finish_reason, cached_tokens=int(cached or 0),
                        response_model=getattr(response, "model", None) or None)

    def _map_error(self, exc: Exception) -> LLMError:
        openai = self._sdk
        message = self._one_line(exc)
        if isinstance(exc, openai.APITimeoutError) and not _refused_connection(exc):
            return TransientLLMError(f"openai: request timed out ({message})", congestion=True)
        if isinstance(exc, openai.APIConnectionError):
            return TransientLLMError(f"openai: cannot connect to {self._where()} ({message})",
                                     congestion=True)
        if isinstance(exc, openai.RateLimitError):
            return TransientLLMError(f"openai: rate limited (429): {message}",
                                     retry_after=retry_after_seconds(exc.response),
                                     congestion=True)
        if isinstance(exc, openai.AuthenticationError):
            return LLMError(f"openai: authentication failed (401), check OPENAI_API_KEY: {message}")
        if isinstance(exc, openai.PermissionDeniedError):
            return LLMError(f"openai: permission denied (403): {message}")
        if isinstance(exc, openai.NotFoundError):
            return LLMError(f"openai: not found (404), check the model name and base URL: "
                            f"{message}")
        if isinstance(exc, openai.BadRequestError):
            return LLMError(f"openai: bad request (400): {message}")
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            # 408 and 409 are what the SDK itself would retry; 5xx are server trouble.
            if status >= 500 or status in (408, 409):
                return TransientLLMError(f"openai: server error ({status}): {message}",
                                         retry_after=retry_after_seconds(exc.response),
                                         congestion=status == 503)
            return LLMError(f"openai: HTTP {status}: {message}")
        return LLMError(f"openai: {type(exc).__name__}: {message}")

    def _where(self) -> str:
        return self.base_url or "api.openai.com"

    def _one_line(self, exc: Exception) -> str:
        """The exception's text on one short line, with the API key scrubbed."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        text = scrub(text, self._secret)
        if len(text) > _MAX_MESSAGE_CHARS:
            text = text[: _MAX_MESSAGE_CHARS - 1] + "…"
        return text

    async def aclose(self) -> None:
        for client in self._clients:
            await client.close()


def _refused_connection(exc: BaseException) -> bool:
    """Whether an SDK timeout is really a connection that could not be made: the aiohttp
    transport reports a refused connection (a server that is not there) as a connect
    timeout, which would send the user looking for a slow server."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ConnectionRefusedError) or any(
                kind.__name__ == "ClientConnectorError" for kind in type(cause).__mro__):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _aiohttp_client(openai: Any, base_url: str | None) -> Any | None:
    """The SDK's aiohttp-based HTTP client, or None where the `openai[aiohttp]` extra (or an
    SDK that has it) is missing, or the base URL carries credentials (`user:pw@host`, which
    aiohttp will not send beside the API key's header): the default transport then serves,
    a little slower."""
    make = getattr(openai, "DefaultAioHttpClient", None)
    if make is None or os.environ.get("SEMBACK_HTTP_TRANSPORT") == "httpx" \
            or "@" in urlsplit(base_url or "").netloc:
        return None
    try:
        return make()
    except (ImportError, RuntimeError):  # the SDK's message when the extra is missing
        return None


def response_format(request: LLMRequest) -> dict[str, Any]:
    """The `response_format` of a request with a schema: strict JSON schema output, named
    after the request's role."""
    name = "".join(c if c.isalnum() or c in "_-" else "_"
                   for c in str(request.meta.get("role") or "reply"))[:64]
    return {"type": "json_schema",
            "json_schema": {"name": name, "strict": True,
                            "schema": _without_lengths(request.schema or {})}}


def _without_lengths(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_lengths(v) for k, v in schema.items() if k not in _LENGTH_KEYWORDS}
    if isinstance(schema, list):
        return [_without_lengths(v) for v in schema]
    return schema


def scrub(text: str, secret: str) -> str:
    """Replace every occurrence of `secret` in `text` (keys shorter than 4 chars are not
    secrets worth scrubbing and would mangle ordinary words)."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    return text


def retry_after_seconds(response: Any) -> float | None:
    """Seconds to wait from a response's Retry-After (seconds or HTTP date) or
    retry-after-ms header; None when absent or unreadable."""
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
