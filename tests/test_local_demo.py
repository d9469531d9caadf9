"""The demo graph end to end on the small embedded model, SmolLM2-135M (about a minute on
two cores; the default model, Qwen2.5-Coder-0.5B, takes minutes: test_default_model.py).

SmolLM2-135M ignores the requested reply formats, so this is the proof that a whole run
degrades gracefully: every phase completes, nothing is dropped, every fallback is recorded.
The demo's scores are printed by benchmarks/demo_local.py, not asserted here.
"""

from __future__ import annotations

import asyncio

import duckdb
import pytest

from engine.runs.execute import RunConfig, execute
from tests.support.graphs import REPO

pytestmark = [pytest.mark.embedded_model, pytest.mark.slow]


def test_demo_graph_runs_end_to_end_on_the_embedded_model(tmp_path):
    db = tmp_path / "runs.duckdb"
    config = RunConfig(graph=str(REPO / "sample_graphs" / "demo.yaml"), backend="local",
                       model="smollm2-135m", steps=1, test=0, db=str(db))
    result = asyncio.run(execute(config))
    assert result.status == "finished"
    assert result.stats.failures == 0
    with duckdb.connect(str(db), read_only=True) as con:
        def one(sql):
            return con.execute(sql).fetchone()

        assert one("SELECT model, backend FROM runs") == ("smollm2-135m", "local")
        # 8 train + 24 validation examples x 3 nodes at step 0
        assert one("SELECT count(*) FROM node_outputs WHERE step = 0") == (96,)
        assert one("SELECT count(*) FROM node_outputs WHERE output_text = ''") == (0,)
        # the failing examples sampled at step 1 were back-propagated to every node
        sampled = one("SELECT count(DISTINCT example_id) FROM gradients WHERE step = 1")[0]
        assert sampled >= 1
        assert one("SELECT count(DISTINCT node_id) FROM gradients WHERE step = 1 AND kind = "
                   "'gradient'") == (3,)
        # every trainable node got a proposal with a non-empty prompt, unless all its
        # gradients claimed no change (--update-when asked): then the step counts it skipped
        proposals, nonempty = one("SELECT count(*), coalesce(min(length(new_prompt)) > 0, true) "
                                  "FROM updates")
        skipped = one("SELECT value FROM metrics WHERE key = 'updates_skipped'")[0]
        assert nonempty
        assert proposals + skipped == 3
        asked = one("SELECT count(DISTINCT node_id) FROM gradients WHERE step = 1 AND kind = "
                    "'gradient' AND asks_change IS NOT false AND content <> ''")[0]
        assert proposals == asked
        # the model's format slips were parsed by fallback rules and recorded, not dropped
        slips = one("SELECT count(*) FROM node_outputs WHERE parse_error IS NOT NULL")[0]
        kept = one("SELECT count(*) FROM node_outputs WHERE parse_error IS NOT NULL AND "
                   "output_text <> ''")[0]
        assert slips == kept
