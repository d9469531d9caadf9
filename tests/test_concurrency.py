"""One optimization step against the fake OpenAI-compatible server overlaps its calls as
far as dependencies allow. The benchmark (benchmarks/critical_path.py) prints the exact
ratio; this test only guards against losing the overlap (e.g. calls made one by one)."""

from __future__ import annotations

import sys

from tests.conftest import REPO


def test_a_step_is_close_to_its_dependency_bound():
    sys.path.insert(0, str(REPO))
    from benchmarks.critical_path import ROUNDS, measure

    latency = 0.1
    wall, ratio, requests = measure(latency, concurrency=64)
    assert requests == 197  # step 0, step 1 and nothing else reached the server
    # 50 calls in step 1: made one after another they would take 50 x latency = 25 rounds
    assert ratio < 2.5, f"step 1 took {wall:.2f} s for {ROUNDS} dependent rounds"
