"""Bring your own traces: OpenTelemetry spans of a pipeline the user already runs become a
run in the run log (docs/traces.md).

`otlp.py` reads OTLP JSON lines into LLM calls; `infer.py` finds the pipeline's graph in
them (call sites, content flow, the root input); `importer.py` makes the run (the recorded
calls replayed through the client, so the log holds them as a run's step 0); `backprop.py`
runs the backward pass and proposals on it.
"""

from __future__ import annotations


class TraceError(ValueError):
    """Traces this importer cannot read or cannot make one pipeline of (bad input: one
    `error:` line, status 2, nothing written). `details` go into the error's JSON (--json),
    e.g. the ambiguous flows that left a call feeding nothing."""

    def __init__(self, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.details = details or {}
