"""Where the example pipelines send their spans (the four `*_pipeline.py` scripts beside
this file): OTLP JSON lines in a file, one ExportTraceServiceRequest a line with ids in hex
(the OpenTelemetry Collector's file exporter's format, which `import-traces FILE` reads),
or, with no file, the standard OTLP/HTTP exporter at OTEL_EXPORTER_OTLP_ENDPOINT (which
`python -m engine collect` receives)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
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
