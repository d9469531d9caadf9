"""Reading a run log in tests."""

from __future__ import annotations

from pathlib import Path

import duckdb


def rows(db: str | Path, sql: str, *params: object) -> list[tuple]:
    """The rows of `sql` on the run log `db` (read-only), with `params` bound in order."""
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def log_at_version(db: str | Path, version: int, table: str, added: str,
                   row: tuple[str, dict[str, object]]) -> None:
    """A run log as an older engine wrote it: today's tables with `table` lacking the
    columns a later version `added` (the text of its column list, e.g.
    ", cached_tokens INTEGER"), stamped `version`, holding one `row` (table, values)."""
    from engine.runlog.schema import TABLES

    with duckdb.connect(str(db)) as con:
        for name, columns in TABLES.items():
            con.execute(f"CREATE TABLE {name} "
                        f"({columns.replace(added, '') if name == table else columns})")
        con.execute("INSERT INTO schema_version VALUES (?, 0)", [version])
        into, values = row
        con.execute(f"INSERT INTO {into} ({', '.join(values)}) VALUES "
                    f"({', '.join('?' for _ in values)})", list(values.values()))
