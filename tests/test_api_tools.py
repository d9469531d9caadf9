"""`run --functions FILE.py` on the command line, and the worked example
(sample_graphs/calculator.py): a safe calculator tool fed an expression by an LLM node."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import duckdb
import pytest

from engine.cli import main
from engine.llm.base import LLMRequest
from engine.llm.scripted import ScriptedBackend
from tests.support.graphs import write_graph

SAMPLE = Path(__file__).resolve().parents[1] / "sample_graphs" / "calculator.py"
TOOL_GRAPH = """name: tool-graph
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
splits: {train: 3, val: 3}
nodes:
  - id: plan
    prompt: Write the arithmetic expression.
    inputs: [question]
  - id: calc
    kind: function
    function: calculator
    description: Evaluates an arithmetic expression.
    inputs: [plan]
  - id: final
    prompt: Give the final number.
    inputs: [question, calc]
    output: true
"""


def load_sample():
    spec = importlib.util.spec_from_file_location("calculator_sample", SAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


calc = load_sample()


def error_line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def graph_file(tmp_path: Path) -> Path:
    return write_graph(tmp_path, TOOL_GRAPH, calc.sample_rows()[:6])


# --- the calculator ----------------------------------------------------------------------


def test_evaluate_computes_arithmetic_only():
    assert calc.evaluate("(12 + 7) * 3") == 57 and calc.evaluate("-2 ** 3 + 10 / 4") == -5.5
    for code in ["__import__('os').system('echo hi')", "open('x')", "(1).__class__", "a + 1",
                 "2 ** 1000", "1 / 0", "[1, 2]", "True + 1", "'3' * 3"]:
        with pytest.raises(ValueError):
            calc.evaluate(code)


def test_calculator_finds_the_expression_in_model_text():
    assert calc.calculator("The expression is 12 x 3 + 7.") == "43"
    assert calc.calculator("Total: 1,200 ÷ 4") == "300"
    assert calc.calculator("no numbers here").startswith("error: no arithmetic expression")


def expression_writer(request: LLMRequest) -> str | None:
    """plan writes '<a> * <b>' from the question's first two numbers; final copies calc."""
    text = request.messages[-1][1]
    if request.purpose == "forward" and request.meta.get("node") == "plan":
        a, b = re.findall(r"\d+", text.split("</input>")[0])[:2]
        return f"<output>{a} * {b}</output>"
    if request.purpose == "forward" and request.meta.get("node") == "final":
        value = re.search(r'<input name="calc">\n(.*?)\n</input>', text).group(1)
        return f"<output>{value}</output>"
    return None


def test_worked_example_feeds_the_tool_an_expression():
    acts = calc.build_graph().forward(calc.sample_rows()[5],  # 24 eggs a box, 192 eggs
                                      backend=ScriptedBackend(responder=expression_writer))
    assert acts["plan"].output_text == "24 * 192" and acts["calc"].output_text == "4608"
    assert acts["final"].output_text == "4608"


def test_worked_example_runs_under_the_scripted_backend(tmp_path, capsys):
    db = tmp_path / "runs.duckdb"
    calc.main(["--backend", "scripted", "--steps", "1", "--train", "3", "--val", "3",
               "--db", str(db)])
    out = capsys.readouterr().out
    assert "calc:" in out and "(finished)" in out
    with duckdb.connect(str(db), read_only=True) as con:
        calls = con.execute("SELECT count(*) FROM node_outputs WHERE node_id = 'calc'"
                            ).fetchone()[0]
        described = con.execute("SELECT graph_yaml FROM runs").fetchone()[0]
    assert calls == 12  # step 0 on 3 train + 3 val, step 1 on 3 train and 3 val candidates
    assert "function: calculator" in described and "A calculator: evaluates" in described


# --- the command line --------------------------------------------------------------------


def test_run_with_functions_binds_the_file(tmp_path, capsys):
    db = tmp_path / "runs.duckdb"
    code = main(["run", str(graph_file(tmp_path)), "--functions", str(SAMPLE), "--backend",
                 "scripted", "--steps", "1", "--db", str(db)])
    assert code == 0, capsys.readouterr().err
    with duckdb.connect(str(db), read_only=True) as con:
        outputs = con.execute("SELECT input_text, output_text FROM node_outputs "
                              "WHERE node_id = 'calc' AND step = 0").fetchall()
    assert len(outputs) == 6 and all(o.startswith("error: no arithmetic") for _, o in outputs)
    assert main(["validate", str(graph_file(tmp_path)), "--functions", str(SAMPLE)]) == 0


def test_without_functions_an_unknown_function_is_refused(tmp_path, capsys):
    assert main(["run", str(graph_file(tmp_path)), "--backend", "scripted",
                 "--db", str(tmp_path / "runs.duckdb")]) == 2
    assert "node 'calc': unknown function 'calculator'" in error_line(capsys)
    assert not (tmp_path / "runs.duckdb").exists()


@pytest.mark.parametrize("source, expected", [
    ("def calculator(:\n", "cannot import: SyntaxError: "),
    ("import not_a_module_anywhere\n", "cannot import: ModuleNotFoundError: No module named"),
    ("raise SystemExit(3)\n", "cannot import: SystemExit: 3"),
    (None, "functions file not found"),
])
def test_functions_file_that_does_not_import_exits_2(tmp_path, capsys, source, expected):
    tools = tmp_path / "tools.py"
    if source is not None:
        tools.write_text(source)
    code = main(["run", str(graph_file(tmp_path)), "--functions", str(tools), "--backend",
                 "scripted", "--db", str(tmp_path / "runs.duckdb")])
    assert code == 2
    line = error_line(capsys)
    assert str(tools) in line and expected in line


def test_functions_file_with_the_wrong_signature_names_the_node(tmp_path, capsys):
    tools = tmp_path / "tools.py"
    tools.write_text("def calculator(text, extra):\n    return text\n")
    assert main(["validate", str(graph_file(tmp_path)), "--functions", str(tools)]) == 2
    line = error_line(capsys)
    assert "node 'calc'" in line and "cannot take the node's 1 input (plan)" in line


def test_functions_file_may_import_its_sibling_modules(tmp_path):
    from engine import load_functions

    (tmp_path / "helpers_for_tools.py").write_text("def shout(text):\n    return text.upper()\n")
    (tmp_path / "tools.py").write_text("from helpers_for_tools import shout\n\n"
                                       "def calculator(text):\n    return shout(text)\n")
    functions = load_functions(tmp_path / "tools.py")
    assert functions["calculator"]("abc") == "ABC"
    assert str(tmp_path) not in __import__("sys").path


def test_resume_binds_the_functions_again(tmp_path, capsys):
    import asyncio

    from engine.api.builder import Graph
    from engine.api.support import load_functions
    from engine.events import StepFinished
    from engine.runs.execute import RunConfig, execute

    path, db = graph_file(tmp_path), tmp_path / "runs.duckdb"

    def stop_after_step_0(event):
        if isinstance(event, StepFinished) and event.step == 0:
            raise RuntimeError("stopped for the test")

    spec = Graph.from_yaml(path, functions=load_functions(SAMPLE)).spec
    with pytest.raises(RuntimeError):
        asyncio.run(execute(RunConfig(graph=str(path), steps=2, db=str(db), run_id="r"),
                            graph=spec, listeners=(stop_after_step_0,)))
    # the run recorded where its functions came from: resume imports them again, no flag
    assert main(["resume", "r", "--db", str(db)]) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        status, steps = con.execute("SELECT status, (SELECT max(step) FROM steps) FROM runs"
                                    ).fetchone()
    assert (status, steps) == ("finished", 2)
