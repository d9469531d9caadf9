"""One optimization step overlaps its calls as far as dependencies allow.

Timing lives in benchmarks/critical_path.py (it prints the wall time against the
dependency bound). These tests assert counts and ordering only: how many requests reach
the server, and that independent calls are in flight together."""

from __future__ import annotations

import asyncio

from engine.llm.scripted import ScriptedBackend
from tests.support.graphs import DIAMOND, arithmetic_rows, run_engine, write_graph


def test_a_step_makes_exactly_its_calls(tmp_path):
    graph = write_graph(tmp_path, DIAMOND, arithmetic_rows())
    backend = ScriptedBackend()
    run_engine(graph, tmp_path / "r.duckdb", backend, steps=1, train=8, val=8, cache="off",
               failures_per_step=2, node_gates="off")
    purposes = [r.purpose for r in backend.requests if not r.meta["role"].endswith("_repair")]
    # step 0: 4 nodes x 16 examples; step 1: 4 x 8 train, one joint backward call per
    # sampled example (only 'final' has node inputs), 4 updates, 4 x 8 for the candidate
    assert purposes.count("forward") == 64 + 32 + 32
    assert purposes.count("backward") == 2
    assert purposes.count("update") == 4


class Rendezvous(ScriptedBackend):
    """Holds the first `expected` forward calls until all of them are in flight at once
    (or a generous timeout passes, which only a lost overlap would need)."""

    def __init__(self, expected: int, **kwargs):
        super().__init__(**kwargs)
        self.expected, self.in_flight, self.max_in_flight = expected, 0, 0
        self.arrived = 0
        self.all_in = asyncio.Event()
        self.timed_out = False

    async def complete(self, request):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if request.purpose == "forward" and self.arrived < self.expected:
                self.arrived += 1
                if self.arrived == self.expected:
                    self.all_in.set()
                try:
                    await asyncio.wait_for(self.all_in.wait(), timeout=20)
                except TimeoutError:
                    self.timed_out = True
            return await super().complete(request)
        finally:
            self.in_flight -= 1


def test_independent_activations_are_in_flight_together(tmp_path):
    graph = write_graph(tmp_path, DIAMOND, arithmetic_rows())
    # step 0 evaluates train and validation together: 3 root nodes x 16 examples
    backend = Rendezvous(expected=48)
    result = run_engine(graph, tmp_path / "r.duckdb", backend, steps=0, train=8, val=8,
                        concurrency=64)
    assert result.status == "finished"
    assert not backend.timed_out and backend.max_in_flight == 48


def test_the_concurrency_limit_bounds_what_is_in_flight(tmp_path):
    graph = write_graph(tmp_path, DIAMOND, arithmetic_rows())
    backend = Rendezvous(expected=0)
    run_engine(graph, tmp_path / "r.duckdb", backend, steps=0, train=8, val=8, concurrency=5)
    assert backend.max_in_flight <= 5
