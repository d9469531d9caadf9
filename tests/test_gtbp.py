"""GTBP through the real engine under the scripted backend: the prompts it sends, the
targets it logs, the claim budget it enforces, and that it is deterministic."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.llm.scripted import ScriptedBackend
from engine.methods import METHODS, make_method
from engine.methods.gtbp import (
    ADD_FORBIDDEN,
    GTBP,
    edit_budget,
    enforce_budget,
    may_add_claim,
    parse_claims_reply,
    parse_inferred_input,
    parse_target,
    split_claims,
)
from engine.runs import execute as engine_run
from engine.runs.execute import RunConfig
from tests.support.runlog import rows

ROOT = Path(__file__).resolve().parents[1]

CHAIN = """name: chain
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: exact_match
nodes:
  - id: draft
    prompt: Write a draft answer.
    inputs: [question]
  - id: final
    prompt: Give the final answer. Be brief. Use the draft.
    inputs: [question, draft]
    output: true
"""

FAN_IN = """name: fan_in
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: exact_match
nodes:
  - {id: p1, prompt: First view., inputs: [question]}
  - {id: p2, prompt: Second view., inputs: [question]}
  - {id: p3, prompt: Third view., inputs: [question]}
  - {id: out, prompt: Decide from the three views., inputs: [p1, p2, p3], output: true}
"""

FAN_OUT = """name: fan_out
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: exact_match
splits: {train: 4, val: 4}
nodes:
  - {id: n, prompt: Extract the facts., inputs: [question]}
  - {id: s1, prompt: Reason forwards from the facts., inputs: [n]}
  - {id: s2, prompt: Reason backwards from the facts., inputs: [n]}
  - {id: f, prompt: Answer., inputs: [question, s1, s2], output: true}
"""

FUNCTION_OUT = """name: fn
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: exact_match
nodes:
  - {id: a, prompt: Work it out., inputs: [question]}
  - {id: pick, kind: function, function: first_line, inputs: [a], output: true}
"""


def _write(tmp_path: Path, graph: str) -> Path:
    rows = [{"id": f"q{i}", "question": f"question number {i}", "answer": f"ans-{i}"}
            for i in range(8)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    path = tmp_path / "graph.yaml"
    path.write_text(graph)
    return path


def _role(request) -> str:
    return request.meta.get("role", "")


def wrong_forward(request) -> str | None:
    """Every forward output is wrong, so every train example fails and gets sampled."""
    if request.purpose == "forward":
        return f"<output>out-of-{request.meta['node']}</output>"
    return None


def _run(tmp_path: Path, graph: str, responder=wrong_forward, steps: int = 2,
         options: dict | None = None, db: str = "r.duckdb", cache: str = "off"):
    backend = ScriptedBackend(responder=responder)
    config = RunConfig(graph=str(_write(tmp_path, graph)), backend="scripted", method="gtbp",
                       steps=steps, train=4, val=4, db=str(tmp_path / db), cache=cache,
                       run_id="gtbp-test", method_options=options or {})
    result = asyncio.run(engine_run.execute(config, forward_backend=backend))
    assert result.status == "finished"
    return backend, config.db




def _gradients(db: str) -> list[tuple]:
    return rows(db, "SELECT step, example_id, node_id, from_node_id, kind, content, "
                     "parse_error FROM gradients ORDER BY ALL")


# --- the schedule ----------------------------------------------------------------------


def test_schedule_follows_m0_m_plus_m_minus_exactly():
    method = GTBP(m0=3, m_plus=2, m_minus=2)
    assert [method.edit_budget(t) for t in range(1, 9)] == [3, 3, 2, 2, 1, 1, 1, 1]
    assert [method.may_add_claim(t) for t in range(1, 7)] == [False, True] * 3
    assert [edit_budget(t, 2, 1) for t in range(1, 5)] == [2, 1, 1, 1]
    assert [may_add_claim(t, 3) for t in range(1, 7)] == [False, False, True] * 2
    with pytest.raises(ValueError):
        edit_budget(0, 2, 2)


@pytest.mark.parametrize("options", [{"m0": 0}, {"m_plus": -1}, {"m_minus": "2"},
                                     {"max_claims": True}])
def test_options_must_be_positive_whole_numbers(options):
    with pytest.raises(ValueError, match="gtbp option"):
        make_method("gtbp", **options)


def test_registered():
    assert METHODS["gtbp"] is GTBP
    method = make_method("gtbp", m0=4, m_plus=3, m_minus=5, max_claims=6)
    assert (method.m0, method.m_plus, method.m_minus, method.max_claims) == (4, 3, 5, 6)


def test_defaults_follow_the_paper_no_cap_no_deletion():
    method = make_method("gtbp")
    assert method.max_claims is None and method.allow_delete is False
    assert make_method("gtbp", allow_delete="true").allow_delete is True  # --option form
    with pytest.raises(ValueError, match="gtbp option allow_delete"):
        make_method("gtbp", allow_delete="maybe")


def test_schedule_makes_the_edited_share_fall_like_one_over_t():
    # with the paper's defaults the list only grows, one claim every m_plus steps, while
    # at most edit_budget(t) <= m0 claims change: the edited share is O(1/t)
    for m0, m_plus, m_minus in [(2, 2, 2), (3, 1, 2), (4, 3, 1)]:
        method = GTBP(m0=m0, m_plus=m_plus, m_minus=m_minus)
        claims = 1
        for t in range(1, 200):
            budget = method.edit_budget(t)
            assert 1 <= budget <= m0 and budget <= method.edit_budget(max(1, t - 1))
            claims += method.may_add_claim(t)
            assert budget / claims <= (m0 * m_plus) / t + 1e-9, (t, budget, claims)


# --- parsers ---------------------------------------------------------------------------


def test_claims_parsing():
    assert split_claims("Be brief. Use the draft!  Check it?") == [
        "Be brief.", "Use the draft!", "Check it?"]
    assert split_claims("Rules:\n- one\n  more of one\n2) two\n* three") == [
        "Rules:", "one more of one", "two", "three"]
    claims, _, problem = parse_claims_reply("why\n<claims>\n- a\n- b\n</claims>")
    assert claims == ["a", "b"] and problem is None
    claims, _, problem = parse_claims_reply("Here:\n1. a\n2. b")
    assert claims == ["a", "b"] and "no <claims> tags" in problem
    claims, _, problem = parse_claims_reply("I would not change anything.")
    assert claims is None and "unchanged" in problem


def test_target_and_inferred_input_fallbacks():
    assert parse_target("x <target> t </target>") == ("t", None)
    assert parse_target("just this")[1] == "no <target> tags: used the whole reply"
    values, problem = parse_inferred_input(
        '<input name="b">B</input>\nc: C text', ["q", "b", "c", "d"], {"q"},
        {"q": "Q", "b": "old"})
    assert values["q"] == "Q" and values["b"] == "B" and values["c"] == "C text"
    # with several predecessors, d never receives b's or c's block
    assert values["d"] == ""
    assert "'name:' label" in problem and "field q" in problem and "for d: no target" in problem
    values, problem = parse_inferred_input("only prose", ["q", "b"], {"q"}, {"q": "Q"})
    assert values == {"q": "Q", "b": "only prose"}  # the only predecessor: whole reply
    assert "no block for b: gave it the whole reply" in problem


def test_enforce_budget_counts_edits_removals_and_additions():
    current = ["A", "B", "C"]
    # edit A, remove B, add X and Y: four changes
    claims, kept, problem = enforce_budget(current, ["A2", "C", "X", "Y"], 2, True, 8,
                                           allow_delete=True)
    assert claims == ["A2", "C"] and kept == 2 and "over the edit budget of 2" in problem
    # deletion off (the paper's default): B stays, the edit and one addition are applied
    claims, kept, problem = enforce_budget(current, ["A2", "C", "X", "Y"], 2, True)
    assert claims == ["A2", "B", "C", "X"] and kept == 2
    assert "kept 1 claim(s) the proposal removed: deletion is off" in problem
    claims, kept, problem = enforce_budget(current, ["A", "B", "C", "X", "Y"], 3, True, 8)
    assert claims == ["A", "B", "C", "X"] and kept == 1 and "at most one" in problem
    claims, kept, problem = enforce_budget(current, ["A", "B", "C", "X"], 3, False, 8)
    assert claims == current and kept == 0 and "no claim may be added" in problem
    claims, kept, problem = enforce_budget(current, ["A", "B", "C", "X"], 3, True, 3)
    assert claims == current and kept == 0 and "max 3 claims" in problem
    claims, kept, problem = enforce_budget(current, ["A", "B", "C", "X"], 3, True, None)
    assert claims == ["A", "B", "C", "X"] and kept == 1 and problem is None  # no cap
    claims, kept, problem = enforce_budget(current, ["a ", "B", "C2"], 1, False, 8)
    assert claims == ["A", "B", "C2"] and kept == 1 and problem is None


# --- through the engine ----------------------------------------------------------------


def test_target_prompt_shows_prompt_input_output_and_target(tmp_path):
    def responder(request):
        if _role(request) == "gtbp_input":
            target = request.meta["target"]
            return (f'<input name="question">{request.meta["values"]["question"]}</input>\n'
                    f'<input name="draft">better draft for {target}</input>')
        return wrong_forward(request)

    backend, db = _run(tmp_path, CHAIN, responder, steps=1)
    calls = [r for r in backend.requests if _role(r) == "gtbp_input"]
    assert calls and {r.meta["node"] for r in calls} == {"final"}  # draft reads only fields
    for request in calls:
        text = request.user_text
        question = request.meta["values"]["question"]
        target = request.meta["target"]
        assert "Give the final answer. Be brief. Use the draft." in text
        assert f'<input name="question">\n{question}\n</input>' in text
        assert '<input name="draft">\nout-of-draft\n</input>' in text
        assert "<output>\nout-of-final\n</output>" in text
        assert f"<target>\n{target}\n</target>" in text and re.fullmatch(r"ans-\d", target)
        assert '<input name="draft">' in text.split("one block per input")[-1]
    rows = _gradients(db)
    for _, ex, node, src, kind, content, problem in rows:
        answer = f"ans-{ex[1:]}"
        assert problem is None
        if kind == "target" and node == "final":
            assert (src, content) == ("loss", answer)
        if kind == "target" and node == "draft":
            assert (src, content) == ("final", f"better draft for {answer}")
        if kind == "aggregate" and node == "draft":
            assert content == f"better draft for {answer}"
        if kind == "inferred_input":
            assert node == "final" and src is None
            assert f'<input name="draft">\nbetter draft for {answer}\n</input>' in content
    assert {r[4] for r in rows} == {"target", "aggregate", "inferred_input"}
    update = next(r for r in backend.requests if _role(r) == "gtbp_update"
                  and r.meta["node"] == "draft")
    assert re.search(r"<output>\nout-of-draft\n</output>\n<target>\nbetter draft for ans-\d",
                     update.user_text)


def test_each_predecessor_receives_its_own_part(tmp_path):
    def responder(request):
        if _role(request) == "gtbp_input":  # out of order on purpose
            return ('<input name="p3">part three</input><input name="p1">part one</input>'
                    '<input name="p2">part two</input>')
        return wrong_forward(request)

    backend, db = _run(tmp_path, FAN_IN, responder, steps=1)
    calls = [r for r in backend.requests if _role(r) == "gtbp_input"]
    assert len(calls) == 2  # one call per sampled example, for the node with predecessors
    assert all(r.meta["inputs"] == ["p1", "p2", "p3"] for r in calls)
    targets = [(n, src, c) for _, _, n, src, kind, c, _ in _gradients(db)
               if kind == "target" and src != "loss"]
    assert sorted(set(targets)) == [("p1", "out", "part one"), ("p2", "out", "part two"),
                                    ("p3", "out", "part three")]
    assert len(targets) == 6


def test_function_node_passes_its_target_through(tmp_path):
    backend, db = _run(tmp_path, FUNCTION_OUT, steps=1)
    assert not [r for r in backend.requests if _role(r) in ("gtbp_input", "gtbp_combine")]
    rows = [(n, src, kind, c, ex) for _, ex, n, src, kind, c, _ in _gradients(db)]
    passed = [r for r in rows if r[0] == "a" and r[2] == "target"]
    assert passed and all(src == "pick" and c == f"ans-{ex[1:]}" for _, src, _, c, ex in passed)


def test_two_successors_are_combined_in_one_call(tmp_path):
    def responder(request):
        role, node = _role(request), request.meta.get("node")
        if role == "gtbp_input" and node == "f":
            return ('<input name="question">Q</input><input name="s1">S1-target</input>'
                    '<input name="s2">S2-target</input>')
        if role == "gtbp_input":
            return f'<input name="n">from-{node}</input>'
        if role == "gtbp_combine":
            return "Both need the facts. <target>combined facts</target>"
        return wrong_forward(request)

    backend, db = _run(tmp_path, FAN_OUT, responder, steps=2)
    combines = [r for r in backend.requests if _role(r) == "gtbp_combine"]
    assert len(combines) == 4  # 2 steps x 2 sampled examples, one call each
    for request in combines:
        assert request.meta["node"] == "n" and request.meta["from"] == ["s1", "s2"]
        text = request.user_text
        assert "Extract the facts." in text and "<output>\nout-of-n\n</output>" in text
        assert text.index('<target from="s1">\nfrom-s1') < text.index('<target from="s2">\nfrom-s2')
    rows = _gradients(db)
    to_n = {(src, kind, c) for _, _, node, src, kind, c, _ in rows if node == "n"}
    assert to_n == {(None, "aggregate", "combined facts"), ("s1", "target", "from-s1"),
                    ("s2", "target", "from-s2")}
    assert not [r for r in rows if r[2] == "n" and r[4] == "inferred_input"]
    update = next(r for r in backend.requests if _role(r) == "gtbp_update"
                  and r.meta["node"] == "n")
    assert "<target>\ncombined facts\n</target>" in update.user_text


def test_claim_budget_is_enforced_each_step(tmp_path):
    def responder(request):
        if _role(request) == "gtbp_update" and request.meta["node"] == "final":
            return ("Rewrite everything.\n<claims>\n- Give only the final answer.\n"
                    "- Be very brief.\n- Quote the draft.\n- New one.\n- New two.\n</claims>")
        return wrong_forward(request)

    backend, db = _run(tmp_path, CHAIN, responder, steps=3,
                       options={"m0": 2, "m_plus": 2, "m_minus": 1})
    updates = [r for r in backend.requests if _role(r) == "gtbp_update"
               and r.meta["node"] == "final"]
    assert [(u.meta["budget"], u.meta["may_add"]) for u in updates] == [
        (2, False), (1, True), (1, False)]
    for u, budget in zip(updates, (2, 1, 1)):
        assert f"change at most {budget} claim(s)" in u.user_text
        assert "1. Give the final answer.\n2. Be brief.\n3. Use the draft." in u.user_text
    assert ADD_FORBIDDEN in updates[0].user_text and ADD_FORBIDDEN not in updates[1].user_text
    # step 1's proposal failed the gate, so step 2 is shown it as rejected
    assert '<rejected index="1">\n- Give only the final answer.\n- Be very brief.' in \
        updates[1].user_text
    proposals = rows(db, "SELECT step, new_prompt, parse_error FROM updates "
                         "WHERE node_id = 'final' ORDER BY step")
    assert proposals[0][1] == "- Give only the final answer.\n- Be very brief.\n- Use the draft."
    assert "over the edit budget of 2" in proposals[0][2] and \
        "no claim may be added" in proposals[0][2]
    for _, prompt, problem in proposals[1:]:
        assert prompt == "- Give only the final answer.\n- Be brief.\n- Use the draft."
        assert "over the edit budget of 1" in problem


def test_default_scripted_replies_are_well_formed_and_deterministic(tmp_path):
    _, db1 = _run(tmp_path, FAN_OUT, responder=None, steps=2, db="a.duckdb", cache="readwrite")
    _, db2 = _run(tmp_path, FAN_OUT, responder=None, steps=2, db="b.duckdb", cache="readwrite")
    grads = _gradients(db1)
    assert grads == _gradients(db2)
    assert {r[4] for r in grads} == {"target", "aggregate", "inferred_input"}
    assert all(r[6] is None for r in grads)  # the scripted replies parse cleanly
    versions = "SELECT node_id, version, prompt, step, accepted FROM prompt_versions ORDER BY ALL"
    assert rows(db1, versions) == rows(db2, versions)
    updates = rows(db1, "SELECT step, node_id, new_prompt, parse_error FROM updates ORDER BY ALL")
    assert updates == rows(db2, "SELECT step, node_id, new_prompt, parse_error FROM updates "
                                 "ORDER BY ALL")
    assert updates and all(p is None and n.startswith("- ") for _, _, n, p in updates)


def test_cli_runs_gtbp_end_to_end(tmp_path):
    graph = _write(tmp_path, FAN_OUT)
    db = tmp_path / "cli.duckdb"
    done = subprocess.run(
        [sys.executable, "-m", "engine", "run", str(graph), "--backend", "scripted",
         "--method", "gtbp", "--db", str(db), "--steps", "2", "--option", "m0=3",
         "--option", "m_minus=1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert rows(str(db), "SELECT DISTINCT method FROM gradients") == [("gtbp",)]
    config = json.loads(rows(str(db), "SELECT config FROM runs")[0][0])
    assert config["method_options"] == {"m0": 3, "m_minus": 1}
