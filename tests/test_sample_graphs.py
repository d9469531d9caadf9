"""Every sample graph loads, its data carries the fields it reads, and each teaching graph
has the shape its description promises."""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from engine.core.graph import GraphSpec, load_graph
from engine.data.datasets import DatasetError, load_examples, with_target
from engine.data.examples import split_examples
from engine.data.graders import grade

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_graphs"
DATA = ROOT.parent / "shared" / "datasets"
GRAPH_FILES = sorted(SAMPLES.glob("*.yaml"))
EXPECTED = {"gsm8k", "bbh", "liar", "faulty_pipeline", "diamond", "two_successors", "demo"}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)


def _graph(name: str) -> GraphSpec:
    return load_graph(SAMPLES / f"{name}.yaml")


def _rows(graph: GraphSpec) -> list[dict]:
    path = SAMPLES / graph.dataset
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def test_all_expected_graphs_exist():
    assert {p.stem for p in GRAPH_FILES} >= EXPECTED
    readme = (SAMPLES / "README.md").read_text("utf-8")
    for name in EXPECTED:
        assert f"`{name}.yaml`" in readme


@pytest.mark.parametrize("path", GRAPH_FILES, ids=[p.stem for p in GRAPH_FILES])
def test_graph_loads_with_a_description_and_dataset(path: Path):
    graph = load_graph(path)
    assert graph.name == path.stem
    assert graph.description.strip() and graph.dataset
    assert graph.splits.get("train", 0) > 0 and graph.splits.get("val", 0) > 0


def _uses_jsonl(path: Path) -> bool:
    """Read without validation, so a broken graph fails its own test, not collection."""
    dataset = (yaml.safe_load(path.read_text("utf-8")) or {}).get("dataset")
    return str(dataset or "").endswith(".jsonl")


JSONL_GRAPHS = [p for p in GRAPH_FILES if _uses_jsonl(p)]


@pytest.mark.parametrize("path", JSONL_GRAPHS, ids=[p.stem for p in JSONL_GRAPHS])
def test_demo_data_has_ids_inputs_and_targets(path: Path):
    graph = load_graph(path)
    rows = _rows(graph)
    assert (SAMPLES / graph.dataset).parent == SAMPLES / "data"
    assert len(rows) >= 40
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        for name in (*graph.input_fields, graph.target_field):
            assert isinstance(row.get(name), str) and row[name].strip(), (row, name)
    examples = with_target(load_examples(graph.dataset, graph_dir=str(SAMPLES)),
                           graph.target_field)
    assert [e.id for e in examples] == [r["id"] for r in rows]
    for e in examples:
        assert grade(graph.metric, e.target, e.target) == 1.0, e
    sizes = graph.splits
    splits = split_examples(examples, 0, sizes["train"], sizes["val"], sizes.get("test"))
    assert len(splits.train) == sizes["train"] and len(splits.val) == sizes["val"]


def test_every_data_file_is_used_by_a_graph_or_an_example_pipeline():
    used = {(SAMPLES / p.name).parent / load_graph(p).dataset for p in JSONL_GRAPHS}
    # the traced example pipelines (sample_graphs/*_pipeline.py) read theirs as DATA
    used |= {SAMPLES / "data" / name for script in SAMPLES.glob("*_pipeline.py")
             for name in re.findall(r'"data" / "([\w.-]+\.jsonl)"', script.read_text())}
    files = {SAMPLES / "data" / f.name for f in (SAMPLES / "data").glob("*.jsonl")}
    assert {f.resolve() for f in files} <= {u.resolve() for u in used}


BENCHMARK_GRAPHS = [p for p in GRAPH_FILES if p not in JSONL_GRAPHS]


@pytest.mark.parametrize("path", BENCHMARK_GRAPHS, ids=[p.stem for p in BENCHMARK_GRAPHS])
def test_benchmark_graph_fields_exist_in_its_dataset(path: Path):
    if not DATA.is_dir():
        pytest.skip(f"benchmark data not found at {DATA} (expected ../shared/datasets)")
    graph = load_graph(path)
    try:
        examples = load_examples(graph.dataset, data_dir=str(DATA))
    except DatasetError as exc:
        pytest.skip(f"dataset {graph.dataset} not present here: {exc}")
    examples = with_target(examples, graph.target_field)
    for name in graph.input_fields:
        assert all(name in e.fields for e in examples), name
    assert all(e.target.strip() for e in examples)
    assert sum(graph.splits.values()) <= len(examples)


# --- the shape each graph promises ------------------------------------------------------


def test_paper_graphs():
    for name in ("gsm8k", "bbh"):
        graph = _graph(name)
        assert graph.node_ids == ["hint_a", "hint_b", "final"]
        assert graph.predecessors("final") == ["hint_a", "hint_b"]
        assert graph.node("hint_a").prompt == graph.node("hint_b").prompt == (
            "Work out an intermediate step that helps solve the problem.")
        assert graph.output_node.id == "final" and graph.answer_format
    gsm8k, bbh = _graph("gsm8k"), _graph("bbh")
    assert (gsm8k.dataset, gsm8k.metric, gsm8k.target_field) == ("gsm8k/train", "numeric",
                                                                 "answer")
    assert gsm8k.splits == {"train": 128, "val": 64, "test": 200}
    assert (bbh.dataset, bbh.metric, bbh.splits) == ("bbh/boolean_expressions", "auto",
                                                     {"train": 20, "val": 20})


def test_liar_graph_has_five_analyses_and_six_prompts():
    graph = _graph("liar")
    assert graph.metric == "yes_no" and graph.dataset == "liar"
    assert len(graph.trainable_nodes) == 6
    analyses = graph.predecessors("final")
    assert len(analyses) == 5 and "statement" in graph.node("final").inputs
    # as in the reference, every analysis node sees the statement together with
    # the metadata; "source" is the context the statement was made in, not the speaker
    shown = ("statement", "job_title", "state", "party", "context")
    for node_id in analyses:
        assert graph.node(node_id).inputs == shown
        assert "two sentences" in graph.node(node_id).prompt
    assert graph.node("final").inputs[:5] == shown
    assert "speaker" not in graph.input_fields


def test_faulty_pipeline_names_its_fault():
    graph = _graph("faulty_pipeline")
    order = graph.topological_order()
    assert 2 <= len(order) <= 3
    for upstream, downstream in itertools.pairwise(order):
        assert graph.node(downstream).inputs == (upstream,)
    faulty = graph.node(order[0])
    assert "first word" in faulty.prompt and f"'{faulty.id}'" in graph.description
    # The fault is real: the first word of every text is never the answer.
    for row in _rows(graph):
        assert row["text"].split()[0] != row[graph.target_field]
        assert row[graph.target_field] in row["text"].split()


def test_diamond_has_one_node_with_three_predecessors():
    graph = _graph("diamond")
    assert [n for n in graph.node_ids if len(graph.predecessors(n)) == 3] == [
        graph.output_node.id]


def test_two_successors_has_a_node_read_by_two_nodes_that_both_feed_the_output():
    graph = _graph("two_successors")
    shared = [n for n in graph.node_ids if len(graph.successors(n)) == 2]
    assert len(shared) == 1
    for successor in graph.successors(shared[0]):
        assert successor in graph.predecessors(graph.output_node.id)


def test_demo_graph_is_tiny_and_marked():
    graph = _graph("demo")
    assert "demo" in graph.description.lower() and "Qwen2.5-Coder-0.5B" in graph.description
    assert 2 <= len(graph.nodes) <= 3
    # siblings: the output node reads two LLM nodes, so a sibling-aware gradient and a
    # sibling-blind one are different calls on this graph
    llm = {n.id for n in graph.nodes if n.kind == "llm"}
    assert len(llm & set(graph.output_node.inputs)) >= 2
    # its default plan is the one-click demo's: one step (run's --steps overrides it)
    assert graph.steps == 1
    assert all(n.max_tokens is not None and n.max_tokens <= 64 for n in graph.nodes)
    # validation large enough to show a fix (benchmarks/demo_prompts.py), training small
    assert graph.splits["val"] >= 24 and graph.splits["train"] <= 10
    rows = _rows(graph)
    assert all(len(r["text"]) < 80 for r in rows)
    # each sentence holds one number, the answer: a model that finds it and passes it on
    # is right, one that writes anything else is not
    for r in rows:
        assert re.findall(r"\d+", r["text"]) == [r[graph.target_field]], r
    assert len({r[graph.target_field] for r in rows}) >= 20


@pytest.mark.parametrize("path", GRAPH_FILES, ids=lambda p: p.stem)
def test_every_sample_graph_runs_under_the_scripted_backend(path: Path, tmp_path: Path,
                                                            shared_datasets: Path):
    """`python -m engine run` on each bundled graph: status 0, whole steps in the log."""
    import duckdb

    from engine.cli import main

    db = tmp_path / "runs.duckdb"
    code = main(["run", str(path), "--backend", "scripted", "--steps", "1", "--train", "3",
                 "--val", "3", "--test", "2", "--data-dir", str(shared_datasets),
                 "--db", str(db)])
    assert code == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("finished",)]
        assert con.execute("SELECT step FROM steps ORDER BY step").fetchall() == [(0,), (1,)]
        nodes = con.execute("SELECT count(DISTINCT node_id) FROM node_outputs").fetchone()[0]
    assert nodes == len(load_graph(path).nodes)


def test_the_demo_fixed_prompts_fix_every_node_and_copy_no_example():
    """sample_graphs/data/demo_fixed_prompts.yaml, the hand-fixed prompts that
    benchmarks/demo_prompts.py measures (and the dashboard can offer), names every LLM
    node at fault (the demo's others are fine as they are), changes its prompt, and shows
    no example of the demo's own data."""
    from engine.core.copies import find_copies

    graph = _graph("demo")
    fixed = yaml.safe_load((SAMPLES / "data" / "demo_fixed_prompts.yaml").read_text("utf-8"))
    llm = {n.id: n.prompt for n in graph.nodes if n.kind == "llm"}
    assert set(fixed) == {"note"}
    assert all(fixed[n].strip() and fixed[n] != llm[n] for n in fixed)
    rows = _rows(graph)
    examples = [({f: r[f] for f in graph.input_fields}, r[graph.target_field]) for r in rows]
    assert find_copies({n: (fixed[n], llm[n]) for n in fixed}, examples) == {}
