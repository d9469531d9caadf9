"""Reading a run log in tests."""

from __future__ import annotations

from pathlib import Path

import duckdb


def rows(db: str | Path, sql: str, *params: object) -> list[tuple]:
    """The rows of `sql` on the run log `db` (read-only), with `params` bound in order."""
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()
