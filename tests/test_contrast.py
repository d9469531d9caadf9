"""`contrast:` / `run --contrast METHOD`: a sibling-aware run also writes a sibling-blind
method's gradients for the same back-propagated examples, from the same forward pass and
the same feedback, recorded as kind 'contrast' and never used for an update. On the demo
graph (`answer` reads `note` and `thing`) the run's own backward prompt for `note` shows
`thing`'s output and the contrast one does not."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.graph import GraphError, load_graph
from engine.runs.estimate import backward_calls_per_example
from engine.runs.execute import RunConfig, execute
from tests.support.runlog import rows

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "sample_graphs" / "demo.yaml"
DEMO_MODEL = f"{ROOT / 'sample_graphs' / 'demo_responder.py'}:demo_responder"


def run_demo(db: Path, run_id: str, **settings) -> None:
    config = RunConfig(graph=str(DEMO), backend="scripted", scripted_responder=DEMO_MODEL,
                       steps=1, db=str(db), run_id=run_id, **settings)
    assert asyncio.run(execute(config)).status == "finished"


@pytest.fixture(scope="module")
def demo_log(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("contrast") / "runs.duckdb"
    run_demo(db, "with", contrast="semantic-nosibling")
    run_demo(db, "without")
    return db


def test_the_demo_graph_asks_for_the_sibling_blind_gradients():
    assert load_graph(str(DEMO)).run_defaults()["contrast"] == "semantic-nosibling"


def test_each_back_propagated_example_gets_the_sibling_blind_gradient_of_each_input(demo_log):
    own = rows(demo_log, "SELECT example_id, node_id FROM gradients WHERE run_id = 'with' "
                         "AND kind = 'gradient' AND from_node_id = 'answer' ORDER BY ALL")
    contrast = rows(demo_log, "SELECT example_id, node_id, method FROM gradients WHERE "
                              "run_id = 'with' AND kind = 'contrast' AND from_node_id = "
                              "'answer' ORDER BY ALL")
    assert len(own) == 4  # two examples, two inputs of `answer`
    assert [(e, n) for e, n, _ in contrast] == own
    assert {m for _, _, m in contrast} == {"semantic-nosibling"}
    # one backward call per input of `answer` beside the run's one joint call
    calls = dict(rows(demo_log, "SELECT run_id, count(*) FROM llm_calls WHERE purpose = "
                                "'backward' GROUP BY run_id"))
    assert calls == {"with": 2 + 4, "without": 2}


def test_the_contrast_prompt_leaves_the_sibling_out_and_keeps_the_same_feedback(demo_log):
    (example,) = rows(demo_log, "SELECT min(example_id) FROM gradients WHERE run_id = 'with' "
                                "AND kind = 'contrast'")[0]
    (thing,) = rows(demo_log, "SELECT output_text FROM node_outputs WHERE run_id = 'with' "
                              "AND step = 1 AND split = 'train' AND example_id = ? AND "
                              "node_id = 'thing'", example)[0]
    (feedback,) = rows(demo_log, "SELECT content FROM gradients WHERE run_id = 'with' AND "
                                 "step = 1 AND example_id = ? AND node_id = 'answer' AND "
                                 "kind = 'aggregate'", example)[0]

    def prompt(kind: str) -> str:
        (messages,) = rows(demo_log, """
            SELECT c.messages FROM gradients g JOIN llm_calls c ON c.call_id = g.call_id
            WHERE g.run_id = 'with' AND g.step = 1 AND g.example_id = ? AND g.kind = ?
              AND g.node_id = 'note'""", example, kind)[0]
        return " ".join(m["content"] for m in json.loads(messages))

    joint, blind = prompt("gradient"), prompt("contrast")
    assert thing.strip() and thing in joint and thing not in blind
    assert feedback in joint and feedback in blind


def test_the_contrast_changes_nothing_the_run_did(demo_log):
    """Same prompts proposed and kept, same scores, same counts of gradients per example:
    the sibling-blind messages are written beside the run, never read by it."""
    def outcome(run: str) -> list[tuple]:
        return [*rows(demo_log, "SELECT step, node_id, new_prompt, accepted FROM updates "
                                "WHERE run_id = ? ORDER BY ALL", run),
                *rows(demo_log, "SELECT step, val_score, accepted FROM steps WHERE run_id = ? "
                                "ORDER BY step", run)]

    assert outcome("with") == outcome("without")
    from engine.runlog.reader import step_examples

    def counts(run: str) -> list[int]:
        return list(step_examples(str(demo_log), run, 1)["gradients"])

    assert counts("with") == counts("without")


def test_the_estimate_and_progress_count_the_contrast_calls():
    graph = load_graph(str(DEMO))
    assert backward_calls_per_example(graph, "semantic") == 1
    assert backward_calls_per_example(graph, "semantic", "semantic-nosibling") == 3
    assert backward_calls_per_example(graph, "textgrad", "semantic-nosibling") == 2


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_a_method_without_siblings_is_refused_a_contrast_and_skips_the_graphs(tmp_path):
    db = tmp_path / "runs.duckdb"
    refused = cli("run", str(DEMO), "--backend", "scripted", "--method", "textgrad",
                  "--contrast", "semantic-nosibling", "--db", str(db))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: --contrast writes sibling-blind gradients beside a sibling-aware method's "
        "(semantic, semantic-evaluative); --method textgrad has none to contrast"]
    assert not db.exists()
    done = cli("run", str(DEMO), "--backend", "scripted", "--method", "textgrad",
               "--steps", "1", "--db", str(db), "--run-id", "tg")
    assert done.returncode == 0, done.stderr
    (config,) = rows(db, "SELECT config FROM runs WHERE run_id = 'tg'")[0]
    assert json.loads(config)["contrast"] is None  # the demo's contrast: not for textgrad
    assert rows(db, "SELECT count(*) FROM gradients WHERE kind = 'contrast'") == [(0,)]


def test_an_unknown_contrast_in_a_graph_names_its_line(tmp_path):
    graph = tmp_path / "g.yaml"
    graph.write_text(DEMO.read_text().replace("contrast: semantic-nosibling",
                                              "contrast: semantic"))
    with pytest.raises(GraphError) as caught:
        load_graph(str(graph))
    line = next(i for i, t in enumerate(graph.read_text().splitlines(), 1)
                if t.startswith("contrast:"))
    assert f":{line}" in str(caught.value)
    assert "unknown contrast 'semantic' (allowed: semantic-nosibling, textgrad)" in str(
        caught.value)
