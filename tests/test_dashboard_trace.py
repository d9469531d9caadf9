"""The header of an example's trace keeps the example's wall time apart from the summed
time its calls spent at the model, which overlap when calls run concurrently, and from the
time they waited for a turn (the run's concurrency limit, the embedded model's slots)."""

from __future__ import annotations

import pandas as pd

from dashboard.views.trace import model_ms, trace_header


def test_trace_header_shows_wall_time_and_summed_call_time_apart():
    # three calls: two at once (1.0 s and 2.0 s from t=10), one after (0.5 s from t=12.5)
    calls = pd.DataFrame({"started_at": [10.0, 10.0, 12.5], "latency_ms": [1000.0, 2000.0, 500.0],
                          "prompt_tokens": [10, 20, 30], "completion_tokens": [1, 2, 3]})
    assert trace_header(calls) == (
        "3 calls · 3,000 ms from the first call's start to the last one's end · 3,500 ms at "
        "the model summed (calls overlap) · 66 tokens.")
    one = calls.iloc[[2]]
    assert trace_header(one) == ("1 call · 500 ms from the first call's start to the last "
                                 "one's end · 500 ms at the model summed · 33 tokens.")


def test_a_calls_wait_for_a_turn_is_not_counted_as_time_at_the_model():
    # two calls asked at once, one slot: the second waits 1.0 s for the first, then takes
    # 1.0 s; its latency (ask to answer) is 2.0 s; a row logged before waits were measured
    # (NULL) counts as no wait
    calls = pd.DataFrame({"started_at": [10.0, 10.0, 13.0],
                          "latency_ms": [1000.0, 2000.0, 400.0],
                          "queued_ms": [0.0, 1000.0, None],
                          "prompt_tokens": [10, 20, 30], "completion_tokens": [1, 2, 3]})
    assert list(model_ms(calls)) == [1000.0, 1000.0, 400.0]
    assert trace_header(calls) == (
        "3 calls · 3,400 ms from the first call's start to the last one's end · 2,400 ms at "
        "the model summed · 1,000 ms waiting summed (for a turn, a retry or an identical "
        "call's reply) · 66 tokens.")
