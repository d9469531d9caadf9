"""Structured replies: the schema of each reply role, the instruction restated as
JSON, JSON replies read without a fallback, the scripted backend's schema-valid replies,
and llm_calls.constrained in the run log."""

from __future__ import annotations

import json

import duckdb
import pytest

from engine.llm.schema import token_budget
from engine.methods.gtbp import (
    GTBP,
    GTBP_COMBINE,
    GTBP_INPUT,
    parse_claims_reply,
    parse_inferred_input,
    parse_target,
)
from engine.prompts import structured as S
from engine.prompts import templates as P
from tests.support.graphs import TWO_HINTS, arithmetic_rows, run_engine, write_graph
from tests.support.json_schema import assert_follows

NAMES = ["hint_a", "hint_b"]


def with_claims(names):
    """Each input's gradient, then its boolean `asks_change` field."""
    return [f for n in names for f in (n, f"asks_change_{n}")]


@pytest.mark.parametrize("role, names, answer", [
    ("backward_joint", NAMES, with_claims(NAMES)),
    ("backward_evaluative", NAMES, with_claims(NAMES)),
    ("backward_single", ["hint_a"], with_claims(["hint_a"])),
    ("backward_nosibling", ["hint_a"], with_claims(["hint_a"])),
    ("backward_textgrad_lib", ["hint_a"], with_claims(["hint_a"])),
    ("backward_joint_repair", ["hint_b"], with_claims(["hint_b"])),
    ("update", [], ["output_wanted", "prompt"]),
    ("gtbp_combine", [], ["target"]),
    ("gtbp_input", ["question", "hint_a"], ["question", "hint_a"]),
    ("gtbp_update", [], ["claims"]),
])
def test_each_role_has_a_schema_with_reasoning_first_then_its_answer_fields(role, names, answer):
    schema = S.schema_for(role, names)
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert list(schema["properties"]) == ["reasoning", *answer]
    assert schema["required"] == ["reasoning", *answer]
    for key, field in schema["properties"].items():
        if field["type"] == "string":
            assert 1 <= field.get("minLength", 1) <= field["maxLength"], key
        elif key.startswith("asks_change_"):
            assert field == {"type": "boolean"}
        else:
            assert field["type"] == "array" and field["items"]["maxLength"] > 0
    assert token_budget(schema) > 0


# Reasoning the embedded optimizer (Qwen2.5-Coder-1.5B) wrote, as recorded in the run log:
# a backward call's and an update call's, on the attribution benchmark's chain4 graph
RECORDED_REASONING = {
    "backward_joint": (
        "The original output 'The person feels content and satisfied with their apples.' does "
        "not match the expected output '43'. The original output is a string, while the "
        "expected output is a number. To satisfy the feedback, the input should be changed to "
        "'The person feels content and satisfied with their apples.' to produce the expected "
        "output '43'."),
    "update": (
        "The current prompt does not specify what the output should be. The feedback suggests "
        "that the output should be 'The person feels content and satisfied with their "
        "apples.' This is a more specific and meaningful output than the current prompt, "
        "which only repeats the input. To improve the prompt, we should ask for the person's "
        "feelings about the apples, which is a more natural and meaningful output."),
}


@pytest.mark.parametrize("role, names, answer", [
    ("backward_joint", ["relay"], {"relay": "Carry the number of apples.",
                                   "asks_change_relay": True}),
    ("update", [], {"output_wanted": "the number of apples",
                    "prompt": "Write the number of apples the person has."}),
])
def test_the_reasoning_field_holds_the_few_sentences_the_optimizer_writes(role, names, answer):
    """A constrained reply must close its reasoning string at the schema's bound: too short a
    bound stops the model mid-sentence and the fields after it are written without the end
    of the thought (at 240 characters, 29% of the 1.5B's backward and 57% of its update
    replies on the attribution graphs were cut)."""
    reasoning = RECORDED_REASONING[role]
    assert len(reasoning) > 300
    assert_follows(S.schema_for(role, names), json.dumps({"reasoning": reasoning, **answer}))


def test_roles_that_stay_text_have_no_schema():
    for role in ("forward", "judge", "probe_rewrite", "backward_joint"):
        assert S.schema_for(role, []) is None  # a backward call with no input asks nothing


def test_an_input_called_reasoning_keeps_its_own_field():
    schema = S.schema_for("backward_joint", ["reasoning", "hint"])
    assert list(schema["properties"]) == ["reasoning_", "reasoning", "asks_change_reasoning",
                                          "hint", "asks_change_hint"]
    text = S.reply_text(json.dumps({"reasoning_": "why", "reasoning": "R", "hint": "H"}),
                        "backward_joint", ["reasoning", "hint"])
    assert P.parse_gradients(text, ["reasoning", "hint"]) == (
        {"reasoning": "R", "hint": "H"}, None)


def _view(asked):
    return P.BackwardView("Solve it.", {"question": "Q?", "hint_a": "A", "hint_b": "B"},
                          frozenset({"question"}), "5", 'The expected output is: "7".', asked)


def role_messages():
    """Each role's real messages, as the engine renders them."""
    gtbp = GTBP()
    sample = [{"input": "Q?", "output": "5", "feedback": "Say 7."}]
    return {
        "backward_joint": (P.backward_messages(_view(NAMES)), NAMES),
        "update": (P.update_messages("final", "Solve it.", sample, []), []),
        "gtbp_combine": ([("user", GTBP_COMBINE.format(prompt="p", inputs="i", output="o",
                                                       targets="t"))], []),
        "gtbp_input": ([("user", GTBP_INPUT.format(
            prompt="p", inputs="i", output="o", target="t", fields="question", names="hint_a",
            blocks="\n".join(P.INPUT_BLOCK.format(name=n, value=f"the input {n} as it should be")
                             for n in ("question", "hint_a"))))], ["question", "hint_a"]),
        "gtbp_update": ([("user", gtbp.update_text("final", ["Solve it."], [], [], 1, True))], []),
    }


@pytest.mark.parametrize("role", list(role_messages()))
def test_the_text_format_instruction_is_restated_as_json(role):
    messages, names = role_messages()[role]
    restated, schema = S.prepare(messages, {"role": role, "inputs": names})
    text = restated[-1][1]
    assert S.JSON_ASK in text and schema is not None
    for field in schema["properties"]:
        assert f'- "{field}":' in text
    for tag in ("<gradient input=", "between <prompt>", "between <target>", "between <claims>",
                "the input hint_a as it should be\n</input>"):
        assert tag not in text, f"{role} still asks for {tag}"
    assert restated[:-1] == messages[:-1]  # only the instruction changed


def test_json_replies_read_without_a_fallback_and_never_swap_inputs():
    grads = S.reply_text('{"reasoning": "r", "hint_b": "about B", "hint_a": "about A"}',
                         "backward_joint", NAMES)
    assert P.parse_gradients(grads, NAMES) == ({"hint_a": "about A", "hint_b": "about B"}, None)
    prompt = S.reply_text('{"reasoning": "short", "prompt": "Solve carefully."}', "update")
    assert P.parse_prompt(prompt) == ("Solve carefully.", "short", None)
    assert parse_target(S.reply_text('{"reasoning": "r", "target": "T"}', "gtbp_combine")) \
        == ("T", None)
    inferred = S.reply_text('{"reasoning": "r", "question": "Q", "hint_a": "A2"}',
                            "gtbp_input", ["question", "hint_a"])
    assert parse_inferred_input(inferred, ["question", "hint_a"], {"question"}, {}) == (
        {"question": "Q", "hint_a": "A2"}, None)
    claims = S.reply_text('{"reasoning": "r", "claims": ["One.", "Two."]}', "gtbp_update")
    assert parse_claims_reply(claims) == (["One.", "Two."], "r", None)


def test_a_json_reply_missing_an_input_leaves_it_to_the_text_rules():
    text = S.reply_text('{"reasoning": "r", "hint_a": "about A", "hint_b": ""}',
                        "backward_joint", NAMES)
    grads, problem = P.parse_gradients(text, NAMES)
    assert grads == {"hint_a": "about A", "hint_b": ""} and "hint_b" in problem


def test_text_replies_pass_through_unchanged():
    reply = '<gradient input="hint_a">x</gradient>'
    assert S.reply_text(reply, "backward_joint", NAMES) == reply
    assert S.reply_text("{not json", "update") == "{not json"


def _calls(db):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT purpose, constrained, response, messages FROM llm_calls "
                           "ORDER BY started_at").fetchall()


@pytest.mark.parametrize("method", ["semantic", "textgrad", "semantic-evaluative",
                                    "semantic-nosibling", "textgrad-lib", "gtbp"])
def test_scripted_runs_send_schemas_and_get_schema_valid_json(tmp_path, method):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, steps=1, method=method)
    assert result.status == "finished"
    calls = _calls(db)
    optimizer = [c for c in calls if c[0] in ("backward", "update")]
    assert optimizer and all(c[1] is True for c in optimizer)
    assert all(c[1] is False for c in calls if c[0] == "forward")
    for _, _, response, messages in optimizer:
        assert S.JSON_ASK in json.loads(messages)[-1]["content"]
        assert S.decode(response) is not None, response
    with duckdb.connect(str(db), read_only=True) as con:
        problems = con.execute("SELECT count(*) FROM gradients WHERE parse_error IS NOT NULL "
                               "AND kind = 'gradient'").fetchone()[0]
        updates = con.execute("SELECT count(*), count(parse_error) FROM updates").fetchone()
    assert problems == 0 and updates[0] > 0
    if method != "gtbp":  # gtbp notes its budget enforcement in parse_error
        assert updates[1] == 0


SHARED_FACTS = """
name: shared-facts
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
nodes:
  - {id: facts, prompt: List the facts., inputs: [question]}
  - {id: hint_a, prompt: Work out a step., inputs: [question, facts]}
  - {id: hint_b, prompt: Work out a step., inputs: [question, facts]}
  - {id: final, prompt: Solve the problem., inputs: [question, hint_a, hint_b], output: true}
"""


def test_scripted_replies_follow_each_schema(tmp_path):
    from engine.llm.scripted import ScriptedBackend, structured_reply

    graph = write_graph(tmp_path, SHARED_FACTS, arithmetic_rows())
    backend = ScriptedBackend()
    run_engine(graph, tmp_path / "runs.duckdb", backend, steps=1, method="gtbp")
    run_engine(graph, tmp_path / "runs.duckdb", backend, steps=1)
    seen = set()
    for request in backend.requests:
        if request.schema is not None:
            assert_follows(request.schema, structured_reply(request, backend._default(request)))
            seen.add(S.base_role(request.meta["role"]))
    assert {"backward_joint", "update", "gtbp_combine", "gtbp_input", "gtbp_update"} <= seen


def test_structured_off_sends_text_formats_and_logs_unconstrained(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    run_engine(graph, db, steps=1, structured="off")
    optimizer = [c for c in _calls(db) if c[0] in ("backward", "update")]
    assert optimizer and all(c[1] is False for c in optimizer)
    assert all(S.JSON_ASK not in json.loads(c[3])[-1]["content"] for c in optimizer)
    assert all(S.decode(c[2]) is None for c in optimizer)


def test_canned_text_replies_still_reach_the_text_parsers(tmp_path):
    from engine.llm.scripted import ScriptedBackend

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    backend = ScriptedBackend(replies={"update": "Better: <prompt>Solve it step by step.</prompt>"})
    run_engine(graph, db, backend, steps=1)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT u.new_prompt, u.parse_error, c.constrained FROM updates u "
                           "JOIN llm_calls c USING (call_id)").fetchall()
    assert rows and all(r == ("Solve it step by step.", None, False) for r in rows)


def test_every_method_declares_reply_roles_that_have_a_json_shape():
    from engine.methods import METHODS

    for name, method in METHODS.items():
        roles = method.reply_roles()
        assert roles, name
        for role in roles:
            assert S.shape_for(role) is not None, (name, role)
            assert S.schema_for(role, ["a", "b"]) is not None, (name, role)
    assert set(METHODS["gtbp"].reply_roles()) == {"gtbp_combine", "gtbp_input", "gtbp_update"}


def test_a_backward_reply_states_per_input_whether_it_should_change():
    reply = json.dumps({"reasoning": "why", "hint_a": "Fine.", "asks_change_hint_a": False,
                        "hint_b": "Add units.", "asks_change_hint_b": True})
    assert S.reply_claims(reply, NAMES) == {"hint_a": False, "hint_b": True}
    assert S.reply_claims('<gradient input="hint_a">x</gradient>', NAMES) == {}
    assert "asks_change_hint_a" in S.example_reply("backward_joint", NAMES)


def test_a_prompt_field_that_repeats_the_prompt_tag_parses_to_the_prompt_alone():
    """Qwen2.5-Coder writes '<prompt>' into the JSON field the update reply's <prompt>
    block is built from; the new prompt must not keep the tag."""
    reply = json.dumps({"reasoning": "It should ask for the number.",
                        "prompt": "<prompt>Write the number the text counts.</prompt>"})
    text = S.reply_text(reply, "update")
    prompt, reasoning, problem = P.parse_prompt(text)
    assert (prompt, problem) == ("Write the number the text counts.", None)
    assert reasoning == "It should ask for the number."
    half = json.dumps({"reasoning": "r", "prompt": "<prompt>\nCopy the number."})
    assert P.parse_prompt(S.reply_text(half, "update"))[0] == "Copy the number."
