"""Crash safety: a run killed with SIGKILL at random points and then resumed with
`python -m engine resume` ends with exactly the rows of a run that was never interrupted
(scripted backend), and no row twice."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from engine.runs.execute import RunConfig, execute
from tests.support.runlog import CONTENT, run_content

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
GRAPH = str(ROOT / "sample_graphs" / "diamond.yaml")
RUN_ID = "killed"
SIZES = {"steps": 4, "train": 16, "val": 16, "test": 8}
KILLS = 4

# The run kills itself with SIGKILL once it has reported `kill_after` model calls: the
# point of the crash is one the run itself names, whatever the machine's speed.
WRAPPER = f"""
import asyncio, os, signal, sys
from engine.events import CallRecord
from engine.llm.scripted import ScriptedBackend
from engine.runs.execute import RunConfig, execute

graph, db, run_id, kill_after = sys.argv[1:5]
seen = [0]

def crash(event):
    if isinstance(event, CallRecord):
        seen[0] += 1
        if seen[0] >= int(kill_after):
            os.kill(os.getpid(), signal.SIGKILL)

config = RunConfig(graph=graph, db=db, run_id=run_id, **{SIZES!r})
asyncio.run(execute(config, forward_backend=ScriptedBackend(latency=0.002), listeners=(crash,)))
"""

# What makes a row unique within a run.
KEYS = {
    "runs": "run_id",
    "steps": "step",
    "examples": "split, example_id",
    "prompt_versions": "node_id, version",
    "updates": "step, node_id",
    "gradients": "step, example_id, node_id, from_node_id, kind",
    "losses": "step, split, example_id",
    "node_outputs": "step, split, example_id, node_id",
    "metrics": "step, key",
    "llm_calls": "call_id",
    "llm_cache": "key",
}


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def duplicates(db: Path) -> dict[str, list]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        found = {t: con.execute(f"SELECT {key}, count(*) AS n FROM {t} GROUP BY ALL "
                                "HAVING n > 1").fetchall() for t, key in KEYS.items()}
    finally:
        con.close()
    return {t: rows for t, rows in found.items() if rows}


def status_and_steps(db: Path) -> tuple[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        status = con.execute("SELECT status FROM runs").fetchall()[0][0]
        steps = con.execute("SELECT count(*) FROM steps").fetchall()[0][0]
    finally:
        con.close()
    return status, steps


def start_and_kill(tmp_path: Path, trial: int, kill_after: int) -> Path:
    wrapper = tmp_path / "crashing_run.py"
    wrapper.write_text(WRAPPER)
    db = tmp_path / f"killed{trial}.duckdb"
    proc = subprocess.run([sys.executable, str(wrapper), GRAPH, str(db), RUN_ID,
                           str(kill_after)], cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    return db


def test_runs_killed_at_random_moments_resume_to_the_uninterrupted_result(tmp_path):
    reference = tmp_path / "reference.duckdb"
    asyncio.run(execute(RunConfig(graph=GRAPH, db=str(reference), run_id=RUN_ID, **SIZES)))
    expected = run_content(reference, RUN_ID)
    assert len(expected["steps"]) == SIZES["steps"] + 1 and expected["gradients"]

    calls = sum(expected["llm_calls"].values())
    rng = random.Random(20240607)
    interrupted_at = []
    for trial in range(KILLS):
        # One random call in each KILLS-th of the run's calls.
        kill_after = 1 + int((trial + rng.random()) * (calls - 1) / KILLS)
        db = start_and_kill(tmp_path, trial, kill_after)
        status, steps_done = status_and_steps(db)
        assert status == "running", (kill_after, status)  # killed: never marked ended
        interrupted_at.append(steps_done)
        proc = subprocess.run([sys.executable, "-m", "engine", "resume", RUN_ID, "--db",
                               str(db)], cwd=ROOT, env=env(), capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert status_and_steps(db) == ("finished", SIZES["steps"] + 1)
        assert duplicates(db) == {}
        got = run_content(db, RUN_ID)
        for table in CONTENT:
            assert got[table] == expected[table], f"trial {trial}: {table} differs"
    # The kills land at different points of the run.
    assert len(set(interrupted_at)) >= 2, interrupted_at
