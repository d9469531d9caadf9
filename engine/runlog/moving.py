"""Copy runs between two run logs: a file and a lake (`python -m engine runlog push|pull`).

Both logs are attached to one in-memory DuckDB, and every table's rows that the target
lacks are inserted in one transaction on the target: a row already there (the same values
in every column, as copying leaves them) is not copied again, so copying twice adds
nothing, and a run continued on either side brings only its new rows. The `runs` row is
the one exception, being the only row a run updates: the target gains the runs it lacks,
and a run on both sides takes the source's status, end and notes where the source's row
went further (it ended there, or later; it has notes the target lacks), never backwards.
The reply cache is merged by key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from engine.runlog import lake
from engine.runlog.schema import (
    ON_DEMAND_TABLES,
    TABLES,
    RunLogError,
    check_readable,
    column_names,
    connect,
    ensure_schema,
    log_exists,
)

_SRC, _DST = "src", "dst"
RUN_FIELDS = ("status", "ended_at", "error", "notes", "tags")  # what a run updates


@dataclass
class Copied:
    """Rows added to the target, per table; runs added and runs brought up to date."""

    rows: dict[str, int] = field(default_factory=dict)
    runs_added: list[str] = field(default_factory=list)
    runs_updated: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.rows.values()) + len(self.runs_updated)


def copy_runs(source: str, target: str, run_ids: list[str] | None = None) -> Copied:
    """Copy `run_ids` (default: every run) with their rows, and the reply cache, from the run
    log `source` into `target` (created, or upgraded to this engine's schema)."""
    source, target = str(source), str(target)
    if source == target:
        raise RunLogError(f"{source}: the source and the target are the same run log")
    if not log_exists(source):
        raise RunLogError(f"{source}: no such run log")
    check_readable(source)  # also brings an older file log to this engine's schema
    with connect(target) as con:  # creates or upgrades the target's tables
        ensure_schema(con, target)
    con = _pair(source, target)
    try:
        return _copy(con, run_ids)
    except duckdb.Error as exc:
        raise RunLogError(f"{target}: copying failed, nothing was written "
                          f"({' '.join(str(exc).split())[:200]})") from None
    finally:
        con.close()


def _attach(con: duckdb.DuckDBPyConnection, db: str, alias: str, read_only: bool) -> None:
    if lake.is_lake(db):
        lake.forget(db)  # a catalog file serves one attachment at a time
        lake.attach(con, db, alias)
    else:
        mode = " (READ_ONLY)" if read_only else ""
        con.execute(f"ATTACH {lake._quote(str(Path(db)))} AS {alias}{mode}")


def _pair(source: str, target: str) -> duckdb.DuckDBPyConnection:
    needs_lake = lake.is_lake(source) or lake.is_lake(target)
    con = lake.new_connection() if needs_lake else duckdb.connect()
    try:
        _attach(con, source, _SRC, read_only=True)
        _attach(con, target, _DST, read_only=False)
    except duckdb.Error as exc:
        con.close()
        raise RunLogError(f"cannot open both run logs ({lake.reason(exc)})") from None
    except lake.LakeError as exc:
        con.close()
        raise RunLogError(str(exc)) from None
    return con


def _tables(con: duckdb.DuckDBPyConnection, alias: str) -> set[str]:
    return {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = ? AND "
        "table_schema = 'main'", [alias]).fetchall()}


def _copy(con: duckdb.DuckDBPyConnection, run_ids: list[str] | None) -> Copied:
    from engine.runlog.diffs import DIFF_TABLES

    known = {**TABLES, **ON_DEMAND_TABLES, **DIFF_TABLES}
    src_tables, dst_tables = _tables(con, _SRC), _tables(con, _DST)
    runs = [r[0] for r in con.execute(f"SELECT DISTINCT run_id FROM {_SRC}.runs").fetchall()]
    if run_ids is not None:
        missing = sorted(set(run_ids) - set(runs))
        if missing:
            raise RunLogError(f"no run {', '.join(repr(m) for m in missing)} in the source")
        runs = list(run_ids)
    out = Copied()
    con.execute("BEGIN TRANSACTION")
    for table in sorted(src_tables & set(known)):
        if table == "schema_version":
            continue
        if table not in dst_tables:
            columns = " ".join(known[table].split())
            con.execute(f"CREATE TABLE {_DST}.{table} ({columns})")
        names = ", ".join(_column_list(table, known))
        scope = _scope(con, table, names, runs, run_ids is not None)
        if table == "runs":
            out.runs_added = [r[0] for r in con.execute(
                f"SELECT run_id FROM {_SRC}.runs WHERE list_contains($runs, run_id) AND "
                f"run_id NOT IN (SELECT run_id FROM {_DST}.runs) ORDER BY started_at, run_id",
                {"runs": runs}).fetchall()]
            out.runs_updated = _update_runs(con, runs, set(out.runs_added))
            added = f"SELECT {names} FROM {_SRC}.runs WHERE list_contains($added, run_id)"
            params = {"added": out.runs_added}
        elif table == "llm_cache":
            added = (f"SELECT {names} FROM {_SRC}.llm_cache WHERE key NOT IN "
                     f"(SELECT key FROM {_DST}.llm_cache)")
            params = {}
        else:
            added, params = scope
        count = con.execute(f"SELECT count(*) FROM ({added})", params).fetchone()[0]
        if count:
            con.execute(f"INSERT INTO {_DST}.{table} ({names}) {added}", params)
        out.rows[table] = int(count)
    con.execute("COMMIT")
    return out


def _column_list(table: str, known: dict[str, str]) -> list[str]:
    return column_names(table) if table in TABLES or table in ON_DEMAND_TABLES else [
        part.split()[0] for part in " ".join(known[table].split()).split(", ")]


def _scope(con: duckdb.DuckDBPyConnection, table: str, names: str, runs: list[str],
           chosen: bool) -> tuple[str, dict]:
    """The source's rows the target lacks (as a multiset: a row logged twice stays twice);
    only the chosen runs' rows where the table has a run_id and runs were named."""
    has_run = "run_id" in names.split(", ")
    where = " WHERE list_contains($runs, run_id)" if has_run and chosen else ""
    params = {"runs": runs} if where else {}
    return (f"SELECT {names} FROM {_SRC}.{table}{where} EXCEPT ALL "
            f"SELECT {names} FROM {_DST}.{table}{where}", params)


def _update_runs(con: duckdb.DuckDBPyConnection, runs: list[str], added: set[str]
                 ) -> list[str]:
    """Runs on both sides whose source row went further: it ended where the target's still
    runs or ended earlier, or it has notes or tags the target lacks. Those take the source's
    status, end, error, notes and tags; a target ahead of the source is left as it is."""
    further = (
        "(d.ended_at IS NULL AND s.ended_at IS NOT NULL) OR (s.ended_at > d.ended_at) OR "
        "(d.notes IS NULL AND s.notes IS NOT NULL) OR (d.tags IS NULL AND s.tags IS NOT NULL)")
    differ = [r[0] for r in con.execute(
        f"SELECT s.run_id FROM {_SRC}.runs s JOIN {_DST}.runs d USING (run_id) WHERE "
        f"list_contains($runs, s.run_id) AND ({further})", {"runs": runs}).fetchall()
        if r[0] not in added]
    if differ:
        sets = ", ".join(f"{f} = s.{f}" for f in RUN_FIELDS)
        con.execute(f"UPDATE {_DST}.runs SET {sets} FROM {_SRC}.runs s WHERE "
                    f"{_DST}.runs.run_id = s.run_id AND list_contains($runs, s.run_id)",
                    {"runs": differ})
    return differ
