"""The header of an example's trace keeps the example's wall time apart from the summed
latencies of its calls, which overlap when calls run concurrently."""

from __future__ import annotations

import pandas as pd

from dashboard.views.trace import trace_header


def test_trace_header_shows_wall_time_and_summed_call_time_apart():
    # three calls: two at once (1.0 s and 2.0 s from t=10), one after (0.5 s from t=12.5)
    calls = pd.DataFrame({"started_at": [10.0, 10.0, 12.5], "latency_ms": [1000.0, 2000.0, 500.0],
                          "prompt_tokens": [10, 20, 30], "completion_tokens": [1, 2, 3]})
    assert trace_header(calls) == (
        "3 calls · 3,000 ms from the first call's start to the last one's end · 3,500 ms of "
        "call time summed (calls overlap) · 66 tokens.")
    one = calls.iloc[[2]]
    assert trace_header(one) == ("1 call · 500 ms from the first call's start to the last "
                                 "one's end · 500 ms of call time summed · 33 tokens.")
