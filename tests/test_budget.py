"""The budget (--max-calls / --max-cost): a run stops before the model call that would
exceed it, ends with status 'budget' and a one-line reason, keeps what it wrote, and a
resume with a larger budget ends exactly where an unbudgeted run ends."""

from __future__ import annotations

import asyncio

import duckdb
import pytest

from engine.cli import main
from engine.llm.base import LLMRequest
from engine.llm.budget import Budget, BudgetExhausted
from engine.llm.scripted import ScriptedBackend
from engine.runs.execute import RunConfig, execute, resume
from tests.support.graphs import TWO_HINTS, arithmetic_rows, write_graph


class Counting(ScriptedBackend):
    """The scripted backend, counting the requests that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.made = 0

    async def complete(self, request: LLMRequest):
        self.made += 1
        return await super().complete(request)


def start(graph, db, backend, **options):
    config = RunConfig(graph=str(graph), db=str(db), backend="scripted", steps=2, train=6,
                       val=6, test=4, **options)
    return asyncio.run(execute(config, forward_backend=backend))


def outcome(db, run_id):
    with duckdb.connect(str(db), read_only=True) as con:
        steps = con.execute("SELECT step, train_score, val_score, accepted FROM steps "
                            "WHERE run_id = ? ORDER BY step", [run_id]).fetchall()
        prompts = con.execute("SELECT node_id, version, prompt, accepted FROM prompt_versions "
                              "WHERE run_id = ? ORDER BY node_id, version", [run_id]).fetchall()
        test = con.execute("SELECT value FROM metrics WHERE run_id = ? AND key = 'test_score'",
                           [run_id]).fetchall()
        status = con.execute("SELECT status, error FROM runs WHERE run_id = ?",
                             [run_id]).fetchone()
    return steps, prompts, test, status


def test_half_the_calls_stops_and_a_resume_ends_where_an_unbudgeted_run_ends(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    full_backend = Counting()
    full = start(graph, tmp_path / "full.duckdb", full_backend, run_id="r")
    needed = full_backend.made
    assert full.status == "finished" and needed > 20

    db, half = tmp_path / "budget.duckdb", needed // 2
    backend = Counting()
    stopped = start(graph, db, backend, run_id="r", max_calls=half)
    assert stopped.status == "budget"
    assert backend.made <= half
    assert stopped.reason.startswith(f"budget: --max-calls {half} reached")
    steps, _, _, status = outcome(db, "r")
    assert status == ("budget", stopped.reason)
    assert steps and len(steps) < 3  # whole steps only, and not all of them

    more = Counting()
    resumed = asyncio.run(resume(str(db), "r", forward_backend=more, max_calls=needed))
    assert resumed.status == "finished"
    # the calls made before the stop are answered from the cache: not paid for twice
    assert backend.made + more.made == needed
    full_steps, full_prompts, full_test, _ = outcome(tmp_path / "full.duckdb", "r")
    assert outcome(db, "r")[:3] == (full_steps, full_prompts, full_test)


def test_the_command_line_says_why_in_one_line(tmp_path, capsys):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    code = main(["run", str(graph), "--backend", "scripted", "--steps", "1", "--train", "4",
                 "--val", "4", "--test", "0", "--db", str(db), "--run-id", "r",
                 "--max-calls", "10"])
    assert code == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "--max-calls 10" in ln]
    assert lines == ["stopped: budget: --max-calls 10 reached (10 model calls made); resume "
                     "with a larger budget to continue"]
    assert main(["resume", "r", "--db", str(db), "--max-calls", "500"]) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchone()[0] == "finished"


def test_bad_budget_is_one_error_line(tmp_path, capsys):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(graph), "--backend", "scripted", "--max-cost", "-1"])
    assert exit_info.value.code == 2
    assert "--max-cost: must not be negative" in capsys.readouterr().err


def test_cost_budget_reserves_the_worst_case_of_calls_in_flight():
    prices = {"m": (1_000_000.0, 1_000_000.0)}  # a dollar a token
    request = LLMRequest(messages=(("user", "x" * 40),), model="m", purpose="forward",
                         max_tokens=5)  # 10 prompt tokens + 5 at most: 15 dollars
    budget = Budget(max_cost=40.0)
    first, second = budget.admit(request, prices), budget.admit(request, prices)
    assert (first, second) == (15.0, 15.0)
    with pytest.raises(BudgetExhausted, match="--max-cost 40 USD"):
        budget.admit(request, prices)  # 45 could be spent with three in flight
    budget.settle(first, 12.0)
    with pytest.raises(BudgetExhausted):  # once exhausted, it stays so
        budget.admit(request, prices)
    assert budget.calls == 2 and budget.spent == 12.0


def test_an_experiment_budget_holds_across_its_runs(tmp_path):
    from tests.test_experiment import DATA, experiment, runs_in, smoke_args

    if not (DATA / "bbh").is_dir():
        pytest.skip(f"benchmark data not found at {DATA}")
    db = tmp_path / "runs.duckdb"
    code, stdout, stderr = experiment(*smoke_args(db, tmp_path / "out", "--yes",
                                                  "--max-calls", "30"))
    assert code == 1
    with duckdb.connect(str(db), read_only=True) as con:
        # one budget for the whole plan: at most 30 model calls in all its runs
        made = con.execute("SELECT count(*) FROM llm_cache").fetchone()[0]
    assert made <= 30
    statuses = [status for _, status, _ in runs_in(db)]
    assert "budget" in statuses and "budget: --max-calls 30 reached" in stdout + stderr


def test_engine_optimize_takes_the_budget(tmp_path):
    from engine import Graph, optimize

    g = Graph(name="api-budget", input_fields=["question"], target_field="answer",
              metric="numeric")
    g.llm("final", prompt="Solve the problem.", inputs=["question"], output=True)
    rows = arithmetic_rows(8)
    backend = Counting()
    result = optimize(g, train=rows[:4], val=rows[4:], backend=backend, steps=2,
                      db=tmp_path / "runs.duckdb", max_calls=6)
    assert result.status == "budget" and backend.made <= 6
