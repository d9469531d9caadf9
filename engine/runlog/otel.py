"""OpenTelemetry export of a run: one trace per run, for Phoenix and any OTLP reader.

The spans follow the OpenTelemetry GenAI conventions (`gen_ai.*`) and, beside them, the
OpenInference attributes Phoenix reads (`openinference.span.kind`, `input.value`,
`output.value`, `llm.*`). The tree a person navigates:

    run <id>                                   CHAIN
      step <n>                                 CHAIN
        forward on train | forward on val | backward | update | gate (joint) |
        gate (per-node) | test                 CHAIN
          example <id>                         CHAIN (update calls have no example)
            forward hint_a | backward final → hint_a, hint_b | update hint_b   LLM
      probes                                   CHAIN
        probe <kind> <node> on <example> (step <n>) | probe baseline on <example> (step <n>)
          probe <node>                         LLM
      diffs > diff on <example> (step <n>) > diff <node>

Spans are sent children first and the run span last: Phoenix shows a trace's first 1,000
spans newest-stored first. Span ids derive from the run (and a --project other than the
graph's name), step, phase, example and call ids, so a re-export after a resume only adds
spans: the ones already sent keep their ids (docs/runlog.md).

`export_otel` writes OTLP/JSON lines (the Collector's file format); `send_otel` posts the
same spans as OTLP/HTTP protobuf. The `opentelemetry-proto` messages do the encoding; the
spans themselves are built in engine/runlog/otel_spans.py.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, TracesData

from engine.runlog.export import file_stem, read_run, write_atomically
from engine.runlog.otel_spans import is_copy, trace_batches
from engine.runlog.schema import RunLogError

# Spans per OTLP/HTTP request: a step of a full run holds thousands of calls, each with its
# messages, and receivers cap a request's size (Phoenix, the Collector: a few MB to tens).
SPANS_PER_REQUEST = 200
TRACES_PATH = "/v1/traces"
# What is read of a receiver's answer, and quoted of a refusal in the one error line.
MAX_ANSWER = 64 * 1024
MAX_DETAIL = 120


def export_otel(db: str | Path, run_id: str, out: str | Path | None = None,
                project: str | None = None, content: bool = True) -> Path:
    """OTLP/JSON lines: one `TracesData` object per line (the OpenTelemetry Collector's
    file format), in the order a receiver should store them: each step's calls, the
    probes' and diffs' calls, then the tree's own spans with the run span last.
    `content=False` leaves out messages, replies and probe texts."""
    path = Path(out or f"{file_stem(run_id)}.otel.jsonl")
    lines = otel_lines(read_run(db, run_id), project, content)
    write_atomically(path, "".join(json.dumps(line, ensure_ascii=False) + "\n"
                                   for line in lines))
    return path


def send_otel(db: str | Path, run_id: str, endpoint: str,
              headers: dict[str, str] | None = None, project: str | None = None,
              timeout: float = 30.0, content: bool = True) -> tuple[str, int, int, bool]:
    """POST the run's spans to an OTLP/HTTP receiver in the export's order (children
    first, the run span last), at most SPANS_PER_REQUEST spans a request. Returns (url,
    spans, requests, copy: whether `project` gave the spans ids of their own);
    RunLogError when the receiver refuses, cannot be reached or answers with something
    that is not an OTLP response (an HTML page)."""
    url = traces_url(endpoint)
    tables = read_run(db, run_id)
    batches = [chunk for batch in trace_batches(tables, project, content)
               for chunk in _chunks(batch, SPANS_PER_REQUEST)]
    for number, batch in enumerate(batches, start=1):
        body = ExportTraceServiceRequest(resource_spans=[batch]).SerializeToString()
        request = urllib.request.Request(url, data=body, method="POST", headers={
            **(headers or {}), "Content-Type": "application/x-protobuf"})
        where = f"{url}: request {number} of {len(batches)}"
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                answer = reply.read(MAX_ANSWER)
                kind = reply.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            detail = _detail(exc.read(MAX_ANSWER), exc.headers.get("Content-Type", ""))
            raise RunLogError(f"{where}: the receiver refused the spans (HTTP {exc.code} "
                              f"{exc.reason}{': ' + detail if detail else ''})") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RunLogError(f"{where}: cannot reach the receiver ({reason})") from None
        _check_answer(where, answer, kind)
    spans = sum(len(b.scope_spans[0].spans) for b in batches)
    return url, spans, len(batches), is_copy(tables, project)


def _chunks(batch: ResourceSpans, size: int) -> list[ResourceSpans]:
    spans = list(batch.scope_spans[0].spans)
    return [ResourceSpans(resource=batch.resource, scope_spans=[ScopeSpans(
        scope=batch.scope_spans[0].scope, spans=spans[i:i + size])])
        for i in range(0, len(spans), size)]


def traces_url(endpoint: str) -> str:
    """The URL spans go to: the endpoint itself when it ends in /v1/traces, else the
    endpoint with /v1/traces appended (OTLP's rule for a base URL)."""
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RunLogError(f"--endpoint {endpoint!r}: expected an http:// or https:// URL, "
                          "such as http://localhost:6006/v1/traces")
    path = parts.path.rstrip("/")
    if not path.endswith(TRACES_PATH):
        path += TRACES_PATH
    return urllib.parse.urlunsplit(parts._replace(path=path))


def _is_html(answer: bytes, kind: str) -> bool:
    return "html" in kind.lower() or answer.lstrip()[:15].lower().startswith(
        (b"<!doctype", b"<html"))


def _detail(answer: bytes, kind: str) -> str:
    """What a refusal said, short: an HTML page is named, not quoted."""
    if _is_html(answer, kind):
        return "an HTML page"
    text = " ".join(answer.decode("utf-8", "replace").split())
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL - 1] + "…"


def _check_answer(where: str, answer: bytes, kind: str) -> None:
    """A 2xx is an acceptance when its answer is an OTLP response (or empty); an HTML
    page (a web app's catch-all route, a proxy's login page) means the spans went
    somewhere that is not a trace receiver."""
    if _is_html(answer, kind):
        raise RunLogError(f"{where}: the server answered with an HTML page, not an OTLP "
                          "response: is this its OTLP/HTTP traces URL? (Phoenix: "
                          "http://localhost:6006/v1/traces)")
    if not answer:
        return
    response = ExportTraceServiceResponse()
    try:
        if "protobuf" in kind:
            response.ParseFromString(answer)
        elif "json" in kind:
            json_format.Parse(answer, response, ignore_unknown_fields=True)
        else:
            return
    except Exception:  # noqa: BLE001 - an unreadable answer to a 2xx is still an acceptance
        return
    rejected = response.partial_success.rejected_spans
    if rejected:
        message = response.partial_success.error_message or "no reason given"
        raise RunLogError(f"{where}: the receiver rejected {rejected} spans "
                          f"({_detail(message.encode(), '')})")


# --- OTLP/JSON ---------------------------------------------------------------------------


def otel_lines(tables: dict[str, list[dict[str, Any]]], project: str | None = None,
               content: bool = True) -> list[dict[str, Any]]:
    """The batches as OTLP/JSON `TracesData` objects (ids as hex, enums as numbers)."""
    lines = []
    for batch in trace_batches(tables, project, content):
        line = json_format.MessageToDict(TracesData(resource_spans=[batch]),
                                         use_integers_for_enums=True)
        for resource in line["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:  # protobuf's JSON writes bytes as base64
                            span[key] = base64.b64decode(span[key]).hex()
        lines.append(line)
    return lines
