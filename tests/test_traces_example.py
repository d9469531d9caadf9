"""The example pipeline (sample_graphs/traced_pipeline.py: three `openai` SDK calls traced
by openinference-instrumentation-openai) run against the scripted server, imported, back-
propagated and blamed; its re-runs call the server with upstream outputs substituted."""

from __future__ import annotations

import json
import re

import duckdb
import pytest

from engine.cli.commands import main
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.traced_pipeline import FIXED_NUMBERS, load_pipeline, responder


@pytest.fixture
def imported(tmp_path, capsys):
    pipeline = load_pipeline()
    with FakeOpenAIServer(responder=responder) as server:
        answers = pipeline.run(server.base_url, "fake-qwen", tmp_path / "traces.jsonl", 6,
                               tmp_path / "targets.jsonl")
        db = tmp_path / "runs.duckdb"
        assert main(["import-traces", str(tmp_path / "traces.jsonl"), "--db", str(db),
                     "--targets", str(tmp_path / "targets.jsonl"), "--metric", "numeric",
                     "--base-url", server.base_url, "--run-id", "ex", "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        yield server, db, got, answers


def test_the_example_pipelines_traces_import_as_three_calls_and_two_flows(imported):
    server, _, got, answers = imported
    assert answers == ["0"] * 6  # the numbers call passes a mood on, never a number
    assert [(n["id"], n["calls"], n["prompt"]) for n in got["nodes"]] == [
        ("who", 6, "Who: say in one short sentence who the sentence is about."),
        ("numbers", 6, "Numbers: say in one short sentence how the person feels."),
        ("total", 6, "Total: add up the numbers you are given and reply with the sum, as "
                     "digits only.")]
    assert got["edges"] == [["numbers", "total"], ["who", "total"]]
    assert (got["traces"], got["scored"], got["failing"], got["ambiguous"]) == (6, 6, 6, [])


def test_backprop_then_probes_call_the_users_model_with_upstream_outputs_substituted(
        imported, capsys):
    server, db, _, _ = imported
    seen = len(server.requests)
    assert main(["backprop", "ex", "--db", str(db)]) == 0
    capsys.readouterr()
    backward = server.requests[seen:]
    # the forward pass replays from the cache: only backward and update calls reach the model
    assert not any(r["messages"][0]["content"].startswith(("Who:", "Numbers:", "Total:"))
                   for r in backward)
    with duckdb.connect(str(db), read_only=True) as con:
        graded = con.execute("SELECT DISTINCT example_id FROM gradients WHERE run_id = 'ex' "
                             "AND step = 1").fetchall()
        joint = con.execute(
            "SELECT c.messages, a.output_text, b.output_text FROM gradients g "
            "JOIN llm_calls c USING (call_id) "
            "JOIN node_outputs a ON a.run_id = g.run_id AND a.step = 0 AND "
            "a.example_id = g.example_id AND a.node_id = 'numbers' "
            "JOIN node_outputs b ON b.run_id = g.run_id AND b.step = 0 AND "
            "b.example_id = g.example_id AND b.node_id = 'who' "
            "WHERE g.run_id = 'ex' AND g.step = 1 AND g.node_id = 'numbers' AND "
            "g.kind = 'gradient'").fetchall()
        proposals = con.execute("SELECT node_id FROM updates WHERE run_id = 'ex' AND step = 1 "
                                "ORDER BY node_id").fetchall()
        example = con.execute("SELECT example_id, json_extract_string(fields, '$.input') "
                              "FROM examples WHERE run_id = 'ex' ORDER BY position LIMIT 1"
                              ).fetchone()
    assert len(graded) == 6  # every failing trace
    # sibling-conditioned: numbers' gradient comes from the call that also saw who's reply
    assert len(joint) == 6 and all(count in messages and topic in messages
                                   for messages, count, topic in joint)
    assert proposals == [("numbers",), ("total",), ("who",)]

    seen = len(server.requests)
    assert main(["probe", "ex", "--db", str(db), "--step", "1", "--node", "numbers",
                 "--example", example[0], "--output", "The numbers are 3 and 15."]) == 0
    rerun = [r for r in server.requests[seen:]
             if r["messages"][0]["content"].startswith("Total:")]
    assert [r["messages"][1]["content"] for r in rerun] == [
        "Note: It is about Maria.\nNumbers: The numbers are 3 and 15."]
    assert example[1] == "Maria has 3 apples in the basket and adds 15 more."


def _sent(db, purpose: str, node: str) -> list[str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return [m for (m,) in con.execute(
            "SELECT json_extract_string(messages, '$[1].content') FROM llm_calls WHERE "
            "run_id = 'ex' AND step = 1 AND purpose = ? AND node_id = ?",
            [purpose, node]).fetchall()]


def test_the_optimizer_reads_an_imported_calls_own_message_with_its_inputs_tagged(
        imported, capsys):
    """What `total` really read is the pipeline's message ("Note: ...\nNumbers: ..."): its
    backward call and its update call show that message with each upstream reply tagged
    where it sits, not the bare inputs; a sibling-blind method hides the sibling's reply."""
    server, db, _, _ = imported
    assert main(["backprop", "ex", "--db", str(db)]) == 0
    capsys.readouterr()
    with duckdb.connect(str(db), read_only=True) as con:
        example, read = con.execute(
            "SELECT o.example_id, o.input_text FROM node_outputs o JOIN examples e ON "
            "e.run_id = o.run_id AND e.example_id = o.example_id WHERE o.run_id = 'ex' AND "
            "o.step = 0 AND o.node_id = 'total' ORDER BY e.position LIMIT 1").fetchone()
    assert re.fullmatch(r'<message role="user">\nNote: <input name="who">It is about Maria\.'
                        r'</input>\nNumbers: <input name="numbers">Maria [^<]+</input>\n'
                        r'</message>', read), read
    backward = _sent(db, "backward", "total")
    assert len(backward) == 6 and all(
        "For one example it read these messages, each input tagged where it sits:\n"
        '<message role="user">\nNote: <input name="who">' in m for m in backward)
    assert any(read in m for m in backward)
    update = _sent(db, "update", "total")
    assert update and read in update[0]
    # following a gradient, the rewrite call shows what the call read, tagged the same way
    assert main(["probe", "ex", "--db", str(db), "--step", "1", "--node", "total",
                 "--gradient", "--example", example]) == 0
    capsys.readouterr()
    rewrites = _sent(db, "probe", "total")
    assert rewrites and any(m.startswith("A step of the pipeline read these inputs:\n" + read)
                            for m in rewrites)

    assert main(["backprop", "ex", "--db", str(db), "--method", "textgrad"]) == 0
    capsys.readouterr()
    with duckdb.connect(str(db), read_only=True) as con:
        blind = [m for (m,) in con.execute(
            "SELECT json_extract_string(c.messages, '$[1].content') FROM gradients g JOIN "
            "llm_calls c USING (call_id) WHERE g.run_id = 'ex' AND g.step = 2 AND "
            "g.node_id = 'numbers' AND g.kind = 'gradient'").fetchall()]
    assert blind and all('Note: <input name="who">(not shown)</input>\nNumbers: <input '
                         'name="numbers">' in m for m in blind)
    assert not any("It is about" in m for m in blind)


def test_blame_names_the_call_whose_prompt_is_at_fault(imported, capsys):
    server, db, _, _ = imported
    assert main(["backprop", "ex", "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["blame", "ex", "--db", str(db), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"]["node"] == "numbers", report["verdict"]


def test_diff_explains_a_fork_of_an_imported_run_and_says_why_two_imports_cannot_be_diffed(
        imported, tmp_path, capsys):
    """A fork of the imported run with `numbers`'s prompt repaired scores every trace right;
    diff against the import explains each by `numbers`, re-running `total` on the user's
    model. Two imports share no example (an example is a trace): one line, exit 2, saying
    what to do instead."""
    server, db, _, _ = imported
    prompt = tmp_path / "numbers.txt"
    prompt.write_text(FIXED_NUMBERS, encoding="utf-8")
    assert main(["run", "--fork", "ex", "--from-step", "0", "--set-prompt",
                 f"numbers=@{prompt}", "--steps", "0", "--run-id", "fixed", "--db",
                 str(db)]) == 0
    capsys.readouterr()
    assert main(["diff", "fixed", "ex", "--db", str(db)]) == 2
    assert capsys.readouterr().err == ("error: runs 'fixed' and 'ex' share no val example "
                                       "(they share train examples: --split train)\n")
    assert main(["diff", "fixed", "ex", "--db", str(db), "--split", "train", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["examples"]) == 6
    assert all((e["score_a"], e["score_b"], e["explained_by"], e["patched_score"]) ==
               (1.0, 0.0, ["numbers"], 1.0) for e in report["examples"])
    # only total re-ran, in the import's configuration, with the fork's numbers substituted
    # where the trace had them (the same call as the fork's own: answered from the cache)
    with duckdb.connect(str(db), read_only=True) as con:
        patched = con.execute("SELECT node_id, messages FROM llm_calls WHERE run_id = 'ex' "
                              "AND purpose = 'diff'").fetchall()
    assert len(patched) == 6 and {node for node, _ in patched} == {"total"}
    assert all(re.fullmatch(r"Note: It is about \w+\.\nNumbers: The numbers are \d+ and \d+\.",
                            json.loads(messages)[-1]["content"]) for _, messages in patched)

    pipeline = load_pipeline()
    pipeline.run(server.base_url, "fake-qwen", tmp_path / "fixed.jsonl", 6,
                 tmp_path / "fixed-targets.jsonl",
                 prompts={**pipeline.PROMPTS, "numbers": FIXED_NUMBERS})
    assert main(["import-traces", str(tmp_path / "fixed.jsonl"), "--db", str(db),
                 "--targets", str(tmp_path / "fixed-targets.jsonl"), "--metric", "numeric",
                 "--run-id", "reimported"]) == 0
    capsys.readouterr()
    assert main(["diff", "reimported", "ex", "--db", str(db), "--split", "train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: runs 'reimported' and 'ex' share no train example: an "
                          "imported run's examples are its traces") and err.count("\n") == 1
    assert "run --fork RUN --from-step 0 --set-prompt NODE=@FILE" in err


def test_backprop_keeps_the_call_settings_it_is_given_for_the_runs_probes(imported, capsys):
    server, db, _, _ = imported
    seen = len(server.requests)
    assert main(["backprop", "ex", "--db", str(db), "--concurrency", "3", "--timeout", "90",
                 "--optimizer-max-tokens", "200"]) == 0
    capsys.readouterr()
    assert {r["max_tokens"] for r in server.requests[seen:]} == {200}
    with duckdb.connect(str(db), read_only=True) as con:
        config = json.loads(con.execute("SELECT config FROM runs WHERE run_id = 'ex'"
                                        ).fetchone()[0])
    assert (config["concurrency"], config["timeout"], config["optimizer_max_tokens"]) == (
        3, 90.0, 200)


def test_backprop_can_send_the_optimizers_calls_to_another_backend(imported, capsys):
    """--optimizer-backend/--optimizer-model: the gradient and update calls go to that
    model (a stronger one than the pipeline's, say), none to the pipeline's server, and
    the run keeps them for its probes and blame."""
    server, db, _, _ = imported
    seen = len(server.requests)
    assert main(["backprop", "ex", "--db", str(db), "--optimizer-backend", "scripted",
                 "--optimizer-model", "judge-model"]) == 0
    capsys.readouterr()
    with duckdb.connect(str(db), read_only=True) as con:
        optimizer = con.execute("SELECT DISTINCT backend, model FROM llm_calls WHERE run_id = "
                                "'ex' AND purpose IN ('backward', 'update')").fetchall()
        config = json.loads(con.execute("SELECT config FROM runs WHERE run_id = 'ex'"
                                        ).fetchone()[0])
    assert optimizer == [("scripted", "judge-model")]
    assert all(r.get("model") != "judge-model" for r in server.requests[seen:])
    assert (config["optimizer_backend"], config["optimizer_model"]) == ("scripted",
                                                                        "judge-model")


def test_held_out_traces_are_validation_that_gates_the_proposals_and_tests_each_edit(
        tmp_path, capsys):
    """--val 4: the last four scored traces are the validation split. backprop never
    back-propagates them, scores its proposal on them (re-running them on the user's
    model), and blame --examples val tests each proposed edit on them: out of sample, so
    the repaired `numbers` prompt counts as flips there, where on the training traces that
    fed its update call every flip is in-sample."""
    pipeline = load_pipeline()
    with FakeOpenAIServer(responder=responder) as server:
        pipeline.run(server.base_url, "fake-qwen", tmp_path / "traces.jsonl", 8,
                     tmp_path / "targets.jsonl")
        db = str(tmp_path / "runs.duckdb")
        assert main(["import-traces", str(tmp_path / "traces.jsonl"), "--db", db,
                     "--targets", str(tmp_path / "targets.jsonl"), "--metric", "numeric",
                     "--base-url", server.base_url, "--run-id", "held", "--val", "4",
                     "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert (got["traces"], got["scored"], got["val"], got["failing"]) == (8, 8, 4, 8)
        with duckdb.connect(db, read_only=True) as con:
            splits = con.execute(
                "SELECT split, json_extract_string(fields, '$.input') FROM examples WHERE "
                "run_id = 'held' ORDER BY split, position").fetchall()
            step0 = con.execute("SELECT train_score, val_score FROM steps WHERE run_id = "
                                "'held' AND step = 0").fetchone()
        rows = [json.loads(line)["text"] for line in
                pipeline.DATA.read_text(encoding="utf-8").splitlines()[:8]]
        assert [text for split, text in splits if split == "val"] == rows[4:]
        assert [text for split, text in splits if split == "train"] == rows[:4]
        assert step0 == (0.0, 0.0)

        assert main(["backprop", "held", "--db", db]) == 0
        capsys.readouterr()
        with duckdb.connect(db, read_only=True) as con:
            graded = {e for (e,) in con.execute(
                "SELECT DISTINCT g.example_id FROM gradients g WHERE g.run_id = 'held' AND "
                "g.step = 1").fetchall()}
            val_ids = {e for (e,) in con.execute(
                "SELECT example_id FROM examples WHERE run_id = 'held' AND split = 'val'"
            ).fetchall()}
            update = con.execute("SELECT new_prompt, accepted, val_before, val_after FROM "
                                 "updates WHERE run_id = 'held' AND step = 1 AND node_id = "
                                 "'numbers'").fetchone()
        assert len(graded) == 4 and not graded & val_ids
        assert update == (FIXED_NUMBERS, True, 0.0, 1.0)

        assert main(["blame", "held", "--db", db, "--examples", "val", "--exhaustive",
                     "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
    edits = {row["node"]: row["edit"] for row in report["nodes"]}
    assert (report["examples"], report["probed_examples"]) == ("val", 4)
    assert (edits["numbers"]["flips"], edits["numbers"]["in_sample"]) == (4, 0)
    assert report["verdict"]["node"] == "numbers", report["verdict"]


def test_backprop_proposals_draws_candidates_and_needs_held_out_traces(tmp_path, capsys):
    """--proposals 2: the update calls are made twice from the same gradients (the second
    sampled), each candidate is recorded, and the best on the held-out traces is kept; a run
    with no held-out traces has nothing to choose by, so it is refused and nothing is
    written."""
    from engine.core.optimizer import CANDIDATE_TEMPERATURE
    from tests.support.traced_pipeline import UPDATE

    pipeline = load_pipeline()
    with FakeOpenAIServer(responder=responder) as server:
        pipeline.run(server.base_url, "fake-qwen", tmp_path / "traces.jsonl", 8,
                     tmp_path / "targets.jsonl")
        db = str(tmp_path / "runs.duckdb")
        for run_id, val in (("plain", []), ("held", ["--val", "4"])):
            assert main(["import-traces", str(tmp_path / "traces.jsonl"), "--db", db,
                         "--targets", str(tmp_path / "targets.jsonl"), "--metric",
                         "numeric", "--base-url", server.base_url, "--run-id", run_id,
                         *val]) == 0
        capsys.readouterr()
        assert main(["backprop", "plain", "--db", db, "--proposals", "2"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["error: run 'plain' has no validation examples to choose among 2 "
                       "candidate prompt sets (import the traces again with import-traces "
                       "--val N, or leave --proposals out)"]
        server.requests.clear()
        assert main(["backprop", "held", "--db", db, "--proposals", "2"]) == 0
        out = capsys.readouterr().out
        updates = [r for r in server.requests if UPDATE in r["messages"][-1]["content"]]
    with duckdb.connect(db, read_only=True) as con:
        steps = con.execute("SELECT run_id, max(step) FROM steps GROUP BY 1 ORDER BY 1"
                            ).fetchall()
        rows = con.execute("SELECT candidate, node_id, accepted, reject_reason FROM updates "
                           "WHERE run_id = 'held' AND step = 1 ORDER BY 1, 2").fetchall()
    assert steps == [("held", 1), ("plain", 0)]  # the refused run gained no step
    nodes = sorted({n for _, n, _, _ in rows})
    assert [(c, n) for c, n, _, _ in rows] == [(c, n) for c in (0, 1) for n in nodes]
    assert len(updates) == 2 * len(nodes)
    assert sorted(r.get("temperature", 0) for r in updates)[-len(nodes):] == \
        [CANDIDATE_TEMPERATURE] * len(nodes)
    # the literal-minded responder writes the same repair both times: the second candidate
    # is the first's edits, recorded as such and not scored again; the first is kept
    assert ("numbers", True) in {(n, a) for c, n, a, _ in rows if c == 0}
    assert [r for c, n, _, r in rows if c == 1 and n == "numbers"] == [
        "the same edits as candidate 1"]
    assert re.search(r"numbers \(candidate 1\) kept: " + re.escape(FIXED_NUMBERS[:40]), out)
    assert "numbers (candidate 2): " in out
