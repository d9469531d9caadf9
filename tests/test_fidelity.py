"""Method fidelity (issue 12): tests that fail when a method is wrong.

Each test names the defect class it guards. They run the real engine under the scripted
backend and assert on what was sent (prompts), what came back (gradients) and what was
written (rows), so a broken copy of the engine fails here loudly.
"""

from __future__ import annotations

from engine import prompts as P
from engine.llm.scripted import ScriptedBackend
from tests.conftest import TWO_HINTS, arithmetic_rows, run_engine, write_graph
from tests.test_engine import notes, rows

# --- a gradient reaches only the input it was written for ----------------------------------


def test_parse_gradients_never_gives_one_input_anothers_block():
    reply = '<gradient input="hint_a">only about A</gradient>'
    grads, problem = P.parse_gradients(reply, ["hint_a", "hint_b"])
    assert grads == {"hint_a": "only about A", "hint_b": ""}
    assert "no block for hint_b: empty gradient" in problem
    assert P.missing_gradients(grads) == ["hint_b"]


def test_parse_gradients_with_one_input_lets_the_whole_reply_stand_in():
    grads, problem = P.parse_gradients("Say the unit.", ["hint_a"])
    assert grads == {"hint_a": "Say the unit."}
    assert problem == "no <gradient> block: used the whole reply"


def test_parse_gradients_by_hint_labels_gives_each_its_own_line():
    grads, problem = P.parse_gradients("Hint 1: add units\nHint 2: drop the total",
                                       ["hint_a", "hint_b"])
    assert grads == {"hint_a": "add units", "hint_b": "drop the total"}


def _partial_then(repair_reply: str):
    def responder(request):
        role = request.meta.get("role", "")
        if role == "backward_joint_repair":
            return repair_reply
        if request.purpose == "backward":
            return '<gradient input="hint_a">GRAD-A-ONLY</gradient>'
        return notes(request)
    return responder


def test_a_missing_block_gets_one_repair_request_naming_it(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "r.duckdb"
    backend = ScriptedBackend(responder=_partial_then(
        '<gradient input="hint_b">GRAD-B-REPAIRED</gradient>'))
    run_engine(graph, db, backend, steps=1, failures_per_step=1)
    repairs = [r for r in backend.requests if r.meta.get("role") == "backward_joint_repair"]
    assert len(repairs) == 1
    assert repairs[0].meta["inputs"] == ["hint_b"]
    assert "no <gradient> block for hint_b" in repairs[0].messages[-1][1]
    assert repairs[0].messages[-2] == ("assistant",
                                       '<gradient input="hint_a">GRAD-A-ONLY</gradient>')
    got = dict(rows(db, "SELECT node_id, content FROM gradients WHERE from_node_id = 'final'"))
    assert got == {"hint_a": "GRAD-A-ONLY", "hint_b": "GRAD-B-REPAIRED"}


def test_a_block_still_missing_after_repair_is_empty_never_a_siblings_text(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "r.duckdb"
    backend = ScriptedBackend(responder=_partial_then("I have nothing to add."))
    run_engine(graph, db, backend, steps=1, failures_per_step=1)
    got = {n: (c, e) for n, c, e in rows(db, "SELECT node_id, content, parse_error FROM "
                                              "gradients WHERE from_node_id = 'final'")}
    assert got["hint_a"][0] == "GRAD-A-ONLY"
    assert got["hint_b"][0] == ""
    assert "after one repair request: empty gradient" in got["hint_b"][1]
    # hint_b's update sees no feedback from hint_a's gradient
    (update,) = [r for r in backend.requests if r.purpose == "update"
                 and r.meta["node"] == "hint_b"]
    assert "GRAD-A-ONLY" not in update.user_text
    assert len([r for r in backend.requests if r.meta.get("role", "").endswith("_repair")]) == 1
