"""The header of an example's trace (Examples → Trace): its calls, wall time and tokens."""

from __future__ import annotations

import pandas as pd

from dashboard.views.text import fmt, plural


def trace_header(calls: pd.DataFrame) -> str:
    """'13 calls · 4,210 ms from the first call's start to the last one's end · 262,745 ms
    of call time summed (calls overlap) · 9,120 tokens': the example's wall time and the
    summed latencies apart, since concurrent calls overlap."""
    ends = calls["started_at"] + calls["latency_ms"].fillna(0) / 1000
    wall_ms = (ends.max() - calls["started_at"].min()) * 1000
    summed = calls["latency_ms"].sum()
    overlap = " (calls overlap)" if summed > wall_ms + 0.5 else ""
    tokens = (calls["prompt_tokens"] + calls["completion_tokens"]).sum()
    return (f"{plural(len(calls), 'call')} · {fmt(wall_ms, ',.0f')} ms from the first call's "
            f"start to the last one's end · {fmt(summed, ',.0f')} ms of call time summed"
            f"{overlap} · {fmt(tokens, ',.0f')} tokens.")
