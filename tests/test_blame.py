"""blame on the teaching graph with a planted fault (sample_graphs/blame_fault.yaml): the
probes single out the faulty node, deterministically, and say so when the gradients
pointed elsewhere."""

from __future__ import annotations

import asyncio

import duckdb

from engine.cli import main
from engine.llm.scripted import ScriptedBackend
from engine.probes.blame import blame
from engine.runs.execute import RunConfig, execute
from tests.blame_fault_script import blame_fault_responder
from tests.test_probe import GRAPH


def logged_run(tmp_path, misleading: bool = False) -> str:
    db = str(tmp_path / "runs.duckdb")
    config = RunConfig(graph=str(GRAPH), db=db, steps=1, test=0, run_id="bf",
                       failures_per_step=3)
    asyncio.run(execute(config, forward_backend=ScriptedBackend(
        responder=blame_fault_responder(misleading))))
    return db


def run_blame(db: str, misleading: bool = False, examples: str = "failing"):
    return asyncio.run(blame(db, "bf", 1, examples, forward_backend=ScriptedBackend(
        responder=blame_fault_responder(misleading))))


def table(report) -> dict[str, tuple]:
    return {r.node_id: (r.probed, r.flips, r.leaks, r.edit_flips, r.edit_probed)
            for r in report.nodes}


def test_blame_singles_out_the_planted_fault(tmp_path):
    db = logged_run(tmp_path)
    report = run_blame(db)
    assert len(report.examples) == 3
    assert table(report) == {"who": (3, 0, 0, 0, 3), "numbers": (3, 3, 0, 3, 3),
                             "total": (3, 0, 3, 0, 3)}  # total's flips copy the target
    assert report.blamed == ["numbers"] and report.by_gradients == "numbers" and report.agree
    with duckdb.connect(db, read_only=True) as con:
        kinds = con.execute("SELECT kind, count(*) FROM probes GROUP BY kind ORDER BY kind"
                            ).fetchall()
    assert kinds == [("edit", 9), ("gradient", 9)]
    again = run_blame(db)  # deterministic, and free the second time
    assert table(again) == table(report) and again.model_calls == 0


def test_probes_disagree_with_gradients_that_point_at_the_wrong_node(tmp_path):
    db = logged_run(tmp_path, misleading=True)
    report = run_blame(db, misleading=True)
    # 'who' received the longest gradient; following it fixes nothing
    assert report.by_gradients == "who"
    assert table(report)["who"][:2] == (3, 0)
    assert report.blamed == ["numbers"] and not report.agree


def test_blame_on_validation_examples_backpropagates_them_through_probes(tmp_path):
    db = logged_run(tmp_path)
    report = run_blame(db, examples="val")
    assert len(report.examples) == 8  # every validation example fails with step 1's prompts
    assert report.blamed == ["numbers"]
    assert table(report)["numbers"][:2] == (8, 8)


def test_blame_command_prints_the_table_and_the_verdict(tmp_path, capsys, monkeypatch):
    db = logged_run(tmp_path, misleading=True)
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=blame_fault_responder(True)))
    assert main(["blame", "bf", "--db", db, "--step", "1"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    numbers = next(ln for ln in lines if ln.startswith("│ numbers"))
    assert "3/3" in numbers and "<- probes" in numbers
    assert "<- gradients" in next(ln for ln in lines if ln.startswith("│ who"))
    assert "probes blame: numbers" in captured.out
    assert "gradients singled out: who" in captured.out and "a different node" in captured.out
    assert "probes 18/18 done" in captured.err  # progress, one line at a time in a log
    assert main(["blame", "bf", "--db", db, "--step", "0"]) == 2
    assert "no example was back-propagated at step 0" in capsys.readouterr().err


def test_a_method_without_gradients_probes_the_same_sampled_examples(tmp_path):
    """`--method none` logs no gradients: blame draws the optimizer's seeded sample again,
    the same examples a gradient method back-propagated, and runs edit probes only."""
    db = str(tmp_path / "runs.duckdb")
    for method in ("semantic", "none"):
        config = RunConfig(graph=str(GRAPH), db=db, steps=1, test=0, run_id=method,
                           method=method, failures_per_step=3)
        asyncio.run(execute(config, forward_backend=ScriptedBackend(
            responder=blame_fault_responder())))
    with duckdb.connect(db, read_only=True) as con:
        sampled = [r[0] for r in con.execute(
            "SELECT DISTINCT g.example_id FROM gradients g JOIN examples e USING (run_id, "
            "example_id) WHERE g.run_id = 'semantic' AND g.step = 1 ORDER BY 1").fetchall()]
    report = asyncio.run(blame(db, "none", 1, forward_backend=ScriptedBackend(
        responder=blame_fault_responder())))
    assert sorted(report.examples) == sampled and len(sampled) == 3
    assert {r.kind for r in report.results} == {"edit"}
