"""Forks: a new run from another run's state after step S, with hand-edited prompts; its
lineage is recorded and its steps continue from S+1."""

from __future__ import annotations

import asyncio
import re

import pytest

from engine.cli import main
from engine.llm.scripted import ScriptedBackend
from engine.runs.execute import RunConfig, execute
from engine.runs.fork import fork
from tests.support.blame_fault_script import blame_fault_responder
from tests.support.runlog import rows
from tests.test_probe import GRAPH

EDITED = "List the numbers of the text, separated by 'and'."


def backend() -> ScriptedBackend:
    return ScriptedBackend(responder=blame_fault_responder())


@pytest.fixture
def parent(tmp_path) -> str:
    db = str(tmp_path / "runs.duckdb")
    config = RunConfig(graph=str(GRAPH), db=db, steps=2, test=0, run_id="bf")
    asyncio.run(execute(config, forward_backend=backend()))
    return db




def test_a_fork_records_its_lineage_uses_the_edited_prompt_and_continues(parent):
    bk = backend()
    result = asyncio.run(fork(parent, "bf", 0, set_prompts={"numbers": EDITED},
                              overrides={"run_id": "child", "steps": 1}, forward_backend=bk))
    assert result.status == "finished"
    assert rows(parent, "SELECT parent_run_id, fork_step FROM runs WHERE run_id = 'child'") \
        == [("bf", 0)]
    # step 0 is the starting state, re-scored with the edited prompt; then step 1
    assert rows(parent, "SELECT step, train_score, val_score FROM steps WHERE run_id = "
                        "'child' ORDER BY step") == [(0, 1.0, 1.0), (1, 1.0, 1.0)]
    assert any(r.meta.get("node") == "numbers" and EDITED in r.user_text
               for r in bk.requests)
    version = rows(parent, "SELECT version FROM prompt_versions WHERE run_id = 'child' AND "
                           "node_id = 'numbers' AND prompt = ?", EDITED)[0][0]
    used = rows(parent, "SELECT DISTINCT prompt_version FROM node_outputs WHERE run_id = "
                        "'child' AND step = 1 AND split = 'train' AND node_id = 'numbers'")
    assert used == [(version,)] and version > 0
    same = "SELECT split, example_id, position FROM examples WHERE run_id = ? ORDER BY 1, 3"
    assert rows(parent, same, "child") == rows(parent, same, "bf")


def test_a_fork_without_edits_starts_from_the_parents_accepted_prompts(parent):
    asyncio.run(fork(parent, "bf", 1, overrides={"run_id": "child"},
                     forward_backend=backend()))  # the parent's remaining step: 2
    steps = rows(parent, "SELECT step, val_score FROM steps WHERE run_id = 'child' ORDER BY "
                         "step")
    parent_step1 = rows(parent, "SELECT val_score FROM steps WHERE run_id = 'bf' AND step = 1")
    assert [s for s, _ in steps] == [1, 2] and steps[0][1] == parent_step1[0][0]
    accepted = rows(parent, "SELECT version FROM prompt_versions WHERE run_id = 'bf' AND "
                            "node_id = 'numbers' AND accepted AND step = 1")[0][0]
    used = rows(parent, "SELECT DISTINCT prompt_version FROM node_outputs WHERE run_id = "
                        "'child' AND step = 2 AND split = 'train' AND node_id = 'numbers'")
    assert used == [(accepted,)]
    asyncio.run(fork(parent, "bf", 1, overrides={"run_id": "two", "steps": 2},
                     forward_backend=backend()))  # --steps counts the fork's own steps
    assert rows(parent, "SELECT step FROM steps WHERE run_id = 'two' ORDER BY step") == \
        [(1,), (2,), (3,)]


def test_fork_from_the_command_line(parent, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("engine.llm.factory.make_backend", lambda *a, **k: backend())
    prompt = tmp_path / "numbers.txt"
    prompt.write_text(EDITED, encoding="utf-8")
    code = main(["run", "--fork", "bf", "--from-step", "0", "--set-prompt",
                 f"numbers=@{prompt}", "--steps", "1", "--db", parent, "--run-id", "cli"])
    assert code == 0
    assert rows(parent, "SELECT parent_run_id, fork_step, status FROM runs WHERE run_id = "
                        "'cli'") == [("bf", 0, "finished")]
    assert rows(parent, "SELECT count(*) FROM prompt_versions WHERE run_id = 'cli' AND "
                        "prompt = ?", EDITED) == [(1,)]


@pytest.mark.parametrize("args, message", [
    (["--fork", "nope", "--from-step", "0"], "no run 'nope'"),
    (["--fork", "bf", "--from-step", "9"], "no complete step 9"),
    (["--fork", "bf"], "needs both --fork"),
    (["--fork", "bf", "--from-step", "0", "--set-prompt", "ghost=x"], "no node 'ghost'"),
    (["--fork", "bf", "--from-step", "0", "--set-prompt", "numbers"], "expects NODE=TEXT"),
    (["--fork", "bf", "--from-step", "0", "--run-id", "bf"], "already exists"),
])
def test_bad_fork_requests_get_one_error_line(parent, capsys, args, message):
    assert main(["run", *args, "--db", parent]) == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], errors


ESTIMATE = re.compile(r"^estimate: ~(\d+) model calls \(.*; at most (\d+) with no cache hits\)")


def test_a_fork_prints_its_estimate_before_its_first_call(parent, capsys, monkeypatch):
    monkeypatch.setattr("engine.llm.factory.make_backend", lambda *a, **k: backend())
    fork_args = ["run", "--fork", "bf", "--from-step", "1", "--set-prompt",
                 f"numbers={EDITED}", "--steps", "1", "--db", parent, "--cache", "off"]
    assert main([*fork_args, "--run-id", "dry", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    phases = [line.split("  ")[0] for line in lines[1:]]
    # the fork's own phases: step 1 re-measured with the edit, then its one step, 2
    assert phases[:2] == ["step 1: train", "step 1: validation"]
    assert "step 2: backward" in phases and not any(p.startswith("step 0") for p in phases)
    dry = next(ESTIMATE.match(line) for line in lines if ESTIMATE.match(line))
    assert lines[-1].startswith("dry run:")
    assert rows(parent, "SELECT count(*) FROM runs WHERE run_id = 'dry'") == [(0,)]

    assert main([*fork_args, "--run-id", "real"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    estimate = ESTIMATE.match(first)  # the first line, before the run's summary
    assert estimate and estimate.groups() == dry.groups()
    made = rows(parent, "SELECT count(*) FROM llm_calls WHERE run_id = 'real' AND NOT "
                        "cache_hit")[0][0]
    assert 0 < made <= int(estimate[2])  # the bound holds for what the fork did
    # without an edit the fork re-measures nothing: no train-and-validation pass to count
    assert main(["run", "--fork", "bf", "--from-step", "1", "--steps", "1", "--db", parent,
                 "--run-id", "plain", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "step 1: train" not in out and "step 1: validation" not in out
