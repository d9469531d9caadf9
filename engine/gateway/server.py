"""`gateway`: an OpenAI-compatible server between a pipeline and its model (Starlette on
uvicorn, 127.0.0.1 by default).

It forwards `POST /v1/chat/completions` (tools, tool_choice, response_format, n, and
`stream: true` as server-sent events) and `GET /v1/models` to the upstream, and answers
any other path with an OpenAI-style error naming what it serves. It also takes OTLP/HTTP
spans on `POST /v1/traces`, as `collect` does and into the same table, so one process
serves a pipeline's model calls and its instrumentor's spans. Each chat call it answers
is recorded as an OpenInference LLM span in the run log's `collected_spans`, the table
`collect` fills: journaled before the reply goes out and written in batches soon after
(engine/gateway/journal.py), so that `import-traces --collected` reads a
pipeline that has no instrumentor at all, and a gateway restarted mid-run has lost no call
it answered. Spans are grouped into traces by the W3C `traceparent` header when the client
sends one, else by the session in the path.

The path may carry, before `/v1`:
- `/s/{session}`: the session (one example's pass) the call belongs to;
- `/c/{candidate}`: a candidate (engine.gateway.interventions) to apply;
- `/w/{worker}`: a runner's worker, which the runner points at the example (session and
  candidate) it is running: a pipeline that built its client at import time keeps one
  base URL for all its examples.

The reply cache is content-addressed (SHA-256 of what the request asks,
engine.gateway.calls.request_key) and lives in the recorded spans themselves, so it
survives restarts: a request asked before is answered from it, and only changed requests
go upstream.

The upstream key is `OPENAI_API_KEY` (or none); a client's `Authorization` header is
forwarded instead when it sends one. Neither is ever written anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.gateway.calls import (
    assemble,
    completion_of,
    error_body,
    request_key,
    span_attributes,
    sse_events,
)
from engine.gateway.interventions import NODE_HEADER, NODE_METADATA, Candidate
from engine.gateway.journal import Journal, journal_path
from engine.runlog.collected import SpanStore, gateway_replies, open_for_collecting
from engine.traces.collect import PATH as TRACES_PATH
from engine.traces.collect import Receiver

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8790
SERVICE = "semback-gateway"
STORE_TIMEOUT = 30.0
# the key a runner's worker sends when the user set none: the gateway then sends its own
PLACEHOLDER_KEY = "sk-semback-gateway"
# a stream whose first bytes the upstream has not sent after this long is an error
UPSTREAM_TIMEOUT = 600.0


def session_ids(session: str) -> tuple[str, str]:
    """The trace id and root span id of a session's trace (the runner writes the root)."""
    digest = hashlib.sha256(f"semback-session:{session}".encode()).hexdigest()
    return digest[:32], digest[32:48]


@dataclass
class Seen:
    """One call the gateway answered, as a re-run reads it back."""

    node: str | None
    request: dict[str, Any]
    completion: dict[str, Any]
    cache_hit: bool = False
    patched: bool = False
    latency_ms: float = 0.0


@dataclass
class Counts:
    calls: int = 0  # chat calls answered
    upstream: int = 0  # of them, sent upstream
    cache_hits: int = 0
    patched: int = 0
    errors: int = 0  # requests answered with an error


@dataclass
class Route:
    session: str | None = None
    candidate: str | None = None
    worker: str | None = None
    rest: str = ""


class GatewayError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code, self.kind = status, code, kind


def parse_path(path: str) -> Route | None:
    """`/c/X/s/Y/v1/chat/completions` -> Route; None when the path has no `/v1`."""
    parts = [p for p in path.split("/") if p]
    route = Route()
    while parts and parts[0] != "v1":
        if len(parts) < 2 or parts[0] not in ("c", "s", "w"):
            return None
        key, value, parts = parts[0], parts[1], parts[2:]
        setattr(route, {"c": "candidate", "s": "session", "w": "worker"}[key], value)
    if not parts:
        return None
    route.rest = "/".join(parts[1:])
    return route


class Gateway:
    """The server, bound on start(); `close()` stops it. `candidates`, `workers` and
    `sessions` are the runner's way in (same process)."""

    def __init__(self, db: str | Path, upstream: str, *, host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT, api_key: str | None = None,
                 log: Callable[[str], None] = print, timeout: float = UPSTREAM_TIMEOUT,
                 upstream_model: str | None = None) -> None:
        self.db = str(db)
        open_for_collecting(self.db)
        self.upstream = upstream.rstrip("/")
        self.host, self.port = host, port
        self.api_key = api_key
        self.upstream_model = upstream_model  # a local backend's model name, else the client's
        self.log = log
        self.timeout = timeout
        # held while calls keep coming (another process gets the file in the pauses)
        self.store = SpanStore(self.db, idle=0.5, hold=10.0, timeout=STORE_TIMEOUT)
        # each answered call is journaled before its reply, in the run log soon after
        self.journal = Journal(self.store, journal_path(self.db), log=log)
        self.cache: dict[str, dict[str, Any]] = {}
        for key, output in gateway_replies(self.db):
            try:
                self.cache.setdefault(key, json.loads(output))
            except (TypeError, json.JSONDecodeError):
                continue
        self.candidates: dict[str, Candidate] = {}
        self.workers: dict[str, Route] = {}
        # the calls of the sessions a runner will read back (`expect`), by session: other
        # clients' sessions are recorded as spans only, never held here
        self.sessions: dict[str, list[Seen]] = {}
        self.inputs: dict[str, dict[str, Any]] = {}  # those sessions' examples' input fields
        self.counts = Counts()
        self._lock = threading.Lock()
        self._served: Any = None
        self._client: Any = None
        # OTLP/HTTP spans on POST /v1/traces too, into the same store: one process serves
        # a pipeline's model calls and its instrumentor's spans (engine/traces/collect.py)
        self.intake = Receiver(self.db, log=log, store=self.store, serve=False)

    def expect(self, session: str, fields: dict[str, Any] | None = None) -> None:
        """Hold the calls of `session` for the runner, which takes them with `done`;
        `fields`, the example's input, tell a system message filled from it (its span
        records the template, engine/gateway/calls.py template_of)."""
        with self._lock:
            self.sessions.setdefault(session, [])
            if fields:
                self.inputs[session] = fields

    def done(self, session: str) -> list[Seen]:
        """The calls of an expected session, let go."""
        with self._lock:
            self.inputs.pop(session, None)
            return self.sessions.pop(session, [])

    # --- lifecycle ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route as StarletteRoute

        return Starlette(routes=[StarletteRoute(
            "/{path:path}", self.handle,
            methods=["GET", "POST", "PUT", "DELETE", "PATCH"])],
            lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Any) -> AsyncIterator[None]:
        yield
        await self._close_http()

    def start(self) -> Gateway:
        """Serve in a daemon thread; returns once listening (TraceError when it cannot)."""
        from engine.traces.asgi import Served

        self._served = Served(self.app(), self.host, self.port, name="gateway",
                              lifespan="on")  # its shutdown closes the upstream client
        self.port = self._served.port
        self._served.start()
        return self

    def close(self) -> None:
        if self._served is not None:
            self._served.close()
            self._served = None
        self.journal.close()
        self.store.close()

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one request -------------------------------------------------------------------
    async def handle(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        path = request.url.path
        route = parse_path(path)
        try:
            if route is not None and route.rest == "traces" and path == TRACES_PATH:
                return await self.intake.endpoint(request)
            if route is None or (route.rest, request.method) not in (
                    ("chat/completions", "POST"), ("models", "GET")):
                raise GatewayError(404 if route is None or route.rest not in (
                    "chat/completions", "models") else 405,
                    f"the gateway does not serve {request.method} {path[:80]}: it forwards "
                    "POST /v1/chat/completions and GET /v1/models (optionally under "
                    "/s/SESSION, /c/CANDIDATE or /w/WORKER), and takes OTLP/HTTP spans on "
                    f"POST {TRACES_PATH}", "unsupported_endpoint")
            if route.worker is not None:
                assigned = self.workers.get(route.worker)
                if assigned is None:
                    raise GatewayError(404, f"no runner worker '{route.worker}'",
                                       "unknown_worker")
                route = Route(assigned.session, assigned.candidate, None, route.rest)
            if route.rest == "models":
                return await self._models(request)
            return await self._chat(request, route)
        except GatewayError as exc:
            with self._lock:
                self.counts.errors += 1
            return JSONResponse(error_body(str(exc), exc.kind, exc.code),
                                status_code=exc.status)

    def _headers(self, request: Any) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        auth = request.headers.get("authorization")
        if auth and auth != f"Bearer {PLACEHOLDER_KEY}":
            headers["Authorization"] = auth
        elif self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _http(self) -> Any:
        """The upstream's HTTP client (aiohttp), made in the serving loop, closed with it."""
        if self._client is None:
            import aiohttp

            self._client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout, connect=10),
                connector=aiohttp.TCPConnector(limit=512))
        return self._client

    async def _close_http(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _models(self, request: Any) -> Any:
        from starlette.responses import Response

        try:
            async with self._http().get(f"{self.upstream}/models",
                                        headers=self._headers(request)) as reply:
                status, content = reply.status, await reply.read()
        except Exception as exc:  # noqa: BLE001 - any transport failure: one line
            raise self._unreachable(exc) from None
        return Response(content, status_code=status, media_type="application/json")

    def _unreachable(self, exc: BaseException) -> GatewayError:
        return GatewayError(502, f"the upstream model at {self.upstream} is not reachable "
                                 f"({exc.__class__.__name__})", "upstream_unreachable",
                            "api_error")

    async def _chat(self, request: Any, route: Route) -> Any:
        from starlette.responses import JSONResponse, StreamingResponse

        started = time.perf_counter()
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GatewayError(400, f"the request body is not JSON ({exc})") from None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or \
                not all(isinstance(m, dict) for m in body["messages"]):
            raise GatewayError(400, "expected a JSON object whose 'messages' is a list of "
                                    "message objects")
        candidate = None
        if route.candidate is not None:
            candidate = self.candidates.get(route.candidate)
            if candidate is None:
                raise GatewayError(404, f"no candidate named '{route.candidate}'",
                                   "unknown_candidate")
        named = request.headers.get(NODE_HEADER)
        if candidate is not None:
            node, variables = candidate.identify(body, named)
            sent, patched = candidate.apply(body, node, variables)
        else:
            node = named_node(request, body)
            sent, patched = body, None
        if self.upstream_model and patched is None:
            sent = {**sent, "model": self.upstream_model}
        key = request_key(sent)
        stream = bool(body.get("stream"))
        cache_hit = False
        if patched is not None:
            completion = completion_of(patched, str(body.get("model") or ""), key)
        elif key in self.cache:
            completion, cache_hit = self.cache[key], True
        elif stream:
            return await self._stream_through(request, route, body, sent, key, node,
                                              started)
        else:
            completion = await self._upstream(request, sent)
            self.cache.setdefault(key, completion)
        await self._record(route, body, sent, completion, key, node, cache_hit,
                           patched is not None, started, request)
        if stream:
            return StreamingResponse(_iterate(sse_events(completion)),
                                     media_type="text/event-stream")
        return JSONResponse(completion)

    async def _upstream(self, request: Any, sent: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.counts.upstream += 1
        try:
            async with self._http().post(f"{self.upstream}/chat/completions",
                                         json={k: v for k, v in sent.items()
                                               if k != "metadata"},
                                         headers=self._headers(request)) as reply:
                status, content = reply.status, await reply.read()
        except Exception as exc:  # noqa: BLE001 - any transport failure: one line
            raise self._unreachable(exc) from None
        return self._checked(status, content)

    def _checked(self, status: int, content: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(content)
        except (json.JSONDecodeError, UnicodeDecodeError):
            payload = None
        if status != 200:
            message = (payload.get("error") or {}).get("message") if isinstance(
                payload, dict) and isinstance(payload.get("error"), dict) else None
            raise GatewayError(status, f"the upstream model answered {status}: "
                                       f"{message or content[:200].decode('utf-8', 'replace')}",
                               "upstream_error", "api_error")
        if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
            raise GatewayError(502, "the upstream model's reply is not a chat completion",
                               "upstream_error", "api_error")
        return payload

    async def _stream_through(self, request: Any, route: Route, body: dict[str, Any],
                              sent: dict[str, Any], key: str, node: str | None,
                              started: float) -> Any:
        """Relay the upstream's stream as it comes; record the whole reply before the
        stream's last event."""
        from starlette.responses import StreamingResponse

        with self._lock:
            self.counts.upstream += 1
        try:
            reply = await self._http().post(f"{self.upstream}/chat/completions",
                                            json={k: v for k, v in sent.items()
                                                  if k != "metadata"},
                                            headers=self._headers(request))
        except Exception as exc:  # noqa: BLE001 - any transport failure: one line
            raise self._unreachable(exc) from None
        if reply.status != 200:
            content = await reply.read()
            reply.release()
            self._checked(reply.status, content)

        async def relay() -> AsyncIterator[bytes]:
            chunks = []
            try:
                async for raw in reply.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunks.append(json.loads(data))
                    except json.JSONDecodeError:
                        continue
                    yield f"data: {data}\n\n".encode()
            finally:
                reply.release()
            completion = assemble(chunks)
            self.cache.setdefault(key, completion)
            await self._record(route, body, sent, completion, key, node, False, False,
                               started, request)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def _record(self, route: Route, body: dict[str, Any], sent: dict[str, Any],
                      completion: dict[str, Any], key: str, node: str | None,
                      cache_hit: bool, patched: bool, started: float, request: Any) -> None:
        trace_id, parent = self._trace_of(route, request)
        attributes = span_attributes(sent, completion, node=node, cache_hit=cache_hit,
                                     patched=patched, candidate=route.candidate,
                                     fields=self.inputs.get(route.session or ""))
        if not patched:
            attributes["semback.gateway.key"] = key
        if route.session:
            attributes["semback.gateway.session"] = route.session
        end = time.time_ns()
        begin = end - int((time.perf_counter() - started) * 1e9)
        # the span is named by the node the client named (a candidate's own names for
        # call sites are the gateway's, not the pipeline's)
        row = (trace_id, secrets.token_hex(8), parent, named_node(request, body)
               or "ChatCompletion", begin, end,
               json.dumps(attributes, ensure_ascii=False), SERVICE)
        self.journal.record(row)
        seen = Seen(node, sent, completion, cache_hit, patched,
                    (time.perf_counter() - started) * 1000)
        with self._lock:
            self.counts.calls += 1
            self.counts.cache_hits += cache_hit
            self.counts.patched += patched
            if route.session in self.sessions:  # a session the runner reads back
                self.sessions[route.session].append(seen)

    def _trace_of(self, route: Route, request: Any) -> tuple[str, str]:
        parent = request.headers.get("traceparent", "")
        pieces = parent.split("-")
        if len(pieces) == 4 and len(pieces[1]) == 32 and len(pieces[2]) == 16:
            return pieces[1].lower(), pieces[2].lower()
        if route.session:
            return session_ids(route.session)
        return secrets.token_hex(16), ""


def named_node(request: Any, body: dict[str, Any]) -> str | None:
    """The node a request names: its X-Semback-Node header or metadata.semback_node."""
    metadata = body.get("metadata")
    return request.headers.get(NODE_HEADER) or (
        metadata.get(NODE_METADATA) if isinstance(metadata, dict) else None)


async def _iterate(events: Any) -> AsyncIterator[bytes]:
    for event in events:
        yield event

