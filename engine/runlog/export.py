"""Export a whole run (JSON, Parquet; OpenTelemetry spans in engine/runlog/otel.py) and import a JSON export back.

The CLI (`export`, `import`) is in engine/cli/commands.py.

A JSON export holds every run-log row of the run (see docs/runlog.md) plus the reply-cache
entries its calls used, so an imported run can be inspected and resumed. Problems raise
RunLogError, which the CLI prints as one line with status 2; nothing is written then.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb

from engine.runlog.lake import is_conflict
from engine.runlog.schema import (
    SCHEMA_VERSION,
    TABLES,
    RunLogError,
    check_readable,
    column_names,
    connect,
    dict_rows,
    ensure_schema,
    log_exists,
    write,
)
from engine.runlog.writer import insert_rows

EXPORT_FORMAT = "semback-run"
EXPORT_VERSION = 1

# Tables keyed by run_id, in insertion order, with a stable ordering for the export.
RUN_TABLES: dict[str, str] = {
    "runs": "run_id",
    "examples": "split, position",
    "steps": "step",
    "prompt_versions": "node_id, version",
    "node_outputs": "step, split, example_id, node_id",
    "losses": "step, split, example_id",
    "gradients": "step, example_id, node_id, kind, from_node_id",
    "updates": "step, node_id, candidate NULLS FIRST",
    "llm_calls": "started_at, call_id",
    "metrics": "step NULLS LAST, key",
    "probes": "step, node_id, example_id, kind, created_at, probe_id",
    "probe_outputs": "probe_id, node_id, call_id",
}
CALL_ID_TABLES = ("node_outputs", "losses", "gradients", "updates", "llm_calls",
                  "probe_outputs")
FORMATS = ("json", "parquet", "otel")


# --- reading a run ---------------------------------------------------------------------


def read_run(db: str | Path, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of `run_id`, table by table, plus the llm_cache rows its calls used."""
    check_readable(db)
    with connect(db, read_only=True) as con:
        _require_run(con, db, run_id)
        tables = {name: dict_rows(con, f"SELECT {', '.join(column_names(name))} FROM "
                                       f"{name} WHERE run_id = ? ORDER BY {order}", [run_id])
                  for name, order in RUN_TABLES.items()}
        tables["llm_cache"] = dict_rows(con, (
            f"SELECT {', '.join(column_names('llm_cache'))} FROM llm_cache WHERE key IN "
            "(SELECT cache_key FROM llm_calls WHERE run_id = ?) ORDER BY key"), [run_id])
    return tables


def _require_run(con: Any, db: str | Path, run_id: str) -> None:
    # fetchall, not fetchone: DuckDB keeps a half-read result open and then refuses
    # register() and sql() on the same connection.
    if con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0] == 0:
        raise RunLogError(f"{db}: no run '{run_id}' (see: python -m engine runs --db {db})")




# --- json and parquet ------------------------------------------------------------------


def export_json(db: str | Path, run_id: str, out: str | Path | None = None) -> Path:
    tables = read_run(db, run_id)
    path = Path(out or f"{file_stem(run_id)}.json")
    document = {"format": EXPORT_FORMAT, "format_version": EXPORT_VERSION,
                "schema_version": SCHEMA_VERSION, "run_id": run_id,
                "exported_at": time.time(), "tables": tables}
    write_atomically(path, json.dumps(document, ensure_ascii=False) + "\n")
    return path


def export_parquet(db: str | Path, run_id: str, out: str | Path | None = None) -> Path:
    """A folder with one Parquet file per table (`<table>.parquet`), empty tables too."""
    check_readable(db)
    folder = Path(out or f"{file_stem(run_id)}_parquet")
    with connect(db, read_only=True) as con:
        _require_run(con, db, run_id)
        folder.mkdir(parents=True, exist_ok=True)
        for name, order in RUN_TABLES.items():
            con.sql(f"SELECT * FROM {name} WHERE run_id = $run_id ORDER BY {order}",
                    params={"run_id": run_id}).write_parquet(str(folder / f"{name}.parquet"))
        con.sql("SELECT * FROM llm_cache WHERE key IN (SELECT cache_key FROM llm_calls "
                "WHERE run_id = $run_id) ORDER BY key", params={"run_id": run_id}
                ).write_parquet(str(folder / "llm_cache.parquet"))
    return folder


def file_stem(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


# --- import ----------------------------------------------------------------------------


def import_json(path: str | Path, db: str | Path, new_id: str | None = None) -> str:
    """Insert a JSON export into `db` in one transaction; returns the run id written.
    Refuses (RunLogError) a run id that already exists in `db`."""
    tables = load_export(path)
    run_id = tables["runs"][0]["run_id"]
    if new_id and new_id != run_id:
        tables = renamed(tables, new_id)
        run_id = new_id
    if log_exists(db):
        check_readable(db)  # read-only first: a bad file is refused untouched
    with connect(db) as con:
        ensure_schema(con, str(db))

    def body(con: Any) -> None:
        if con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]:
            raise RunLogError(f"{db}: run '{run_id}' already exists; import it under "
                              "another id with --as NEW_ID")
        try:
            for name in RUN_TABLES:
                insert_rows(con, name, tables.get(name, []))
            cache = tables.get("llm_cache", [])
            if cache:
                keys = [row["key"] for row in cache]
                present = {r[0] for r in con.execute(
                    "SELECT key FROM llm_cache WHERE list_contains(?, key)", [keys]
                ).fetchall()}
                insert_rows(con, "llm_cache", [r for r in cache if r["key"] not in present])
        except duckdb.Error as exc:  # a value the checks let through: nothing is kept
            if is_conflict(exc):
                raise
            reason = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
            raise RunLogError(f"{path}: cannot import: {reason}") from None

    write(db, body)
    return run_id


def load_export(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The tables of a JSON export, checked for the shape `import_json` needs."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunLogError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunLogError(f"{path}: not a run export (not JSON: {exc})") from None
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise RunLogError(f"{path}: not a run export (expected format '{EXPORT_FORMAT}', "
                          "made by: python -m engine export RUN_ID --format json)")
    made_by = document.get("format_version", EXPORT_VERSION)
    if not isinstance(made_by, int) or isinstance(made_by, bool) or made_by > EXPORT_VERSION:
        raise RunLogError(f"{path}: export format version {made_by!r} is not one this engine "
                          f"reads (up to {EXPORT_VERSION}); upgrade the engine")
    version = document.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RunLogError(f"{path}: export schema version {version} is newer than this "
                          f"engine's ({SCHEMA_VERSION}); upgrade the engine")
    tables = document.get("tables")
    if not isinstance(tables, dict) or not isinstance(tables.get("runs"), list) \
            or len(tables["runs"]) != 1:
        raise RunLogError(f"{path}: not a run export (it must hold exactly one run)")
    run_id = tables["runs"][0].get("run_id")
    for name, rows in tables.items():
        if name not in RUN_TABLES and name != "llm_cache":
            raise RunLogError(f"{path}: unknown table '{name}'")
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise RunLogError(f"{path}: table '{name}' is not a list of rows")
        if name in RUN_TABLES and any(r.get("run_id") != run_id for r in rows):
            raise RunLogError(f"{path}: table '{name}' has rows of another run than "
                              f"'{run_id}'")
        _check_cells(path, name, rows)
    return tables


# What a JSON value must be to fit a column of each DuckDB type.
_FITS = {
    "VARCHAR": lambda v: isinstance(v, str),
    "JSON": lambda v: isinstance(v, str),
    "INTEGER": lambda v: isinstance(v, int) and not isinstance(v, bool)
    and -2**31 <= v < 2**31,
    "BIGINT": lambda v: isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63,
    "DOUBLE": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "BOOLEAN": lambda v: isinstance(v, bool),
}
_KIND = {"VARCHAR": "text", "JSON": "JSON text", "INTEGER": "a whole number",
         "BIGINT": "a whole number", "DOUBLE": "a number", "BOOLEAN": "true or false"}


def _check_cells(path: str | Path, table: str, rows: list[dict[str, Any]]) -> None:
    """Every cell null or of its column's type; RunLogError names the first that is not."""
    types = dict(part.split()[:2] for part in " ".join(TABLES[table].split()).split(", "))
    for number, row in enumerate(rows, start=1):
        for column, value in row.items():
            if column not in types:
                raise RunLogError(f"{path}: table '{table}' row {number}: unknown column "
                                  f"'{column}'")
            if value is not None and not _FITS[types[column]](value):
                raise RunLogError(f"{path}: table '{table}' row {number} column '{column}': "
                                  f"expected {_KIND[types[column]]}, found {value!r:.60}")


def renamed(tables: dict[str, list[dict]], new_id: str) -> dict[str, list[dict]]:
    """A copy of an export's tables under `new_id`. Call ids are derived from the new id,
    so that a copy imported next to its original keeps every call id unique."""
    def call_id(old: str | None) -> str | None:
        return None if old is None else uuid.uuid5(uuid.NAMESPACE_URL, f"{new_id}/{old}").hex

    out: dict[str, list[dict]] = {}
    for name, rows in tables.items():
        if name not in RUN_TABLES:
            out[name] = [dict(r) for r in rows]
            continue
        out[name] = [{**r, "run_id": new_id} for r in rows]
        if name in CALL_ID_TABLES:
            for row in out[name]:
                row["call_id"] = call_id(row.get("call_id"))
    for row in out["runs"]:
        try:
            config = json.loads(row.get("config") or "null")
        except json.JSONDecodeError:
            continue
        if isinstance(config, dict) and "run_id" in config:
            config["run_id"] = new_id
            row["config"] = json.dumps(config, sort_keys=True)
    return out
