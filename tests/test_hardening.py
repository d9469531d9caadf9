"""Issue 13, items 1-5: every bad input refused with one `error:` line and status 2 (graphs,
datasets, corrupt or foreign run logs, unwritable places, imports, options), and a run whose
model calls all fail ends `failed`, resumable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import main
from tests.conftest import REPO, TWO_HINTS, arithmetic_rows, write_graph

HEAD = """name: g
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
nodes:
"""


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), repr(err)
    assert "Traceback" not in err and "error: unexpected" not in err, err
    return err.strip()


# --- item 1: validate -------------------------------------------------------------------


@pytest.mark.parametrize("text, problem", [
    (HEAD + "  - {id: [a], prompt: p, inputs: [question], output: true}\n",
     "a node 'id' must be a plain name"),
    (HEAD + "  - {id: {x: 1}, prompt: p, inputs: [question], output: true}\n",
     "a node 'id' must be a plain name"),
    (HEAD + "  - {id: a, prompt: p, inputs: question, output: true}\n",
     "'inputs' must be a list of names"),
    (HEAD + "  - {id: a, prompt: p, inputs: [[question]], output: true}\n",
     "'inputs' must be a list of names"),
    (HEAD + "  - {id: a, kind: function, function: [concatenate], inputs: [question], "
            "output: true}\n", "unknown function"),
    (HEAD + "  - {id: a, prompt: p, inputs: [question], output: true, max_tokens: true}\n",
     "'max_tokens' must be a positive whole number"),
])
def test_malformed_ids_and_inputs_are_refused(tmp_path, capsys, text, problem):
    path = write_graph(tmp_path, text, arithmetic_rows(5))
    assert main(["validate", str(path)]) == 2
    err = one_error_line(capsys)
    assert problem in err and f"{path}:7:" in err


def test_python_tag_is_refused_without_running_code(tmp_path):
    marker = tmp_path / "ran"
    text = HEAD.replace("name: g", f"name: !!python/object/apply:os.system ['touch {marker}']")
    path = write_graph(tmp_path, text + "  - {id: a, prompt: p, inputs: [question], "
                                        "output: true}\n", arithmetic_rows(5))
    proc = subprocess.run([sys.executable, "-m", "engine", "validate", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1
    assert f"{path}:1:" in proc.stderr and "python/object/apply" in proc.stderr
    assert not marker.exists()


def test_deeply_nested_yaml_is_one_line(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("name: " + "[" * 100_000 + "]" * 100_000 + "\n")
    proc = subprocess.run([sys.executable, "-m", "engine", "validate", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "nested too deeply" in proc.stderr


GOOD = HEAD + "  - {id: a, prompt: p, inputs: [question], output: true}\n"


def test_validate_checks_a_relative_dataset_without_check_data(tmp_path, capsys):
    path = write_graph(tmp_path, GOOD)  # no data.jsonl beside it
    assert main(["validate", str(path)]) == 2
    assert "data.jsonl" in one_error_line(capsys)
    path = write_graph(tmp_path, GOOD.replace("[question]", "[quest]"), arithmetic_rows(5))
    assert main(["validate", str(path)]) == 2
    assert "input field 'quest'" in one_error_line(capsys)
    path = write_graph(tmp_path, GOOD.replace("target_field: answer", "target_field: ans"),
                       arithmetic_rows(5))
    assert main(["validate", str(path)]) == 2
    assert "no field 'ans'" in one_error_line(capsys)
    path = write_graph(tmp_path, GOOD, arithmetic_rows(5))
    assert main(["validate", str(path)]) == 0
    assert "checked" in capsys.readouterr().out


def test_validate_checks_a_named_dataset_with_the_data_dir_env(tmp_path, capsys,
                                                               monkeypatch):
    path = write_graph(tmp_path, GOOD.replace("data.jsonl", "gsm8k/train"))
    monkeypatch.setenv("SEMBACK_DATA_DIR", str(tmp_path / "empty"))
    assert main(["validate", str(path)]) == 2
    assert "gsm8k/train" in one_error_line(capsys)
    monkeypatch.delenv("SEMBACK_DATA_DIR")
    assert main(["validate", str(path)]) == 0  # not resolvable offline: structure only
    assert "checked" not in capsys.readouterr().out


@pytest.mark.parametrize("bad", [{"question": None}, {"question": {"text": "x"}}, {}])
def test_every_row_is_checked_and_the_bad_line_named(tmp_path, capsys, bad):
    rows = arithmetic_rows(9)
    rows.append({"id": "late", "answer": "1", **bad})
    path = write_graph(tmp_path, GOOD, rows)
    assert main(["validate", str(path)]) == 2
    err = one_error_line(capsys)
    assert f"{tmp_path / 'data.jsonl'}:10:" in err and "'late'" in err and "'question'" in err
    # and a run refuses it before any model call
    assert main(["run", str(path), "--backend", "scripted", "--db",
                 str(tmp_path / "r.duckdb")]) == 2
    assert "'late'" in one_error_line(capsys)
    assert not (tmp_path / "r.duckdb").exists()


def test_two_hints_graph_still_validates(tmp_path, capsys):
    path = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(5))
    assert main(["validate", str(path)]) == 0
    assert json.dumps("ok")[1:-1] in capsys.readouterr().out
    assert Path(path).exists()


# --- item 6: graph operations in O(V + E) ------------------------------------------------


def test_topology_is_computed_once_per_graph(monkeypatch):
    from benchmarks.large_graph import graph_yaml
    from engine import graph as graph_module

    built = []
    original = graph_module._Topology.of
    monkeypatch.setattr(graph_module._Topology, "of",
                        classmethod(lambda cls, *a: built.append(1) or original(*a)))
    graph = graph_module.parse_graph(graph_yaml(300))
    for node_id in graph.node_ids:
        graph.successors(node_id), graph.predecessors(node_id), graph.node(node_id)
    assert graph.topological_order() == [f"n{i}" for i in range(300)]
    assert graph.successors("n5") == ["n6", "n8"] and graph.predecessors("n5") == ["n4", "n2"]
    assert len(built) == 1


def test_duplicate_input_is_named(tmp_path, capsys):
    path = write_graph(tmp_path, HEAD + "  - {id: a, prompt: p, inputs: [question, question], "
                                        "output: true}\n", arithmetic_rows(5))
    assert main(["validate", str(path)]) == 2
    assert "input 'question' is listed twice" in one_error_line(capsys)
