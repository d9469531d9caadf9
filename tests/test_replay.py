"""Replaying a finished run from the cache reproduces it exactly with zero model calls."""

from __future__ import annotations

import duckdb

from engine.llm.base import LLMError
from engine.llm.scripted import ScriptedBackend
from tests.support.graphs import TWO_HINTS, arithmetic_rows, run_engine, write_graph


class Offline:
    """A backend that fails the test if it is ever called: the network is 'off'."""

    name = "scripted"  # the same backend name, so cache keys match the recorded run
    supports_schema = True  # like the scripted backend: the same (structured) requests

    def __init__(self):
        self.calls = 0

    async def complete(self, request):
        self.calls += 1
        raise LLMError("network is off")

    async def aclose(self):
        return None


def run_view(db, run_id):
    with duckdb.connect(str(db), read_only=True) as con:
        def q(sql):
            return con.execute(sql, [run_id]).fetchall()
        return {
            "steps": q("SELECT step, train_score, val_score, accepted FROM steps "
                       "WHERE run_id = ? ORDER BY step"),
            "prompts": q("SELECT node_id, version, prompt, accepted FROM prompt_versions "
                         "WHERE run_id = ? ORDER BY ALL"),
            "gradients": q("SELECT step, example_id, node_id, from_node_id, kind, content FROM "
                           "gradients WHERE run_id = ? ORDER BY ALL"),
            "updates": q("SELECT step, node_id, old_prompt, new_prompt, accepted, val_before, "
                         "val_after FROM updates WHERE run_id = ? ORDER BY ALL"),
            "outputs": q("SELECT step, split, example_id, node_id, output_text FROM node_outputs "
                         "WHERE run_id = ? ORDER BY ALL"),
        }


def test_replay_from_cache_is_exact_with_zero_calls(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    original = run_engine(graph, db, ScriptedBackend(), steps=3, test=4)
    assert original.stats.network_calls > 0
    offline = Offline()
    replay = run_engine(graph, db, offline, steps=3, test=4, cache="read")
    assert replay.status == "finished"
    assert offline.calls == 0 and replay.stats.network_calls == 0
    assert replay.stats.cache_hits == replay.stats.calls == original.stats.calls
    assert run_view(db, replay.run_id) == run_view(db, original.run_id)
    assert replay.test_score == original.test_score
    with duckdb.connect(str(db), read_only=True) as con:
        hits = con.execute("SELECT bool_and(cache_hit), count(*) FROM llm_calls WHERE run_id = ?",
                           [replay.run_id]).fetchone()
        cached = con.execute("SELECT count(*) FROM llm_cache").fetchone()[0]
    assert hits == (True, original.stats.calls)
    # identical concurrent requests were made once; read mode added nothing
    assert cached == original.stats.network_calls == original.stats.calls - \
        original.stats.cache_hits


def test_cache_off_calls_the_model_every_time(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    run_engine(graph, db, ScriptedBackend(), steps=1)
    backend = ScriptedBackend()
    again = run_engine(graph, db, backend, steps=1, cache="off")
    # nothing is read from the stored replies: the run asks the model exactly as often as
    # the same cache-off run on an empty log does; its only "hits" are identical requests
    # in flight together, sent once whatever the cache setting
    fresh_backend = ScriptedBackend()
    fresh = run_engine(graph, tmp_path / "empty.duckdb", fresh_backend, steps=1, cache="off")
    assert len(backend.requests) == again.stats.network_calls == fresh.stats.network_calls
    assert len(backend.requests) == len(fresh_backend.requests) > 0
    assert again.stats.calls == again.stats.network_calls + again.stats.cache_hits
    assert again.stats.cache_hits == fresh.stats.cache_hits
