"""Adaptive blame's stopping rule (engine/probes/adaptive.py): looks at the evidence after
each round with intervals wide enough that all looks together keep the verdict's 90%."""

from __future__ import annotations

import random

from engine.data.stats import Z90, wilson
from engine.probes.adaptive import example_order, look, look_z, rounds_of


def test_each_look_is_wider_the_more_looks_are_planned():
    assert abs(look_z(1) - Z90) < 1e-9
    assert Z90 < look_z(3) < look_z(6)


def test_a_clear_leader_is_named_and_the_rest_fall_behind():
    seen = look({"note": (8, 8), "thing": (0, 8), "answer": (0, 8)}, looks=6)
    assert seen.named == "note" and seen.behind == {"thing", "answer"}


def test_a_close_second_stays_in_contention_and_nothing_is_named():
    seen = look({"note": (10, 12), "thing": (7, 12), "answer": (0, 12)}, looks=6)
    assert seen.named is None and seen.behind == {"answer"}


def test_nothing_flipped_decides_nothing():
    assert look({"a": (0, 8), "b": (0, 8)}, looks=2) == look({"a": (0, 0), "b": (0, 0)}, 2)
    assert look({"a": (0, 8), "b": (0, 8)}, looks=2).named is None


def test_a_look_never_names_what_the_verdicts_90_percent_intervals_would_not():
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randint(1, 24)
        counts = {k: (rng.randint(0, n), n) for k in ("a", "b", "c")}
        seen = look(counts, looks=rng.randint(1, 8))
        if seen.named:
            low = wilson(*counts[seen.named])[0]
            assert all(low > wilson(*c)[1] for k, c in counts.items() if k != seen.named)


def test_rounds_take_the_examples_in_a_fixed_order_unrelated_to_their_ids():
    ids = [f"ex-{i:02d}" for i in range(10)]
    order = example_order("run-1", ids)
    assert sorted(order) == ids and order != ids
    assert example_order("run-1", reversed(ids)) == order
    assert [len(r) for r in rounds_of(order)] == [4, 4, 2]


def test_adaptive_blame_names_what_exhaustive_blame_names_with_fewer_probes(tmp_path):
    import asyncio

    from engine.llm.scripted import ScriptedBackend
    from engine.probes.blame import blame
    from tests.support.blame_fault_script import blame_fault_responder
    from tests.test_blame import logged_run

    db = logged_run(tmp_path)
    seen: list[tuple[int, int]] = []
    said: list[str] = []

    def run(adaptive: bool):
        return asyncio.run(blame(db, "bf", 1, "failing", adaptive=adaptive,
                                 forward_backend=ScriptedBackend(
                                     responder=blame_fault_responder()),
                                 progress=lambda done, total: seen.append((done, total)),
                                 announce=said.append))

    everything = run(adaptive=False)
    assert everything.spent is None and len(everything.results) == seen[0][1]
    seen.clear()
    adaptive = run(adaptive=True)
    assert adaptive.verdict.node == everything.verdict.node == "numbers"
    made, planned = adaptive.spent.made, adaptive.spent.planned
    assert made == len(adaptive.results) < planned == len(everything.results)
    # the progress line's total falls to what is made, never below what is done
    assert seen[0] == (0, planned) and seen[-1] == (made, made)
    assert all(done <= total for done, total in seen)
    # before any model call, the estimate from the log; once planned, the probes planned
    assert said[-2].startswith("blame: up to ")
    assert said[-1].startswith(f"blame: planned: up to {planned} probes, about ")
    assert adaptive.as_json()["adaptive"]["made"] == made
    assert any("they named numbers" in note for note in adaptive.spent.notes)


def test_the_estimate_from_the_log_bounds_what_blame_plans(tmp_path):
    import asyncio
    import re

    from engine.llm.scripted import ScriptedBackend
    from engine.probes.blame import blame, estimate_from_log
    from tests.support.blame_fault_script import blame_fault_responder
    from tests.test_blame import logged_run

    db = logged_run(tmp_path)
    before = estimate_from_log(db, "bf", 1, "failing")
    said: list[str] = []
    asyncio.run(blame(db, "bf", 1, "failing", adaptive=False, announce=said.append,
                      forward_backend=ScriptedBackend(responder=blame_fault_responder())))

    def figures(line: str) -> tuple[int, int]:
        found = re.match(r"blame: (?:planned: )?up to (\d+) probes, about (\d+) model calls",
                         line)
        return int(found[1]), int(found[2])

    assert figures(said[0]) == figures(before)  # said first, before any model call
    planned, calls = figures(said[1])
    bound, bound_calls = figures(before)
    assert planned <= bound and calls <= bound_calls
    assert bound <= 2 * planned  # an estimate, not a guess off by an order
    assert "at this run's pace" in before
