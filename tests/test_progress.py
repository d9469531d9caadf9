"""Progress by phase and call count: the Progress events of a run, and the plain
lines the CLI writes into a job's log for the dashboard's live view."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from itertools import groupby
from pathlib import Path

from engine.cli.summary import validation_change
from engine.events import CallRecord, Progress, StepFinished
from engine.runs.progress import progress_line
from tests.support.graphs import TWO_HINTS, arithmetic_rows, run_engine, write_graph
from tests.support.runlog import rows

ROOT = Path(__file__).resolve().parents[1]


def test_each_step_reports_its_phases_in_order_with_calls_done_and_expected(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    result = run_engine(graph, tmp_path / "runs.duckdb", steps=2, train=6, val=5, test=4,
                        node_gates="off")
    events = result.events.of(Progress)
    calls = [e for e in events if e.calls_done]  # one per call; the others start a phase
    assert len(calls) == len(result.events.of(CallRecord))
    assert [e.calls_total for e in calls] == list(range(1, len(calls) + 1))
    # the gate says it has begun before its first call comes back, right after the updates
    starts = [(i, e) for i, e in enumerate(events) if not e.calls_done]
    assert [(e.step, e.phase, e.calls_expected) for _, e in starts] == [
        (1, "gate", 15), (2, "gate", 15)]
    assert all(events[i - 1].phase == "update" for i, _ in starts)
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


DEMO = ROOT / "sample_graphs" / "demo.yaml"
DEMO_MODEL = f"{ROOT / 'sample_graphs' / 'demo_responder.py'}:demo_responder"
COUNT_LINE = re.compile(r"^step (\d+) (\w+): (\d+)/(\d+) calls \((\d+) in all\)$")
DONE_LINE = re.compile(r"^step (\d+) done: .*?(?:, (\d+) edits? accepted)?"
                       r"(?:, (\d+) prompts? set by hand)?; (\d+) calls so far$")


def _engine(*args: str) -> tuple[str, str]:
    """Run `python -m engine ARGS` with its output in files (no terminal: one line per
    progress event worth a line, as in a dashboard job's log); (stdout, stderr)."""
    done = subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT,
                          capture_output=True, text=True, check=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    return done.stdout, done.stderr


def _checked_counts(log: str) -> dict[int, int]:
    """Assert every progress line's calls stay within its expected count and the running
    total climbs; return each step's accepted edits as its 'done' line says them."""
    counts = [COUNT_LINE.match(line) for line in log.splitlines()]
    counts = [m for m in counts if m]
    assert counts
    for m in counts:
        step, phase, done, expected = int(m[1]), m[2], int(m[3]), int(m[4])
        assert 0 < done <= expected, f"step {step} {phase}: {done}/{expected}"
    assert [int(m[5]) for m in counts] == sorted(int(m[5]) for m in counts)
    said = {}
    for line in log.splitlines():
        m = DONE_LINE.match(line)
        if m:
            said[int(m[1])] = int(m[2] or 0)
            if m[3]:
                said[("by hand", int(m[1]))] = int(m[3])
    return said


def _summary_cells(stdout: str, column: int) -> dict[int, str]:
    """One column of the summary table, by step."""
    found = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 9 and cells[0].isdigit():
            found[int(cells[0])] = cells[column]
    return found


def _summary_accepted(stdout: str) -> dict[int, int]:
    """The summary table's 'accepted edits' column, by step."""
    return {step: int(cell) for step, cell in _summary_cells(stdout, 4).items()}


def _finished(step: int, val: float) -> StepFinished:
    return StepFinished("r", step, 0.0, val, False, 0.0, 1.0)


def test_the_summary_says_whether_validation_rose_beyond_its_95_percent_intervals():
    """1 of 24 -> 3 of 24 is a rise the gate keeps, but the intervals overlap (Wilson, 95%:
    [0.0074, 0.2024] and [0.0434, 0.3100]); 1 -> 24 of 24 ([0.862, 1]) clears it."""
    small = validation_change([_finished(0, 1 / 24), _finished(1, 3 / 24)], 24)
    assert small == ("validation 0.042 at step 0 -> 0.125 at step 1, on 24 examples; 95% "
                     "intervals [0.01, 0.20] and [0.04, 0.31]: they overlap, so the rise "
                     "may be chance")
    clear = validation_change([_finished(0, 1 / 24), _finished(1, 1.0)], 24)
    assert clear.endswith("[0.01, 0.20] and [0.86, 1.00]: they do not overlap")
    # from the first to the last step scored, whatever lies between
    steps = [_finished(0, 0.5), _finished(1, 0.25), _finished(2, 0.5)]
    assert validation_change(steps, 8).endswith(": no rise")
    assert validation_change(steps[:1], 8) is None  # one step: nothing to compare
    assert validation_change(steps, 0) is None  # no validation examples
    # a step with no score (an empty pass) is left out, not printed as nan
    assert validation_change([*steps[:2], _finished(3, float("nan"))], 8).startswith(
        "validation 0.500 at step 0 -> 0.250 at step 1")


def test_a_forks_progress_counts_and_accepted_edits_agree_with_what_it_did(tmp_path):
    db = str(tmp_path / "runs.duckdb")
    # the parent: one gated step whose three edits are rejected, then scored alone
    # (per-node gates under auto): the gate's count must still bound its calls
    stdout, log = _engine("run", str(DEMO), "--backend", "scripted", "--scripted-responder",
                          DEMO_MODEL, "--steps", "1", "--node-gates", "auto", "--db", db,
                          "--run-id", "parent")
    said = _checked_counts(log)
    assert said == {0: 0, 1: 0} and _summary_accepted(stdout) == {0: 0, 1: 0}
    # each step's validation with its 95% interval on the 24 examples (0 of 24: Wilson's
    # upper bound z^2 / (n + z^2) = 0.138), and the comparison the gate does not make
    assert _summary_cells(stdout, 3) == {0: "[0.00, 0.14]", 1: "[0.00, 0.14]"}
    assert ("validation 0.000 at step 0 -> 0.000 at step 1, on 24 examples; 95% intervals "
            "[0.00, 0.14] and [0.00, 0.14]: no rise") in stdout
    # the demo's two candidates (24 val x 3 nodes each), then each edit of the better one
    # alone as its own phase (3 edits x 72 calls, most answered by the cache)
    assert "step 1 gate: 144/144 calls" in log and "step 1 node_gates: 72/216 calls" in log
    prompt = tmp_path / "answer.txt"
    prompt.write_text("Write the number you are given.", encoding="utf-8")
    # the fork re-measures its hand-set prompt on train and validation at step 1, then runs
    # step 2 with the gate off, so every proposal is accepted
    stdout, log = _engine("run", "--fork", "parent", "--from-step", "1", "--set-prompt",
                          f"answer=@{prompt}", "--steps", "1", "--no-gate", "--db", db,
                          "--run-id", "fork")
    said = _checked_counts(log)
    assert "step 1 forward: 96/96 calls" in log  # (8 train + 24 val) x 3 nodes
    accepted = dict(rows(db, "SELECT step, count(*) FILTER (WHERE accepted) FROM updates "
                             "WHERE run_id = 'fork' GROUP BY step"))
    assert accepted == {2: 3}
    assert said == {1: 0, ("by hand", 1): 1, 2: 3}
    assert _summary_accepted(stdout) == {1: 0, 2: 3}
    assert "edit accepted" not in log.split("step 2 ")[0]  # step 1 was set by hand
    assert "step 1: the fork's starting state, 1 prompt set by hand" in stdout
