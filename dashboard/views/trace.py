"""The header of an example's trace (Examples → Trace): its calls, wall time and tokens."""

from __future__ import annotations

import pandas as pd

from dashboard.views.text import fmt, plural


def model_ms(calls: pd.DataFrame) -> pd.Series:
    """Each call's time at the model: its latency (ask to answer) less its wait for a turn
    (`queued_ms`; engine.runlog.reader.MODEL_MS), which pages show apart."""
    waited = calls["queued_ms"].fillna(0) if "queued_ms" in calls else 0.0
    return calls["latency_ms"].fillna(0) - waited


def trace_header(calls: pd.DataFrame) -> str:
    """'13 calls · 4,210 ms from the first call's start to the last one's end · 262,745 ms
    at the model summed (calls overlap) · 1,020 ms waiting summed (for a turn, a retry or an
    identical call's reply) · 9,120 tokens': the example's wall time, and the summed times
    at the model apart, since concurrent calls overlap; the waits (the run's concurrency
    limit, the embedded model's slots, the pauses between retries, a call that shared an
    identical one's reply) where there were any."""
    ends = calls["started_at"] + calls["latency_ms"].fillna(0) / 1000
    wall_ms = (ends.max() - calls["started_at"].min()) * 1000
    summed = model_ms(calls).sum()
    overlap = " (calls overlap)" if summed > wall_ms + 0.5 else ""
    waited = calls["queued_ms"].fillna(0).sum() if "queued_ms" in calls else 0.0
    wait = (f" · {fmt(waited, ',.0f')} ms waiting summed (for a turn, a retry or an "
            "identical call's reply)"
            if round(waited) > 0 else "")
    tokens = (calls["prompt_tokens"] + calls["completion_tokens"]).sum()
    return (f"{plural(len(calls), 'call')} · {fmt(wall_ms, ',.0f')} ms from the first call's "
            f"start to the last one's end · {fmt(summed, ',.0f')} ms at the model summed"
            f"{overlap}{wait} · {fmt(tokens, ',.0f')} tokens.")
