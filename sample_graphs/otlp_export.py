"""Where the example pipelines send their spans (the four `*_pipeline.py` scripts beside
this file): OTLP JSON lines in a file, one ExportTraceServiceRequest a line with ids in hex
(the OpenTelemetry Collector's file exporter's format, which `import-traces FILE` reads),
or, with no file, the standard OTLP/HTTP exporter at OTEL_EXPORTER_OTLP_ENDPOINT (which
`python -m engine collect` receives)."""

from __future__ import annotations

import argparse
import base64
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)


class OTLPJsonLinesExporter(SpanExporter):
    """Spans as OTLP JSON lines, ids in hex, as the Collector's file exporter writes them."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = json_format.MessageToDict(encode_spans(spans))
        for resource in line.get("resourceSpans", []):
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if span.get(key):  # protobuf's JSON writes bytes as base64
                            span[key] = base64.b64decode(span[key]).hex()
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def tracer_provider(out: str | Path | None, service: str) -> TracerProvider:
    """Spans to the file `out`, or (out None) to OTEL_EXPORTER_OTLP_ENDPOINT over OTLP/HTTP."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if out is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(OTLPJsonLinesExporter(out)))
    return provider


def command_line(doc: str, run: Callable[..., list[str]], expected: str) -> None:
    """The example pipelines' command line: `--base-url URL [--model NAME] [--out FILE]
    [--targets FILE] [--limit N]`. With no --out the spans go to OTEL_EXPORTER_OTLP_ENDPOINT
    when that is set, else to traces.jsonl; `expected` names what --targets holds."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="an OpenAI-compatible server")
    parser.add_argument("--model", default="local", help="the model name to ask for")
    parser.add_argument("--out", help="the OTLP JSON lines file (default: traces.jsonl, or "
                                      "OTEL_EXPORTER_OTLP_ENDPOINT when that is set)")
    parser.add_argument("--targets", help=f"{expected} (default: targets.jsonl beside "
                                          "--out)")
    parser.add_argument("--limit", type=int, default=12, help="inputs to run")
    args = parser.parse_args()
    out = args.out
    if out is None and not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        out = "traces.jsonl"
    targets = args.targets or Path(out or "traces.jsonl").with_name("targets.jsonl")
    for answer in run(args.base_url, args.model, out, args.limit, targets):
        print(answer)
