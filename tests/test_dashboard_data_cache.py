"""dashboard.data's one caching mechanism (`@cached`): each read keeps its name, signature
and docstring, has a Streamlit cache of its own, is served from memory while the run log's
stamp holds and re-read once the engine writes."""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest
from streamlit.runtime.caching.cache_type import CacheType
from streamlit.runtime.caching.cache_utils import CachedFunc, _make_function_key

from dashboard import data
from engine.runlog import reader
from tests.support.dashboard_log import build_run_log

READS = {name: f for name, f in vars(data).items()
         if isinstance(getattr(f, "cache", None), CachedFunc)}


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    return build_run_log(tmp_path_factory.mktemp("data-cache"))


def test_every_read_has_a_cache_of_its_own():
    assert len(READS) >= 25
    keys = {_make_function_key(CacheType.DATA, f.cache._info.func) for f in READS.values()}
    assert len(keys) == len(READS)  # no two reads share (module, qualname, source)
    assert inspect.signature(data.flows) == inspect.signature(data.flows.__wrapped__)
    assert "example_id" in str(inspect.signature(data.flows))
    assert data.graph.__doc__.startswith("The run's graph as logged")
    assert data.graph.__name__ == "graph" and data.graph.__module__ == "dashboard.data"


def test_served_from_memory_until_the_log_changes(log, monkeypatch):
    db = str(log.db)
    calls = []
    step_examples = reader.step_examples
    monkeypatch.setattr(reader, "step_examples",
                        lambda *a: calls.append(a) or step_examples(*a))
    data.step_examples.cache.clear()
    first = data.step_examples(db, log.semantic, 1)
    again = data.step_examples(db, log.semantic, np.int64(1))  # one entry for both
    by_name = data.step_examples(db, run_id=log.semantic, step=1.0)
    assert calls == [(db, log.semantic, 1)] and type(calls[0][2]) is int
    pd.testing.assert_frame_equal(first, again)
    pd.testing.assert_frame_equal(first, by_name)

    import duckdb

    with duckdb.connect(db) as con:  # a write: a new stamp
        con.execute("CREATE TABLE written AS SELECT 1 AS x")
    data.step_examples(db, log.semantic, 1)
    assert len(calls) == 2


def test_defaults_and_options_make_one_entry(log, monkeypatch):
    db = str(log.db)
    seen = []
    monkeypatch.setattr(reader, "step_updates", lambda *a: seen.append(a) or pd.DataFrame())
    data.updates.cache.clear()
    data.updates(db, log.semantic)
    data.updates(db, log.semantic, None)
    data.updates(db, log.semantic, step=np.int64(1))
    assert seen == [(db, log.semantic, None), (db, log.semantic, 1)]

    rows = []
    monkeypatch.setattr(data.debug, "example_rows",
                        lambda *a, **o: rows.append((a, o)) or pd.DataFrame())
    data.example_rows.cache.clear()
    data.example_rows(db, log.semantic, 1, limit=5, split="train")
    data.example_rows(db, log.semantic, 1, split="train", limit=5)
    assert rows == [((db, log.semantic, 1), {"limit": 5, "split": "train"})]


def test_a_missing_log_is_not_read(tmp_path):
    missing = str(tmp_path / "none.duckdb")
    assert list(data.runs(missing).columns) == ["run_id", "graph_name", "method", "status"]
    assert data.test_scores(missing) == {}
    assert data.collected(missing) is data.EMPTY_COLLECTED
