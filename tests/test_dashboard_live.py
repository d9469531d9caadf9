"""Live follow: the step a page shows while a run is running, and the
progress read from the typed events the engine writes. No Streamlit."""

from __future__ import annotations

from dashboard.live import LiveProgress, follow_step, live_progress


def test_following_shows_the_newest_step_and_a_pinned_step_stays():
    assert follow_step([0], 0, True) == 0
    assert follow_step([0, 1, 2], 0, True) == 2  # a new step landed: move to it
    assert follow_step([0, 1, 2], 1, False) == 1  # pinned: stay
    assert follow_step([0, 1, 2], 7, False) == 2  # pinned on something gone: the newest
    assert follow_step([], None, True) is None


def write_events(path, *records):
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def progress(step, phase, done, expected, total):
    return {"event": "progress", "run_id": "r", "step": step, "phase": phase,
            "calls_done": done, "calls_expected": expected, "calls_total": total}


def test_progress_line_has_the_phase_and_calls_against_expected(tmp_path):
    events = tmp_path / "job.progress.jsonl"
    write_events(events, progress(0, "forward", 10, 24, 10), progress(0, "forward", 24, 24, 24),
                 {"event": "step_finished", "run_id": "r", "step": 0, "calls_total": 24},
                 progress(1, "forward", 24, 24, 48), progress(1, "backward", 3, 8, 59))
    now = live_progress(events)
    assert now == LiveProgress(1, "backward", 3, 8, 59)
    assert now.line(0, 2) == "0 of 2 steps written · now step 1: backward, 3 of 8 calls"


def test_progress_after_a_finished_step_only_and_with_nothing_yet(tmp_path):
    events = tmp_path / "job.progress.jsonl"
    write_events(events, progress(0, "gate", 8, 8, 24),
                 {"event": "step_finished", "run_id": "r", "step": 0, "calls_total": 24})
    now = live_progress(events)
    assert now.step == 1 and now.phase is None and now.calls_total == 24
    assert now.line(0, 1) == "0 of 1 step written · 24 calls so far"
    assert live_progress(tmp_path / "missing.jsonl").line(0, None) == "0 of ? steps written"
    assert live_progress(None).step is None
    # a line half-written while the page reads it: what is complete counts
    with open(events, "a", encoding="utf-8") as fh:
        fh.write('{"event": "progress", "run_id": "r", "st')
    assert live_progress(events).calls_total == 24


def test_steps_line_says_the_baseline_is_written():
    from dashboard.live import steps_line

    assert steps_line(0, 1) == "0 of 1 step written"
    assert steps_line(0, 1, baseline=True) == "baseline written · 0 of 1 step"
    assert steps_line(1, 2, baseline=True) == "1 of 2 steps written"
    assert live_progress(None).line(0, 3, True) == "baseline written · 0 of 3 steps"


def test_a_fork_counts_its_own_steps(tmp_path, capsys):
    """A fork from step 1 that ran one step has written 1 of 1 step, not '2 of 1'."""
    from dashboard import data
    from dashboard.live_view import planned_steps
    from engine.cli import main
    from tests.support.graphs import TWO_HINTS, arithmetic_rows, run_engine, write_graph

    db = str(tmp_path / "runs.duckdb")
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    run_engine(graph, db, steps=1, train=4, val=4, run_id="parent")
    assert main(["run", "--fork", "parent", "--from-step", "1", "--steps", "1", "--db", db,
                 "--run-id", "child"]) == 0
    assert [int(s) for s in data.steps(db, "child")["step"]] == [1, 2]
    assert (data.steps_done(db, "child"), planned_steps(db, "child")) == (1, 1)
    assert (data.steps_done(db, "parent"), planned_steps(db, "parent")) == (1, 1)
    assert data.baseline_done(db, "child") and data.baseline_done(db, "parent")
