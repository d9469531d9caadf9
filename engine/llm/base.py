"""The one async interface every model backend implements.

A backend turns an `LLMRequest` into an `LLMReply`. Everything around the call
(cache, concurrency limit, retries, accounting, logging) lives in `engine.llm.client`,
so a backend stays a thin adapter.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Purpose = Literal["forward", "loss", "backward", "update"]
PURPOSES: tuple[str, ...] = ("forward", "loss", "backward", "update")


@dataclass(frozen=True)
class LLMRequest:
    """A full request. Every field except `meta` is part of the cache key.

    `meta` carries context the scripted backend and the logs use (node id, input
    names, template role); it never changes what a real model is asked.
    """

    messages: tuple[tuple[str, str], ...]  # (role, content) pairs
    model: str
    purpose: str
    temperature: float = 0.0
    max_tokens: int = 512
    seed: int | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    sample_index: int = 0
    backend: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # The JSON schema the reply must follow (engine/prompts/structured.py), or None for text.
    schema: dict[str, Any] | None = field(default=None, hash=False)
    # The SHA-256 of the model file (local models): two files of the same name never share
    # cached replies. None for provider models, whose name is all there is to know.
    model_sha256: str | None = None
    # The tools a call imported from traces offered, as the pipeline sent them:
    # {"tools": [OpenAI tool definitions], "tool_choice": ...}; None for a plain call.
    tools: dict[str, Any] | None = field(default=None, hash=False)

    def key_fields(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "model": self.model,
            "messages": [list(m) for m in self.messages],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "top_p": self.top_p,
            "stop": list(self.stop),
            "sample_index": self.sample_index,
            # only when set, so that text requests keep the keys they always had
            **({"schema": self.schema} if self.schema is not None else {}),
            **({"model_sha256": self.model_sha256} if self.model_sha256 else {}),
            **({"tools": self.tools} if self.tools else {}),
        }

    def cache_key(self) -> str:
        """SHA-256 of the canonical JSON of every sampling-relevant field."""
        canonical = json.dumps(self.key_fields(), sort_keys=True, ensure_ascii=False,
                               separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def messages_json(self) -> str:
        """The messages as the call's log and the cache store them (encoded once a
        request: both ask)."""
        text = self.__dict__.get("_messages_json")
        if text is None:
            text = json.dumps([{"role": r, "content": c} for r, c in self.messages],
                              ensure_ascii=False)
            object.__setattr__(self, "_messages_json", text)  # frozen: a cache, no field
        return text

    @property
    def user_text(self) -> str:
        return "\n\n".join(c for r, c in self.messages if r == "user")


@dataclass
class LLMReply:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    constrained: bool | None = None  # whether decoding enforced request.schema (None: unknown)
    finish_reason: str | None = None  # the provider's reason the reply ended (stop, length)
    cached_tokens: int = 0  # prompt tokens the provider's prefix cache served (where reported)
    response_model: str | None = None  # the model the server's reply named, if it named one
    # how long the backend held the request before its model started on it (a slot or
    # context in use, the server starting, the model loading): part of the call's latency,
    # not the model's time
    queued_ms: float = 0.0


class LLMError(Exception):
    """A call that cannot succeed (bad key, unknown model, bad request). Not retried."""


class MissingCredentials(LLMError):
    """No key and no server to call. The message names no flag: which one helps depends on
    the command (run takes --backend, backprop --base-url), so the command line adds the
    flags of the command that ran (engine/cli/commands.py)."""


class SchemaRefused(LLMError):
    """The server rejected the request's `response_format` (a JSON schema). `LLMClient`
    falls back to text formats under `--structured auto`."""


class TransientLLMError(LLMError):
    """A call that may succeed if repeated (timeout, connection error, 429, 5xx).
    `congestion`: the server is overloaded or rate limiting (429, 503, timeouts, refused
    connections), so the client halves its concurrency (engine.llm.limits)."""

    def __init__(self, message: str, retry_after: float | None = None,
                 congestion: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.congestion = congestion


# Seconds a call may take: a provider's from when it is sent; the embedded model's from
# when the model starts on it. On two cores a 1.5B model writes an update of ~100 tokens
# after ~400 prompt tokens in ~30 s alone, several times that beside other work.
DEFAULT_TIMEOUT = 120.0
LOCAL_TIMEOUT = 600.0


class Backend(Protocol):
    """A model behind one interface. A backend whose calls run on this machine's cores
    (the embedded model) may set `times_own_calls = True`: `LLMClient` then does not time
    a call from when it was queued, since on a busy machine the queue is most of the wait,
    and the backend times (or bounds) the work itself."""

    name: str

    async def complete(self, request: LLMRequest) -> LLMReply:
        """Return the model's reply; raise TransientLLMError or LLMError on failure."""
        ...

    async def aclose(self) -> None: ...


def sampling_options(request: LLMRequest) -> dict[str, Any]:
    """The request's optional sampling settings as a chat-completions call takes them
    (seed, top_p, stop): only those set, for every backend that sends them."""
    out: dict[str, Any] = {}
    if request.seed is not None:
        out["seed"] = request.seed
    if request.top_p is not None:
        out["top_p"] = request.top_p
    if request.stop:
        out["stop"] = list(request.stop)
    return out


def tool_call_text(content: str, calls: list[tuple[str, str]]) -> str:
    """A reply as text when it asks for tools: its content (if any), then one line
    `<tool_call name="NAME">ARGUMENTS</tool_call>` a call, the arguments as JSON in
    Python's default spacing (as most pipelines pass them on).
    Both a recorded reply (engine/traces) and a live one (openai_backend) read this way, so
    a tool call is an output like any other."""
    lines = [content] if content else []
    for name, arguments in calls:
        try:
            arguments = json.dumps(json.loads(arguments or "{}"), ensure_ascii=False)
        except (json.JSONDecodeError, TypeError):
            pass
        lines.append(f'<tool_call name="{name}">{arguments}</tool_call>')
    return "\n".join(lines)


def estimate_tokens(text: str) -> int:
    """A rough token count (about four characters a token) for backends without usage."""
    return max(1, len(text) // 4) if text else 0
