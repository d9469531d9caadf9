"""Per-node gates: when a step changes several prompts, each edit is also scored alone on
validation (others as they were) and stored as updates.val_alone; the joint decision is
unchanged, the alone passes are not logged as the run's activations, and the run summary
prints what they cost."""

from __future__ import annotations

import re

import duckdb
import pytest

from engine.cli import main
from engine.events import StepFinished
from engine.llm.scripted import ScriptedBackend
from tests.support.graphs import TWO_HINTS, arithmetic_rows, run_engine, write_graph


def good_and_bad_edits(request) -> str | None:
    """hint_a's edit helps, hint_b's edit hurts, and together they hurt: the final node is
    right only when it sees a 'good' hint and no 'bad' one."""
    node, text = request.meta.get("node"), request.user_text
    if request.purpose == "update":
        new = {"hint_a": "A-GOOD", "hint_b": "B-BAD"}.get(node, request.meta["prompt"])
        return f"<prompt>{new}</prompt>"
    if request.purpose == "forward" and node == "hint_a":
        return "<output>good</output>" if "A-GOOD" in text else "<output>plain</output>"
    if request.purpose == "forward" and node == "hint_b":
        return "<output>bad</output>" if "B-BAD" in text else "<output>plain</output>"
    if request.purpose == "forward" and node == "final":
        a, b = map(int, re.findall(r"(\d+) apples and buys (\d+)", text)[0])
        right = "\ngood\n" in text and "\nbad\n" not in text  # inputs as rendered
        return f"<output>{a + b if right else 0}</output>"
    return None


def updates(db) -> dict[str, tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT node_id, accepted, val_before, val_after, val_alone "
                           "FROM updates WHERE step = 1").fetchall()
    return {r[0]: r[1:] for r in rows}


def test_each_edit_is_scored_alone_and_the_joint_decision_stays(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=good_and_bad_edits), steps=1,
                        train=4, val=4, node_gates="auto")
    rows = updates(db)
    # joint: good + bad hint -> wrong everywhere: rejected, as the paper's gate says
    assert rows["hint_a"][:3] == (False, 0.0, 0.0)
    assert rows["hint_b"][:3] == (False, 0.0, 0.0)
    # alone: hint_a's edit would have fixed every validation example, hint_b's none
    assert rows["hint_a"][3] == 1.0
    assert rows["hint_b"][3] == 0.0
    assert rows["final"][3] is None  # the final prompt did not change
    step1 = [s for s in result.events.of(StepFinished) if s.step == 1][0]
    # beside the joint pass (hint_a and hint_b new, final on both), the passes alone add the
    # old hints and the final node on each mixed pair: 2 edits x 4 val examples x 2 calls
    assert step1.metrics["node_gate_calls"] == 2 * 4 * 2
    # the hints' old and new prompts were all seen on val already (cache hits); only the
    # final node, which sees a new pair of hints, reaches the model: 2 x 4 calls
    assert step1.timings["node_gate_model_calls"] == 8
    assert step1.timings["node_gate_seconds"] >= 0
    with duckdb.connect(str(db), read_only=True) as con:
        # the alone passes are not the run's activations: one joint val pass only
        val_rows = con.execute("SELECT count(*) FROM node_outputs WHERE step = 1 "
                               "AND split = 'val'").fetchone()[0]
        val_losses = con.execute("SELECT count(*) FROM losses WHERE step = 1 "
                                 "AND split = 'val'").fetchone()[0]
        logged = con.execute("SELECT value FROM metrics WHERE step = 1 "
                             "AND key = 'node_gate_calls'").fetchone()[0]
        forward_calls = con.execute("SELECT count(*) FROM llm_calls WHERE step = 1 "
                                    "AND purpose = 'forward'").fetchone()[0]
    assert (val_rows, val_losses) == (4 * 3, 4)
    assert logged == 16
    # one call per distinct node call: train 4 x 3, joint val 4 x 3, the 16 the gates added
    # (a gate pass that repeated the joint pass's calls would make 4 x 3 x 2 more, not 16)
    assert forward_calls == 12 + 12 + 16


@pytest.mark.parametrize("given", [{}, {"node_gates": "off"}], ids=["default", "off"])
def test_a_default_step_scores_nothing_alone(tmp_path, given):
    # the default is off: a rejected two-edit step pays for the joint pass only
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    run_engine(graph, db, ScriptedBackend(responder=good_and_bad_edits), steps=1, train=4,
               val=4, **given)
    rows = updates(db)
    assert rows["hint_a"][:3] == (False, 0.0, 0.0)  # the joint decision as under auto
    assert rows["hint_a"][3] is None and rows["hint_b"][3] is None
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM metrics WHERE key LIKE 'node_gate%'"
                           ).fetchone()[0] == 0
        forward_calls = con.execute("SELECT count(*) FROM llm_calls WHERE step = 1 "
                                    "AND purpose = 'forward'").fetchone()[0]
        reasons = [r[0] for r in con.execute("SELECT reject_reason FROM updates WHERE step = 1 "
                                             "AND node_id LIKE 'hint_%'").fetchall()]
    assert forward_calls == 12 + 12  # train 4 x 3 and the joint val pass 4 x 3, no more
    assert all("alone" not in r for r in reasons), reasons


def test_auto_skips_steps_that_change_more_than_four_prompts():
    from engine.core.optimizer import node_gates_apply

    assert node_gates_apply("auto", 2) and node_gates_apply("auto", 4)
    assert not node_gates_apply("auto", 5) and node_gates_apply("on", 5)
    assert not node_gates_apply("off", 3) and not node_gates_apply("on", 1)


def test_one_change_reuses_the_joint_score(tmp_path):
    def only_hint_a(request):
        if request.purpose == "update":
            prompt = request.meta["prompt"]
            return f"<prompt>{'A-GOOD' if request.meta['node'] == 'hint_a' else prompt}</prompt>"
        return good_and_bad_edits(request)

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    run_engine(graph, db, ScriptedBackend(responder=only_hint_a), steps=1, train=4, val=4,
               node_gates="auto")
    rows = updates(db)
    assert rows["hint_a"] == (True, 0.0, 1.0, 1.0)


def every_edit_hurts(request) -> str | None:
    """Each update appends a marker naming its node; a hint writes the marker it was given
    (or "plain") and the question's first number, so no two of a pass's final calls share
    their inputs; the final node is right only without any marker, and only where that
    number is even (so some training examples fail at the start and some validation
    examples pass). The joint candidate, and each edit alone, then score 0 on validation."""
    text = request.user_text + "\n".join(c for _, c in request.messages)
    node = request.meta.get("node")
    if request.purpose == "update":
        return f"<prompt>{request.meta['prompt']} EDITED-{node}</prompt>"
    if request.purpose != "forward":
        return None
    a, b = map(int, re.findall(r"(\d+) apples and buys (\d+)", text)[0])
    markers = sorted(set(re.findall(r"EDITED-\w+", text)))
    if node in ("hint_a", "hint_b"):
        return f"<output>{' '.join(markers) or 'plain'} {a}</output>"
    return f"<output>{a + b if not markers and a % 2 == 0 else 0}</output>"


def every_edit_hurts_responder():
    """--scripted-responder FILE.py:NAME calls NAME() for the responder."""
    return every_edit_hurts


def test_run_summary_prints_the_cost_of_per_node_gates(tmp_path, capsys):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    code = main(["run", str(graph), "--backend", "scripted", "--steps", "1", "--train", "4",
                 "--val", "4", "--test", "0", "--seed", "4", "--node-gates", "auto",
                 "--scripted-responder", f"{__file__}:every_edit_hurts_responder",
                 "--db", str(db)])
    assert code == 0
    assert {n: u[0] for n, u in updates(db).items()} == {
        "hint_a": False, "hint_b": False, "final": False}  # rejected: the gates ran
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("per-node")]
    # beside the joint pass, the passes alone need the two old hints (2 x 4: their step-0
    # requests, answered by the cache) and the final node on three other input sets
    # (3 x 4: new requests, none alike)
    assert len(line) == 1 and "20 calls (12 to the model)" in line[0], line


def good_and_harmless_edits(request) -> str | None:
    """hint_a's edit helps and hint_b's changes nothing that matters: the joint candidate
    is right everywhere and accepted."""
    if request.purpose == "update":
        new = {"hint_a": "A-GOOD", "hint_b": "B-PLAIN"}.get(request.meta["node"],
                                                            request.meta["prompt"])
        return f"<prompt>{new}</prompt>"
    return good_and_bad_edits(request)


def test_auto_scores_edits_alone_only_after_a_rejection(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    alone, gate_calls = {}, {}
    for mode in ("auto", "on"):
        db = tmp_path / f"{mode}.duckdb"
        result = run_engine(graph, db, ScriptedBackend(responder=good_and_harmless_edits),
                            steps=1, train=4, val=4, node_gates=mode)
        rows = updates(db)
        assert rows["hint_a"][:3] == (True, 0.0, 1.0)  # the same joint decision either way
        alone[mode] = (rows["hint_a"][3], rows["hint_b"][3])
        step1 = [s for s in result.events.of(StepFinished) if s.step == 1][0]
        gate_calls[mode] = step1.metrics.get("node_gate_calls")
    # accepted jointly: auto's gates spend nothing on the question "which edit helped?";
    # the accepted candidate's pruning left hint_b's edit out, which is hint_a's alone, and
    # dropped it: hint_b's alone was never scored
    assert alone["auto"] == (1.0, None) and gate_calls["auto"] is None
    # on: today's behaviour, each edit scored alone beside the joint pass: the old hints
    # (2 x 4) and the final node on (plain, plain) (4); hint_a alone shows the final node
    # the joint pass's inputs as text, so those calls are shared
    assert alone["on"] == (1.0, 0.0) and gate_calls["on"] == 12
