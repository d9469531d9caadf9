"""What the Traces page shows of the spans `engine collect` received: per service and per
trace, counted once here from the run log's rows (engine.runlog.collected.collected_heads),
so the page's summary line and its tables never disagree. No Streamlit here."""

from __future__ import annotations

from dataclasses import dataclass

from engine.traces.infer import root_input
from engine.traces.otlp import Span, is_llm_span


@dataclass(frozen=True)
class ServiceRow:
    service: str  # OTLP's service.name ("" when the exporter named none)
    traces: int  # traces with a span of this service
    spans: int
    llm_calls: int
    last_received: float  # seconds since the epoch


@dataclass(frozen=True)
class TraceRow:
    trace_id: str  # 32 hex digits, whole
    service: str  # its root span's service (else its first span's)
    spans: int
    llm_calls: int
    root_input: str | None
    first_received: float
    last_received: float


@dataclass(frozen=True)
class Collected:
    services: tuple[ServiceRow, ...]  # the most recently heard from first
    traces: tuple[TraceRow, ...]  # newest first (by their first span's arrival)

    @property
    def spans(self) -> int:
        return sum(t.spans for t in self.traces)

    @property
    def llm_calls(self) -> int:
        return sum(t.llm_calls for t in self.traces)

    def line(self) -> str:
        """'12 traces · 48 spans · 36 LLM calls from 1 service'."""
        if not self.traces:
            return "no spans received yet"
        return (f"{plural(len(self.traces), 'trace')} · {plural(self.spans, 'span')} · "
                f"{plural(self.llm_calls, 'LLM call')} from "
                f"{plural(len(self.services), 'service')}")


EMPTY = Collected((), ())


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def collected_overview(rows: list[tuple]) -> Collected:
    """Services and traces of the collected spans, from rows in
    engine.runlog.collected.HEAD's order (service, trace_id, span_id, parent_id,
    received_at, kind, operation, semback_run, input), oldest first."""
    services: dict[str, dict] = {}
    traces: dict[str, dict] = {}
    for service, trace_id, span_id, parent_id, received, kind, operation, own, value in rows:
        arrival = len(traces)
        service = service or ""
        attributes = {k: v for k, v in (("openinference.span.kind", kind),
                                         ("gen_ai.operation.name", operation),
                                         ("input.value", value)) if v is not None}
        if own:
            attributes["semback.run_id"] = True
        span = Span(trace_id, span_id, parent_id or "", "", 0, 0, attributes)
        llm = int(is_llm_span(span))
        received = float(received or 0.0)
        s = services.setdefault(service, {"traces": set(), "spans": 0, "llm": 0, "last": 0.0})
        s["traces"].add(trace_id)
        s["spans"] += 1
        s["llm"] += llm
        s["last"] = max(s["last"], received)
        t = traces.setdefault(trace_id, {"service": service, "spans": 0, "llm": 0,
                                         "input": None, "first": received, "last": received,
                                         "order": arrival})
        t["spans"] += 1
        t["llm"] += llm
        t["first"], t["last"] = min(t["first"], received), max(t["last"], received)
        if not span.parent_id:
            t["service"] = service
            t["input"] = root_input(span) or t["input"]
    return Collected(
        tuple(sorted((ServiceRow(name, len(s["traces"]), s["spans"], s["llm"], s["last"])
                      for name, s in services.items()),
                     key=lambda r: (-r.last_received, r.service))),
        tuple(TraceRow(tid, t["service"], t["spans"], t["llm"], t["input"], t["first"],
                       t["last"])
              for tid, t in sorted(traces.items(),
                                   key=lambda item: (-item[1]["first"], -item[1]["order"]))))


def ago(seconds: float) -> str:
    """'just now', '12 s ago', '3 min ago', '2 h ago'."""
    seconds = max(0.0, seconds)
    if seconds < 2:
        return "just now"
    if seconds < 120:
        return f"{int(seconds)} s ago"
    if seconds < 7200:
        return f"{int(seconds // 60)} min ago"
    return f"{int(seconds // 3600)} h ago"
