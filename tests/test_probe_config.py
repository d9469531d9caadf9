"""Probes run in exactly the run's configuration: an identity patch (every node's output
replaced by itself) changes no answer, on runs of every prompt set and structured mode."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import pytest

from engine.llm.scripted import ScriptedBackend
from engine.probes.single import probe
from engine.prompts.sets import PROMPT_SETS
from engine.runs.execute import RunConfig, execute

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("graph, prompts, structured", [
    ("blame_fault", "default", "auto"), *[("blame_fault", name, "auto")
                                          for name in PROMPT_SETS if name != "default"],
    ("diamond", "paper", "off")])
def test_identity_patch_changes_no_answer(tmp_path, graph, prompts, structured):
    db = str(tmp_path / "runs.duckdb")
    config = RunConfig(graph=str(ROOT / "sample_graphs" / f"{graph}.yaml"), db=db, steps=1,
                       train=4, val=4, test=0, run_id="r", prompts=prompts,
                       structured=structured, temperature=0.0)
    asyncio.run(execute(config, forward_backend=ScriptedBackend()))
    with duckdb.connect(db, read_only=True) as con:
        logged = con.execute(
            "SELECT o.example_id, o.node_id, o.output_text, l.prediction FROM node_outputs o "
            "JOIN losses l USING (run_id, step, split, example_id) WHERE o.step = 1 AND "
            "o.split = 'train' AND o.error IS NULL ORDER BY 1, 2").fetchall()
    assert logged
    for example, node, output, prediction in logged:
        [result] = asyncio.run(probe(db, "r", 1, node, "output", example=example,
                                     text=output, forward_backend=ScriptedBackend()))
        assert result.error is None
        assert (result.before_output, result.after_output) == (prediction, prediction), \
            (example, node)
        assert result.after_score == result.before_score


def test_only_descendants_rerun_and_upstream_comes_from_the_log(tmp_path):
    """On the diamond, 'sum' has one descendant ('compare'); 'difference' and 'larger' come
    later in topological order but do not depend on it, and nothing upstream is re-run."""
    db = str(tmp_path / "runs.duckdb")
    asyncio.run(execute(RunConfig(graph=str(ROOT / "sample_graphs" / "diamond.yaml"), db=db,
                                  steps=1, train=4, val=4, test=0, run_id="d"),
                        forward_backend=ScriptedBackend()))
    with duckdb.connect(db, read_only=True) as con:
        example = con.execute("SELECT example_id FROM node_outputs WHERE step = 1 AND split = "
                              "'train' ORDER BY 1 LIMIT 1").fetchone()[0]
    backend = ScriptedBackend()
    [result] = asyncio.run(probe(db, "d", 1, "sum", "output", example=example, text="99",
                                 forward_backend=backend))
    assert [r.meta["node"] for r in backend.requests if r.purpose == "forward"] == ["compare"]
    assert [o.node_id for o in result.outputs] == ["sum", "compare"]
    with duckdb.connect(db, read_only=True) as con:  # cache hits count: nothing else ran
        assert con.execute("SELECT node_id FROM llm_calls WHERE purpose = 'probe'"
                           ).fetchall() == [("compare",)]
    backend = ScriptedBackend()
    asyncio.run(probe(db, "d", 1, "compare", "output", example=example, text="Yes",
                      forward_backend=backend))
    assert not [r for r in backend.requests if r.purpose == "forward"]


def test_an_edit_prompt_that_carries_the_answer_is_a_leak(tmp_path):
    db = str(tmp_path / "runs.duckdb")
    asyncio.run(execute(RunConfig(graph=str(ROOT / "sample_graphs" / "blame_fault.yaml"), db=db,
                                  steps=1, test=0, run_id="bf", failures_per_step=3),
                        forward_backend=ScriptedBackend()))
    with duckdb.connect(db, read_only=True) as con:
        example, target = con.execute("SELECT example_id, target FROM examples WHERE split = "
                                      "'train' ORDER BY position LIMIT 1").fetchone()
    words = {"18": "eighteen"}.get(target, f"{int(target):,}")
    [result] = asyncio.run(probe(db, "bf", 1, "numbers", "edit", examples=example,
                                 text=f"Write the numbers; they add up to {words}.",
                                 forward_backend=ScriptedBackend()))
    assert result.leaks_target
    [clean] = asyncio.run(probe(db, "bf", 1, "numbers", "edit", examples=example,
                                text="Write the numbers of the text.",
                                forward_backend=ScriptedBackend()))
    assert not clean.leaks_target
