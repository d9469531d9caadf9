"""The estimate's tokens come from the prompts the run will send (engine/runs/call_sizes.py):
templates rendered on the run's own examples, replies sized from max_tokens and from what
earlier runs of the graph recorded; a fork's estimate counts what the fork re-runs."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import duckdb
import pytest

from engine.core.graph import load_graph
from engine.events import StepFinished
from engine.llm.factory import default_model
from engine.llm.schema import token_budget
from engine.prompts.structured import schema_for
from engine.prompts.templates import forward_messages
from engine.runs.call_sizes import CHARS_PER_TOKEN, FIRST_REPLY, SCRIPTED_REPLY, measure_sizes
from engine.runs.estimate import duration, estimate_for, estimate_fork
from engine.runs.execute import RunConfig, execute, load_splits
from engine.runs.fork import plan_fork, run_fork
from tests.support.graphs import TWO_HINTS, arithmetic_rows, write_graph

ONE_NODE = """
name: one-node
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
answer_format: Give only the number.
nodes:
  - {id: solve, prompt: Solve the problem., inputs: [question], output: true, max_tokens: 40}
"""


def rows_of_length(n: int, chars: int) -> list[dict]:
    return [{"id": f"q{i}", "question": f"Q{i:03d} " + "x" * (chars - 5), "answer": str(i)}
            for i in range(n)]


def sizes_for(tmp_path, graph_text, rows, backend="scripted", **settings):
    config = RunConfig(graph=str(write_graph(tmp_path, graph_text, rows)), backend=backend,
                       db=str(tmp_path / "runs.duckdb"), **settings)
    graph = load_graph(config.graph)
    splits = load_splits(config, graph)
    return config, graph, splits, measure_sizes(graph, config, splits, "m")


@pytest.mark.parametrize("chars", [50, 800])
def test_forward_tokens_are_the_rendered_prompt_on_the_runs_own_examples(tmp_path, chars):
    _, _, splits, sizes = sizes_for(tmp_path, ONE_NODE, rows_of_length(30, chars), "openai",
                                    train=4, val=6, test=0)
    rendered = [sum(len(c) for _, c in forward_messages(
        "Solve the problem.", {"question": ex.fields["question"]}, "Give only the number."))
        for ex in splits.val]
    assert sizes.forward["val"].prompt == pytest.approx(
        sum(rendered) / len(rendered) / CHARS_PER_TOKEN)
    # the reply: no earlier run, so the default reply capped by the node's max_tokens
    assert sizes.forward["val"].completion == min(40, FIRST_REPLY["forward"]) == 40
    # the scripted backend's replies are known to be short
    scripted = sizes_for(tmp_path, ONE_NODE, rows_of_length(30, chars), train=4, val=6,
                         test=0)[3]
    assert scripted.forward["val"].completion == SCRIPTED_REPLY["forward"] < 40


def test_the_estimated_tokens_grow_with_the_examples_text(tmp_path):
    short = sizes_for(tmp_path, ONE_NODE, rows_of_length(30, 50), train=4, val=6, test=0)
    (tmp_path / "long").mkdir()
    long = sizes_for(tmp_path / "long", ONE_NODE, rows_of_length(30, 850), train=4, val=6,
                     test=0)
    # 800 more characters per question: 200 more prompt tokens per forward call
    assert long[3].forward["val"].prompt - short[3].forward["val"].prompt == pytest.approx(200)


def test_replies_are_sized_from_what_an_earlier_run_of_the_graph_recorded(tmp_path):
    config, graph, splits, before = sizes_for(tmp_path, TWO_HINTS, arithmetic_rows(), steps=1,
                                              train=6, val=6, test=0)
    assert before.forward["val"].completion == SCRIPTED_REPLY["forward"]
    asyncio.run(execute(config))
    after = measure_sizes(graph, config, splits, "scripted")
    with duckdb.connect(config.db, read_only=True) as con:
        per_node = con.execute("SELECT avg(completion_tokens) FROM llm_calls WHERE NOT "
                               "cache_hit AND purpose = 'forward' GROUP BY node_id").fetchall()
        backward = con.execute("SELECT avg(completion_tokens) FROM llm_calls WHERE NOT "
                               "cache_hit AND purpose = 'backward'").fetchone()[0]
    # the mean over the graph's nodes of each node's recorded mean reply
    assert after.forward["val"].completion == pytest.approx(
        sum(r[0] for r in per_node) / len(per_node))
    assert after.backward.completion == pytest.approx(backward)


def test_the_estimated_tokens_of_a_second_run_are_within_a_quarter(tmp_path):
    graph_path = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    first = RunConfig(graph=str(graph_path), backend="scripted", steps=2, train=12, val=12,
                      test=4, db=str(tmp_path / "runs.duckdb"))
    asyncio.run(execute(first))
    with duckdb.connect(first.db) as con:  # the second run pays for every call
        con.execute("DELETE FROM llm_cache")
    second = RunConfig(**{**first.__dict__, "seed": 1, "run_id": None})
    graph = load_graph(second.graph)
    estimate = estimate_for(second, graph, load_splits(second, graph))
    result = asyncio.run(execute(second))
    with duckdb.connect(second.db, read_only=True) as con:
        tokens = con.execute("SELECT sum(prompt_tokens + completion_tokens) FROM llm_calls "
                             "WHERE run_id = ? AND NOT cache_hit", [result.run_id]).fetchone()[0]
    assert abs(estimate.tokens() - tokens) <= 0.25 * tokens, (estimate.tokens(), tokens)


def test_a_forks_estimate_counts_only_the_nodes_its_edit_reaches(tmp_path):
    graph_path = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    config = RunConfig(graph=str(graph_path), backend="scripted", steps=2, train=8, val=8,
                       test=0, db=str(tmp_path / "runs.duckdb"), run_id="parent")
    asyncio.run(execute(config))
    plan = plan_fork(config.db, "parent", 1, {"final": "Solve it, then give the number."})
    estimate = estimate_fork(plan)
    phases = {p.name: p.expected for p in estimate.phases}
    # step 1's re-measure: only `final` reads the edited prompt; the hints are the parent's
    assert phases["step 1: train"] == 8 and phases["step 1: validation"] == 8
    result = asyncio.run(run_fork(plan))
    with duckdb.connect(config.db, read_only=True) as con:
        remeasured = con.execute("SELECT count(*) FROM llm_calls WHERE run_id = ? AND step = 1 "
                                 "AND NOT cache_hit", [result.run_id]).fetchone()[0]
        # a proposal the parent already tried (the scripted optimizer can repeat one) is
        # served from the parent's cache: the estimate counts every candidate call as paid
        repeated = con.execute(
            "SELECT count(*) FROM updates f JOIN updates p ON p.run_id = 'parent' "
            "AND p.node_id = f.node_id AND p.new_prompt = f.new_prompt "
            "WHERE f.run_id = ? AND f.step = 2", [result.run_id]).fetchone()[0] * 8
    assert remeasured == 16
    actual = result.stats.calls - result.stats.cache_hits
    assert abs(estimate.calls() - repeated - actual) <= 0.15 * actual, \
        (estimate.calls(), repeated, actual)


NOTE_ANSWER = """
name: note-answer
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
nodes:
  - {id: note, prompt: Write one word about the text., inputs: [question]}
  - {id: answer, prompt: Answer., inputs: [note], output: true}
"""


def one_word(request) -> str | None:
    """`note` writes the same word for every text, so `answer` (which reads only the note)
    sends one distinct request per pass, whatever the number of examples."""
    if request.purpose == "forward" and request.meta.get("node") == "note":
        return "<output>red</output>"
    return None


def test_requests_repeated_within_a_pass_are_estimated_once_after_a_run(tmp_path):
    from engine.llm.scripted import ScriptedBackend

    graph_path = write_graph(tmp_path, NOTE_ANSWER, arithmetic_rows())
    first = RunConfig(graph=str(graph_path), backend="scripted", steps=0, train=8, val=8,
                      test=0, db=str(tmp_path / "runs.duckdb"))
    asyncio.run(execute(first, forward_backend=ScriptedBackend(responder=one_word)))
    with duckdb.connect(first.db) as con:
        con.execute("DELETE FROM llm_cache")
    second = RunConfig(**{**first.__dict__, "seed": 1, "run_id": None})
    graph = load_graph(second.graph)
    splits = load_splits(second, graph)
    sizes = measure_sizes(graph, second, splits, "scripted")
    # per pass: note 8 distinct of 8, answer 1 of 8 (train and validation alike)
    assert sizes.distinct_share == pytest.approx(18 / 32)
    estimate = estimate_for(second, graph, splits)
    result = asyncio.run(execute(second, forward_backend=ScriptedBackend(responder=one_word)))
    # 32 calls without the history; the run made 17: answer's one request per pass is also
    # the same in train and validation (passes in flight together), which it does not count
    assert estimate.calls() == 18
    assert result.stats.calls - result.stats.cache_hits == 17


def test_a_local_models_time_is_estimated_at_its_measured_speed(tmp_path):
    graph_path = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    config = RunConfig(graph=str(graph_path), backend="scripted", steps=1, train=6, val=6,
                       test=0, db=str(tmp_path / "runs.duckdb"))
    asyncio.run(execute(config))
    with duckdb.connect(config.db) as con:  # as if its calls had run on the local model
        con.execute("UPDATE llm_calls SET backend = 'local', model = ?",
                    [default_model("local")])
        con.execute("UPDATE steps SET ended_at = started_at + 10 * (step + 1)")  # 10 s, 20 s
        completion = con.execute("SELECT sum(completion_tokens) FROM llm_calls WHERE NOT "
                                 "cache_hit").fetchone()[0]
    local = RunConfig(**{**config.__dict__, "backend": "local", "run_id": None})
    graph = load_graph(local.graph)
    estimate = estimate_for(local, graph, load_splits(local, graph))
    rate = 30 / completion  # seconds per generated token, as the logged steps took
    expected = sum(p.expected * p.size(estimate.sizes).completion for p in estimate.phases)
    assert estimate.seconds() == pytest.approx(expected * rate)
    assert f"~{estimate.seconds():.0f} s at this model's measured speed" in estimate.line()
    # no local history: no time
    assert estimate_for(config, graph, load_splits(config, graph)).seconds() is None


def test_the_embedded_pairs_optimizer_calls_are_sized_and_timed_from_the_optimizer_model(
        tmp_path, monkeypatch):
    graph_path = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    config = RunConfig(graph=str(graph_path), backend="scripted", steps=1, train=6, val=6,
                       test=0, db=str(tmp_path / "runs.duckdb"))
    asyncio.run(execute(config))
    forward, optimizer = default_model("local"), "qwen2.5-coder-1.5b"
    with duckdb.connect(config.db) as con:  # as if the embedded pair had run it
        con.execute("UPDATE llm_calls SET backend = 'local', model = CASE WHEN purpose = "
                    "'forward' THEN ? ELSE ? END", [forward, optimizer])
        con.execute("UPDATE llm_calls SET completion_tokens = 100 WHERE purpose <> 'forward'")
        con.execute("UPDATE steps SET ended_at = started_at + 10 * (step + 1)")  # 10 s, 20 s
        completion, optimizer_calls = con.execute(
            "SELECT sum(completion_tokens), count(*) FILTER (WHERE purpose <> 'forward') "
            "FROM llm_calls WHERE NOT cache_hit").fetchone()
    assert optimizer_calls > 0
    # the run pairs the 0.5B with the 1.5B (when installed): so does its estimate
    monkeypatch.setattr("engine.llm.models.paired_optimizer", lambda model: (optimizer, None))
    local = RunConfig(**{**config.__dict__, "backend": "local", "run_id": None})
    graph = load_graph(local.graph)
    estimate = estimate_for(local, graph, load_splits(local, graph))
    assert estimate.models == (forward, optimizer)
    # backward and update replies: what the 1.5B wrote, not a first run's prior
    assert estimate.sizes.backward.completion == estimate.sizes.update.completion == 100
    assert "assumed: replies" not in estimate.line()
    # the steps' time was spent on both models' tokens
    rate = 30 / completion
    expected = sum(p.expected * p.size(estimate.sizes).completion for p in estimate.phases)
    assert estimate.seconds() == pytest.approx(expected * rate)


def test_a_first_run_on_the_embedded_pair_is_timed_at_its_reference_speed(
        tmp_path, monkeypatch):
    from engine.runs.call_sizes import REFERENCE_SPEED

    graph_path = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    forward, optimizer = default_model("local"), "qwen2.5-coder-1.5b"
    monkeypatch.setattr("engine.llm.models.paired_optimizer", lambda model: (optimizer, None))
    config = RunConfig(graph=str(graph_path), backend="local", steps=1, train=6, val=6,
                       test=0, db=str(tmp_path / "empty.duckdb"))
    graph = load_graph(config.graph)
    estimate = estimate_for(config, graph, load_splits(config, graph))
    per_prompt, per_completion = REFERENCE_SPEED[(forward, optimizer)]
    expected = sum(p.expected * (per_prompt * p.size(estimate.sizes).prompt
                                 + per_completion * p.size(estimate.sizes).completion)
                   for p in estimate.phases)
    assert estimate.seconds() == pytest.approx(expected)
    assert (f"~{duration(estimate.seconds())} at the speed of a two-core machine (no run of "
            "these models here yet)") in estimate.line()
    # a model outside the measured pair has no reference: no time before its first run
    monkeypatch.setattr("engine.llm.models.paired_optimizer", lambda model: (None, None))
    alone = estimate_for(config, graph, load_splits(config, graph))
    assert alone.seconds() is None and "speed" not in alone.line()


def test_a_first_run_on_the_embedded_pair_sizes_replies_from_what_they_wrote_on_our_graphs(
        tmp_path, monkeypatch):
    """No history, the named embedded pair: forward replies sized at the 0.5B's measured
    mean, backward and update at the 1.5B's (REFERENCE_REPLY), each capped at the call's
    limit, and the line says what it assumed; a model file we never measured gets the
    prior, and a run log that has seen the models sizes from it instead."""
    from engine.runs.call_sizes import REFERENCE_REPLY

    forward, optimizer = default_model("local"), "qwen2.5-coder-1.5b"
    monkeypatch.setattr("engine.llm.models.paired_optimizer", lambda model: (optimizer, None))
    config = RunConfig(graph=str(write_graph(tmp_path, TWO_HINTS, arithmetic_rows())),
                       backend="local", steps=1, train=6, val=6, test=0,
                       db=str(tmp_path / "empty.duckdb"))
    graph = load_graph(config.graph)
    estimate = estimate_for(config, graph, load_splits(config, graph))
    sizes = estimate.sizes
    assert sizes.forward["val"].completion == REFERENCE_REPLY[forward]["forward"] == 9
    assert sizes.backward.completion == REFERENCE_REPLY[optimizer]["backward"] == 109
    assert sizes.update.completion == REFERENCE_REPLY[optimizer]["update"] == 106
    assert ("replies of ~9 tokens (forward), ~109 tokens (backward), ~106 tokens (update) "
            "(what these embedded models wrote on the sample graphs; no earlier run of them "
            "here)") in estimate.line()
    # a node's own max_tokens still caps it
    (tmp_path / "capped").mkdir()
    capped = replace(config, graph=str(write_graph(tmp_path / "capped", TWO_HINTS.replace(
        "id: hint_a", "id: hint_a\n    max_tokens: 4"), arithmetic_rows())))
    capped_graph = load_graph(capped.graph)
    capped_sizes = estimate_for(capped, capped_graph, load_splits(capped, capped_graph)).sizes
    nodes = [n for n in capped_graph.nodes if n.kind == "llm"]
    assert capped_sizes.forward["val"].completion == pytest.approx(
        sum(4 if n.id == "hint_a" else 9 for n in nodes) / len(nodes))
    # a GGUF file's path is no named model: the backend's prior
    monkeypatch.setattr("engine.llm.models.paired_optimizer", lambda model: (None, None))
    unnamed = estimate_for(replace(config, model=str(tmp_path / "other.gguf")), graph,
                           load_splits(config, graph))
    assert unnamed.sizes.forward["val"].completion == min(128, FIRST_REPLY["forward"])
    assert "sample graphs" not in unnamed.line()


@pytest.mark.parametrize("backend", ["local", "openai"])
def test_replies_are_capped_at_the_limits_the_runs_calls_ask_for(tmp_path, monkeypatch,
                                                                 backend):
    """No history: the prior's reply, capped at the token limit the run's calls will send,
    which on a local model is smaller by default (128) than the prior's optimizer replies."""
    from engine.runs.execute import default_max_tokens

    monkeypatch.setattr("engine.llm.models.paired_optimizer", lambda model: (None, None))
    # a local model we have not measured (the named ones have REFERENCE_REPLY: next test)
    monkeypatch.setattr("engine.runs.call_sizes.REFERENCE_REPLY", {})
    graph_text = ONE_NODE.replace(", max_tokens: 40", "")
    config = RunConfig(graph=str(write_graph(tmp_path, graph_text, arithmetic_rows())),
                       backend=backend, steps=1, train=6, val=6, test=0,
                       db=str(tmp_path / "empty.duckdb"))
    graph = load_graph(config.graph)
    sizes = estimate_for(config, graph, load_splits(config, graph)).sizes
    forward_limit, optimizer_limit = default_max_tokens(config)
    assert (forward_limit, optimizer_limit) == ((128, 128) if backend == "local"
                                                else (512, 1024))
    assert sizes.forward["val"].completion == min(forward_limit, FIRST_REPLY["forward"])
    # structured replies (the default): on the local backend an update call's limit is
    # raised to its schema's bound (reply_tokens), which the prior's reply fits under
    bound = token_budget(schema_for("update", []))
    update_limit = max(optimizer_limit, bound) if backend == "local" else optimizer_limit
    assert sizes.update.completion == min(update_limit, FIRST_REPLY["update"])
    if backend == "local":
        assert sizes.update.completion == FIRST_REPLY["update"] > optimizer_limit
    # ... not with structured replies off: the run's own limit
    text = estimate_for(replace(config, structured="off"), graph,
                        load_splits(config, graph)).sizes
    assert text.backward.completion == min(optimizer_limit, FIRST_REPLY["backward"])
    assert text.update.completion == min(optimizer_limit, FIRST_REPLY["update"])
    # a limit set for the run is the cap, up to a local schema's bound
    capped = estimate_for(replace(config, optimizer_max_tokens=64), graph,
                          load_splits(config, graph)).sizes
    assert capped.update.completion == (min(bound, FIRST_REPLY["update"])
                                        if backend == "local" else 64)
    capped_text = estimate_for(replace(config, optimizer_max_tokens=64, structured="off"),
                               graph, load_splits(config, graph)).sizes
    assert capped_text.backward.completion == capped_text.update.completion == 64
    # a node that reads two others: its backward call's bound (two gradients) is the limit
    (tmp_path / "two").mkdir()
    config = replace(config, graph=str(write_graph(tmp_path / "two", TWO_HINTS,
                                                   arithmetic_rows())))
    graph = load_graph(config.graph)
    sizes = estimate_for(config, graph, load_splits(config, graph)).sizes
    bound = token_budget(schema_for("backward_joint", ["hint_a", "hint_b"]))
    assert sizes.backward.completion == min(
        max(optimizer_limit, bound) if backend == "local" else optimizer_limit,
        FIRST_REPLY["backward"])

ONE_NODE_UNCAPPED = ONE_NODE.replace("name: one-node", "name: another-graph").replace(
    ", max_tokens: 40", "")


def wordy(request) -> str | None:
    """Forward replies of 100 words: a model far wordier than the scripted default."""
    if request.purpose == "forward":
        return "<output>" + "word " * 100 + "</output>"
    return None


def test_a_models_replies_on_another_graph_size_a_new_graphs_first_estimate(tmp_path):
    from engine.llm.scripted import ScriptedBackend

    db = str(tmp_path / "runs.duckdb")
    (tmp_path / "new").mkdir()
    other = RunConfig(graph=str(write_graph(tmp_path / "new", ONE_NODE_UNCAPPED,
                                            arithmetic_rows())),
                      backend="scripted", steps=0, train=4, val=4, test=0, db=db)
    graph = load_graph(other.graph)
    cold = estimate_for(other, graph, load_splits(other, graph))
    # nothing in the run log: the scripted backend's prior, and the line says so
    assert cold.sizes.forward["val"].completion == SCRIPTED_REPLY["forward"]
    assert "assumed: replies of ~10 tokens (forward)" in cold.line()

    first = RunConfig(graph=str(write_graph(tmp_path, TWO_HINTS, arithmetic_rows())),
                      backend="scripted", steps=0, train=6, val=6, test=0, db=db)
    asyncio.run(execute(first, forward_backend=ScriptedBackend(responder=wordy)))
    with duckdb.connect(db, read_only=True) as con:
        recorded = con.execute("SELECT avg(completion_tokens) FROM llm_calls WHERE NOT "
                               "cache_hit AND purpose = 'forward'").fetchone()[0]
    assert recorded > 5 * SCRIPTED_REPLY["forward"]
    # a graph this log never ran, on the same model: its replies are the model's
    warm = estimate_for(other, graph, load_splits(other, graph))
    assert warm.sizes.forward["val"].completion == pytest.approx(recorded)
    # the first run made no backward call: those replies are still the prior's, and say so
    assert "(forward)" not in warm.line() and "~50 tokens (backward)" in warm.line()


def test_a_forks_test_pass_re_runs_what_its_parents_test_pass_did_not_ask(tmp_path):
    from tests.support.graphs import DIAMOND

    # every step accepted: the parent tested its step-2 prompts, not its step-1 ones
    config = RunConfig(graph=str(write_graph(tmp_path, DIAMOND, arithmetic_rows())),
                       backend="scripted", steps=2, train=4, val=4, test=8, gate=False,
                       db=str(tmp_path / "runs.duckdb"), run_id="parent")
    asyncio.run(execute(config))
    for step, differing in ((1, 4), (2, 0)):  # test the prompts of step 1, then of step 2
        plan = plan_fork(config.db, "parent", step, overrides={"steps": 0})
        tested = {p.name: p.expected for p in estimate_fork(plan).phases}["test"]
        result = asyncio.run(run_fork(plan))
        with duckdb.connect(config.db, read_only=True) as con:
            made = con.execute("SELECT count(*) FROM llm_calls WHERE run_id = ? AND NOT "
                               "cache_hit", [result.run_id]).fetchone()[0]
        # step 1's prompts: every node's test calls are new; step 2's: the parent's, cached
        assert tested == made == 8 * differing, (step, tested, made)


def val_calls_after_step_0(db: str, run_id: str) -> tuple[int, int]:
    """(model calls, calls) of a run's validation passes after step 0."""
    with duckdb.connect(db, read_only=True) as con:
        return con.execute(
            "SELECT count(*) FILTER (WHERE NOT c.cache_hit), count(*) FROM llm_calls c "
            "JOIN examples e USING (run_id, example_id) WHERE c.run_id = ? AND c.step > 0 "
            "AND e.split = 'val' AND c.purpose = 'forward'", [run_id]).fetchone()


# The edits of `repeating_edits`, by candidate (sample_index) and node: the second
# candidate gives hint_b the edit the first gave hint_a
EDITS = {0: {"hint_a": "Use R1.", "hint_b": "Use R2.", "final": "Use R3."},
         1: {"hint_a": "Use R4.", "hint_b": "Use R1.", "final": "Use R5."}}


def repeating_edits(request) -> str | None:
    """Updates append EDITS[candidate][node]; a hint writes the edit its prompt carries
    (or "plain") and the question's first number, so two hint requests get one output only
    when they are one request, and the final node's requests differ whenever a hint's
    output does. What repeats is then what the edits make repeat, whatever the templates
    say."""
    node = request.meta.get("node")
    if request.purpose == "update":
        return f"<prompt>{request.meta['prompt']} {EDITS[request.sample_index][node]}</prompt>"
    if request.purpose == "forward" and node in ("hint_a", "hint_b"):
        text = "\n".join(c for _, c in request.messages)
        edit = re.findall(r"Use R\d\.", text)
        first = re.findall(r"Tom has (\d+) apples", text)[0]
        return f"<output>{' '.join(edit) or 'plain'} {first}</output>"
    return None


def repeating_edits_responder():
    return repeating_edits


RESPONDER = f"{__file__}:repeating_edits_responder"


def test_candidates_that_repeat_requests_are_estimated_from_what_earlier_runs_asked_anew(
        tmp_path):
    """Two candidates a step: the second gives `hint_b` the edit the first gave `hint_a`
    (`repeating_edits`), so 8 of the 48 validation requests repeat one the step already
    sent. The first estimate counts all 48; after a run, the share of new requests its
    candidate passes sent (40 of 48) sizes the next run's."""
    config = RunConfig(graph=str(write_graph(tmp_path, TWO_HINTS, arithmetic_rows())),
                       backend="scripted", scripted_responder=RESPONDER, steps=1,
                       proposals=2, train=8, val=8, test=0, db=str(tmp_path / "runs.duckdb"))
    graph = load_graph(config.graph)

    def candidates(estimate) -> int:
        return next(p.expected for p in estimate.phases if "validation candidates" in p.name)

    first = estimate_for(config, graph, load_splits(config, graph))
    assert first.sizes.later_val_share is None and candidates(first) == 48
    result = asyncio.run(execute(config))
    assert val_calls_after_step_0(config.db, result.run_id) == (40, 48)
    with duckdb.connect(config.db) as con:
        con.execute("DELETE FROM llm_cache")  # the next run pays for its calls
    again = replace(config, seed=1, run_id=None)
    estimate = estimate_for(again, graph, load_splits(again, graph))
    assert estimate.sizes.later_val_share == pytest.approx(40 / 48)
    assert candidates(estimate) == 40
    result = asyncio.run(execute(again))
    assert val_calls_after_step_0(again.db, result.run_id) == (40, 48)
    # with the pruning of an accepted step's edits, which the estimate counts at the share
    # of steps accepted (1 in 6 here: none of 1 earlier step, the prior's 25% as 2 steps)
    # and this run, accepting none, does not make
    assert not any(s.accepted for s in result.events.of(StepFinished))
    pruning = next(p.expected for p in estimate.phases if "pruning" in p.name)
    assert pruning == round(8 * 5 / 6 * 40 / 48)
    assert estimate.calls() - pruning == result.stats.calls - result.stats.cache_hits == 80
    # replies a run log already holds from another run are not counted as repeats
    rerun = asyncio.run(execute(replace(again, run_id=None)))
    assert val_calls_after_step_0(again.db, rerun.run_id)[0] == 0  # all from the cache
    assert estimate_for(again, graph, load_splits(again, graph)).sizes.later_val_share == \
        pytest.approx(40 / 48)


def test_a_node_no_edit_reaches_repeats_its_step_0_requests_and_is_not_counted_again(
        tmp_path):
    """`--update-mode one` edits `hint_a` only: `hint_b`'s validation requests after step 0
    are step 0's again (answered from the run's cache), so 16 of the pass's 24 calls are
    new, and the next estimate counts 16, as the run then makes."""
    config = RunConfig(graph=str(write_graph(tmp_path, TWO_HINTS, arithmetic_rows())),
                       backend="scripted", scripted_responder=RESPONDER, steps=1,
                       update_mode="one", train=8, val=8, test=0,
                       db=str(tmp_path / "runs.duckdb"))
    graph = load_graph(config.graph)
    result = asyncio.run(execute(config))
    assert val_calls_after_step_0(config.db, result.run_id) == (16, 24)
    with duckdb.connect(config.db) as con:
        con.execute("DELETE FROM llm_cache")
    again = replace(config, seed=1, run_id=None)
    estimate = estimate_for(again, graph, load_splits(again, graph))
    assert estimate.sizes.later_val_share == pytest.approx(16 / 24)
    assert next(p.expected for p in estimate.phases if "validation candidate" in p.name) == 16


def test_a_share_of_accepted_steps_learnt_from_few_steps_says_what_it_rests_on(tmp_path):
    """One earlier run of two steps is little to learn a graph's accepted share from: the
    line says how many steps were accepted of how many, beside the prior it is pooled with
    (on GSM8K a first run accepted 0 of 4 steps and five later seeds 1 of 4 each)."""
    graph_path = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    config = RunConfig(graph=str(graph_path), backend="scripted", steps=2, train=6, val=6,
                       test=0, db=str(tmp_path / "runs.duckdb"))
    graph = load_graph(config.graph)
    cold = estimate_for(config, graph, load_splits(config, graph))
    assert "25% of steps accepted (no earlier step of this graph)" in cold.line()
    asyncio.run(execute(config))
    with duckdb.connect(config.db, read_only=True) as con:
        accepted = con.execute("SELECT count(DISTINCT step) FROM updates WHERE accepted"
                               ).fetchone()[0]
    warm = estimate_for(config, graph, load_splits(config, graph))
    share = (accepted + 0.5) / 4
    assert warm.sizes.accepted_share == pytest.approx(share)
    assert (f"{share:.0%} of steps accepted ({accepted} of 2 earlier steps of this graph, "
            "with the prior's 25% counted as 2 steps)") in warm.line()
