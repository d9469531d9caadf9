"""One run log for a team: a DuckLake whose catalog is a real PostgreSQL on 127.0.0.1
(tests/support/postgres.py), written by several processes at once (docs/team.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.cli.commands import main
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.runlog import CONTENT, rows, run_content

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[1]
GRAPH = str(ROOT / "sample_graphs" / "diamond.yaml")
SIZES = ["--steps", "2", "--train", "8", "--val", "8", "--test", "4"]


def engine(args: list[str], cwd: Path, *, env: dict | None = None, timeout: float = 300
           ) -> subprocess.CompletedProcess:
    """`python -m engine ARGS` in its own working directory and cache folder."""
    home = cwd / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT), "HOME": str(home),
           "XDG_CACHE_HOME": str(home / ".cache")}
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def start_engine(args: list[str], cwd: Path) -> subprocess.Popen:
    home = cwd / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home),
           "XDG_CACHE_HOME": str(home / ".cache")}
    return subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def error_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("error:")]


def test_four_processes_write_one_lake_as_each_would_write_its_own_file(lake, tmp_path):
    runs = {f"p{i}": ["--seed", str(i)] for i in range(4)}
    procs = {}
    for run_id, seed in runs.items():
        cwd = tmp_path / run_id
        cwd.mkdir()
        procs[run_id] = start_engine(["run", GRAPH, "--backend", "scripted", "--run-id",
                                      run_id, "--db", lake, *SIZES, *seed], cwd)
    for run_id, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (run_id, err[-2000:])
    # the same runs, each alone in a local file
    for run_id, seed in runs.items():
        alone = tmp_path / f"{run_id}.duckdb"
        done = engine(["run", GRAPH, "--backend", "scripted", "--run-id", run_id, "--db",
                       str(alone), *SIZES, *seed], tmp_path / run_id)
        assert done.returncode == 0, done.stderr[-2000:]
        in_lake, in_file = run_content(lake, run_id), run_content(alone, run_id)
        assert in_lake["steps"] and in_lake["llm_calls"]
        for table in CONTENT:
            assert in_lake[table] == in_file[table], f"{run_id}: {table} differs"
        assert rows(lake, "SELECT status FROM runs WHERE run_id = ?", run_id) == [("finished",)]
    # a fifth process blames a run another one wrote; its probes land in the lake
    blamed = engine(["blame", "p1", "--db", lake, "--json"], tmp_path / "fifth")
    assert blamed.returncode == 0, blamed.stderr[-2000:]
    report = json.loads(blamed.stdout)
    assert report["run_id"] == "p1"
    probes = rows(lake, "SELECT count(*), count(DISTINCT probe_id) FROM probes WHERE "
                        "run_id = 'p1'")[0]
    assert probes[0] > 0 and probes[1] == probes[0]


def test_a_reply_one_process_paid_for_is_a_cache_hit_for_another(lake, tmp_path):
    with FakeOpenAIServer() as server:
        common = ["run", GRAPH, "--backend", "openai", "--base-url", server.base_url,
                  "--model", "fake", "--db", lake, *SIZES]
        env = {"OPENAI_API_KEY": "sk-test"}
        first = engine([*common, "--run-id", "first"], tmp_path / "a", env=env)
        assert first.returncode == 0, first.stderr[-2000:]
        paid = len(server.requests)
        assert paid > 0
        second = engine([*common, "--run-id", "second"], tmp_path / "b", env=env)
        assert second.returncode == 0, second.stderr[-2000:]
        assert len(server.requests) == paid  # every call of the second run was a hit
    logged = rows(lake, "SELECT run_id, count(*) FROM llm_calls GROUP BY run_id ORDER BY 1")
    assert [r[0] for r in logged] == ["first", "second"] and logged[0][1] == logged[1][1]


def test_a_password_on_the_command_line_is_refused_before_anything_is_written(
        postgres, tmp_path, capsys):
    db = f"ducklake:postgres:{postgres.dsn('nowhere')} password=hunter2"
    assert main(["run", GRAPH, "--backend", "scripted", "--db", db, *SIZES]) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and "PGPASSWORD" in err and "hunter2" not in err


@pytest.mark.parametrize("what", ["wrong password", "unreachable host", "no such database"])
def test_a_catalog_out_of_reach_is_one_error_line(postgres, tmp_path, monkeypatch, capsys,
                                                  what):
    name = postgres.create_database(f"reach_{what.split()[0]}")
    monkeypatch.setenv("PGPASSWORD", "lake-test-secret")
    monkeypatch.setenv("SEMBACK_DATA_PATH", str(tmp_path / "data"))
    dsn = postgres.dsn(name)
    if what == "wrong password":
        monkeypatch.setenv("PGPASSWORD", "not-the-password")
    elif what == "unreachable host":
        dsn = dsn.replace(f"port={postgres.port}", "port=1")
    else:
        dsn = dsn.replace(f"dbname={name}", "dbname=absent_db")
    code = main(["run", GRAPH, "--backend", "scripted", "--db", f"ducklake:postgres:{dsn}",
                 *SIZES])
    err = capsys.readouterr().err
    assert code == 2
    lines = error_lines(err)
    assert len(lines) == 1, err
    assert "cannot open the lake's catalog" in lines[0] and "not-the-password" not in err
    assert "Traceback" not in err
    # nothing written: the catalog database holds no DuckLake tables
    assert postgres.psql("SELECT count(*) FROM information_schema.tables WHERE "
                         "table_schema = 'public'", name).strip() == "0"


def raw_count(db: str, table: str) -> int:
    """Rows of `table`, read past the engine's schema check (a lake it refuses)."""
    from engine.runlog import lake as lakes

    cur = lakes.cursor(db)
    try:
        return cur.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        cur.close()


def test_a_lake_of_a_newer_schema_is_refused_in_one_line(lake, tmp_path, capsys):
    from engine.runlog.schema import SCHEMA_VERSION, write

    write(lake, lambda con: con.execute("INSERT INTO schema_version VALUES (?, ?)",
                                        [SCHEMA_VERSION + 1, time.time()]))
    from engine.runlog import schema

    schema._CURRENT.discard(lake)  # as a new process would meet it
    assert main(["run", GRAPH, "--backend", "scripted", "--db", lake, *SIZES]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "newer than this engine's" in lines[0], lines
    assert raw_count(lake, "runs") == 0 and raw_count(lake, "examples") == 0


# A scripted responder that counts the model calls reaching it and, at call $PAUSE_AT,
# says so in $PAUSE_FLAG and waits until the test removes that file: the test stops the
# catalog while the run is inside a step. It answers nothing itself (None: the scripted
# backend's own reply).
PAUSING_RESPONDER = """
import os, time
from pathlib import Path

def pausing():
    seen = [0]
    def respond(request):
        seen[0] += 1
        count = os.environ.get("CALLS_SEEN")
        if count:
            Path(count).write_text(str(seen[0]))
        if seen[0] == int(os.environ.get("PAUSE_AT", "0")):
            flag = Path(os.environ["PAUSE_FLAG"])
            flag.write_text("paused")
            while flag.exists():
                time.sleep(0.05)
        return None
    return respond
"""


def test_postgres_killed_mid_step_stops_the_run_and_resume_ends_as_if_uninterrupted(
        postgres, lake, tmp_path):
    responder = tmp_path / "pausing.py"
    responder.write_text(PAUSING_RESPONDER)
    run = ["run", GRAPH, "--backend", "scripted", "--scripted-responder",
           f"{responder}:pausing", "--run-id", "crash", *SIZES]
    seen = tmp_path / "calls_seen"
    reference = engine([*run, "--db", str(tmp_path / "reference.duckdb")], tmp_path / "ref",
                       env={"CALLS_SEEN": str(seen)})
    assert reference.returncode == 0, reference.stderr[-2000:]
    calls = int(seen.read_text())
    flag = tmp_path / "paused"
    home = tmp_path / "crashing" / "home"
    home.mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", *run, "--db", lake], cwd=tmp_path / "crashing",
        env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(home),
             "PAUSE_AT": str(calls * 2 // 3), "PAUSE_FLAG": str(flag)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not flag.exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        committed = rows(lake, "SELECT count(*) FROM steps WHERE run_id = 'crash'")[0][0]
        assert 1 <= committed <= 2  # inside a step after the first
        postgres.kill()
        flag.unlink()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        postgres.start()
    assert proc.returncode == 2, err[-2000:]
    lines = error_lines(err)
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith(f"error: {lake}: ") and "the lake's catalog" in lines[0]
    assert "python -m engine resume crash" in lines[0] and "Traceback" not in err
    # what the lake holds is the steps committed before the kill, the run still 'running'
    assert rows(lake, "SELECT count(*) FROM steps WHERE run_id = 'crash'")[0][0] == committed
    resumed = engine(["resume", "crash", "--db", lake], tmp_path / "crashing")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    expected = run_content(tmp_path / "reference.duckdb", "crash")
    got = run_content(lake, "crash")
    for table in CONTENT:
        assert got[table] == expected[table], f"{table} differs after the resume"
    assert rows(lake, "SELECT status FROM runs WHERE run_id = 'crash'") == [("finished",)]


def test_push_then_pull_round_trips_a_run_log_and_pushing_twice_adds_nothing(lake, tmp_path):
    local = tmp_path / "laptop.duckdb"
    made = engine(["run", GRAPH, "--backend", "scripted", "--run-id", "offline", "--db",
                   str(local), *SIZES], tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    blamed = engine(["blame", "offline", "--db", str(local), "--json"], tmp_path)
    assert blamed.returncode == 0, blamed.stderr[-2000:]
    tables = ["runs", "examples", "steps", "prompt_versions", "node_outputs", "losses",
              "gradients", "updates", "llm_calls", "metrics", "probes", "probe_outputs",
              "llm_cache"]

    def everything(db) -> dict[str, list]:
        return {t: sorted(rows(db, f"SELECT * FROM {t}"), key=repr) for t in tables}

    before = everything(local)
    assert before["probes"] and before["steps"]
    pushed = engine(["runlog", "push", str(local), "--to", lake, "--json"], tmp_path)
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    report = json.loads(pushed.stdout)
    assert report["runs_added"] == ["offline"]
    assert report["rows"]["probes"] == len(before["probes"])
    assert everything(lake) == before
    again = engine(["runlog", "push", str(local), "--to", lake, "--json"], tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["runs_added"] == []
    assert sum(json.loads(again.stdout)["rows"].values()) == 0
    assert everything(lake) == before
    pulled_into = tmp_path / "elsewhere.duckdb"
    pulled = engine(["runlog", "pull", str(pulled_into), "--from", lake], tmp_path)
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    assert everything(pulled_into) == before


def test_a_lake_an_older_engine_wrote_is_migrated_in_place(lake, tmp_path):
    from engine.runlog import lake as lakes
    from engine.runlog.schema import SCHEMA_VERSION, TABLES

    cur = lakes.cursor(lake)  # the lake as version 8 left it: llm_calls without queued_ms
    try:
        for name, columns in TABLES.items():
            if name == "llm_calls":
                columns = columns.replace(", queued_ms DOUBLE", "")
            cur.execute(f"CREATE TABLE {name} ({columns})")
        cur.execute("INSERT INTO schema_version VALUES (8, 0)")
        cur.execute("INSERT INTO llm_calls (run_id, call_id) VALUES ('old', 'c1')")
    finally:
        cur.close()
    done = engine(["run", GRAPH, "--backend", "scripted", "--run-id", "new", "--db", lake,
                   *SIZES], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert rows(lake, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
    assert rows(lake, "SELECT call_id, queued_ms FROM llm_calls WHERE run_id = 'old'") == [
        ("c1", None)]
    assert rows(lake, "SELECT count(*) FROM llm_calls WHERE run_id = 'new' AND queued_ms "
                      "IS NOT NULL")[0][0] > 0


def test_replies_another_writer_commits_mid_run_join_this_runs_cache(lake):
    from engine.events import StepFinished
    from engine.llm.cache import Cache
    from engine.runlog.schema import write
    from engine.runlog.writer import RunLogWriter, insert_rows

    cache = Cache()
    writer = RunLogWriter(lake, "mine", cache)
    writer.start_run({"run_id": "mine", "status": "running"}, [])

    def step(n: int) -> StepFinished:
        return StepFinished(run_id="mine", step=n, train_score=0.0, val_score=0.0, accepted=False,
                            started_at=0.0, ended_at=0.0, metrics={})

    writer.flush(step(0))
    # another machine pays for a call and commits it
    write(lake, lambda con: insert_rows(con, "llm_cache", [{
        "key": "k-elsewhere", "backend": "openai", "model": "m", "request": "[]",
        "response": "paid elsewhere", "prompt_tokens": 3, "completion_tokens": 2,
        "created_at": 0.0}]))
    assert cache.get("k-elsewhere") is None
    writer.flush(step(1))
    reply = cache.get("k-elsewhere")
    assert reply is not None and reply.text == "paid elsewhere"


def test_engine_optimize_writes_a_python_graph_run_into_a_lake(lake):
    from engine import optimize
    from engine.llm.scripted import ScriptedBackend
    from tests.test_api import ROWS, plan_from_question, tool_graph

    result = optimize(tool_graph(), train=ROWS[:4], val=ROWS[4:], steps=1,
                      backend=ScriptedBackend(responder=plan_from_question),
                      failures_per_step=4, db=lake)
    assert result.status == "finished"
    assert rows(lake, "SELECT count(*) FROM steps WHERE run_id = ?", result.run_id) == [(2,)]
    assert rows(lake, "SELECT count(*) FROM node_outputs WHERE run_id = ?",
                result.run_id)[0][0] > 0


def test_a_one_machine_lake_takes_two_writers_in_turn_and_copies_to_a_file(tmp_path,
                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SEMBACK_DATA_PATH", "lake-files")  # relative: stored absolute
    db = "ducklake:team.ducklake"
    procs = [start_engine(["run", GRAPH, "--backend", "scripted", "--run-id", f"w{i}",
                           "--db", db, *SIZES, "--seed", str(i)], tmp_path) for i in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
    assert rows(db, "SELECT run_id FROM runs ORDER BY 1") == [("w0",), ("w1",)]
    from engine.runlog import lake as lakes

    cur = lakes.cursor(db)
    try:
        stored = cur.execute("SELECT value FROM __ducklake_metadata_runlog.ducklake_metadata "
                             "WHERE key = 'data_path'").fetchone()[0]
    finally:
        cur.close()
    assert stored == f"{tmp_path / 'lake-files'}/"
    pulled = engine(["runlog", "pull", "copy.duckdb", "--from", db, "--json"], tmp_path)
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    # in no set order: the lake's rows come in the order of its data files, which the
    # writers' timings decide
    assert sorted(json.loads(pulled.stdout)["runs_added"]) == ["w0", "w1"]


def test_a_lake_whose_data_folder_is_not_mounted_here_is_refused(lake, tmp_path, monkeypatch,
                                                                 capsys):
    assert main(["run", GRAPH, "--backend", "scripted", "--db", lake, *SIZES]) == 0
    data = Path(os.environ["SEMBACK_DATA_PATH"])
    data.rename(tmp_path / "moved")
    monkeypatch.delenv("SEMBACK_DATA_PATH")  # another machine: the catalog's path only
    from engine.runlog import lake as lakes

    lakes.forget(lake)
    capsys.readouterr()
    assert main(["runs", "--db", lake]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and f"data folder {data}/ is not on this machine" in lines[0]
    assert not data.exists()  # never replaced by an empty local folder


def test_push_never_takes_a_run_backwards(lake, tmp_path):
    local = tmp_path / "laptop.duckdb"
    made = engine(["run", GRAPH, "--backend", "scripted", "--run-id", "r", "--db",
                   str(local), *SIZES], tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    assert engine(["runlog", "push", str(local), "--to", lake], tmp_path).returncode == 0
    from engine.runlog.writer import set_notes

    set_notes(lake, "r", "seen by the team", ["lake"])
    older = tmp_path / "older.duckdb"
    assert engine(["runlog", "pull", str(older), "--from", lake], tmp_path).returncode == 0
    from engine.runlog.schema import write

    write(older, lambda con: con.execute(
        "UPDATE runs SET status = 'running', ended_at = NULL, notes = NULL, tags = NULL"))
    pushed = engine(["runlog", "push", str(older), "--to", lake, "--json"], tmp_path)
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    assert json.loads(pushed.stdout)["runs_updated"] == []
    assert rows(lake, "SELECT status, notes FROM runs") == [("finished", "seen by the team")]
    # the other way, the older copy catches up
    pulled = engine(["runlog", "pull", str(older), "--from", lake, "--json"], tmp_path)
    assert json.loads(pulled.stdout)["runs_updated"] == ["r"]
    assert rows(older, "SELECT status, notes FROM runs") == [("finished", "seen by the team")]


def test_traces_exported_from_a_file_log_import_into_a_lake(lake, tmp_path):
    from tests.support.otlp_traces import exported_diamond_run

    graph, spans = exported_diamond_run(tmp_path)
    done = engine(["import-traces", str(spans), "--db", lake, "--run-id", "imported"],
                  tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    traces = rows(lake, "SELECT count(*) FROM examples WHERE run_id = 'imported'")[0][0]
    assert traces > 0
    assert rows(lake, "SELECT count(DISTINCT node_id) FROM node_outputs WHERE "
                      "run_id = 'imported'")[0][0] >= 2
