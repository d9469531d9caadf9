"""The budget (--max-calls / --max-cost): a run stops before the model call that would
exceed it, ends with status 'budget' and a one-line reason, keeps what it wrote, and a
resume with a larger budget ends exactly where an unbudgeted run ends."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import duckdb
import pytest

from engine.cli import main
from engine.llm.base import LLMRequest
from engine.llm.budget import Budget, BudgetExhausted
from engine.llm.scripted import ScriptedBackend
from engine.runs.execute import RunConfig, execute, resume
from tests.support.graphs import TWO_HINTS, arithmetic_rows, write_graph
from tests.support.runlog import CONTENT, rows, run_content


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


STEP_TABLES = ("llm_calls", "node_outputs", "losses", "gradients", "updates",
               "prompt_versions", "metrics")


def before_step(content: dict, last: int) -> dict:
    """A run's content (tests.support.runlog.run_content) cut to steps 0..last: what its
    log holds once those steps are written whole and no later row is (nor the test
    score, a metric of no step written after the last step)."""
    step_at = {t: cols.split(", ").index("step") for t, cols in CONTENT.items()
               if "step" in cols.split(", ")}

    def kept(table: str, row: tuple) -> bool:
        return table not in step_at or (row[step_at[table]] is not None
                                        and row[step_at[table]] <= last)

    return {t: Counter({row: n for row, n in found.items() if kept(t, row)})
            for t, found in content.items()}


def test_half_the_calls_stops_and_a_resume_ends_where_an_unbudgeted_run_ends(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    full_backend = Counting()
    full = start(graph, tmp_path / "full.duckdb", full_backend, run_id="r")
    needed = full_backend.made
    assert full.status == "finished" and needed > 20
    full_content = run_content(tmp_path / "full.duckdb", "r")

    db, half = tmp_path / "budget.duckdb", needed // 2
    backend = Counting()
    stopped = start(graph, db, backend, run_id="r", max_calls=half)
    assert stopped.status == "budget"
    assert backend.made <= half
    assert stopped.reason.startswith(f"budget: --max-calls {half} reached")
    steps, _, _, status = outcome(db, "r")
    assert status == ("budget", stopped.reason)
    assert steps and len(steps) < 3  # not all of them
    last = steps[-1][0]
    # the stop fell inside step last + 1: calls were paid for there ...
    logged = rows(db, "SELECT count(*) FROM llm_calls WHERE NOT cache_hit")[0][0]
    assert logged < backend.made
    # ... and kept in the cache only: the log holds whole steps 0..last, row for row
    # what the unbudgeted run wrote for them, and nothing of the interrupted step
    for table in STEP_TABLES:
        assert rows(db, f"SELECT count(*) FROM {table} WHERE step > ?", last)[0][0] == 0, table
    assert run_content(db, "r") == before_step(full_content, last)
    assert rows(db, "SELECT count(*) FROM llm_cache")[0][0] == backend.made

    more = Counting()
    resumed = asyncio.run(resume(str(db), "r", forward_backend=more, max_calls=needed))
    assert resumed.status == "finished"
    # the calls made before the stop are answered from the cache: not paid for twice
    assert backend.made + more.made == needed
    full_steps, full_prompts, full_test, _ = outcome(tmp_path / "full.duckdb", "r")
    assert outcome(db, "r")[:3] == (full_steps, full_prompts, full_test)
    # the interrupted step was redone whole: every row as the unbudgeted run wrote it, once
    assert run_content(db, "r") == full_content


def reject_then_accept(request: LLMRequest) -> str | None:
    """TWO_HINTS on a model that rewards hint_a's 'Refine.' sentences: hint_a writes its
    level L (how many its prompt has); the final node answers question i right when
    i % 4 < max(L, 1); hint_a's update adds one 'Refine.', two when it is shown rejected
    proposals (the other nodes keep their prompts). So step 1's edit (level 1) is
    rejected, step 2's (shown it: level 2) accepted, and step 3's is level 3 when its
    update call is shown no stale proposal."""
    text = "\n".join(c for _, c in request.messages)
    node = request.meta.get("node")
    if request.purpose == "forward":
        task = text.split("## Inputs")[0] + "".join(c for r, c in request.messages
                                                    if r == "system")
        if node == "hint_a":
            return f"<output>level {task.count('Refine.')}</output>"
        if node == "hint_b":
            return "<output>a note</output>"
        i = int(re.search(r"Tom has (\d+) apples", text).group(1))
        level = int(re.search(r"level (\d+)", text).group(1))
        return f"<output>{2 * i + 3 if i % 4 < max(level, 1) else i}</output>"
    if request.purpose == "update":
        prompt = request.meta.get("prompt", "")
        if node != "hint_a":
            return f"<prompt>{prompt}</prompt>"
        shown = "These earlier proposals" in text  # the update shows rejected proposals
        return f"<prompt>{prompt} Refine.{' Refine.' if shown else ''}</prompt>"
    return None


def test_a_resume_shows_the_update_call_only_proposals_rejected_since_the_last_edit(tmp_path):
    """A run stopped after a step that accepted hint_a's edit (a step after one that
    rejected it) and resumed sends exactly the update requests of the uninterrupted run:
    the proposal rejected for hint_a's old prompt is no longer shown as rejected."""
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    settings = dict(backend="scripted", steps=3, train=8, val=8, test=0, run_id="r",
                    failures_per_step=2)

    def run(db, steps=3, **budget):
        config = RunConfig(graph=str(graph), db=str(db), **{**settings, "steps": steps},
                           **budget)
        backend = ScriptedBackend(responder=reject_then_accept)
        return asyncio.run(execute(config, forward_backend=backend)), backend

    full, _ = run(tmp_path / "full.duckdb")
    assert full.status == "finished"
    # step 1 rejected hint_a's edit, steps 2 and 3 accepted the next ones
    assert [a for _, _, _, a in outcome(tmp_path / "full.duckdb", "r")[0]] == \
        [False, False, True, True]
    updates = "SELECT step, node_id, cache_key, messages FROM llm_calls WHERE purpose = " \
              "'update' ORDER BY step, node_id"
    full_updates = rows(tmp_path / "full.duckdb", updates)
    shown = {s: "These earlier proposals" in m for s, n, _, m in full_updates if n == "hint_a"}
    assert shown == {1: False, 2: True, 3: False}  # step 3 follows an accepted edit
    _, first = run(tmp_path / "two.duckdb", steps=2)  # what steps 0..2 cost

    db = tmp_path / "budget.duckdb"
    stopped, _ = run(db, max_calls=len(first.requests) + 3)
    assert stopped.status == "budget"
    assert [s for s, *_ in outcome(db, "r")[0]] == [0, 1, 2]  # stopped inside step 3
    more = ScriptedBackend(responder=reject_then_accept)
    resumed = asyncio.run(resume(str(db), "r", forward_backend=more, max_calls=10_000))
    assert resumed.status == "finished"
    sent = [q for q in more.requests if q.purpose == "update"]
    assert sent and all("These earlier proposals" not in q.user_text for q in sent)
    assert rows(db, updates) == full_updates
    assert run_content(db, "r") == run_content(tmp_path / "full.duckdb", "r")


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
