"""Reading while a run writes: one process writes a multi-step run while this one reads
it with the dashboard's reader functions in a loop. No read fails on the lock, progress
never goes backwards, a step is seen whole or not at all, and every row arrives."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb

from engine.runlog import reader
from engine.runs.execute import RunConfig, execute

ROOT = Path(__file__).resolve().parents[1]
GRAPH = str(ROOT / "sample_graphs" / "diamond.yaml")
RUN_ID = "live"
SIZES = {"steps": 4, "train": 16, "val": 16, "test": 8}
TABLES = ("steps", "prompt_versions", "node_outputs", "losses", "gradients", "updates",
          "llm_calls", "metrics", "examples")

# 50 ms per scripted call: the run takes several seconds, long enough to watch even on a
# loaded machine (at 20 ms a busy CI machine once read it only after it had finished).
WRITER = f"""
import asyncio, sys
from engine.llm.scripted import ScriptedBackend
from engine.runs.execute import RunConfig, execute

config = RunConfig(graph=sys.argv[1], db=sys.argv[2], run_id=sys.argv[3], **{SIZES!r})
result = asyncio.run(execute(config, forward_backend=ScriptedBackend(latency=0.05)))
sys.exit(0 if result.status == "finished" else 1)
"""


def counts(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [RUN_ID]
                               ).fetchall()[0][0] for t in TABLES}
    finally:
        con.close()


def read_once(db: Path) -> dict | None:
    runs = reader.list_runs(db)
    if runs.empty:
        return None
    steps = reader.step_table(db, RUN_ID)
    activations = reader.node_activations(db, RUN_ID, "compare")
    totals = reader.token_totals(db, RUN_ID)
    trace = None
    if len(steps):
        first = activations[activations["step"] == steps["step"].max()]
        if len(first):
            trace = reader.example_trace(db, RUN_ID, int(first["step"].iloc[0]),
                                         first["example_id"].iloc[0])
    return {"status": runs["status"].iloc[0], "steps": len(steps),
            "per_step": activations.groupby(["step", "split"]).size().to_dict(),
            "calls": int(totals["calls"].sum()) if len(totals) else 0,
            "trace_rows": 0 if trace is None else len(trace["activations"])}


def test_a_reader_watches_a_run_in_progress_without_errors_or_lost_rows(tmp_path):
    reference = tmp_path / "reference.duckdb"
    asyncio.run(execute(RunConfig(graph=GRAPH, db=str(reference), run_id=RUN_ID, **SIZES)))

    db = tmp_path / "live.duckdb"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writer = subprocess.Popen([sys.executable, str(script), GRAPH, str(db), RUN_ID], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    reads: list[dict] = []
    deadline = time.monotonic() + 120
    try:
        while writer.poll() is None:
            assert time.monotonic() < deadline, "the writer did not finish"
            if not db.exists():
                time.sleep(0.01)
                continue
            seen = read_once(db)  # any exception here fails the test
            if seen is not None:
                reads.append(seen)
        _, errors = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == 0, errors[-2000:]
    final = read_once(db)
    reads.append(final)

    # The reader saw the run in progress, and progress never went backwards.
    total_steps = SIZES["steps"] + 1
    assert any(r["status"] == "running" and 0 < r["steps"] < total_steps for r in reads), reads
    for earlier, later in zip(reads, reads[1:]):
        assert later["steps"] >= earlier["steps"] and later["calls"] >= earlier["calls"]
    # Every step the reader saw was whole: as many activations as at the end. (The test
    # split is logged under the last step, in its own transaction after it.)
    for r in reads:
        for key, n in r["per_step"].items():
            assert n == final["per_step"][key], (key, n, final["per_step"][key])
        assert r["trace_rows"] > 0 or r["steps"] == 0
    # And at the end every row is there: the same counts as an unwatched run.
    assert final["status"] == "finished" and final["steps"] == total_steps
    assert counts(db) == counts(reference)
    print(f"{len(reads)} reads while the run wrote")
