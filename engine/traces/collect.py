"""`collect`: a live OTLP/HTTP receiver. A pipeline exports its spans to it as it runs (the
standard `opentelemetry-exporter-otlp-proto-http`, with only
`OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318` set), and each request's spans land in
the run log's `collected_spans` (engine/runlog/collected.py) before the reply, so a span the
exporter saw acknowledged is never lost. `import-traces --collected` then makes a run of
them exactly as of a file.

The protocol (OTLP/HTTP, opentelemetry.io/docs/specs/otlp): `POST /v1/traces` with an
`ExportTraceServiceRequest`, `Content-Type: application/x-protobuf` or `application/json`
(ids in hex, or base64), optionally `Content-Encoding: gzip` or `deflate`. The reply is an
`ExportTraceServiceResponse` in the request's encoding (with `partial_success` naming spans
whose ids are not valid, which are left out); a body that does not decode gets 400 with a
`google.rpc.Status`, an unknown content type or encoding 415, another path 404, and a run
log that another process holds for too long 503 with `Retry-After` (the exporter retries).
A bad request is logged in one line and the receiver keeps serving.

A span that arrives again (the exporter re-sends a batch whose reply it did not get, e.g.
because the receiver was killed mid-request) is stored once; the spans of one trace meet in
the table whatever request, or which run of the receiver, brought them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.runlog.collected import SpanStore, collected_spans, open_for_collecting
from engine.runlog.schema import RunLogError, log_exists
from engine.traces import TraceError
from engine.traces.otlp import Span, spans_of

PATH = "/v1/traces"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4318  # OTLP/HTTP's port
PROTOBUF, JSON = "application/x-protobuf", "application/json"
MAX_BODY = 64 * 1024 * 1024  # bytes of a request's body, compressed or not
# seconds a request waits for the run log (held by another process) before a 503; the
# exporter may give up sooner, and re-send: what this wait then stores is not stored twice
STORE_TIMEOUT = 30.0
# google.rpc.Code values of the Status an error reply carries
INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, UNIMPLEMENTED = 3, 5, 14, 12


class BadRequest(Exception):
    """A request the receiver refuses: its HTTP status and one line saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# --- decoding --------------------------------------------------------------------------


def decode(body: bytes, content_type: str, encoding: str = "") -> tuple[list[tuple[str, Span]],
                                                                       list[str]]:
    """The spans of one request's body, each with its resource's `service.name`, and why
    each span left out was left out (ids that are not valid). BadRequest (400 or 415) when
    the body cannot be read."""
    body = decompress(body, encoding)
    kind = media_type(content_type)
    if kind == PROTOBUF:
        resources = _protobuf_resources(body)
    elif kind == JSON:
        resources = _json_resources(body)
    else:
        raise BadRequest(415, f"unsupported content type {content_type!r}: send "
                              f"{PROTOBUF} or {JSON}")
    found, dropped = [], []
    for service, span in resources:
        problem = _bad_ids(span)
        if problem:
            dropped.append(problem)
        else:
            found.append((service, span))
    return found, dropped


def media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


def decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise BadRequest(415, f"unsupported content encoding {encoding!r}: send gzip, "
                              "deflate or none")
    # gzip, zlib and raw deflate streams alike, never past MAX_BODY (a small bomb stays small)
    gzip_or_zlib = encoding == "gzip" or body[:2] == b"\x1f\x8b" or _zlib_header(body)
    inflater = zlib.decompressobj(wbits=47 if gzip_or_zlib else -15)
    try:
        out = inflater.decompress(body, MAX_BODY + 1)
    except zlib.error as exc:
        raise BadRequest(400, f"the body is not {encoding} ({exc})") from None
    if len(out) > MAX_BODY or inflater.unconsumed_tail:
        raise BadRequest(413, f"the body inflates past {MAX_BODY // 2**20} MiB")
    if not inflater.eof:
        raise BadRequest(400, f"the body is not {encoding} (truncated)")
    return out


def _zlib_header(body: bytes) -> bool:
    return len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0


def _protobuf_resources(body: bytes) -> list[tuple[str, Span]]:
    """The spans of a protobuf request, read from the message itself: what
    `spans_of(MessageToDict(request)["resourceSpans"])` gives, twenty times faster."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise BadRequest(400, f"not an OTLP ExportTraceServiceRequest in protobuf "
                              f"({exc.__class__.__name__}: {exc})") from None
    out = []
    for resource in request.resource_spans:
        service = next((kv.value.string_value for kv in resource.resource.attributes
                        if kv.key == "service.name"), "")
        for scope in resource.scope_spans:
            for span in scope.spans:
                attributes = {}
                for kv in span.attributes:  # the hot loop of a busy receiver: inlined
                    value = kv.value
                    kind = value.WhichOneof("value")
                    attributes[kv.key] = getattr(value, kind) if kind in _SCALARS \
                        else _pb_value(value)
                out.append((service, Span(
                    span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                    span.name, span.start_time_unix_nano, span.end_time_unix_nano,
                    attributes)))
    return out


_SCALARS = frozenset(("string_value", "int_value", "double_value", "bool_value"))


def _pb_value(value: Any) -> Any:
    """An AnyValue as otlp.spans_of reads its JSON form (kvlist and bytes values: None)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_pb_value(v) for v in value.array_value.values]
    if kind in _SCALARS:
        return getattr(value, kind)
    return None


def _json_resources(body: bytes) -> list[tuple[str, Span]]:
    try:
        document = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"not an OTLP ExportTraceServiceRequest in JSON "
                              f"({exc.__class__.__name__}: {exc})") from None
    resources = document.get("resourceSpans", document.get("resource_spans", [])) \
        if isinstance(document, dict) else None
    if not isinstance(resources, list) or not all(isinstance(r, dict) for r in resources):
        raise BadRequest(400, "not an OTLP ExportTraceServiceRequest in JSON (expected an "
                              "object whose resourceSpans is a list of objects)")
    try:
        return [(_service(resource), span) for resource in resources
                for span in spans_of([resource])]
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise BadRequest(400, f"not an OTLP ExportTraceServiceRequest in JSON "
                              f"({exc.__class__.__name__}: {exc})") from None


def _service(resource: dict) -> str:
    attributes = (resource.get("resource") or {}).get("attributes") or []
    for attribute in attributes:
        if isinstance(attribute, dict) and attribute.get("key") == "service.name":
            value = attribute.get("value") or {}
            return str(value.get("stringValue", value.get("string_value", "")))
    return ""


_HEX = re.compile(r"[0-9a-f]+")


def _bad_ids(span: Span) -> str:
    """Why a span's ids are not valid OTLP ids ("" when they are)."""
    if len(span.trace_id) == 32 and len(span.span_id) == 16 and \
            len(span.parent_id) in (0, 16) and _HEX.fullmatch(
                span.trace_id + span.span_id + span.parent_id) and \
            span.trace_id.strip("0") and span.span_id.strip("0") and \
            (not span.parent_id or span.parent_id.strip("0")):
        return ""  # the common case, in one match
    for name, value, size, required in (("trace id", span.trace_id, 32, True),
                                        ("span id", span.span_id, 16, True),
                                        ("parent span id", span.parent_id, 16, False)):
        if not value and not required:
            continue
        if len(value) != size or not _HEX.fullmatch(value) or set(value) == {"0"}:
            return f"span {span.name!r:.60}: {name} {value!r:.40} is not {size // 2} bytes"
    return ""


# one encoder for every span (json.dumps with options builds a new one each call)
_ATTRIBUTES = json.JSONEncoder(ensure_ascii=False).encode


def span_row(service: str, span: Span) -> tuple:
    """A span as engine.runlog.collected stores it (its ROW order)."""
    return (span.trace_id, span.span_id, span.parent_id, span.name, span.start, span.end,
            _ATTRIBUTES(span.attributes), service)


def span_of_row(row: tuple) -> Span:
    trace_id, span_id, parent_id, name, start, end, attributes, _ = row
    return Span(trace_id, span_id, parent_id or "", name or "", int(start or 0),
                int(end or 0), json.loads(attributes) if attributes else {})


def collected(db: str | Path, service: str | None = None, since: float | None = None,
              trace_ids: list[str] | None = None) -> list[Span]:
    """The spans collected into `db` (of whole traces; `service`, `since`, `trace_ids`: see
    engine.runlog.collected.collected_spans), for import_traces(spans=...)."""
    if not log_exists(db):
        raise TraceError(f"{db}: no such run log (start `python -m engine collect --db {db}` "
                         "and send it your pipeline's spans)")
    rows = collected_spans(db, service, since, trace_ids)
    rows.reverse()
    spans = []
    while rows:  # each row let go as its span is made: the two lists never both whole
        spans.append(span_of_row(rows.pop()))
    return spans


def since_time(text: str, now: float | None = None) -> float:
    """`--since`: a duration back from now (`90s`, `30m`, `2h`, `1d`) or a date and time
    (ISO 8601; local time unless it names its zone), as seconds since the epoch."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if match:
        seconds = float(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
        return (time.time() if now is None else now) - seconds
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValueError(f"--since {text!r}: expected a duration (90s, 30m, 2h, 1d) or a "
                         "date and time (2026-12-06T14:30)") from None


# --- the receiver ----------------------------------------------------------------------


@dataclass
class Counts:
    requests: int = 0  # requests whose spans were stored
    spans: int = 0  # spans received in them (repeats included)
    new: int = 0  # of them, spans not stored before
    rejected: int = 0  # requests refused (bad body, content type, path)
    dropped: int = 0  # spans left out for bad ids


class Receiver:
    """The OTLP/HTTP server (Starlette on uvicorn, engine/traces/asgi.py), bound on
    construction (TraceError when the address is taken). `start()` serves in a thread,
    `serve_forever()` in this one, `close()` from another; `log` gets one line per refused
    request. `endpoint` is its route, which the gateway serves too."""

    def __init__(self, db: str | Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 log: Callable[[str], None] = print,
                 on_store: Callable[[int, int], None] | None = None,
                 store: SpanStore | None = None, serve: bool = True) -> None:
        self.db = str(db)
        open_for_collecting(self.db)  # the schema and collected_spans, or one error line
        self.log = log
        self.on_store = on_store
        self.counts = Counts()
        self.store = store or SpanStore(self.db, timeout=STORE_TIMEOUT)
        self._own_store = store is None
        self._counts_lock = threading.Lock()
        self.served = None
        if serve:
            from starlette.applications import Starlette
            from starlette.routing import Route

            from engine.traces.asgi import Served

            app = Starlette(routes=[Route("/{path:path}", self.endpoint,
                                          methods=["GET", "POST", "PUT", "DELETE", "PATCH"])])
            self.served = Served(app, host, port, name="collect")
            self.host, self.port = self.served.host, self.served.port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def serve_forever(self) -> None:
        self.start().join()

    def start(self) -> threading.Thread:
        """Serve in a daemon thread (tests, benchmarks)."""
        return self.served.start()

    def close(self) -> None:
        """Stop accepting requests and wait for a write in progress (its reply may then not
        be sent; the exporter re-sends, and the repeat is not stored twice)."""
        if self.served is not None:
            self.served.close()
        if self._own_store:
            self.store.close()

    def __enter__(self) -> Receiver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # one request
    async def endpoint(self, request: Any) -> Any:
        """The route: POST /v1/traces, anything else refused as OTLP/HTTP says."""
        from starlette.responses import Response

        kind = media_type(request.headers.get("content-type", ""))
        reply_kind = kind if kind in (PROTOBUF, JSON) else JSON
        path = request.url.path
        if path.rstrip("/") != PATH:
            return _status_response(reply_kind, 404, f"no such path {path[:80]!r}: spans go "
                                                     f"to POST {PATH}")
        if request.method != "POST":
            return _status_response(JSON, 405, f"{PATH} takes POST", {"Allow": "POST"})
        try:
            body = await read_body(request)
            status, payload = await asyncio.to_thread(
                self.export, body, request.headers.get("content-type", ""),
                request.headers.get("content-encoding", ""))
        except BadRequest as exc:
            self.refused(request.client.host if request.client else "?", exc.status,
                         str(exc))
            return _status_response(reply_kind, exc.status, str(exc))
        except Exception as exc:  # noqa: BLE001 - never a crash: one line, a 500, serve on
            self.refused(request.client.host if request.client else "?", 500,
                         f"unexpected {exc.__class__.__name__}: {exc}")
            return Response(status_body(reply_kind, 13, "internal error"), 500,
                            media_type=reply_kind)
        return Response(payload, status, media_type=kind)

    def export(self, body: bytes, content_type: str, encoding: str) -> tuple[int, bytes]:
        """Decode and store one request's spans; the reply's status and body (an
        ExportTraceServiceResponse in the request's encoding). BadRequest when refused."""
        found, dropped = decode(body, content_type, encoding)
        rows = [span_row(service, span) for service, span in found]
        try:
            new = self.store.store(rows)
        except RunLogError as exc:
            raise BadRequest(503, f"the run log is busy, try again ({exc})") from None
        with self._counts_lock:
            self.counts.requests += 1
            self.counts.spans += len(rows)
            self.counts.new += new
            self.counts.dropped += len(dropped)
        if self.on_store:
            self.on_store(len(rows), new)
        if dropped:
            self.log(f"left out {len(dropped)} span(s) with bad ids: {dropped[0]}")
        return 200, response(media_type(content_type), len(dropped),
                             f"{len(dropped)} span(s) with bad ids: {dropped[0]}"
                             if dropped else "")

    def refused(self, client: str, status: int, message: str) -> None:
        with self._counts_lock:
            self.counts.rejected += 1
        self.log(f"refused a request from {client}: {status} {message}")


async def read_body(request: Any) -> bytes:
    """A request's body, never past MAX_BODY (BadRequest 413), chunked or not."""
    length = request.headers.get("content-length")
    if length is not None:
        try:
            size = int(length)
        except ValueError:
            raise BadRequest(400, f"Content-Length {length[:20]!r} is not a number") from None
        if size > MAX_BODY or size < 0:
            raise BadRequest(413, f"the body is over {MAX_BODY // 2**20} MiB")
    parts, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > MAX_BODY:
            raise BadRequest(413, f"the body is over {MAX_BODY // 2**20} MiB")
        parts.append(chunk)
    return b"".join(parts)


def _status_response(kind: str, status: int, message: str,
                     headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import Response

    extra = dict(headers or {})
    if status == 503:
        extra["Retry-After"] = "1"
    return Response(status_body(kind, _CODE_OF.get(status, INVALID_ARGUMENT), message),
                    status, headers=extra, media_type=kind)


def response(kind: str, rejected: int = 0, message: str = "") -> bytes:
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    reply = ExportTraceServiceResponse()
    if rejected:
        reply.partial_success.rejected_spans = rejected
        reply.partial_success.error_message = message
    if kind == JSON:
        return json.dumps(json_format.MessageToDict(reply)).encode()
    return reply.SerializeToString()


def status_body(kind: str, code: int, message: str) -> bytes:
    """A google.rpc.Status, in JSON or protobuf as the request was."""
    if kind == JSON:
        return json.dumps({"code": code, "message": message}).encode()
    from google.rpc.status_pb2 import Status

    return Status(code=code, message=message).SerializeToString()


_CODE_OF = {400: INVALID_ARGUMENT, 404: NOT_FOUND, 405: UNIMPLEMENTED, 411: INVALID_ARGUMENT,
            413: INVALID_ARGUMENT, 415: UNIMPLEMENTED, 503: UNAVAILABLE}
