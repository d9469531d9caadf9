"""Adaptive blame's stopping rule (engine/probes/adaptive.py): looks at the evidence after
each round with intervals wide enough that all looks together keep the verdict's 90%."""

from __future__ import annotations

import random

from engine.data.stats import Z90, wilson
from engine.probes.adaptive import (
    cannot_be_named,
    example_order,
    look,
    look_z,
    needed_share,
    rounds_of,
)


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
    from engine.probes.blame import blame
    from engine.probes.estimate import estimate_from_log
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


def test_a_node_whose_gradient_fixes_all_carry_the_answer_falls_behind():
    # (flips, counted, leaks): `total`'s two fixes both carried the answer, none counted
    seen = look({"who": (0, 4, 0), "numbers": (0, 4, 0), "total": (0, 4, 2)}, looks=6)
    assert seen.named is None and seen.behind == {"total"}
    # one leak is not yet a pattern; a counted flip beside the leaks keeps it in
    assert look({"a": (0, 4, 1), "b": (0, 4, 0)}, looks=6).behind == frozenset()
    assert "a" not in look({"a": (1, 4, 3), "b": (0, 4, 0)}, looks=6).behind
    # once another node flips, the leader rule alone decides: `total` stays in the rounds
    # until its interval clears the leader's (frozen at 0 of 2 it would bar a name)
    assert look({"numbers": (2, 2, 0), "total": (0, 2, 2)}, looks=3).behind == frozenset()
    # without leak counts (the edit probes' looks) nothing falls behind for leaking
    assert look({"a": (0, 4), "b": (0, 4)}, looks=6).behind == frozenset()


def test_adaptive_blame_computes_gradients_only_for_the_examples_it_probes(tmp_path):
    """The step back-propagated 3 of its 8 failing training examples; the other 5 need a
    backward pass before their gradients can be followed. Exhaustive blame makes it for all
    5; adaptive blame, which names `numbers` after its first rounds, only for the examples
    those rounds took, and follows no more of `total`'s gradients once two of its fixes have
    carried the answer."""
    import asyncio
    import shutil

    from engine.llm.scripted import ScriptedBackend
    from engine.probes.blame import blame
    from tests.support.blame_fault_script import blame_fault_responder
    from tests.test_blame import logged_run

    db = logged_run(tmp_path)
    copy = str(tmp_path / "copy.duckdb")
    shutil.copy(db, copy)

    def backward_calls(path: str) -> int:
        """blame's calls with the backward pass's system message (the run's own are
        purpose 'backward'; blame's, 'probe')."""
        import duckdb

        with duckdb.connect(path, read_only=True) as con:
            return con.execute(
                "SELECT count(*) FROM llm_calls WHERE purpose = 'probe' AND json_extract_string("
                "messages::JSON, '$[0].content') IN (SELECT json_extract_string(messages::JSON, "
                "'$[0].content') FROM llm_calls WHERE purpose = 'backward')").fetchone()[0]

    reports = {}
    for path, adaptive in ((db, False), (copy, True)):
        reports[adaptive] = asyncio.run(blame(path, "bf", 1, "failing", adaptive=adaptive,
                                              forward_backend=ScriptedBackend(
                                                  responder=blame_fault_responder())))
    assert reports[True].verdict.node == reports[False].verdict.node == "numbers"
    fresh = {adaptive: {r.example_id for r in report.results if r.kind == "gradient"}
             for adaptive, report in reports.items()}
    assert len(fresh[False]) == 8 and len(fresh[True]) < 8
    assert 0 < backward_calls(copy) < backward_calls(db)
    totals = [r for r in reports[True].results if r.kind == "gradient" and r.node_id == "total"]
    assert totals and all(r.leaks_target for r in totals if r.flipped)
    assert len(totals) < 8


def test_a_node_that_cannot_reach_a_name_beside_nodes_out_of_the_rounds_falls_behind():
    # the demo's gradient probes: `note`'s and `answer`'s fixes carried the number (out);
    # `thing`'s rewrites fixed nothing, and beside the two out at 0/2 it would need about
    # 78% of 23 examples, above its look interval's top after 2 probes
    assert needed_share([(0, 2), (0, 2)], 23) == 18 / 23
    seen = look({"note": (0, 2, 2), "thing": (0, 2, 0), "answer": (0, 2, 2)}, looks=7,
                examples=23)
    assert seen.behind == {"note", "thing", "answer"} and seen.named is None
    # the early look (after 2 examples) gives up the same way, and never names a node
    early = look({"note": (0, 2, 2), "thing": (0, 2, 0), "answer": (0, 2, 2)}, looks=6,
                 examples=23, give_up_only=True)
    assert early.behind == {"note", "thing", "answer"}
    assert look({"a": (8, 8), "b": (0, 8)}, looks=1, give_up_only=True) == look(
        {"a": (0, 0), "b": (0, 0)}, 1)
    # the same counts with every node still in the rounds: the others' evidence will grow
    # (their intervals narrow, the need falls), so nobody is given up on after 2 probes
    assert look({"a": (0, 2), "b": (0, 2), "c": (0, 2)}, looks=7, examples=23).behind == set()
    # once a node flips, the leader rule decides alone: `c` stays in until it is clearly
    # behind (dropped early, its wide interval would be a bar the leader must clear)
    seen = look({"a": (3, 4), "b": (3, 4), "c": (0, 4)}, looks=6, examples=23)
    assert seen.behind == set() and seen.named is None
    # a node with a flip is left to the leader rule
    assert not cannot_be_named({"a": (1, 4), "b": (0, 2)}, "a", 23, look_z(6),
                               frozenset({"b"}))


def test_the_paces_share_the_steps_wall_time_by_each_kinds_time_at_the_model(tmp_path):
    """One 60 s step: 100 forward calls that spent 20 s at the model in all, 10 optimizer
    calls that spent 100 s (less 20 s waiting for a turn: 80 s). The step's 60 s go 20:80,
    so 0.12 s a forward call and 4.8 s an optimizer call; a cache hit, and the probes'
    calls logged at the step (made after it), change nothing."""
    from engine.runlog.probing import run_paces
    from engine.runlog.schema import connect, ensure_schema

    db = str(tmp_path / "runs.duckdb")
    with connect(db) as con:
        ensure_schema(con)
        con.execute("INSERT INTO steps (run_id, step, started_at, ended_at) VALUES "
                    "('r', 0, 0, 0), ('r', 1, 100, 160)")
        calls = ([("forward", 200.0, 0.0, False)] * 100 + [("backward", 10_000.0, 2_000.0, False)]
                 * 10 + [("forward", 5.0, 0.0, True)] * 50 + [("probe", 90_000.0, 0.0, False)] * 9)
        con.executemany("INSERT INTO llm_calls (run_id, step, purpose, latency_ms, queued_ms, "
                        "cache_hit) VALUES ('r', 1, ?, ?, ?, ?)", calls)
    forward, optimizer = run_paces(db, "r")
    assert abs(forward - 0.12) < 1e-9 and abs(optimizer - 4.8) < 1e-9
    assert run_paces(db, "other") is None


def test_the_estimate_reads_as_people_write_durations():
    """A scripted run's paces (tens of microseconds) and an embedded one's (seconds)."""
    from engine.probes.estimate import _estimate_line

    fast = _estimate_line(10, 40, 5, (5e-05, 0.0004), adaptive=True)
    assert "under a second at this run's pace (under 10 ms a forward call, under 10 ms an " \
           "optimizer call" in fast
    assert "e-0" not in fast and "about under" not in fast
    slow = _estimate_line(141, 166, 138, (0.45, 6.2), adaptive=False)
    assert "about 16 min at this run's pace (0.5 s a forward call, 6.2 s an optimizer call" \
        in slow
