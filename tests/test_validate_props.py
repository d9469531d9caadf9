"""Property tests (hypothesis): whatever a graph file holds, `validate` answers with status 0,
or with status 2 and exactly one `error:` line, never a traceback; random valid DAGs
validate and run under the scripted backend."""

from __future__ import annotations

import contextlib
import io
import json
import random
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.cli import main
from engine.core.graph import GRAPH_KEYS, NODE_KEYS, parse_graph
from tests.support.graphs import arithmetic_rows, run_engine

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**20), st.floats(),
                    st.text(max_size=12), st.sampled_from(["question", "a", "b", "final", ""]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
names = st.one_of(st.sampled_from(["question", "a", "b", "c", "answer"]), values)


def validate(text: str) -> tuple[int, str]:
    """`python -m engine validate` in process on `text`, with data beside it."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(Path(tmp) / "data.jsonl", "w") as fh:
            for row in arithmetic_rows(6):
                fh.write(json.dumps(row) + "\n")
        path = Path(tmp) / "graph.yaml"
        path.write_text(text, encoding="utf-8")
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(["validate", str(path)])
    return code, err.getvalue()


def assert_clean(code: int, err: str) -> None:
    assert code in (0, 2), err
    assert "Traceback" not in err and "error: unexpected" not in err, err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("error: "), err


@SETTINGS
@given(values)
@example({"\n": None})  # an unknown key holding a line break, quoted: still one line
def test_random_yaml_structures(data):
    code, err = validate(yaml.safe_dump(data))
    assert_clean(code, err)
    assert code == 2  # nothing random is a graph with nodes, fields and a target


def test_an_unknown_node_key_with_a_line_break_is_named_on_one_line():
    graph = {"name": "g", "dataset": "data.jsonl", "input_fields": ["question"],
             "target_field": "answer", "nodes": [{"id": "a", "prompt": "p",
                                                  "inputs": ["question"], "a\nb": 1}]}
    code, err = validate(yaml.safe_dump(graph))
    assert code == 2 and err.count("\n") == 1 and "unknown key 'a\\nb'" in err, err


@SETTINGS
@given(st.text(alphabet="{}[]:-,!&*#'\"|>? \nabc12\t%@`", max_size=80))
def test_random_text(text):
    assert_clean(*validate(text))


node_keys = st.sampled_from([*NODE_KEYS, "extra", "Id", "inputs "])
graph_keys = st.sampled_from([*GRAPH_KEYS, "node", "extra"])


@st.composite
def graph_like(draw):
    """A graph-shaped mapping: random key sets, ids, inputs and values."""
    nodes = []
    for _ in range(draw(st.integers(0, 4))):
        node = {"id": draw(names), "prompt": "p", "inputs": draw(st.one_of(
            st.lists(names, max_size=3), names))}
        for key in draw(st.lists(node_keys, max_size=3)):
            node[key] = draw(values)
        for key in draw(st.lists(st.sampled_from(list(node)), max_size=2)):
            node.pop(key, None)
        nodes.append(node)
    graph = {"name": "g", "dataset": "data.jsonl", "input_fields": ["question"],
             "target_field": "answer", "nodes": nodes}
    for key in draw(st.lists(graph_keys, max_size=3)):
        graph[key] = draw(values)
    for key in draw(st.lists(st.sampled_from(list(graph)), max_size=2)):
        graph.pop(key, None)
    return graph


@SETTINGS
@given(graph_like())
def test_random_key_sets_ids_and_inputs(graph):
    assert_clean(*validate(yaml.safe_dump(graph)))


@SETTINGS
@given(graph_like(), st.sampled_from(["!!python/object:os.system", "!custom",
                                      "!!python/name:os.system", "!!binary"]))
def test_random_tags(graph, tag):
    text = yaml.safe_dump(graph).replace("name: g", f"name: {tag} g", 1)
    assert_clean(*validate(text))


@st.composite
def dags(draw):
    """A random DAG whose every node reaches the output, declared in random order."""
    n = draw(st.integers(1, 9))
    ids = [f"n{i}" for i in range(n)]
    inputs = []
    for i in range(n):
        chosen = draw(st.lists(st.sampled_from(["question", *ids[:i]]), min_size=1,
                               max_size=3, unique=True))
        inputs.append(chosen)
    readers = {name for chosen in inputs for name in chosen}
    for node_id in ids[:-1]:
        if node_id not in readers:
            inputs[-1].append(node_id)
    kinds = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    nodes = []
    for i, node_id in enumerate(ids):
        node = {"id": node_id, "inputs": inputs[i]}
        if kinds[i] and i < n - 1:
            node.update(kind="function", function="concatenate")
        else:
            node["prompt"] = f"Step {i}: work on the problem."
        nodes.append(node)
    nodes[-1]["output"] = True
    random.Random(draw(st.integers(0, 1000))).shuffle(nodes)
    return {"name": "dag", "dataset": "data.jsonl", "input_fields": ["question"],
            "target_field": "answer", "metric": "numeric", "nodes": nodes}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_validate_and_run(graph):
    text = yaml.safe_dump(graph)
    code, err = validate(text)
    assert code == 0, err
    parsed = parse_graph(text)
    order = parsed.topological_order()
    assert sorted(order) == sorted(parsed.node_ids)
    for node_id in order:  # every input is computed before its reader
        assert all(order.index(p) < order.index(node_id) for p in parsed.predecessors(node_id))
    with tempfile.TemporaryDirectory() as tmp:
        with open(Path(tmp) / "data.jsonl", "w") as fh:
            for row in arithmetic_rows(8):
                fh.write(json.dumps(row) + "\n")
        path = Path(tmp) / "graph.yaml"
        path.write_text(text)
        result = run_engine(path, Path(tmp) / "r.duckdb", steps=1, train=2, val=2)
    assert result.status == "finished"
    forward = [c for c in result.events.events if getattr(c, "purpose", None) == "forward"]
    llm_nodes = sum(1 for n in graph["nodes"] if n.get("kind") != "function")
    assert len({(c.example_id, c.node_id) for c in forward if c.step == 0}) == 4 * llm_nodes
