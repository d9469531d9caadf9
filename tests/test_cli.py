"""The command line's answers to bad input and unavailable models: one line, status 2."""

from __future__ import annotations

import socket

import duckdb
import pytest

from engine.cli import main
from tests.support.graphs import TWO_HINTS, arithmetic_rows, write_graph


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens here once the socket closes


def error_line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_unreachable_server_stops_the_run_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    code = main(["run", str(graph), "--backend", "openai", "--base-url",
                 f"http://127.0.0.1:{closed_port()}/v1", "--max-retries", "1", "--db", str(db)])
    assert code == 2
    line = error_line(capsys)
    assert "unavailable" in line and "none succeeded" in line and "cannot connect" in line
    with duckdb.connect(str(db), read_only=True) as con:
        status, error = con.execute("SELECT status, error FROM runs").fetchone()
    assert status == "failed" and "unavailable" in error


def test_missing_key_names_the_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    assert main(["run", str(graph), "--backend", "openai", "--db",
                 str(tmp_path / "r.duckdb")]) == 2
    assert "OPENAI_API_KEY" in error_line(capsys)


def test_bad_options_and_sizes(tmp_path, capsys):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(10))
    db = str(tmp_path / "r.duckdb")
    assert main(["run", str(graph), "--backend", "scripted", "--option", "m0", "--db", db]) == 2
    assert "KEY=VALUE" in error_line(capsys)
    assert main(["run", str(graph), "--backend", "scripted", "--train", "8", "--val", "8",
                 "--db", db]) == 2
    assert "only 10" in error_line(capsys)
    assert main(["run", str(graph), "--backend", "scripted", "--train", "4", "--val", "0",
                 "--db", db]) == 2
    assert "--no-gate" in error_line(capsys)


def test_a_file_that_is_not_a_run_log_is_left_alone(tmp_path, capsys):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "notes.duckdb"
    db.write_bytes(b"my notes, not a database")
    assert main(["run", str(graph), "--backend", "scripted", "--db", str(db)]) == 2
    assert "not a readable DuckDB run log" in error_line(capsys)
    assert db.read_bytes() == b"my notes, not a database"


def test_an_existing_run_id_is_not_reused(tmp_path, capsys):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = str(tmp_path / "r.duckdb")
    args = ["run", str(graph), "--backend", "scripted", "--steps", "1", "--train", "4",
            "--val", "4", "--run-id", "mine", "--db", db]
    assert main(args) == 0
    capsys.readouterr()
    with duckdb.connect(db, read_only=True) as con:
        before = con.execute("SELECT count(*) FROM node_outputs").fetchone()
    assert main(args) == 2
    assert "a run 'mine' already exists" in error_line(capsys)
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM node_outputs").fetchone() == before
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (1,)


def test_progress_to_a_log_file_is_one_line_a_step(tmp_path):
    import subprocess
    import sys

    from tests.support.graphs import REPO

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    proc = subprocess.run([sys.executable, "-m", "engine", "run", str(graph), "--backend",
                           "scripted", "--steps", "2", "--train", "4", "--val", "4", "--db",
                           str(tmp_path / "r.duckdb")], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    steps = [ln for ln in proc.stderr.splitlines() if ln.startswith("step ") and "train" in ln]
    assert [ln.split(" done")[0] for ln in steps] == ["step 0", "step 1", "step 2"]
    assert "calls so far" in steps[-1]
    # and one line per phase, with its last count: not a line every few calls
    import re

    phases = [m.groups() for m in (re.match(r"^step (\d+) (\w+): (\d+)/(\d+) calls",
                                            ln) for ln in proc.stderr.splitlines()) if m]
    keys = [(step, phase) for step, phase, _, _ in phases]
    assert len(keys) == len(set(keys)) and ("0", "forward") in keys and ("1", "gate") in keys
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        forward0 = con.execute("SELECT count(*) FROM llm_calls WHERE step = 0 AND "
                               "purpose = 'forward'").fetchone()[0]
    assert [done for step, phase, done, _ in phases if (step, phase) == ("0", "forward")] \
        == [str(forward0)]
    # the summary's cost per phase names the same phases as the progress lines
    (summary,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("per phase: ")]
    named = re.findall(r"(?:^per phase: |, )(\w+) (\d+) calls", summary)
    assert {phase for phase, _ in named} == {phase for _, phase in keys}


LONG_ID = "api-marble-falcon-20261201-183040-semantic-long"


def logged_run(tmp_path, run_id: str = LONG_ID):
    from tests.support.graphs import run_engine

    graph = write_graph(tmp_path, TWO_HINTS.replace("name: two-hints",
                                                    "name: a-graph-with-a-long-name"),
                        arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    run_engine(graph, db, steps=1, run_id=run_id, train=4, val=4)
    return db


def test_runs_never_cuts_a_run_id(tmp_path, capsys, monkeypatch):
    db = logged_run(tmp_path)
    capsys.readouterr()
    for columns in ("80", "50"):
        monkeypatch.setenv("COLUMNS", columns)  # rich reads it at every print
        assert main(["runs", "--db", str(db)]) == 0
        printed = capsys.readouterr().out
        assert any(LONG_ID in line for line in printed.splitlines()), printed
        assert "…" not in printed


def test_runs_json_prints_the_rows(tmp_path, capsys):
    import json

    db = logged_run(tmp_path)
    capsys.readouterr()
    assert main(["runs", "--db", str(db), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["method"], r["status"], r["steps"]) for r in rows] == [
        (LONG_ID, "semantic", "finished", 1)]
    assert set(rows[0]) == {"run_id", "graph", "method", "model", "status", "steps",
                            "best_val"}
    assert rows[0]["model"] == "scripted" and isinstance(rows[0]["best_val"], float)


def test_every_argument_of_every_subcommand_has_help_text(capsys):
    import argparse

    from engine.cli.commands import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [f"{name} {' '.join(action.option_strings) or action.dest}"
               for name, command in sub.choices.items() for action in command._actions
               if not isinstance(action, argparse._HelpAction) and not action.help]
    assert missing == []
    for name in ("blame", "probe", "export"):
        with pytest.raises(SystemExit):
            main([name, "--help"])
        text = capsys.readouterr().out
        assert "the run log: a DuckDB file, or a lake" in text and "the run (python -m engine runs" in text


def run_stopped_in_step_zero(tmp_path, db):
    """A run stopped (as by the dashboard's Stop or Ctrl-C) at its first model call, before
    step 0 was written: a runs row with no steps."""
    import asyncio

    from engine.events import CallRecord
    from engine.runs.execute import RunConfig, execute

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())

    async def stopped():
        task = None

        def stop_at_first_call(event):
            if isinstance(event, CallRecord) and not task.cancelling():
                task.cancel()

        config = RunConfig(graph=str(graph), db=str(db), backend="scripted", steps=1,
                           train=4, val=4, test=0, run_id="stopped-early")
        task = asyncio.ensure_future(execute(config, listeners=(stop_at_first_call,)))
        return await task

    return asyncio.run(stopped())


def test_runs_survives_a_run_stopped_during_step_zero(tmp_path, capsys):
    import json

    db = logged_run(tmp_path)
    result = run_stopped_in_step_zero(tmp_path, db)
    assert result.status == "stopped"
    capsys.readouterr()
    assert main(["runs", "--db", str(db)]) == 0
    printed = capsys.readouterr()
    assert "stopped-early" in printed.out and "error" not in printed.err
    assert main(["runs", "--db", str(db), "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["stopped-early"]["status"], rows["stopped-early"]["steps"],
            rows["stopped-early"]["best_val"]) == ("stopped", None, None)
    assert rows[LONG_ID]["steps"] == 1


def test_a_run_stopped_in_step_zero_says_so_and_how_to_resume(tmp_path, capsys):
    from engine.cli.summary import print_summary

    db = tmp_path / "runs.duckdb"
    result = run_stopped_in_step_zero(tmp_path, db)
    capsys.readouterr()
    print_summary(result, str(db))
    out = capsys.readouterr().out
    assert "run stopped-early: stopped; no step finished in this session" in out
    assert "┃ step" not in out  # no empty step table
    assert f"to continue it: python -m engine resume stopped-early --db {db}" in out


def test_a_refused_run_log_or_step_is_the_only_line_printed(tmp_path, capsys):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    truncated = tmp_path / "truncated.duckdb"
    truncated.write_bytes(logged_run(tmp_path).read_bytes()[:100_000])
    capsys.readouterr()
    for db in (tmp_path / "missing" / "r.duckdb", truncated):
        assert main(["run", str(graph), "--backend", "scripted", "--db", str(db)]) == 2
        printed = capsys.readouterr()
        lines = (printed.out + printed.err).splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), lines  # no estimate line
    assert main(["blame", LONG_ID, "--db", str(tmp_path / "runs.duckdb"), "--step", "7"]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.startswith("error: run "), printed.err


def test_semback_db_names_the_run_log_of_every_command(tmp_path, monkeypatch, capsys):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows(10))
    db = tmp_path / "from-env.duckdb"
    monkeypatch.setenv("SEMBACK_DB", str(db))
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(graph), "--backend", "scripted", "--steps", "1", "--train", "4",
                 "--val", "4", "--run-id", "env"]) == 0
    assert not (tmp_path / "runs.duckdb").exists()
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT run_id FROM runs").fetchall() == [("env",)]
    capsys.readouterr()
    assert main(["runs", "--json"]) == 0
    assert '"env"' in capsys.readouterr().out
    # a --db typed on the command line still wins
    assert main(["runs", "--db", str(tmp_path / "none.duckdb")]) == 2
