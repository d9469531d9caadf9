"""A small fake OpenAI-compatible chat-completions server for tests and benchmarks.

It runs in a background thread on 127.0.0.1 (a free port), one thread per connection,
so slow requests overlap as they would against a real server::

    with FakeOpenAIServer(latency=0.1, faults=[("status", 500)]) as server:
        backend = OpenAIBackend(base_url=server.base_url, api_key="sk-test")
        ...
        assert len(server.requests) == 2

Routes: POST /v1/chat/completions and GET /v1/models.

A responder returns the reply's text, or a dict {"content": text or None, "tool_calls":
[...]} (OpenAI's format) for an assistant message that calls tools (finish_reason
"tool_calls").

Faults are consumed in order, one per chat request, before the normal reply:
  ("status", code)              reply with HTTP `code` and an OpenAI-style error body
  ("status", 429, seconds)      the same, with a `Retry-After: seconds` header
  ("status", code, None, msg)   an error whose body message is `msg` (no Retry-After)
  ("hang", seconds)             wait `seconds` before answering normally
  ("empty",)                    answer with empty content

`prompt_responder` replies by a digest of the whole request (see its docstring): the
benchmarks' stand-in for a model. Structured outputs: the default responder answers a request whose `response_format` is
{"type": "json_schema", "json_schema": {"schema": ...}} with a JSON object that follows the
schema (`schema_reply`). `FakeOpenAIServer(reject_response_format=True)` plays a server
without structured outputs: any request with a `response_format` gets a 400 that names it.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

Fault = tuple[Any, ...]
Responder = Callable[[dict], str | dict]


def default_responder(body: dict) -> str:
    """A deterministic reply that the engine's parsers accept for every purpose: an
    `<output>42</output>` answer and a `<prompt>…</prompt>` revision tagged with a
    short digest of the last user message (so different requests get different text);
    a JSON object following the schema when the request has a json_schema response_format."""
    users = [m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "user"]
    digest = hashlib.sha256((users[-1] if users else "").encode("utf-8")).hexdigest()[:8]
    schema = requested_schema(body)
    if schema is not None:
        return json.dumps(schema_reply(schema, digest))
    return (f"<output>42</output>\n"
            f"<prompt>Answer the question carefully and give only the final answer. "
            f"[{digest}]</prompt>")


WORDS = ("first", "add", "the", "total", "each", "then", "price", "per", "half", "more",
         "left", "count", "sum", "days", "times", "units")


def prompt_responder(body: dict) -> str:
    """Replies that depend on the whole request, as a model's do: a different prompt (any
    message, the schema asked for) gets a different reply, the same prompt the same one.
    It still follows the requested format, so a run proceeds as on a model: a JSON object
    following the schema when the request has one; a `<prompt>` revision when the prompt
    asks for one; otherwise a short working and a result in `<output>` tags, whose number
    (from the digest) is almost never a GSM8K answer, so most steps are rejected, as on a
    real small model."""
    request = json.dumps([body.get("messages"), body.get("response_format")], sort_keys=True)
    digest = hashlib.sha256(request.encode("utf-8")).digest()
    tag = digest.hex()[:8]
    schema = requested_schema(body)
    if schema is not None:
        return json.dumps(schema_reply(schema, tag))
    users = [m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "user"]
    if users and "<prompt>" in users[-1]:
        return f"<prompt>Solve the problem step by step; give only the final number. [{tag}]</prompt>"
    thought = " ".join(WORDS[b % len(WORDS)] for b in digest[:5])
    a, b = digest[5] % 60 + 1, digest[6] % 40 + 1
    return f"{thought.capitalize()}.\n<output>{WORDS[digest[7] % len(WORDS)]}: {a} + {b} = {a + b}</output>"


def requested_schema(body: dict) -> dict | None:
    """The JSON schema a request's response_format asks for, or None."""
    fmt = body.get("response_format") or {}
    if fmt.get("type") != "json_schema":
        return None
    return (fmt.get("json_schema") or {}).get("schema") or {}


def schema_reply(schema: dict, tag: str = "") -> Any:
    """A value that follows `schema` (objects, arrays, strings, numbers, booleans): every
    required property, strings naming their field and carrying `tag`."""
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        keys = schema.get("required", list(props))
        return {k: schema_reply(props.get(k, {"type": "string"}), f"{k} [{tag}]") for k in keys}
    if kind == "array":
        count = max(1, schema.get("minItems", 1))
        return [schema_reply(schema.get("items", {"type": "string"}), f"{tag} {i + 1}")
                for i in range(count)]
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    text = f"Answer the question carefully: {tag}"
    return text[: schema.get("maxLength", len(text))]


def _count_tokens(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


class _Server(ThreadingHTTPServer):
    # The stdlib default backlog of 5 drops bursts of connections (each dropped SYN costs
    # a one-second retransmit), which would make concurrency look slow.
    request_queue_size = 256


class FakeOpenAIServer:
    """See the module docstring. Thread-safe records: `requests` (chat request bodies,
    in arrival order) and `authorizations` (the Authorization header of each)."""

    def __init__(self, latency: float = 0.0, responder: Responder | None = None,
                 faults: Iterable[Fault] | None = None, reject_response_format: bool = False,
                 rate_limit_share: float = 0.0, capacity: int | None = None,
                 retry_after: float | None = None, seed: int = 0,
                 finish_reason: str = "stop", prefix_cache: bool = False,
                 reply_model: str | None = None):
        self.latency = latency
        self.reply_model = reply_model  # the model replies name (default: the one asked for)
        self.finish_reason = finish_reason  # what every completion says ended it
        # prefix caching as OpenAI reports it: usage.prompt_tokens_details.cached_tokens is
        # the longest prefix (in tokens of 4 characters) shared with an earlier request
        self.prefix_cache = prefix_cache
        # the hashes of every 4-character-aligned prefix of the prompts seen: a prefix-closed
        # set, so a new prompt's longest cached prefix is one binary search, whatever the
        # number of earlier prompts (comparing with each of them, under the lock and after
        # the latency, added the fake's own CPU to every round of a benchmark's step)
        self._prefixes: set[int] = set()
        # push-back (429, with Retry-After: retry_after): a seeded random share of requests,
        # and/or every request beyond `capacity` arriving within one latency
        self.rate_limit_share, self.capacity, self.retry_after = (rate_limit_share, capacity,
                                                                  retry_after)
        self._rng = random.Random(seed)
        self._arrivals: deque[float] = deque()
        self.reject_response_format = reject_response_format
        self.responder = responder or default_responder
        self.requests: list[dict] = []
        self.authorizations: list[str | None] = []
        self._faults: list[Fault] = list(faults or [])
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> FakeOpenAIServer:
        httpd = _Server(("127.0.0.1", 0), _make_handler(self))
        httpd.daemon_threads = True  # a hung handler must not block shutdown
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, name="fake-openai",
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._stopping.set()  # wakes handlers sleeping for latency or a hang
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the server is not running")
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting -----------------------------------------------------------------
    def add_fault(self, *fault: Any) -> None:
        with self._lock:
            self._faults.append(tuple(fault))

    @property
    def faults(self) -> list[Fault]:
        """Faults not yet consumed (a copy)."""
        with self._lock:
            return list(self._faults)

    def _record(self, body: dict, authorization: str | None) -> Fault | None:
        with self._lock:
            self.requests.append(body)
            self.authorizations.append(authorization)
            return self._faults.pop(0) if self._faults else None

    def _pushback(self) -> Fault | None:
        with self._lock:
            now = time.monotonic()
            self._arrivals.append(now)
            while self._arrivals[0] < now - max(self.latency, 0.001):
                self._arrivals.popleft()
            over = self.capacity is not None and len(self._arrivals) > self.capacity
            if over:
                self._arrivals.pop()  # a refused request takes no capacity
            chance = self.rate_limit_share > 0 and self._rng.random() < self.rate_limit_share
        return ("status", 429, self.retry_after) if over or chance else None

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)

    def _cached_prefix(self, prompt: str) -> int:
        """Tokens (of 4 characters) of the longest prefix `prompt` shares with an earlier
        prompt: len(os.path.commonprefix([prompt, seen])) // 4 at its largest."""
        blocks = len(prompt) // 4
        hashes = [hash(prompt[:4 * k]) for k in range(1, blocks + 1)]
        with self._lock:
            low, high = 0, blocks  # prompt[:4 * low] was seen; find the largest such low
            while low < high:
                mid = (low + high + 1) // 2
                if hashes[mid - 1] in self._prefixes:
                    low = mid
                else:
                    high = mid - 1
            self._prefixes.update(hashes)
        return low

    def _completion(self, body: dict, text: str | dict) -> dict:
        prompt = "".join(m.get("content") or "" for m in body.get("messages", []))
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish_reason = self.finish_reason
        if isinstance(text, dict):  # a message that calls tools
            message = {"role": "assistant", "content": text.get("content"),
                       "tool_calls": text.get("tool_calls") or []}
            finish_reason = "tool_calls" if message["tool_calls"] else finish_reason
            text = (text.get("content") or "") + json.dumps(message["tool_calls"])
        prompt_tokens, completion_tokens = _count_tokens(prompt), _count_tokens(text)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        if self.prefix_cache:
            usage["prompt_tokens_details"] = {"cached_tokens": self._cached_prefix(prompt)}
        return {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.reply_model or body.get("model", "fake"),
            "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}],
            "usage": usage,
        }


def _make_handler(server: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go out in separate writes: without TCP_NODELAY, Nagle's
        # algorithm and the client's delayed ACK add ~40 ms to every reply
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

        def _send_json(self, status: int, payload: dict,
                       headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode("utf-8")
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (timeout); fine

        def _send_stream(self, completion: dict) -> None:
            """A completion as OpenAI streams it: server-sent chat.completion.chunk events,
            the content a few characters at a time, each tool call's arguments in two
            pieces, then `[DONE]` (the connection closes after)."""
            message = completion["choices"][0]["message"]
            base = {k: completion[k] for k in ("id", "created", "model")}
            events = [{"role": "assistant", "content": ""}]
            content = message.get("content") or ""
            events += [{"content": content[i:i + 8]} for i in range(0, len(content), 8)]
            for i, call in enumerate(message.get("tool_calls") or []):
                arguments = call["function"]["arguments"]
                half = len(arguments) // 2
                events.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                               "function": {"name": call["function"]["name"],
                                                            "arguments": arguments[:half]}}]})
                events.append({"tool_calls": [{"index": i, "function": {
                    "arguments": arguments[half:]}}]})
            finish = completion["choices"][0]["finish_reason"]
            lines = [{**base, "object": "chat.completion.chunk",
                      "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
                     for d in events]
            lines.append({**base, "object": "chat.completion.chunk",
                          "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for line in lines:
                    self.wfile.write(f"data: {json.dumps(line)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send_json(200, {"object": "list", "data": [
                    {"id": "fake", "object": "model", "created": 0, "owned_by": "fake"}]})
            else:
                self._send_json(404, _error("not found", "invalid_request_error"))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send_json(404, _error("not found", "invalid_request_error"))
                return
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                self._send_json(400, _error("body is not JSON", "invalid_request_error"))
                return
            fault = server._record(body, self.headers.get("Authorization")) \
                or server._pushback()
            refused = server.reject_response_format and body.get("response_format")
            # a plain reply is worked out within the latency, as a real server's work is
            # part of its latency: the fake's own CPU does not lengthen every round
            ready = None if fault is not None or refused else server._completion(
                body, server.responder(body))
            server._sleep(server.latency)
            if ready is not None and body.get("stream"):
                self._send_stream(ready)
                return
            if ready is not None:
                self._send_json(200, ready)
                return
            if refused:
                self._send_json(400, _error("response_format is not supported by this server",
                                            "invalid_request_error"))
                return
            text = None
            if fault is not None:
                kind = fault[0]
                if kind == "status":
                    status = int(fault[1])
                    retry_after = fault[2] if len(fault) > 2 else None
                    message = fault[3] if len(fault) > 3 else f"scripted fault {status}"
                    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
                    self._send_json(status, _error(message, "server_error"), headers)
                    return
                if kind == "hang":
                    server._sleep(float(fault[1]))
                elif kind == "empty":
                    text = ""
                else:
                    raise ValueError(f"unknown fault {fault!r}")
            if text is None:
                text = server.responder(body)
            self._send_json(200, server._completion(body, text))

    return Handler


def _error(message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
