"""Graph files: loading, topology, and one clear line with status 2 for every kind of
malformed file."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.cli import main
from engine.core.graph import GraphError, load_graph, parse_graph
from tests.support.graphs import REPO, TWO_HINTS, arithmetic_rows, write_graph

HEAD = """name: g
input_fields: [question]
target_field: answer
nodes:
"""


def test_loads_the_issue_example(tmp_path):
    graph = load_graph(write_graph(tmp_path, TWO_HINTS))
    assert graph.name == "two-hints"
    assert graph.topological_order() == ["hint_a", "hint_b", "final"]
    assert graph.predecessors("final") == ["hint_a", "hint_b"]
    assert graph.successors("hint_a") == ["final"]
    assert graph.output_node.id == "final"
    assert graph.trainable_nodes == ["hint_a", "hint_b", "final"]


def test_function_nodes_are_never_trainable():
    graph = parse_graph(HEAD + """  - id: solve
    prompt: Solve.
    inputs: [question]
  - id: number
    kind: function
    function: extract_number
    inputs: [solve]
    output: true
""")
    assert graph.node("number").trainable is False
    assert graph.trainable_nodes == ["solve"]


MALFORMED = {
    "yaml syntax": ("name: g\nnodes: [unclosed\n", "YAML syntax error", 3),
    "unknown top key": (HEAD.replace("name: g", "name: g\ncolour: red") +
                        "  - {id: a, prompt: p, inputs: [question], output: true}\n",
                        "unknown key 'colour'", 2),
    "unknown node key": (HEAD + "  - id: a\n    prompt: p\n    inputs: [question]\n"
                         "    output: true\n    temperature: 3\n", "unknown key 'temperature'", 9),
    "duplicate id": (HEAD + "  - {id: a, prompt: p, inputs: [question]}\n"
                     "  - {id: a, prompt: p, inputs: [question], output: true}\n",
                     "duplicate node id", 6),
    "unknown input": (HEAD + "  - {id: a, prompt: p, inputs: [question, hint], output: true}\n",
                      "input 'hint' names neither a node nor an input field", 5),
    "cycle": (HEAD + "  - {id: a, prompt: p, inputs: [b]}\n"
              "  - {id: b, prompt: p, inputs: [a]}\n"
              "  - {id: c, prompt: p, inputs: [a], output: true}\n", "cycle", 5),
    "self loop": (HEAD + "  - {id: a, prompt: p, inputs: [a], output: true}\n", "cycle", 5),
    "no output": (HEAD + "  - {id: a, prompt: p, inputs: [question]}\n", "no output node", None),
    "two outputs": (HEAD + "  - {id: a, prompt: p, inputs: [question], output: true}\n"
                    "  - {id: b, prompt: p, inputs: [question], output: true}\n",
                    "several output nodes", 6),
    "unreachable": (HEAD + "  - {id: a, prompt: p, inputs: [question]}\n"
                    "  - {id: b, prompt: p, inputs: [question], output: true}\n",
                    "cannot reach the output node 'b'", 5),
    "unknown function": (HEAD + "  - {id: a, kind: function, function: eval, inputs: [question],"
                         " output: true}\n", "unknown function 'eval'", 5),
    "empty prompt": (HEAD + "  - {id: a, prompt: '', inputs: [question], output: true}\n",
                     "needs a non-empty 'prompt'", 5),
    "no nodes": ("name: g\ninput_fields: [q]\ntarget_field: a\n", "missing required key 'nodes'",
                 1),
    "bad metric": (HEAD.replace("nodes:", "metric: bleu\nnodes:") +
                   "  - {id: a, prompt: p, inputs: [question], output: true}\n",
                   "unknown metric 'bleu'", 4),
    "not a mapping": ("- just\n- a list\n", "must be a YAML mapping", 1),
    "missing target": ("name: g\ninput_fields: [q]\nnodes:\n"
                       "  - {id: a, prompt: p, inputs: [q], output: true}\n",
                       "missing required key 'target_field'", 1),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_graph_gives_status_2_and_one_clear_line(case, tmp_path, capsys):
    text, problem, line = MALFORMED[case]
    path = write_graph(tmp_path, text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert err.startswith(f"error: {path}")
    assert problem in err
    if line is not None:
        assert f"{path}:{line}:" in err
    assert "Traceback" not in err


def test_errors_name_the_node(tmp_path):
    path = write_graph(tmp_path, MALFORMED["unknown input"][0])
    with pytest.raises(GraphError) as info:
        load_graph(path)
    assert info.value.node == "a"
    assert "node 'a'" in str(info.value)


def test_missing_file_and_binary_file(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "file not found" in capsys.readouterr().err
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["validate", str(binary)]) == 2
    assert "cannot read file" in capsys.readouterr().err


def test_validate_subprocess_prints_no_traceback(tmp_path):
    path = write_graph(tmp_path, MALFORMED["cycle"][0])
    proc = subprocess.run([sys.executable, "-m", "engine", "validate", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "cycle" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_validates_before_running(tmp_path, capsys):
    path = write_graph(tmp_path, MALFORMED["two outputs"][0])
    db = tmp_path / "runs.duckdb"
    assert main(["run", str(path), "--backend", "scripted", "--db", str(db)]) == 2
    assert "several output nodes" in capsys.readouterr().err
    assert not db.exists()


def test_a_graphs_steps_are_runs_default_and_the_flag_overrides_them(tmp_path, capsys):
    """`steps: N` in a graph file is `run`'s default --steps for it (the demo's is 1, the
    one-click demo's plan); --steps still wins; a bad value is one clear error."""
    from tests.support.runlog import rows

    path = write_graph(tmp_path, TWO_HINTS.replace("nodes:", "steps: 1\nsplits: "
                       "{train: 3, val: 3, test: 0}\nnodes:", 1), arithmetic_rows(8))
    assert load_graph(str(path)).steps == 1 and load_graph(
        str(write_graph(tmp_path, TWO_HINTS, name="plain.yaml"))).steps is None
    db = tmp_path / "runs.duckdb"
    for run_id, flags in (("graph-default", []), ("flag", ["--steps", "2"])):
        assert main(["run", str(path), "--backend", "scripted", "--db", str(db),
                     "--run-id", run_id, *flags]) == 0
    assert rows(db, "SELECT run_id, max(step) FROM steps GROUP BY run_id ORDER BY run_id"
                ) == [("flag", 2), ("graph-default", 1)]
    bad = write_graph(tmp_path, TWO_HINTS.replace("nodes:", "steps: -1\nnodes:", 1),
                      name="bad.yaml")
    capsys.readouterr()
    assert main(["validate", str(bad)]) == 2
    assert "'steps' must be a whole number, 0 or more" in capsys.readouterr().err
