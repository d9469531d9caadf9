"""Hardening: every bad input refused with one `error:` line and status 2 (graphs,
datasets, corrupt or foreign run logs, unwritable places, imports, options), and a run whose
model calls all fail ends `failed`, resumable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import main
from tests.support.graphs import REPO, TWO_HINTS, arithmetic_rows, write_graph

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
    from engine.core import graph as graph_module

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


# --- item 2: corrupt, foreign and unwritable run logs ------------------------------------


def finished_log(tmp_path: Path) -> Path:
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(20))
    db = tmp_path / "runs.duckdb"
    assert main(["run", str(graph), "--backend", "scripted", "--steps", "1", "--train", "4",
                 "--val", "4", "--db", str(db), "--run-id", "r1"]) == 0
    return db


def run_args(tmp_path: Path, db: Path) -> list[str]:
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(20))
    return ["run", str(graph), "--backend", "scripted", "--steps", "1", "--train", "2",
            "--val", "2", "--db", str(db)]


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9])
def test_truncated_log_is_refused_by_every_command(tmp_path, capsys, fraction):
    db = finished_log(tmp_path)
    data = db.read_bytes()
    cut = tmp_path / "cut.duckdb"
    cut.write_bytes(data[:int(len(data) * fraction)])
    capsys.readouterr()
    for args in (["runs"], ["export", "r1"], ["resume", "r1"]):
        assert main([*args, "--db", str(cut)]) == 2, args
        assert str(cut) in one_error_line(capsys)
    assert main(run_args(tmp_path, cut)) == 2
    assert "truncated" in one_error_line(capsys) or "damaged" in capsys.readouterr().err
    assert not Path(str(cut) + ".wal").exists()
    assert cut.read_bytes() == data[:int(len(data) * fraction)]


def test_foreign_duckdb_file_is_left_alone(tmp_path, capsys):
    import duckdb

    foreign = tmp_path / "theirs.duckdb"
    with duckdb.connect(str(foreign)) as con:
        con.execute("CREATE TABLE sales (amount INTEGER)")
    assert main(run_args(tmp_path, foreign)) == 2
    assert "not a run log" in one_error_line(capsys)
    with duckdb.connect(str(foreign), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM "
                                            "information_schema.tables").fetchall()}
    assert tables == {"sales"}


@pytest.fixture
def immutable(tmp_path):
    """chattr +i on a path (undone afterwards); skips where chattr is not allowed."""
    made = []

    def make(path: Path) -> Path:
        proc = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
        if proc.returncode != 0:
            pytest.skip("chattr +i is not available here")
        made.append(path)
        return path

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def test_unwritable_folder_is_refused_before_any_model_call(tmp_path, capsys, immutable,
                                                            monkeypatch):
    from engine.llm.scripted import ScriptedBackend

    calls = []
    original = ScriptedBackend.complete
    monkeypatch.setattr(ScriptedBackend, "complete",
                        lambda self, request: calls.append(1) or original(self, request))
    folder = tmp_path / "locked"
    folder.mkdir()
    immutable(folder)
    assert main(run_args(tmp_path, folder / "runs.duckdb")) == 2
    assert "cannot write in the folder" in one_error_line(capsys)
    assert calls == []


def test_immutable_file_is_named_as_not_writable(tmp_path, capsys, immutable):
    db = finished_log(tmp_path)
    immutable(db)
    capsys.readouterr()
    assert main(run_args(tmp_path, db)) == 2
    err = one_error_line(capsys)
    assert "cannot write to the run log" in err and "not readable" not in err
    assert main(["runs", "--db", str(db)]) == 0  # still readable


def test_a_failing_finish_does_not_hide_the_original_error(tmp_path, monkeypatch):
    import asyncio

    from engine.runlog.schema import RunLogError
    from engine.runlog.writer import RunLogWriter
    from engine.runs.execute import RunConfig, execute

    def broken_finish(self, status, error=None):
        raise RunLogError("disk gone")

    def stop(event):
        if type(event).__name__ == "StepFinished":
            raise RuntimeError("the original problem")

    monkeypatch.setattr(RunLogWriter, "finish", broken_finish)
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(20))
    config = RunConfig(graph=str(graph), db=str(tmp_path / "r.duckdb"), steps=1, train=2,
                       val=2, test=0)
    with pytest.raises(RuntimeError, match="the original problem") as info:
        asyncio.run(execute(config, listeners=(stop,)))
    assert "disk gone" in " ".join(getattr(info.value, "__notes__", []))


# --- item 3: resume keeps host and port; a step whose calls all failed is not finished ---


def test_stored_config_keeps_host_and_port_but_never_credentials():
    from engine.runs.execute import RunConfig

    def stored(url):
        return RunConfig(graph="g", base_url=url).to_json()["base_url"]

    assert stored("http://user:pw@127.0.0.1:18182/v1") == "http://127.0.0.1:18182/v1"
    assert stored("https://key@[::1]:8443/v1") == "https://[::1]:8443/v1"
    assert stored("http://localhost:8000/v1") == "http://localhost:8000/v1"
    assert "pw" not in json.dumps(RunConfig(graph="g", base_url="http://u:pw@h:1/").to_json())


def test_resume_reaches_the_same_port_and_a_failed_step_fails_the_run(tmp_path, monkeypatch):
    import asyncio

    from engine.llm.client import ModelUnavailable
    from engine.runlog.schema import connect
    from engine.runs.execute import RunConfig, execute, resume
    from tests.support.fake_openai import FakeOpenAIServer

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(20))
    db = tmp_path / "r.duckdb"

    def kill_after_step_1(event):
        if type(event).__name__ == "StepFinished" and event.step == 1:
            raise RuntimeError("killed")

    with FakeOpenAIServer() as server:
        url = server.base_url.replace("http://", "http://user:pw@")
        config = RunConfig(graph=str(graph), db=str(db), backend="openai", base_url=url,
                           steps=3, train=4, val=4, test=0, max_retries=0, run_id="r")
        with pytest.raises(RuntimeError):
            asyncio.run(execute(config, listeners=(kill_after_step_1,)))
        for _ in range(500):
            server.add_fault("status", 500)
        before = len(server.requests)
        with pytest.raises(ModelUnavailable, match="step 2: all .* model calls failed"):
            asyncio.run(resume(str(db), "r"))
        assert len(server.requests) > before  # the resumed run called host:port
        with connect(db, read_only=True) as con:
            status, error = con.execute("SELECT status, error FROM runs").fetchall()[0]
            steps = con.execute("SELECT max(step) FROM steps").fetchall()[0][0]
        assert status == "failed" and "step 2" in error and steps == 1
        while server.faults:
            server._faults.clear()
        result = asyncio.run(resume(str(db), "r"))
    assert result.status == "finished" and result.state.step == 3
    assert all(a != "Bearer user:pw" for a in server.authorizations)


# --- item 4: import ----------------------------------------------------------------------


def exported(tmp_path: Path) -> dict:
    db = finished_log(tmp_path)
    out = tmp_path / "r1.json"
    assert main(["export", "r1", "--db", str(db), "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.update(format_version=99), "export format version 99"),
    (lambda d: d["tables"]["steps"][0].update(step="one"),
     "table 'steps' row 1 column 'step': expected a whole number, found 'one'"),
    (lambda d: d["tables"]["steps"][0].update(accepted="yes"),
     "column 'accepted': expected true or false"),
    (lambda d: d["tables"]["llm_calls"][0].update(prompt_tokens=1.5),
     "column 'prompt_tokens': expected a whole number"),
    (lambda d: d["tables"]["runs"][0].update(config={"a": 1}),
     "column 'config': expected JSON text"),
    (lambda d: d["tables"]["steps"][0].update(bogus=1), "unknown column 'bogus'"),
])
def test_bad_export_is_refused_and_nothing_written(tmp_path, capsys, change, problem):
    document = exported(tmp_path)
    change(document)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    target = tmp_path / "other.duckdb"
    capsys.readouterr()
    assert main(["import", str(bad), "--db", str(target)]) == 2
    err = one_error_line(capsys)
    assert problem in err and "transaction" not in err
    assert not target.exists()


# --- item 5: smaller ones ---------------------------------------------------------------


@pytest.mark.parametrize("method, option, known", [
    ("semantic", "bogus=1", "it takes no options"),
    ("gtbp", "m9=1", "its options: m0"),
])
def test_unknown_method_option_is_one_line(tmp_path, capsys, method, option, known):
    args = run_args(tmp_path, tmp_path / "r.duckdb") + ["--method", method, "--option", option]
    assert main(args) == 2
    err = one_error_line(capsys)
    assert option.split("=")[0] in err and known in err
    assert not (tmp_path / "r.duckdb").exists()


def test_run_error_has_no_blank_line_before_it(tmp_path, capsys):
    assert main(run_args(tmp_path, tmp_path / "r.duckdb") + ["--val", "999"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, repr(err)
