"""A run log written before probes existed (schema version 1) still lists, exports and
takes probes: it is upgraded on first read."""

from __future__ import annotations

import asyncio
import json

import duckdb

from engine.cli import main
from engine.llm.scripted import ScriptedBackend
from engine.runlog.schema import SCHEMA_VERSION, TABLES
from engine.runs.execute import RunConfig, execute
from tests.support.blame_fault_script import blame_fault_responder
from tests.test_probe import GRAPH

# What schema versions 2, 3, 4, 6 and 9 added to these tables (docs/runlog.md); version 1
# is the rest.
V2_TABLES = {"probes", "probe_outputs"}
V2_COLUMNS = {"runs": {"parent_run_id", "fork_step", "notes", "tags"},
              "updates": {"val_alone", "reject_reason"},
              "llm_calls": {"constrained", "finish_reason", "cached_tokens", "response_model",
                            "queued_ms"}}


def v1_columns(table: str) -> list[str]:
    parts = [" ".join(p.split()) for p in " ".join(TABLES[table].split()).split(", ")]
    return [p for p in parts if p.split()[0] not in V2_COLUMNS.get(table, set())]


def write_v1_copy(source, target) -> None:
    """Build the version-1 tables and copy a current log's rows into them."""
    with duckdb.connect(str(target)) as con:
        con.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
        for table in TABLES:
            if table in V2_TABLES:
                continue
            columns = v1_columns(table)
            con.execute(f"CREATE TABLE {table} ({', '.join(columns)})")
            if table != "schema_version":
                names = ", ".join(c.split()[0] for c in columns)
                con.execute(f"INSERT INTO {table} SELECT {names} FROM src.{table}")
        con.execute("INSERT INTO schema_version VALUES (1, 0)")


def test_a_version_1_log_lists_exports_and_takes_probes(tmp_path, capsys, monkeypatch):
    current = tmp_path / "v2.duckdb"
    config = RunConfig(graph=str(GRAPH), db=str(current), steps=1, test=0, run_id="bf",
                       failures_per_step=3)
    asyncio.run(execute(config, forward_backend=ScriptedBackend(
        responder=blame_fault_responder())))
    old = tmp_path / "v1.duckdb"
    write_v1_copy(current, old)
    with duckdb.connect(str(old), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables")
                  .fetchall()}
    assert "probes" not in tables  # really the old layout

    assert main(["runs", "--db", str(old)]) == 0
    assert "bf" in capsys.readouterr().out
    out = tmp_path / "bf.json"
    assert main(["export", "bf", "--db", str(old), "--out", str(out)]) == 0
    exported = json.loads(out.read_text())["tables"]
    assert exported["runs"][0]["run_id"] == "bf" and exported["gradients"]
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=blame_fault_responder()))
    with duckdb.connect(str(old), read_only=True) as con:
        example = con.execute("SELECT min(example_id) FROM gradients WHERE step = 1"
                              ).fetchone()[0]
    capsys.readouterr()
    assert main(["probe", "bf", "--db", str(old), "--step", "1", "--node", "numbers",
                 "--example", example, "--gradient", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["after_score"] == 1.0
    with duckdb.connect(str(old), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == \
            SCHEMA_VERSION
        assert con.execute("SELECT count(*) FROM probes").fetchone()[0] == 1
