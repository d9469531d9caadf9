"""Progress by phase and call count: the Progress events of a run, and the plain
lines the CLI writes into a job's log for the dashboard's live view."""

from __future__ import annotations

import subprocess
import sys
from itertools import groupby
from pathlib import Path

from engine.events import CallRecord, Progress
from engine.runs.progress import progress_line
from tests.support.graphs import TWO_HINTS, arithmetic_rows, run_engine, write_graph

ROOT = Path(__file__).resolve().parents[1]


def test_each_step_reports_its_phases_in_order_with_calls_done_and_expected(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    result = run_engine(graph, tmp_path / "runs.duckdb", steps=2, train=6, val=5, test=4,
                        node_gates="off")
    events = result.events.of(Progress)
    assert len(events) == len(result.events.of(CallRecord))  # one per call
    assert [e.calls_total for e in events] == list(range(1, len(events) + 1))
    phases = [(step, [p for p, _ in groupby(e.phase for e in items)])
              for step, items in groupby(events, key=lambda e: e.step)]
    assert phases[0] == (0, ["forward"])
    assert phases[1][1][:4] == ["forward", "backward", "update", "gate"]
    assert phases[-1][1][-1] == "test"
    last = {}
    for e in events:
        last[(e.step, e.phase)] = e
    # three LLM nodes: step 0 scores train and val together; then train, gate and test
    assert (last[(0, "forward")].calls_done, last[(0, "forward")].calls_expected) == (33, 33)
    assert (last[(1, "forward")].calls_done, last[(1, "forward")].calls_expected) == (18, 18)
    assert (last[(1, "gate")].calls_done, last[(1, "gate")].calls_expected) == (15, 15)
    test = [e for e in events if e.phase == "test"][-1]
    assert (test.calls_done, test.calls_expected) == (12, 12)
    # backward: k = 2 examples x one joint call (only `final` has LLM inputs); updates: 3
    assert last[(1, "backward")].calls_expected == 2
    assert last[(1, "update")].calls_done == last[(1, "update")].calls_expected == 3


def test_the_cli_writes_progress_events_that_the_live_view_reads(tmp_path):
    from dashboard.live import live_progress
    from engine.runs.progress import read_progress

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    events = tmp_path / "job.progress.jsonl"
    subprocess.run([sys.executable, "-m", "engine", "run", str(graph), "--backend",
                    "scripted", "--steps", "1", "--train", "4", "--val", "4",
                    "--db", str(tmp_path / "runs.duckdb"), "--progress-file", str(events)],
                   cwd=ROOT, capture_output=True, check=True, timeout=300)
    lines = events.read_text(encoding="utf-8").splitlines()
    cut = tmp_path / "cut.jsonl"  # as the live view sees the file mid-run
    upto = next(i for i, line in enumerate(lines) if '"phase": "update"' in line)
    cut.write_text("\n".join(lines[:upto]) + "\n", encoding="utf-8")
    latest, finished, _ = read_progress(cut)
    assert (latest.step, latest.phase, latest.calls_done, latest.calls_expected) == \
        (1, "backward", 2, 2)
    assert finished == 0
    assert live_progress(events).step == 2 and live_progress(events).phase is None  # all done


def test_progress_line_format():
    assert progress_line(Progress("r", 1, "backward", 12, 40, 96)) == \
        "step 1 backward: 12/40 calls (96 in all)"
