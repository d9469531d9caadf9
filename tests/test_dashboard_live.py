"""Live follow (issue 11, item 5): the step a page shows while a run is running, and the
progress line read from the engine's log. Pure functions."""

from __future__ import annotations

from dashboard.live import Progress, follow_step, parse_progress


def test_following_shows_the_newest_step_and_a_pinned_step_stays():
    assert follow_step([0], 0, True) == 0
    assert follow_step([0, 1, 2], 0, True) == 2  # a new step landed: move to it
    assert follow_step([0, 1, 2], 1, False) == 1  # pinned: stay
    assert follow_step([0, 1, 2], 7, False) == 2  # pinned on something gone: the newest
    assert follow_step([], None, True) is None


def test_progress_line_has_the_phase_and_calls_against_expected():
    log = ("$ python -m engine run demo.yaml\n"
           "step 0 forward: 10/24 calls (10 in all)\n"
           "step 0 forward: 24/24 calls (24 in all)\n"
           "step 0 done: train 0.250, val 0.250; 24 calls so far\n"
           "step 1 forward: 24/24 calls (48 in all)\n"
           "step 1 backward: 3/8 calls (59 in all)\n")
    progress = parse_progress(log)
    assert progress == Progress(1, "backward", 3, 8, 59)
    assert progress.line(0, 2) == "0 of 2 steps written · now step 1: backward, 3 of 8 calls"


def test_progress_after_a_step_line_only_and_with_nothing_yet():
    progress = parse_progress("step 0 done: train 0.250, val 0.250; 24 calls so far\n")
    assert progress.step == 1 and progress.phase is None and progress.calls_total == 24
    assert progress.line(0, 1) == "0 of 1 step written · 24 calls so far"
    nothing = parse_progress("$ python -m engine run demo.yaml\n")
    assert nothing.line(0, None) == "0 of ? steps written"
    # rich redraws a line with carriage returns: the last state counts
    bar = parse_progress("step 2 gate: 1/8 calls\rstep 2 gate: 6/8 calls\n")
    assert (bar.phase, bar.calls_done, bar.calls_expected) == ("gate", 6, 8)
