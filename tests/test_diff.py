"""`python -m engine diff`: the source changes of two runs' traces, patched from A into B,
and the smallest set that reproduces A's score (engine/probes/diff.py)."""

from __future__ import annotations

import asyncio
import json

from engine.cli import main
from engine.llm.scripted import ScriptedBackend
from engine.probes.diff import diff
from tests.support.diff_script import (
    CHAIN,
    PAIR,
    backend,
    careful_model,
    forked,
    on_two_models,
)
from tests.support.graphs import run_engine, write_graph
from tests.support.runlog import rows


def test_one_edited_middle_prompt_explains_every_differing_example(tmp_path):
    db = forked(tmp_path, CHAIN, {"plan": "Plan the sum CAREFULLY."})
    activations = rows(db, "SELECT count(*) FROM node_outputs")[0][0]
    bk = backend()
    report = asyncio.run(diff(str(db), "child", "parent", forward_backend=bk))
    differing = report.differing
    # the odd-numbered validation questions: right in the child, wrong in the parent
    assert differing and all((e.score_a, e.score_b) == (1.0, 0.0) for e in differing)
    assert len(differing) == sum(int(e.example[1:]) % 2 for e in report.examples)
    assert report.model_change == ""  # one model: a prompt edit can explain
    for e in differing:
        assert e.sources == ["plan"]
        assert [(c.why, c.patchable) for c in e.changes if c.node == "plan"] == [
            ("prompt differs", True)]
        assert [c.node for c in e.changes if c.kind == "downstream"] == ["final"]
        assert e.explained_by == ["plan"] and e.patched_score == 1.0
    assert report.nodes() == [
        {"node": "parse", "explains": 0, "of": 0, "downstream": 0},
        {"node": "plan", "explains": len(differing), "of": len(differing), "downstream": 0},
        {"node": "final", "explains": 0, "of": 0, "downstream": len(differing)}]
    # only 'final' was re-run, in the parent's configuration, on the child's plan output
    assert {r.meta["node"] for r in bk.requests} <= {"final"}
    assert all("plan ok" in r.user_text for r in bk.requests)
    # the patch runs are the diff's own rows, never the runs' activations
    assert rows(db, "SELECT count(*) FROM node_outputs")[0][0] == activations
    assert rows(db, "SELECT count(*) FROM diffs WHERE diff_id = ?",
                report.diff_id)[0][0] == len(report.examples)
    patched = rows(db, "SELECT nodes, score, outputs FROM diff_patches WHERE diff_id = ?",
                   report.diff_id)
    assert len(patched) == len(differing)
    assert all(json.loads(n) == ["plan"] and s == 1.0 and "final" in json.loads(o)
               for n, s, o in patched)
    assert {r[0] for r in rows(db, "SELECT DISTINCT purpose FROM llm_calls WHERE call_id IN "
                                   "(SELECT unnest(call_ids::VARCHAR[]) FROM diff_patches)")
            } <= {"diff"}


def test_a_model_change_is_a_source_change_at_every_llm_node_and_never_patched(tmp_path,
                                                                              capsys):
    """Two runs of one backend and one set of prompts on two models: the model changed
    every LLM node's behaviour at once, so the diff says so, names each LLM node whose
    output differs as a source change ('model differs', the output node too, whose inputs
    also differ) and patches nothing across the two models."""
    db = on_two_models(tmp_path)
    assert rows(db, "SELECT DISTINCT backend FROM runs") == [("scripted",)]
    bk = ScriptedBackend(responder=careful_model)
    report = asyncio.run(diff(str(db), "careful", "plain", forward_backend=bk))
    assert "different models" in report.model_change
    assert "A: scripted 'careful'" in report.model_change
    assert "B: scripted 'plain'" in report.model_change
    differing = report.differing
    assert differing and all((e.score_a, e.score_b) == (1.0, 0.0) for e in differing)
    for e in differing:
        kinds = {c.node: (c.kind, c.why, c.patchable) for c in e.changes}
        assert kinds["parse"][0] == "unchanged"  # same output on both models
        assert e.sources == ["plan", "final"]
        assert kinds["plan"] == ("source", "model differs: not patched across models", False)
        assert kinds["final"] == ("source", "model differs; its inputs differ too: not "
                                  "patched across models", False)
        assert e.explained_by is None and e.tried == 0 and e.patched_score is None
    assert report.calls == 0 and bk.requests == []  # both traces are logged; no patch run
    assert rows(db, "SELECT count(*) FROM diff_patches WHERE diff_id = ?",
                report.diff_id)[0][0] == 0
    assert main(["diff", "careful", "plain", "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model_change"] == report.model_change
    assert all(e["explained_by"] is None for e in data["examples"] if e["differs"])
    assert main(["diff", "careful", "plain", "--db", str(db)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "not patched (models differ)" in printed
    assert ("The runs use different models (A: scripted 'careful', B: scripted 'plain'): "
            "every LLM node's behaviour differs") in printed
    assert "within the bound" not in printed


def test_two_edits_needed_together_give_a_set_of_two(tmp_path):
    db = forked(tmp_path, PAIR, {"left": "Check the first number CAREFULLY.",
                                 "right": "Check the second number CAREFULLY."})
    report = asyncio.run(diff(str(db), "child", "parent", forward_backend=backend()))
    assert report.differing
    for e in report.differing:
        assert sorted(e.sources) == ["left", "right"]
        assert sorted(e.explained_by) == ["left", "right"]
        assert e.tried == 3  # left, right, then both
    assert {n["node"]: n["explains"] for n in report.nodes()} == {
        "parse": 0, "left": len(report.differing), "right": len(report.differing),
        "final": 0}


def test_bound_of_one_leaves_the_pair_unexplained(tmp_path, capsys):
    db = forked(tmp_path, PAIR, {"left": "Check the first number CAREFULLY.",
                                 "right": "Check the second number CAREFULLY."})
    report = asyncio.run(diff(str(db), "child", "parent", bound=1, forward_backend=backend()))
    assert report.differing and all(e.explained_by is None for e in report.differing)
    assert main(["diff", "child", "parent", "--db", str(db), "--bound", "1"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "1 of 1 differing examples not explained within the bound (1" in printed


def test_identity_diff_has_no_differing_example_and_no_call(tmp_path):
    db = forked(tmp_path, CHAIN, {"plan": "Plan the sum CAREFULLY."})
    bk = backend()
    report = asyncio.run(diff(str(db), "parent", "parent", step_a=0, step_b=0,
                              forward_backend=bk))
    assert report.examples and not report.differing
    assert report.calls == 0 and bk.requests == []
    assert all(c.kind == "unchanged" for e in report.examples for c in e.changes)


def test_repeated_diff_makes_no_model_call(tmp_path):
    # two edits: patching one alone gives the final node inputs neither run saw, so the
    # first diff has to ask the model; the repeat finds every reply in the cache
    db = forked(tmp_path, PAIR, {"left": "Check the first number CAREFULLY.",
                                 "right": "Check the second number CAREFULLY."})
    first = asyncio.run(diff(str(db), "child", "parent", split="train",
                             forward_backend=backend()))
    assert first.differing and first.model_calls > 0
    bk = backend()
    again = asyncio.run(diff(str(db), "child", "parent", split="train", forward_backend=bk))
    assert again.calls == first.calls and again.model_calls == 0 and bk.requests == []
    assert [e.explained_by for e in again.examples] == [e.explained_by for e in first.examples]


def test_json_output_and_bad_input(tmp_path, capsys):
    db = forked(tmp_path, CHAIN, {"plan": "Plan the sum CAREFULLY."})
    assert main(["diff", "child", "parent", "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"examples", "nodes"} <= set(data)
    example = next(e for e in data["examples"] if e["score_a"] != e["score_b"])
    assert {"example", "score_a", "score_b", "sources", "explained_by"} <= set(example)
    assert example["explained_by"] == ["plan"]
    assert {"node": "plan", "explains": data["differing"], "of": data["differing"]}.items() \
        <= next(n for n in data["nodes"] if n["node"] == "plan").items()
    for argv, message in ((["diff", "nope", "parent"], "no run 'nope'"),
                          (["diff", "child", "parent", "--step-a", "7"], "no complete step 7"),
                          (["diff", "child", "parent", "--examples", "zz"], "'zz'")):
        assert main([*argv, "--db", str(db)]) == 2
        err = capsys.readouterr()
        line = (err.out + err.err).strip()
        assert line.startswith("error:") and message in line and "Traceback" not in line


def test_graphs_of_another_shape_are_compared_on_shared_nodes(tmp_path):
    """A node only one graph has is named, the shared ones compared."""
    db = forked(tmp_path, CHAIN, {"plan": "Plan the sum CAREFULLY."})
    graph = write_graph(tmp_path, CHAIN.replace(
        "  - {id: final", "  - {id: extra, prompt: Note something., inputs: [question]}\n"
        "  - {id: final").replace("inputs: [question, plan]", "inputs: [question, plan, extra]"),
        name="shaped.yaml")
    run_engine(graph, db, backend(), steps=0, run_id="shaped")
    report = asyncio.run(diff(str(db), "shaped", "parent", forward_backend=backend()))
    assert report.not_compared == ["extra"]
    assert "extra" not in [n["node"] for n in report.nodes()]


def test_step_against_previous_step_on_gsm8k(tmp_path, shared_datasets):
    """Step S against S-1 of one run (scripted): the examples the accepted edit flipped are
    explained by source changes of that edit."""
    from pathlib import Path

    graph = Path(__file__).resolve().parents[1] / "sample_graphs" / "gsm8k.yaml"
    db = tmp_path / "gsm.duckdb"
    # without the gate, step 1's edits are accepted whatever they score: the diff must
    # still explain every validation example they flipped by the edited nodes
    run_engine(graph, db, steps=1, train=24, val=24, seed=0, run_id="gsm", gate=False,
               data_dir=str(shared_datasets))
    accepted = [s for s, ok in rows(db, "SELECT step, accepted FROM steps WHERE run_id = "
                                        "'gsm' ORDER BY step") if ok]
    assert accepted, "no step accepted an edit"
    s = accepted[0]
    report = asyncio.run(diff(str(db), "gsm", step_a=s))
    assert (report.step_a, report.step_b) == (s, s - 1)
    edited = {r[0] for r in rows(db, "SELECT node_id FROM prompt_versions WHERE run_id = "
                                     "'gsm' AND step = ? AND accepted", s)}
    assert report.differing, "the accepted edit flipped no validation example"
    for e in report.differing:
        assert set(e.sources) <= edited
        assert e.explained_by and set(e.explained_by) <= edited
        assert e.patched_score == e.score_a
