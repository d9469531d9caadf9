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



def test_a_calls_wait_for_a_turn_is_logged_apart_from_its_time_at_the_model(tmp_path):
    """With one call at a time, the calls asked together queue behind one another: each
    logs that wait in `queued_ms`, and what the pages call its latency (its time at the
    model, `latency_ms - queued_ms`) is the backend's own time only."""
    from engine.runlog.reader import token_totals
    from engine.runlog.schema import connect

    graph = write_graph(tmp_path, DIAMOND, arithmetic_rows())
    db = tmp_path / "r.duckdb"
    # step 0: the three root nodes on 2 + 2 examples, asked at once, answered one by one
    result = run_engine(graph, db, ScriptedBackend(latency=0.2), steps=0, train=2, val=2,
                        concurrency=1)
    with connect(db, read_only=True) as con:
        rows = con.execute("SELECT latency_ms, queued_ms FROM llm_calls WHERE node_id <> "
                           "'final' ORDER BY queued_ms").fetchall()
    assert len(rows) == 12
    waits = [queued for _, queued in rows]
    at_model = [latency - queued for latency, queued in rows]
    # the k-th call answered waited for the k-1 before it, 0.2 s each at least, and then
    # took the backend's 0.2 s itself
    assert all(w >= 200 * k - 20 for k, w in enumerate(waits))
    assert all(m >= 190 for m in at_model)
    # the last one waited over 2 s; counted as the model's time, it would read 2.4 s
    assert at_model[-1] < waits[-1] / 2
    # the Curves table's mean latency is the time at the model; the wait has its column
    totals = token_totals(str(db), result.run_id).set_index("node_id")
    root = totals.loc[["a", "b", "c"]]
    assert (root["mean_latency_ms"] < root["mean_wait_ms"]).all()
    assert abs(root["mean_latency_ms"].mean() - sum(at_model) / len(at_model)) < 1


def test_the_demo_benchmark_counts_calls_at_the_model_at_once_without_their_waits():
    """benchmarks/demo_local.py's measure of how well a run used the server's slots: two
    calls decoded together for 1 s, then one that waited 1 s for a turn and took 1 s."""
    from types import SimpleNamespace

    from benchmarks.demo_local import decoded_together
    from engine.events import CallRecord

    def call(start, latency_ms, queued_ms, purpose="forward", hit=False):
        return CallRecord("id", "r", 1, "e", "n", purpose, "local", "m", "[]", "",
                          latency_ms=latency_ms, queued_ms=queued_ms, started_at=start,
                          cache_hit=hit)

    calls = [call(10.0, 1000, 0), call(10.0, 1000, 0), call(10.0, 2000, 1000),
             call(10.0, 9000, 0, purpose="update"), call(10.0, 5000, 0, hit=True)]
    result = SimpleNamespace(events=SimpleNamespace(of=lambda kind: calls))
    assert decoded_together(result, ("forward",)) == (
        "3 calls, 3.0 s at the model summed over 2.0 s of wall with one or more at it "
        "(1.50 at the model at once on average); 1.0 s waiting for a turn summed")
