"""The run log: schema and version, refusal of bad input by the CLI (one line, status 2,
nothing changed), and one transaction per step."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from engine.cli import main
from engine.events import Activation, StepFinished
from engine.llm.scripted import ScriptedBackend
from engine.runlog.export import export_json
from engine.runlog.schema import SCHEMA_VERSION, TABLES, column_names
from engine.runlog.writer import open_for_writing
from engine.runs.execute import RunConfig, execute

ROOT = Path(__file__).resolve().parents[1]
DIAMOND = str(ROOT / "sample_graphs" / "diamond.yaml")
PROBE_TABLES = {"probes", "probe_outputs"}  # written only by `engine probe` / `blame`
STEP_TABLES = ("steps", "prompt_versions", "node_outputs", "losses", "gradients", "updates",
               "llm_calls", "metrics")


def make_run(db: Path, run_id: str = "r1", steps: int = 2, **kwargs) -> None:
    sizes = {"train": 8, "val": 8, "test": 4, **kwargs}
    asyncio.run(execute(RunConfig(graph=DIAMOND, db=str(db), run_id=run_id, steps=steps,
                                  **sizes)))


def contents(db: Path) -> dict[str, list[tuple]]:
    """Every row of every table, sorted: what "nothing changed" compares."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables"
                                           ).fetchall()]
        return {n: sorted(con.execute(f"SELECT * FROM {n}").fetchall(), key=repr)
                for n in names}
    finally:
        con.close()


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, out: str, err: str, *words: str) -> None:
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err + out
    for word in words:
        assert word in lines[0], lines[0]


# --- schema ----------------------------------------------------------------------------


def test_schema_created_with_every_table_and_one_version_row(tmp_path):
    db = tmp_path / "log.duckdb"
    open_for_writing(db)
    open_for_writing(db)  # idempotent: no second version row, no error
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables"
                                            ).fetchall()}
        assert tables == set(TABLES)
        for table in TABLES:
            columns = [r[0] for r in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                "ORDER BY ordinal_position", [table]).fetchall()]
            assert columns == column_names(table)
        versions = con.execute("SELECT version FROM schema_version").fetchall()
    finally:
        con.close()
    assert versions == [(SCHEMA_VERSION,)]


def test_a_run_fills_every_run_table(tmp_path):
    db = tmp_path / "log.duckdb"
    make_run(db)
    rows = contents(db)
    for table in set(TABLES) - PROBE_TABLES:
        assert rows[table], f"{table} is empty after a run"
    assert not any(rows[t] for t in PROBE_TABLES), "a plain run wrote probe rows"
    assert [r[1] for r in rows["steps"]] == [0, 1, 2]
    assert rows["runs"][0][9] == "finished"


# --- bad input: one line, status 2, nothing changed --------------------------------------


@pytest.fixture(scope="module")
def good_export(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("export")
    make_run(folder / "src.duckdb", run_id="r1", steps=1)
    return export_json(folder / "src.duckdb", "r1", folder / "r1.json")


def bad_input_commands(db: Path, export: Path, out: Path) -> list[list[str]]:
    return [["runs", "--db", str(db)],
            ["resume", "r1", "--db", str(db)],
            ["export", "r1", "--db", str(db), "--format", "json", "--out", str(out)],
            ["export", "r1", "--db", str(db), "--format", "otel", "--out", str(out)],
            ["import", str(export), "--db", str(db)]]


def test_newer_schema_is_refused_by_python_m_engine_runs(tmp_path):
    db = tmp_path / "new.duckdb"
    open_for_writing(db)
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO schema_version VALUES (?, ?)", [SCHEMA_VERSION + 1, time.time()])
    con.close()
    before = db.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "engine", "runs", "--db", str(db)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "newer", str(db))
    assert db.read_bytes() == before


def test_newer_schema_is_refused_by_every_command(tmp_path, capsys, good_export):
    db = tmp_path / "new.duckdb"
    make_run(db, steps=1)
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO schema_version VALUES (?, ?)", [SCHEMA_VERSION + 1, time.time()])
    con.close()
    before, before_bytes = contents(db), db.read_bytes()
    for argv in bad_input_commands(db, good_export, tmp_path / "out"):
        assert_one_line_error(*cli(capsys, *argv), "newer")
    assert contents(db) == before and db.read_bytes() == before_bytes
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_duckdb_is_refused_untouched(tmp_path, capsys, good_export):
    db = tmp_path / "notes.duckdb"
    db.write_bytes(b"these are my notes, not a database\n" * 100)
    before = db.read_bytes()
    for argv in bad_input_commands(db, good_export, tmp_path / "out"):
        assert_one_line_error(*cli(capsys, *argv), str(db))
        assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.duckdb"]


def test_a_missing_database_is_refused_and_not_created(tmp_path, capsys):
    db = tmp_path / "missing.duckdb"
    for argv in (["runs", "--db", str(db)], ["resume", "r1", "--db", str(db)],
                 ["export", "r1", "--db", str(db)]):
        assert_one_line_error(*cli(capsys, *argv), "no such run log")
    assert not db.exists()


def test_an_unknown_run_id_is_refused_untouched(tmp_path, capsys):
    db = tmp_path / "log.duckdb"
    make_run(db, steps=1)
    before = contents(db)
    out = tmp_path / "out"
    for argv in (["resume", "nope", "--db", str(db)],
                 ["export", "nope", "--db", str(db), "--format", "json", "--out", str(out)],
                 ["export", "nope", "--db", str(db), "--format", "parquet", "--out", str(out)],
                 ["export", "nope", "--db", str(db), "--format", "otel", "--out", str(out)]):
        assert_one_line_error(*cli(capsys, *argv), "no run 'nope'")
    assert contents(db) == before
    assert not out.exists()


def test_a_finished_run_is_not_resumed(tmp_path, capsys):
    db = tmp_path / "log.duckdb"
    make_run(db, steps=1)
    before = contents(db)
    code, out, err = cli(capsys, "resume", "r1", "--db", str(db))
    assert code == 2 and "Traceback" not in err
    assert err.strip() == "error: run 'r1' has already finished; nothing to resume"
    assert contents(db) == before


# --- one transaction per step ------------------------------------------------------------


class FailsAtStep(ScriptedBackend):
    """A scripted backend that raises a non-LLM error on its first call in `step`; it is
    also a listener, which is how it knows the step in progress."""

    def __init__(self, step: int):
        super().__init__()
        self.fail_step, self.current = step, 0

    def __call__(self, event: object) -> None:
        if isinstance(event, StepFinished):
            self.current = event.step + 1

    async def complete(self, request):
        if self.current == self.fail_step:
            raise RuntimeError("disk on fire")
        return await super().complete(request)


def per_step_counts(db: Path) -> dict[tuple[str, int], int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {(t, s): n for t in STEP_TABLES for s, n in con.execute(
            f"SELECT step, count(*) FROM {t} WHERE step IS NOT NULL GROUP BY step").fetchall()}
    finally:
        con.close()


def test_a_step_that_fails_leaves_whole_earlier_steps_and_nothing_of_itself(tmp_path):
    failing_db, clean_db = tmp_path / "failing.duckdb", tmp_path / "clean.duckdb"
    backend = FailsAtStep(2)
    config = RunConfig(graph=DIAMOND, db=str(failing_db), run_id="r1", steps=3, train=8,
                       val=8, test=0)
    with pytest.raises(RuntimeError, match="disk on fire"):
        asyncio.run(execute(config, forward_backend=backend, listeners=(backend,)))
    assert backend.current == 2  # it did get into step 2 before failing
    make_run(clean_db, steps=3, test=0)

    failed, clean = per_step_counts(failing_db), per_step_counts(clean_db)
    assert {s for _, s in failed} == {0, 1}
    assert failed == {k: n for k, n in clean.items() if k[1] in (0, 1)}
    rows = contents(failing_db)
    assert rows["runs"][0][9] == "failed" and "disk on fire" in rows["runs"][0][12]


@pytest.mark.parametrize("spilled", [False, True])
def test_thousands_of_rows_with_a_column_null_in_every_row_are_written(tmp_path, spilled):
    """A step's 2,500 outputs, none with an error (the column NULL in every row): written
    whole, whether inserted at once or spilled to Parquet first (an import's traces).
    DuckDB 1.4.4 fails on such a column over 2,000 rows unless it reads every value."""
    from engine.runlog.writer import RunLogWriter

    db = tmp_path / "runs.duckdb"
    open_for_writing(db)
    writer = RunLogWriter(db, "big")
    for i in range(2500):
        writer(Activation("big", 0, "train", f"ex-{i}", "answer", 0, "", str(i)))
    if spilled:
        writer.spill()
    writer.flush()
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute("SELECT count(*), count(error), max(output_text::INTEGER) FROM "
                          "node_outputs WHERE run_id = 'big'").fetchone()
    assert got == (2500, 0, 2499)
