"""`python -m engine prompts`: the prompts a run keeps, handed back with their evidence, as
YAML, JSON, or written into a DSPy program's saved state that `program.load` accepts."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import yaml

from engine.cli.commands import main
from tests.support.graphs import run_engine, write_graph

COUNT = "Count the things the sentence names."
GRAPH = f"""
name: handback
dataset: data.jsonl
input_fields: [sentence, topic]
target_field: answer
metric: exact_match
nodes:
  - {{id: number, prompt: "{COUNT}", inputs: [sentence]}}
  - {{id: answer, prompt: "Give the answer.", inputs: [number, topic], output: true,
      trainable: false}}
"""


def rows(n: int = 12) -> list[dict]:
    return [{"id": f"r{i}", "sentence": f"Crate {i} holds {i + 2} jars.", "topic": "jars",
             "answer": "never right"} for i in range(n)]


@pytest.fixture
def run(tmp_path) -> tuple[Path, str, str]:
    """A run whose `number` prompt the optimizer changed (no gate: every proposal kept);
    `answer` is frozen. (db, run id, number's kept prompt)"""
    graph = write_graph(tmp_path, GRAPH, rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, steps=1, train=4, val=4, gate=False)
    with duckdb.connect(str(db), read_only=True) as con:
        kept = con.execute("SELECT prompt FROM prompt_versions WHERE run_id = ? AND node_id = "
                           "'number' AND accepted ORDER BY step DESC, version DESC LIMIT 1",
                           [result.run_id]).fetchall()[0][0]
    assert kept != COUNT
    return db, result.run_id, kept


def test_yaml_and_json_give_each_node_its_kept_prompt_and_evidence(run, tmp_path, capsys):
    db, run_id, kept = run
    assert main(["prompts", run_id, "--db", str(db)]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["run_id"] == run_id and list(doc["nodes"]) == ["number", "answer"]
    number, answer = doc["nodes"]["number"], doc["nodes"]["answer"]
    assert (number["prompt"], number["original"], number["changed"], number["step"]) == \
        (kept, COUNT, True, 1)
    evidence = number["evidence"]
    assert (evidence["kept_by"], evidence["step"], evidence["validation"]["n"]) == \
        ("no gate", 1, 4)
    with duckdb.connect(str(db), read_only=True) as con:
        logged = con.execute("SELECT val_before, val_after FROM updates WHERE run_id = ? AND "
                             "node_id = 'number' AND step = 1", [run_id]).fetchall()[0]
    for side, score in zip(("before", "after"), logged):
        shown = evidence["validation"][side]
        low, high = shown["interval_95"]
        assert shown["score"] == score and shown["passed"] == round(score * 4)
        assert 0.0 <= low <= score <= high <= 1.0 and high - low > 0.3  # 4 examples: wide
    assert (answer["prompt"], answer["changed"], answer["step"]) == ("Give the answer.", False, 0)
    assert answer["evidence"] == {"kept_by": "start", "step": 0, "validation": None}
    out = tmp_path / "kept.json"
    assert main(["prompts", run_id, "--db", str(db), "--format", "json", "--out", str(out)]) == 0
    assert "1 changed (number)" in capsys.readouterr().out
    assert json.loads(out.read_text(encoding="utf-8")) == doc


def _program():
    dspy = pytest.importorskip("dspy")

    class Pipeline(dspy.Module):
        def __init__(self):
            super().__init__()
            self.count = dspy.Predict(dspy.Signature("sentence -> number", COUNT))
            self.answer = dspy.ChainOfThought("number, topic -> answer")
            self.polish = dspy.Predict(dspy.Signature("answer -> polished", "Polish it."))

    return Pipeline


def test_dspy_gives_the_kept_prompt_to_its_predictor_and_program_load_takes_it(run, tmp_path,
                                                                               capsys):
    db, run_id, kept = run
    Pipeline = _program()
    saved = tmp_path / "program.json"
    Pipeline().save(str(saved))
    out = tmp_path / "better.json"
    assert main(["prompts", run_id, "--db", str(db), "--format", "dspy", "--program",
                 str(saved), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "number -> predictor count (matched by instructions)" in said
    assert "answer -> predictor answer.predict (matched by fields)" in said
    program = Pipeline()
    program.load(str(out))
    assert program.count.signature.instructions == kept
    fresh = Pipeline()
    assert program.answer.predict.signature.instructions == \
        fresh.answer.predict.signature.instructions  # the frozen node's prompt did not change
    assert program.polish.signature.instructions == "Polish it."  # no node: untouched
    assert list(program.count.signature.fields) == list(fresh.count.signature.fields)


def _refused(capsys, *argv: str) -> str:
    assert main(["prompts", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert not captured.out
    return captured.err


def test_dspy_is_refused_without_a_program_or_with_no_or_two_matching_predictors(
        run, tmp_path, capsys):
    db, run_id, _ = run
    dspy = pytest.importorskip("dspy")
    out = tmp_path / "better.json"
    assert "--format dspy needs --program" in _refused(
        capsys, run_id, "--db", str(db), "--format", "dspy", "--out", str(out))

    class Twice(dspy.Module):  # two predictors with number's original instructions
        def __init__(self):
            super().__init__()
            self.first = dspy.Predict(dspy.Signature("sentence -> number", COUNT))
            self.second = dspy.Predict(dspy.Signature("sentence -> count", COUNT))
            self.answer = dspy.ChainOfThought("number, topic -> answer")

    class Lacking(dspy.Module):  # nothing like `answer`
        def __init__(self):
            super().__init__()
            self.count = dspy.Predict(dspy.Signature("sentence -> number", COUNT))

    for cls, words in ((Twice, "node 'number' matches 2 predictors (first, second"),
                       (Lacking, "node 'answer' matches no predictor")):
        path = tmp_path / f"{cls.__name__}.json"
        cls().save(str(path))
        assert words in _refused(capsys, run_id, "--db", str(db), "--format", "dspy",
                                 "--program", str(path), "--out", str(out))
    assert not out.exists()
    assert "--program goes with --format dspy" in _refused(
        capsys, run_id, "--db", str(db), "--program", str(tmp_path / "Twice.json"))
    assert "no run 'nosuch'" in _refused(capsys, "nosuch", "--db", str(db))
