"""Reading a run log in tests."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb


def rows(db: str | Path, sql: str, *params: object) -> list[tuple]:
    """The rows of `sql` on the run log `db` (read-only; a file, or a lake through the
    engine's connection), with `params` bound in order."""
    if str(db).startswith("ducklake:"):
        from engine.runlog.schema import connect

        with connect(str(db), read_only=True) as con:
            return con.execute(sql, list(params)).fetchall()
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


# Rows that identify a run's content; volatile columns (times, call ids) are left out.
CONTENT = {
    "steps": "step, train_score, val_score, accepted",
    "prompt_versions": "node_id, version, prompt, step, accepted",
    "updates": "step, node_id, old_prompt, new_prompt, accepted, val_before, val_after, "
               "parse_error, reasoning",
    "gradients": "step, example_id, node_id, from_node_id, method, kind, content, parse_error",
    "losses": "step, split, example_id, prediction, target, score, feedback, error",
    "node_outputs": "step, split, example_id, node_id, prompt_version, input_text, "
                    "output_text, error, parse_error",
    "metrics": "step, key, value",
    "llm_calls": "step, purpose, node_id, example_id, cache_key, response",
    "examples": "split, example_id, position, fields, target",
}


def run_content(db: str | Path, run_id: str) -> dict[str, Counter]:
    """Per table of CONTENT, the run's rows (those columns) with how often each occurs."""
    return {t: Counter(rows(db, f"SELECT {cols} FROM {t} WHERE run_id = ?", run_id))
            for t, cols in CONTENT.items()}


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
