"""The estimate before a run (engine/runs/estimate.py): one line before every `run`, the
breakdown by phase with `run --dry-run` (no request, no file), and figures close to the
calls the run then makes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re

import duckdb

from engine.cli import main
from engine.core.graph import load_graph
from engine.events import StepFinished
from engine.runs.call_sizes import CallSizes
from engine.runs.estimate import estimate_calls, estimate_for, node_gate_calls, prune_calls
from engine.runs.execute import RunConfig, execute, load_splits
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.graphs import TWO_HINTS, arithmetic_rows, write_graph


def test_dry_run_makes_no_request_and_writes_no_file(tmp_path, capsys, monkeypatch):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    before = sorted(os.listdir(tmp_path))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeOpenAIServer() as server:
        code = main(["run", str(graph), "--backend", "openai", "--base-url", server.base_url,
                     "--model", "gpt-4o-mini", "--steps", "2", "--train", "8", "--val", "8",
                     "--test", "4", "--db", str(tmp_path / "runs.duckdb"), "--dry-run"])
        assert code == 0
        assert server.requests == []
    assert sorted(os.listdir(tmp_path)) == before  # no run log, nothing else
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["phase", "model", "calls", "at", "most"]
    phases = [ln.split("  ")[0] for ln in lines[1:] if ln and not ln.startswith(
        ("total", "estimate", "dry run"))]
    # per-node gates are off by default: no phase for them
    assert not any("per-node gates" in p for p in phases) and "test" in phases
    estimate = [ln for ln in lines if ln.startswith("estimate: ")]
    # priced: gpt-4o-mini is in the price table
    assert len(estimate) == 1 and "$" in estimate[0] and "model calls" in estimate[0]
    assert "dry run: no model call made, no run log written" in out


def test_every_run_prints_the_estimate_line_first(tmp_path, capsys):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    code = main(["run", str(graph), "--backend", "scripted", "--steps", "1", "--train", "4",
                 "--val", "4", "--test", "0", "--db", str(tmp_path / "runs.duckdb")])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("estimate: ~")
    assert "cost" not in out.splitlines()[0] or "$0.00" in out.splitlines()[0]


def test_the_gsm8k_shape_is_estimated_within_15_percent(tmp_path):
    graph_path = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    config = RunConfig(graph=str(graph_path), backend="scripted", steps=2, train=16, val=16,
                       test=8, db=str(tmp_path / "runs.duckdb"))
    graph = load_graph(config.graph)
    estimate = estimate_for(config, graph, load_splits(config, graph))
    # pruning (an accepted candidate scored without each of its edits) is counted at the
    # share of steps accepted, which no first estimate knows; this run accepts none, so
    # its pruning makes no call: set aside, as are the repeated edits below
    pruning = next(p.expected for p in estimate.phases if "pruning" in p.name)
    expected = estimate.calls() - pruning
    result = asyncio.run(execute(config))
    actual = result.stats.calls - result.stats.cache_hits
    assert not any(s.accepted for s in result.events.of(StepFinished))
    with duckdb.connect(config.db, read_only=True) as con:
        logged = con.execute("SELECT count(*) FROM llm_calls WHERE NOT cache_hit").fetchone()[0]
        # a step whose candidate gives both hints the same prompt (the scripted optimizer
        # can, as a model can) asks one hint's validation requests once: no first estimate
        # can know that, so those calls are set aside
        same_edit = con.execute(
            "SELECT count(*) FROM updates a JOIN updates b USING (run_id, step, candidate) "
            "WHERE a.node_id = 'hint_a' AND b.node_id = 'hint_b' "
            "AND a.new_prompt = b.new_prompt").fetchone()[0]
    assert abs(expected - same_edit * config.val - actual) <= 0.15 * actual, (expected, actual)
    assert logged == actual


def test_the_estimate_counts_the_per_node_gates(tmp_path):
    graph = load_graph(write_graph(tmp_path, TWO_HINTS, arithmetic_rows()))
    changed = graph.trainable_nodes
    # each edit alone: the final node sees 3 other input sets; without the cache the old
    # hints count too (hint_b's old call beside hint_a's edit, and back): the 80 calls of the
    # GSM8K step at 16 validation examples
    assert node_gate_calls(graph, changed, cached=True) == 3
    assert node_gate_calls(graph, changed, cached=False) == 5

    def gates(mode: str) -> tuple[int, int]:
        config = RunConfig(graph="", steps=4, node_gates=mode)
        # half the steps accepted: auto scores edits alone after the other half
        est = estimate_calls(graph, config, 20, 16, 0, sizes=CallSizes(accepted_share=0.5))
        phase = [p for p in est.phases if "per-node gates" in p.name]
        return (phase[0].expected, phase[0].upper) if phase else (0, 0)

    assert gates("on") == (4 * 16 * 3, 4 * 16 * 5)
    assert gates("auto") == (2 * 16 * 3, 4 * 16 * 5)  # auto: after a rejection only
    assert gates("off") == (0, 0)


def never_right(request) -> str | None:
    """The output node never gives the answer: validation stays 0, every step is rejected.
    Each update request gets an edit of its own (a digest of the request, where the
    scripted model draws among eight), so two steps' candidates repeat each other's
    requests only when their update requests were the same, as a model's would: the count
    is the method's, not the draws' (whatever the templates' wording)."""
    if request.purpose == "forward" and request.meta.get("output_node"):
        return "<output>none</output>"
    if request.purpose == "update":
        digest = hashlib.sha256(request.user_text.encode()).hexdigest()[:8]
        return f"<prompt>{request.meta['prompt']} Check {digest}.</prompt>"
    return None


def model_calls(result) -> int:
    return result.stats.calls - result.stats.cache_hits


def always_right(request) -> str | None:
    """The output node adds the question's two numbers: no example fails."""
    if request.purpose == "forward" and request.meta.get("output_node"):
        found = re.search(r"Tom has (\d+) apples and buys (\d+) more", request.user_text)
        return f"<output>{int(found[1]) + int(found[2])}</output>"
    return None


def test_the_estimate_brackets_the_runs_outcomes(tmp_path):
    from dataclasses import replace

    from engine.llm.scripted import ScriptedBackend
    from tests.support.graphs import DIAMOND

    # no two nodes alike: no two candidates' requests coincide by chance
    graph_path = write_graph(tmp_path, DIAMOND, arithmetic_rows())
    base = dict(graph=str(graph_path), backend="scripted", steps=3, train=8, val=8, test=8)
    graph = load_graph(str(graph_path))
    config = RunConfig(**base, db=str(tmp_path / "estimate.duckdb"))
    estimate = estimate_for(config, graph, load_splits(config, graph))
    (low, high), _ = estimate.by_outcome
    assert low < estimate.calls() < high
    assert f"{low:,} to {high:,} calls" in estimate.line()

    def made(name: str, responder=None, **settings) -> int:
        run = RunConfig(**base, **settings, db=str(tmp_path / f"{name}.duckdb"))
        backend = ScriptedBackend(responder=responder) if responder else None
        return model_calls(asyncio.run(execute(run, forward_backend=backend)))

    # the dearest outcome: every step accepted (the gate off), and with the gate on the
    # pruning of every step's kept candidate (each of the 4 edits left out in turn: the
    # final node's 4 requests per validation example are new, the roots' old ones cached)
    accepted = made("every", gate=False)
    assert prune_calls(graph, graph.trainable_nodes, cached=True) == 4
    assert high == estimate_for(replace(config, gate=False), graph, load_splits(
        config, graph)).by_outcome[0][1] + 3 * 8 * 4
    high -= 3 * 8 * 4
    assert abs(high - accepted) <= 0.05 * accepted, (high, accepted)
    # the cheapest: no training example fails, so no step has anything to change
    solved = made("solved", always_right)
    assert abs(low - solved) <= 0.05 * solved, (low, solved)
    # between them, every step rejected: the estimate with no step accepted
    rejected = made("none", never_right)
    none_accepted = estimate_calls(graph, config, 8, 8, 8, sizes=replace(
        estimate.sizes, accepted_share=0.0)).calls()
    assert low < rejected < high
    assert abs(none_accepted - rejected) <= 0.05 * rejected, (none_accepted, rejected)


def test_a_rejected_step_that_samples_the_same_failures_again_is_answered_by_the_cache(
        tmp_path):
    from engine.llm.scripted import ScriptedBackend

    # two training examples, both failing, two sampled a step: every step back-propagates
    # the same two, under the same prompts while every step is rejected
    graph_path = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    config = RunConfig(graph=str(graph_path), backend="scripted", steps=3, train=2, val=4,
                       test=0, db=str(tmp_path / "runs.duckdb"))
    graph = load_graph(config.graph)
    estimate = estimate_calls(graph, config, 2, 4, 0, sizes=CallSizes(accepted_share=0.0))
    backward = {p.name: p.expected for p in estimate.phases}["steps 1-3: backward"]
    asyncio.run(execute(config, forward_backend=ScriptedBackend(responder=never_right)))
    with duckdb.connect(config.db, read_only=True) as con:
        made = con.execute("SELECT count(*) FROM llm_calls WHERE purpose = 'backward' AND "
                           "NOT cache_hit").fetchone()[0]
    assert made == backward == 2  # step 1's two; steps 2 and 3 repeat them
