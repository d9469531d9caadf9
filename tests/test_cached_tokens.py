"""Prompt tokens served from the provider's prefix cache: recorded per call in
llm_calls.cached_tokens (usage.prompt_tokens_details.cached_tokens) and priced at the
model's cached price where one is known; a version-2 run log gains the column in place."""

from __future__ import annotations

import asyncio

import duckdb
import pytest

from engine.llm.pricing import DEFAULT_PRICES, cost_usd
from engine.runlog.schema import SCHEMA_VERSION
from engine.runlog.writer import open_for_writing
from engine.runs.execute import RunConfig, execute
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.graphs import TWO_HINTS, arithmetic_rows, write_graph
from tests.support.runlog import log_at_version


def test_cached_prompt_tokens_are_recorded_and_priced_at_the_cached_price(tmp_path,
                                                                         monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    with FakeOpenAIServer(prefix_cache=True) as server:
        config = RunConfig(graph=str(graph), backend="openai", base_url=server.base_url,
                           model="gpt-4o-mini", steps=1, train=4, val=4, test=0,
                           cache="off", db=str(db))
        asyncio.run(execute(config))
        reported = [r for r in server.requests]
    assert reported
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT prompt_tokens, completion_tokens, cached_tokens, cost_usd "
                           "FROM llm_calls WHERE NOT cache_hit").fetchall()
        shared = con.execute("SELECT count(*), sum(cost_usd) FROM llm_calls WHERE cache_hit"
                             ).fetchone()
    # every request the server saw is one model-answered row; identical requests in flight
    # together (the hint calls, even with the cache off) were sent once and the others
    # logged as free cache hits
    assert len(rows) == len(reported)
    assert shared[0] > 0 and shared[1] == 0
    cached = [r for r in rows if r[2] > 0]
    assert cached, "the shared system prompt should be served from the prefix cache"
    per_in, per_out, per_cached = DEFAULT_PRICES["gpt-4o-mini"]
    for prompt, completion, hit, cost in rows:
        assert 0 <= hit <= prompt
        assert cost == pytest.approx(((prompt - hit) * per_in + hit * per_cached
                                      + completion * per_out) / 1e6)
    # cheaper than the same tokens at the full input price
    full = sum(cost_usd({"m": (per_in, per_out)}, "m", p, c) for p, c, _, _ in rows)
    assert sum(r[3] for r in rows) < full


def test_without_a_cached_price_cached_tokens_cost_the_input_price():
    assert cost_usd({"m": (2.0, 4.0)}, "m", 100, 10, 60) == pytest.approx(
        (100 * 2.0 + 10 * 4.0) / 1e6)
    assert cost_usd({"m": (2.0, 4.0, 0.5)}, "m", 100, 10, 60) == pytest.approx(
        (40 * 2.0 + 60 * 0.5 + 10 * 4.0) / 1e6)


def test_a_version_2_log_gains_the_column_in_place(tmp_path):
    db = tmp_path / "v2.duckdb"
    log_at_version(db, 2, "llm_calls", ", cached_tokens INTEGER",
                   ("llm_calls", {"call_id": "c1", "run_id": "r"}))
    open_for_writing(db)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == \
            SCHEMA_VERSION == 9
        assert con.execute("SELECT call_id, cached_tokens FROM llm_calls").fetchall() == \
            [("c1", None)]
