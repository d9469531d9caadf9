"""Method fidelity: tests that fail when a method is wrong.

Each test names the defect class it guards. They run the real engine under the scripted
backend and assert on what was sent (prompts), what came back (gradients) and what was
written (rows), so a broken copy of the engine fails here loudly.
"""

from __future__ import annotations

import re

from engine.llm.scripted import ScriptedBackend
from engine.prompts import templates as P
from tests.support.graphs import DIAMOND, TWO_HINTS, arithmetic_rows, run_engine, write_graph
from tests.support.runlog import rows
from tests.test_engine import notes

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


# --- function nodes: one backward rule per registered function -----------------------------

JOINED = """
name: joined
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
nodes:
  - {id: a, prompt: Find the first quantity., inputs: [question]}
  - {id: b, prompt: Find the second quantity., inputs: [question]}
  - {id: j, kind: function, function: concatenate, inputs: [a, b]}
  - {id: final, prompt: Solve the problem., inputs: [question, j]}
  - {id: num, kind: function, function: extract_number, inputs: [final, a], output: true}
"""


def test_every_registered_function_has_a_backward_rule():
    from engine.core.functions import BACKWARD_RULES, FUNCTIONS
    assert set(BACKWARD_RULES) == set(FUNCTIONS)


def test_concatenate_splits_a_message_by_part_and_extractors_feed_only_their_input():
    from engine.core.functions import function_backward
    values = {"a": "first", "b": "second"}
    assert function_backward("concatenate", "NEW-A\n\nNEW-B", values) == (
        {"a": "NEW-A", "b": "NEW-B"}, None)
    assert function_backward("concatenate", "a: fix the first\nb: fix the second", values)[0] \
        == {"a": "fix the first", "b": "fix the second"}
    framed, note = function_backward("concatenate", "too long", values)
    assert "this part:\nfirst" in framed["a"] and "this part:\nsecond" in framed["b"]
    assert note and "not split by part" in note
    for name in ("extract_number", "extract_choice", "extract_yes_no", "first_line"):
        assert function_backward(name, "be 18", {"x": "...", "y": "..."})[0] == {
            "x": "be 18", "y": ""}


def test_semantic_feedback_through_functions_follows_their_rules(tmp_path):
    graph = write_graph(tmp_path, JOINED, arithmetic_rows())

    def responder(request):
        if request.purpose == "backward" and request.meta["node"] == "final":
            return ('<gradient input="j"><part name="a">FIX-A</part>'
                    '<part name="b">FIX-B</part></gradient>')
        return notes(request)

    db = tmp_path / "r.duckdb"
    run_engine(graph, db, ScriptedBackend(responder=responder), steps=1, failures_per_step=1)
    got = dict(rows(db, "SELECT node_id || '<-' || from_node_id, content FROM gradients "
                        "WHERE kind = 'gradient'"))
    assert got["a<-j"] == "FIX-A" and got["b<-j"] == "FIX-B"
    assert "a<-num" not in got  # the extractor reads only 'final'
    assert got["final<-num"].startswith("The expected output is")


def test_gtbp_targets_through_concatenate_split_by_part(tmp_path):
    graph = write_graph(tmp_path, JOINED, arithmetic_rows())

    def responder(request):
        if request.meta.get("role") == "gtbp_input" and request.meta["node"] == "final":
            return ('<input name="question">q</input>'
                    '<input name="j">TARGET-A\n\nTARGET-B</input>')
        return notes(request)

    db = tmp_path / "r.duckdb"
    run_engine(graph, db, ScriptedBackend(responder=responder), steps=1, failures_per_step=1,
               method="gtbp")
    got = dict(rows(db, "SELECT node_id || '<-' || from_node_id, content FROM gradients "
                        "WHERE kind = 'target'"))
    assert got["a<-j"] == "TARGET-A" and got["b<-j"] == "TARGET-B"
    assert "a<-num" not in got


# --- rejected proposals: cleared when the prompt changes; per-node outcome recorded ---------

def _halfway_responder(final_prompts: list[str]):
    """'final' is right on even-numbered questions once its prompt says IMPROVED; update
    calls for 'final' return the given prompts in order (others keep their prompt)."""
    queue = list(final_prompts)

    def responder(request):
        if request.purpose == "forward" and request.meta.get("output_node"):
            task, question = request.user_text.split("## Inputs", 1)
            n = int(re.search(r"has (\d+) apples", question).group(1))
            right = "IMPROVED" in task and n % 2 == 0
            return f"<output>{2 * n + 3 if right else 0}</output>"
        if request.purpose == "update":
            if request.meta["node"] == "final" and queue:
                return f"<prompt>{queue.pop(0)}</prompt>"
            return f"<prompt>{request.meta['prompt']}</prompt>"
        return notes(request)
    return responder


def test_rejected_proposals_are_cleared_once_the_prompt_changes(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    backend = ScriptedBackend(responder=_halfway_responder(
        ["REJECTED-ONE", "Solve it. IMPROVED", "Solve it. IMPROVED twice"]))
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, backend, steps=3, failures_per_step=1)
    assert rows(db, "SELECT step, accepted FROM steps ORDER BY step") == [
        (0, False), (1, False), (2, True), (3, False)]
    finals = [r.user_text for r in backend.requests
              if r.purpose == "update" and r.meta["node"] == "final"]
    assert len(finals) == 3
    assert "REJECTED-ONE" in finals[1]  # step 2: still the prompt it was rejected for
    assert "REJECTED-ONE" not in finals[2]  # step 3: the prompt changed at step 2
    reasons = rows(db, "SELECT step, reject_reason FROM updates WHERE node_id = 'final' "
                       "ORDER BY step")
    assert reasons[0][0] == 1 and reasons[0][1].startswith("rejected jointly: the candidate "
                                                           "scored 0")
    assert reasons[1] == (2, None)
    assert rows(db, "SELECT count(*) FROM updates WHERE node_id <> 'final' AND "
                    "reject_reason IS NOT NULL") == [(0,)]  # unchanged prompts: no outcome


def test_reject_reason_names_the_edit_alone_when_a_node_gate_scored_it():
    from engine.core.optimizer import reject_reason
    assert reject_reason(False, 0.5, 0.4, None) is None
    assert reject_reason(True, 0.5, 0.4, None) == (
        "rejected jointly: the candidate scored 0.4, not above 0.5")
    assert reject_reason(True, 0.5, 0.4, 0.6).endswith(
        "this edit alone scored 0.6 (an improvement on its own)")


# --- the joint backward call shows the node's own output, its siblings and the fields -------


def _final_backward_calls(tmp_path, method: str, prompts: str = "default", responder=notes):
    graph = write_graph(tmp_path, DIAMOND, arithmetic_rows())
    backend = ScriptedBackend(responder=responder)
    db = tmp_path / f"{method}-{prompts}.duckdb"
    run_engine(graph, db, backend, steps=1, failures_per_step=1, method=method, prompts=prompts)
    calls = [r for r in backend.requests if r.purpose == "backward"
             and r.meta["node"] == "final" and not r.meta["role"].endswith("_repair")]
    return calls, db


def test_joint_call_shows_own_output_every_sibling_and_the_examples_fields(tmp_path):
    (call,), db = _final_backward_calls(tmp_path, "semantic")
    (example, output), = rows(db, "SELECT example_id, output_text FROM node_outputs WHERE "
                                  "step = 1 AND split = 'train' AND node_id = 'final' AND "
                                  "example_id IN (SELECT example_id FROM gradients)")
    n = int(example.removeprefix("q"))
    text = call.user_text
    assert f"<output>\n{output}\n</output>" in text  # the node's own output
    for sibling in ("a", "b", "c"):
        assert f"NOTE-{sibling}-{n}\n" in text  # every sibling, for THIS example
    assert f"Tom has {n} apples" in text  # the example's fields
    assert "Solve the problem." in text and 'The expected output is: "' in text


TASKS = {"a": "Find the first quantity.", "b": "Find the second quantity.",
         "c": "Find the operation."}


def _tasks_shown(text: str) -> dict[str, str]:
    return dict(re.findall(r'<task of="([^"]+)">\n(.*?)\n</task>', text, flags=re.S))


def test_a_backward_call_shows_what_the_step_behind_each_asked_input_was_told(tmp_path):
    # the joint call: every sibling's task (a gradient can say which step was asked for the
    # wrong thing); a per-input call (TextGrad, the ablation): only its own input's task
    (joint,), _ = _final_backward_calls(tmp_path, "semantic")
    assert _tasks_shown(joint.user_text) == TASKS
    assert "The inputs written by earlier steps (a, b, c) were written with these tasks:" \
        in joint.user_text
    for method in ("semantic-nosibling", "textgrad"):
        calls, _ = _final_backward_calls(tmp_path, method)
        shown = sorted(tuple(_tasks_shown(c.user_text).items()) for c in calls)
        assert shown == [((n, t),) for n, t in sorted(TASKS.items())], method
    # the example's field has no step behind it: no task block for `question`
    assert 'task of="question"' not in joint.user_text


def _context_free(text: str) -> str:
    """The call with the shown inputs (and the tasks of the steps that wrote them), the
    asked-about names and the reply format (text blocks or a JSON shape,
    engine/prompts/structured.py) taken out."""
    text = text[:text.index("\nAnswer with")]
    text = re.sub(r'<input name="[^"]+">\n.*?\n</input>\n?', "", text, flags=re.S)
    text = re.sub(r'<task of="[^"]+">\n.*?\n</task>\n?', "", text, flags=re.S)
    return re.sub(r"\(([a-z_, ]+)\)", "(NAMES)", text)


def test_ablations_differ_from_semantic_only_in_the_context_they_show(tmp_path):
    (joint,), _ = _final_backward_calls(tmp_path, "semantic")
    per_input = {m: _final_backward_calls(tmp_path, m)[0]
                 for m in ("semantic-nosibling", "textgrad", "textgrad-lib")}
    for method, calls in per_input.items():
        assert len(calls) == 3, method  # one call per predecessor
        for call in calls:
            assert call.messages[0] == joint.messages[0], method  # same system message
            assert _context_free(call.user_text) == _context_free(joint.user_text), method
    shown = {m: [re.findall(r'<input name="([^"]+)">', c.user_text) for c in calls]
             for m, calls in per_input.items()}
    assert re.findall(r'<input name="([^"]+)">', joint.user_text) == ["question", "a", "b", "c"]
    assert sorted(shown["semantic-nosibling"]) == [["question", "a"], ["question", "b"],
                                                   ["question", "c"]]
    assert sorted(shown["textgrad"]) == [["a"], ["b"], ["c"]]
    assert shown["textgrad-lib"] == [["question", "a", "b", "c"]] * 3


def test_evaluative_differs_from_semantic_only_in_its_question(tmp_path):
    (joint,), _ = _final_backward_calls(tmp_path, "semantic")
    (evaluative,), _ = _final_backward_calls(tmp_path, "semantic-evaluative")
    assert evaluative.meta["role"] == "backward_evaluative"
    diff = [(x, y) for x, y in zip(joint.user_text.splitlines(),
                                   evaluative.user_text.splitlines()) if x != y]
    assert len(diff) == 1
    assert "explain how that input should change" in diff[0][0]
    assert "comment on the quality of that input" in diff[0][1]


# --- the paper's prompt set ------------------------------------------------------------------

def test_paper_prompt_set_follows_the_reference_structure(tmp_path):
    def responder(request):
        if request.purpose == "backward":
            return "Hint 1: GRAD-FIRST\nHint 2: GRAD-SECOND\nHint 3: GRAD-THIRD"
        return notes(request)

    (call,), db = _final_backward_calls(tmp_path, "semantic", "paper", responder)
    assert [role for role, _ in call.messages] == ["user"]  # no system message
    text = call.user_text
    order = [text.index(h) for h in ("Task:", "Question:", "Hints:", "Output the step gave:",
                                     "Feedback on that output:", '"Hint i"')]
    assert order == sorted(order)
    assert re.search(r"1\. NOTE-a-\d+\n\s+2\. NOTE-b-\d+\n\s+3\. NOTE-c-\d+", text)
    got = dict(rows(db, "SELECT node_id, content FROM gradients WHERE from_node_id = 'final'"))
    assert got == {"a": "GRAD-FIRST", "b": "GRAD-SECOND", "c": "GRAD-THIRD"}


def test_paper_prompt_set_forward_and_update_calls(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    backend = ScriptedBackend(responder=notes)
    run_engine(graph, tmp_path / "r.duckdb", backend, steps=1, failures_per_step=1,
               prompts="paper")
    final = next(r for r in backend.requests if r.purpose == "forward"
                 and r.meta["node"] == "final")
    assert [role for role, _ in final.messages] == ["user"]
    text = final.user_text
    order = [text.index(h) for h in ("Context:", "Use these hints:", "Task:",
                                     "Reason step by step", "<output>")]
    assert order == sorted(order)
    update = next(r for r in backend.requests if r.purpose == "update")
    assert 'must not use the word "feedback"' in update.user_text
    assert "## Example 1" in update.user_text and "My output:" in update.user_text


def test_paper_evaluative_mode_frames_the_request_with_examples(tmp_path):
    (call,), _ = _final_backward_calls(tmp_path, "semantic-evaluative", "paper")
    system = call.messages[0]
    assert system[0] == "system" and "NOT allowed" in system[1] and "allowed:" in system[1]
    assert '"Hint i: This hint"' in call.user_text


def test_unknown_prompt_set_is_refused(tmp_path):
    import pytest

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    with pytest.raises(ValueError, match="unknown prompt set 'papers'"):
        run_engine(graph, tmp_path / "r.duckdb", steps=0, prompts="papers")


# --- no node reads the answer ----------------------------------------------------------------

def _leaky(dataset: str, target: str, field: str) -> str:
    return f"""
name: leaky
dataset: {dataset}
input_fields: [question, {field}]
target_field: {target}
metric: auto
nodes:
  - {{id: hint, prompt: Think., inputs: [question]}}
  - {{id: final, prompt: Solve., inputs: [question, hint, {field}], output: true}}
"""


def test_validate_refuses_a_node_that_reads_the_answer_naming_it():
    import pytest

    from engine.core.graph import GraphError, parse_graph

    cases = [("data.jsonl", "answer", "answer", "the target field"),
             ("gsm8k/train", "answer", "solution", "holds the answer or label"),
             ("liar", "is_lie", "label", "holds the answer or label"),
             ("bbh/navigate", "target", "target", "the target field")]
    for dataset, target, field, what in cases:
        with pytest.raises(GraphError) as caught:
            parse_graph(_leaky(dataset, target, field), "leaky.yaml")
        message = str(caught.value)
        assert message.startswith("leaky.yaml:9: node 'final': ")
        assert f"input '{field}'" in message and what in message
    parse_graph(_leaky("data.jsonl", "answer", "notes"), "fine.yaml")  # any other field


def test_cli_validate_prints_one_error_line_for_a_leaky_graph(tmp_path, capsys):
    from engine.cli import main

    path = tmp_path / "leaky.yaml"
    path.write_text(_leaky("gsm8k", "answer", "solution"), encoding="utf-8")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "node 'final'" in err[0]


# --- the gate scores candidates on validation, and nothing else ------------------------------

def _split_ids(graph, **sizes) -> dict[str, set[str]]:
    from engine.core.graph import load_graph
    from engine.runs.execute import RunConfig, load_splits

    splits = load_splits(RunConfig(graph=str(graph), **sizes), load_graph(graph))
    return {name: {e.id for e in examples} for name, examples in splits.by_name().items()}


def _right_on(ids: set[str], marker: str):
    """'final' answers right on the examples in `ids` once its prompt holds `marker`;
    update calls for 'final' return the prompt with `marker` appended."""
    def responder(request):
        if request.purpose == "forward" and request.meta.get("output_node"):
            task, question = request.user_text.split("## Inputs", 1)
            n = int(re.search(r"has (\d+) apples", question).group(1))
            right = marker in task and f"q{n}" in ids
            return f"<output>{2 * n + 3 if right else 0}</output>"
        if request.purpose == "update":
            if request.meta["node"] == "final":
                return f"<prompt>{request.meta['prompt']} {marker}</prompt>"
            return f"<prompt>{request.meta['prompt']}</prompt>"
        return notes(request)
    return responder


def test_gate_accepts_a_candidate_that_improves_validation_only(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    ids = _split_ids(graph, train=6, val=6, test=0)
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, ScriptedBackend(responder=_right_on(ids["val"], "VALWIN")),
               steps=1, failures_per_step=1)
    assert rows(db, "SELECT step, train_score, val_score, accepted FROM steps ORDER BY step") \
        == [(0, 0.0, 0.0, False), (1, 0.0, 1.0, True)]


def test_gate_rejects_a_candidate_that_improves_training_only(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    ids = _split_ids(graph, train=6, val=6, test=0)
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, ScriptedBackend(responder=_right_on(ids["train"], "TRAINWIN")),
               steps=2, failures_per_step=1)
    assert rows(db, "SELECT step, accepted FROM steps ORDER BY step") == [
        (0, False), (1, False), (2, False)]
    assert rows(db, "SELECT DISTINCT val_after FROM updates WHERE node_id = 'final'") == [(0.0,)]


def test_every_split_sees_only_its_own_examples_and_test_only_at_the_end(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    ids = _split_ids(graph, train=6, val=6, test=8)
    db = tmp_path / "r.duckdb"
    backend = ScriptedBackend(responder=notes)
    run_engine(graph, db, backend, steps=2, test=8, failures_per_step=2)
    seen: dict[tuple[int, str], set[str]] = {}
    for step, split, example in rows(db, "SELECT step, split, example_id FROM node_outputs"):
        seen.setdefault((step, split), set()).add(example)
    for (step, split), examples in seen.items():
        assert examples == ids[split], (step, split)  # each pass: its whole split, only it
        assert split != "test" or step == 2  # the test split once, after the last step
    assert {k for k in seen if k[1] == "train"} == {(0, "train"), (1, "train"), (2, "train")}
    grads = {e for (e,) in rows(db, "SELECT DISTINCT example_id FROM gradients")}
    assert grads and grads <= ids["train"]  # back-propagated: training failures only
    losses = rows(db, "SELECT split, example_id FROM losses")
    assert all(e in ids[s] for s, e in losses)
    held_out = [f"Tom has {e.removeprefix('q')} apples" for e in ids["test"] | ids["val"]]
    for request in backend.requests:
        if request.purpose in ("backward", "update"):
            assert not any(q in request.user_text for q in held_out)


# --- failure sampling follows the seed -------------------------------------------------------

def test_failure_sampling_is_seeded_by_seed_and_step():
    from engine.core.optimizer import sample_failures
    from engine.events import LossRecord

    losses = [LossRecord("r", 1, "train", f"e{i}", "", "", 0.0, "") for i in range(30)]
    losses[3] = LossRecord("r", 1, "train", "e3", "", "", 1.0, "")  # solved: never sampled
    losses[5] = LossRecord("r", 1, "train", "e5", "", "", 0.0, "", error="boom")  # failed
    picks = {seed: tuple(sample_failures(losses, 2, seed, 1)) for seed in range(8)}
    assert all(p == tuple(sample_failures(losses, 2, seed, 1)) for seed, p in picks.items())
    assert len(set(picks.values())) >= 6  # the seed changes the sample
    assert sample_failures(losses, 2, 0, 1) != sample_failures(losses, 2, 0, 2)  # and the step
    assert all(3 not in p and 5 not in p for p in picks.values())
    assert all(len(p) == 2 and list(p) == sorted(p) for p in picks.values())


def test_a_run_samples_failures_by_its_seed(tmp_path):
    import asyncio

    from engine.core.graph import load_graph
    from engine.runs.execute import RunConfig, execute, load_splits

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    splits = load_splits(RunConfig(graph=str(graph), train=20, val=4, test=0),
                         load_graph(graph))  # the same splits for every seed

    def sampled(seed: int, name: str) -> tuple[str, ...]:
        db = tmp_path / f"{name}.duckdb"
        config = RunConfig(graph=str(graph), db=str(db), backend="scripted", steps=1,
                           seed=seed, failures_per_step=2)
        asyncio.run(execute(config, forward_backend=ScriptedBackend(responder=notes),
                            splits=splits))
        return tuple(e for (e,) in rows(db, "SELECT DISTINCT example_id FROM gradients "
                                            "ORDER BY 1"))

    first = sampled(0, "a")
    assert len(first) == 2 and first == sampled(0, "b")
    assert len({first, *(sampled(s, f"s{s}") for s in (1, 2, 3))}) >= 3


def test_paper_prompt_set_repairs_missing_hint_lines_by_their_positions(tmp_path):
    def responder(request):
        if request.meta.get("role") == "backward_joint_repair":
            return "Hint 2: SECOND\nHint 3: THIRD"
        if request.purpose == "backward":
            return "Hint 1: FIRST"
        return notes(request)

    graph = write_graph(tmp_path, DIAMOND, arithmetic_rows())
    backend = ScriptedBackend(responder=responder)
    db = tmp_path / "r.duckdb"
    run_engine(graph, db, backend, steps=1, failures_per_step=1, prompts="paper")
    (repair,) = [r for r in backend.requests if r.meta.get("role") == "backward_joint_repair"]
    assert "no line for Hint 2, Hint 3" in repair.messages[-1][1]
    got = dict(rows(db, "SELECT node_id, content FROM gradients WHERE from_node_id = 'final'"))
    assert got == {"a": "FIRST", "b": "SECOND", "c": "THIRD"}
