"""Counterfactual probes on a logged run: every kind, the rows written, cache reuse, the
command line (JSON, bad input, a busy log) and a run log written before probes existed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import duckdb
import pytest

from engine.cli import main
from engine.llm.scripted import ScriptedBackend
from engine.probes.single import probe
from engine.runs.execute import RunConfig, execute
from tests.support.blame_fault_script import HONEST, blame_fault_responder
from tests.support.runlog import rows

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "sample_graphs" / "blame_fault.yaml"


def backend() -> ScriptedBackend:
    return ScriptedBackend(responder=blame_fault_responder())


@pytest.fixture
def logged(tmp_path) -> Path:
    """One step of the teaching graph: every training example fails (the 'numbers' node
    copies a name), three are back-propagated."""
    db = tmp_path / "runs.duckdb"
    config = RunConfig(graph=str(GRAPH), db=str(db), steps=1, test=0, run_id="bf",
                       failures_per_step=3, update_when="always")  # a proposal for 'who' too
    asyncio.run(execute(config, forward_backend=backend()))
    return db




def failing(db: Path) -> list[str]:
    return [r[0] for r in rows(db, "SELECT DISTINCT example_id FROM gradients WHERE step = 1 "
                                   "ORDER BY example_id")]


def text_of(db: Path, example_id: str) -> tuple[str, str]:
    fields, target = rows(db, "SELECT fields, target FROM examples WHERE example_id = ?",
                          example_id)[0]
    return json.loads(fields)["text"], target


def numbers_in(text: str) -> str:
    import re

    return " and ".join(re.findall(r"\d+", text))


def run_probe(db: Path, node: str, kind: str, bk: ScriptedBackend | None = None, **kw):
    return asyncio.run(probe(str(db), "bf", 1, node, kind, forward_backend=bk or backend(),
                             **kw))


def test_output_probe_reruns_only_descendants_and_records_its_rows(logged):
    example = failing(logged)[0]
    text, target = text_of(logged, example)
    activations = rows(logged, "SELECT count(*) FROM node_outputs")[0][0]
    bk = backend()
    [result] = run_probe(logged, "numbers", "output", bk, example=example,
                         text=numbers_in(text))
    assert (result.before_output, result.before_score) == ("0", 0.0)
    assert (result.after_output, result.after_score) == (target, 1.0) and result.flipped
    # only 'total' was re-run: one forward call, and it saw the new 'numbers' output
    assert [r.meta["node"] for r in bk.requests] == ["total"]
    assert numbers_in(text) in bk.requests[0].user_text
    probe_row = rows(logged, "SELECT kind, intervention, before_output, after_output, "
                             "before_score, after_score, leaks_target, error, call_ids "
                             "FROM probes")
    assert probe_row[0][:8] == ("output", numbers_in(text), "0", target, 0.0, 1.0, False, None)
    call_ids = json.loads(probe_row[0][8])
    assert rows(logged, "SELECT purpose, node_id FROM llm_calls WHERE call_id = ?",
                *call_ids) == [("probe", "total")]
    outputs = rows(logged, "SELECT node_id, output_text, call_id FROM probe_outputs "
                           "ORDER BY node_id DESC")
    assert outputs == [("total", target, call_ids[0]), ("numbers", numbers_in(text), None)]
    # the run's own activations are untouched
    assert rows(logged, "SELECT count(*) FROM node_outputs")[0][0] == activations


def test_gradient_probe_asks_the_optimizer_to_follow_the_gradient(logged):
    example = failing(logged)[0]
    text, target = text_of(logged, example)
    bk = backend()
    [result] = run_probe(logged, "numbers", "gradient", bk, example=example)
    rewrite = bk.requests[0]
    assert rewrite.purpose == "probe" and rewrite.meta["role"] == "probe_rewrite"
    assert HONEST["numbers"] in rewrite.user_text  # the gradient 'numbers' received
    assert "<output>\n" + text.split()[0] + "\n</output>" in rewrite.user_text  # its output
    # not the node's prompt: the claim is the output the gradient asks for, whatever the
    # prompt asked (shown it, a small rewriter keeps to it)
    assert not any("Copy the first word" in content for _, content in rewrite.messages)
    assert result.intervention == numbers_in(text) and result.after_output == target
    assert result.flipped and not result.leaks_target
    purposes = rows(logged, "SELECT purpose, count(*) FROM llm_calls WHERE step = 1 AND "
                            "call_id IN (SELECT unnest(json_extract_string(call_ids, '$[*]')) "
                            "FROM probes) GROUP BY purpose")
    assert purposes == [("probe", 2)]  # the rewrite and the re-run of 'total'


def test_gradient_probe_at_the_output_node_flags_a_leaked_target(logged):
    example = failing(logged)[0]
    _, target = text_of(logged, example)
    [result] = run_probe(logged, "total", "gradient", example=example)
    assert result.intervention == target and result.flipped and result.leaks_target
    assert rows(logged, "SELECT leaks_target FROM probes") == [(True,)]


def test_edit_probe_applies_one_prompt_alone(logged):
    results = run_probe(logged, "numbers", "edit", text="proposed")
    assert sorted(r.example_id for r in results) == failing(logged)
    assert all(r.flipped and r.intervention == "Copy the two numbers in the text."
               for r in results)
    results = run_probe(logged, "who", "edit", text="proposed")
    assert not any(r.flipped for r in results)  # 'who' does not matter to the sum
    val = run_probe(logged, "numbers", "edit", text="Copy every number in the text.",
                    examples="val")
    assert len(val) == 8 and all(r.before_score == 0.0 and r.after_score == 1.0 for r in val)
    kinds = rows(logged, "SELECT kind, count(*) FROM probes GROUP BY kind")
    assert kinds == [("edit", 3 + 3 + 8)]


def test_a_repeated_probe_makes_no_model_call(logged):
    example = failing(logged)[1]
    first, second = backend(), backend()
    [a] = run_probe(logged, "numbers", "gradient", first, example=example)
    [b] = run_probe(logged, "numbers", "gradient", second, example=example)
    assert len(first.requests) == 2 and second.requests == []
    assert (b.intervention, b.after_output, b.after_score) == \
        (a.intervention, a.after_output, a.after_score)
    assert len(b.call_ids) == 2  # the rewrite of 'numbers', then 'total'
    hits = rows(logged, "SELECT cache_hit FROM llm_calls WHERE call_id IN (?, ?)", *b.call_ids)
    assert hits == [(True,), (True,)]


def error_line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_probe_json_prints_the_rows(logged, capsys, monkeypatch):
    monkeypatch.setattr("engine.llm.factory.make_backend", lambda *a, **k: backend())
    example = failing(logged)[0]
    code = main(["probe", "bf", "--db", str(logged), "--step", "1", "--node", "numbers",
                 "--example", example, "--gradient", "--json"])
    assert code == 0
    [row] = json.loads(capsys.readouterr().out)
    stored = rows(logged, "SELECT probe_id, after_score FROM probes")
    assert [(row["probe_id"], row["after_score"])] == stored
    assert row["kind"] == "gradient" and [o["node_id"] for o in row["outputs"]] == \
        ["numbers", "total"]


def test_edit_from_a_file_on_listed_examples(logged, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("engine.llm.factory.make_backend", lambda *a, **k: backend())
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Write each number of the text.", encoding="utf-8")
    ids = failing(logged)[:2]
    code = main(["probe", "bf", "--db", str(logged), "--step", "1", "--node", "numbers",
                 "--edit", f"@{prompt}", "--examples", ",".join(ids)])
    assert code == 0
    assert "2 of 2 examples flipped to correct" in capsys.readouterr().out
    assert rows(logged, "SELECT DISTINCT intervention FROM probes") == \
        [("Write each number of the text.",)]


@pytest.mark.parametrize("args, message", [
    (["--step", "1", "--node", "numbers", "--example", "bf-00", "--gradient"], None),
    (["--step", "7", "--node", "numbers", "--example", "X", "--gradient"], "no complete step 7"),
    (["--step", "1", "--node", "nope", "--example", "X", "--gradient"], "no node 'nope'"),
    (["--step", "1", "--node", "numbers", "--example", "nope", "--gradient"],
     "no example 'nope'"),
    (["--step", "0", "--node", "numbers", "--edit", "proposed", "--examples", "val"],
     "no proposed edit"),
    (["--step", "1", "--node", "numbers", "--edit", "@/no/such/file"], "no such file"),
    (["--step", "1", "--node", "numbers", "--edit", "proposed", "--examples", "a,b"],
     "no example 'a'"),
    (["--step", "0", "--node", "numbers", "--edit", "proposed"], "no proposed edit"),
])
def test_bad_input_gets_one_error_line(logged, capsys, args, message):
    if message is None:  # an example that was not back-propagated has no gradient
        used = set(failing(logged))
        train = [r[0] for r in rows(logged, "SELECT example_id FROM examples WHERE split = "
                                            "'train' ORDER BY position")]
        args = [a if a != "bf-00" else next(e for e in train if e not in used) for a in args]
        message = "received no gradient"
    assert main(["probe", "bf", "--db", str(logged), *args]) == 2
    assert message in error_line(capsys)


def test_unknown_run_and_function_node(logged, tmp_path, capsys):
    assert main(["probe", "nope", "--db", str(logged), "--step", "1", "--node", "numbers",
                 "--example", "x", "--gradient"]) == 2
    assert "no run 'nope'" in error_line(capsys)
    graph = tmp_path / "fn.yaml"
    graph.write_text(GRAPH.read_text().replace("dataset: data/", f"dataset: {GRAPH.parent}/data/")
                     .replace("    output: true\n", "") + "  - id: digits\n    kind: function\n"
                     "    function: extract_number\n    inputs: [total]\n    output: true\n")
    db = tmp_path / "fn.duckdb"
    asyncio.run(execute(RunConfig(graph=str(graph), db=str(db), steps=1, test=0,
                                  run_id="fn"), forward_backend=backend()))
    assert main(["probe", "fn", "--db", str(db), "--step", "1", "--node", "digits",
                 "--edit", "proposed"]) == 2
    assert "function node" in error_line(capsys)


def test_a_busy_log_is_said_in_one_line(logged, capsys, monkeypatch):
    monkeypatch.setattr("engine.llm.factory.make_backend", lambda *a, **k: backend())
    with duckdb.connect(str(logged)) as con:
        con.execute("UPDATE runs SET status = 'running'")
    code = main(["probe", "bf", "--db", str(logged), "--step", "1", "--node", "numbers",
                 "--example", failing(logged)[0], "--output", "1 and 2"])
    assert code == 0
    notes = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and "retried" in notes[0] and "not disturbed" in notes[0]
    assert rows(logged, "SELECT count(*) FROM probes")[0][0] == 1


RUNNER = """
import asyncio, sys
from engine.llm.scripted import ScriptedBackend
from engine.runs.execute import RunConfig, execute

config = RunConfig(graph=sys.argv[1], db=sys.argv[2], run_id="live", steps=6, train=16,
                   val=16, test=0)
asyncio.run(execute(config, forward_backend=ScriptedBackend(latency=0.1)))
"""


def test_probes_while_another_process_writes_the_log(logged, capsys, monkeypatch):
    import subprocess
    import sys
    import time

    from engine.runlog.schema import connect

    def shared(sql: str) -> list[tuple]:  # the writer holds the file now and then: retry
        with connect(logged, read_only=True) as con:
            return con.execute(sql).fetchall()

    monkeypatch.setattr("engine.llm.factory.make_backend", lambda *a, **k: backend())
    examples = failing(logged)
    diamond = str(ROOT / "sample_graphs" / "diamond.yaml")
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, diamond, str(logged)], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not shared("SELECT count(*) FROM runs WHERE "
                                                    "run_id = 'live'")[0][0]:
            time.sleep(0.05)
        capsys.readouterr()
        for example in examples:
            assert main(["probe", "bf", "--db", str(logged), "--step", "1", "--node",
                         "numbers", "--example", example, "--gradient"]) == 0
        running_while_probing = proc.poll() is None
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    err = capsys.readouterr().err
    if running_while_probing:
        assert "note: run 'live' is marked running" in err
    assert rows(logged, "SELECT status FROM runs WHERE run_id = 'live'") == [("finished",)]
    assert rows(logged, "SELECT count(*) FROM steps WHERE run_id = 'live'") == [(7,)]
    assert rows(logged, "SELECT count(*), count(*) FILTER (WHERE after_score = 1) FROM "
                        "probes") == [(3, 3)]
