"""Writes a run into the DuckDB run log, one transaction per step.

The writer is an event listener: it buffers every record of the step in progress and,
when `StepFinished` arrives, inserts them in bulk (a column array each) inside one
transaction together with the step row and the new cache entries. A crash therefore
leaves whole steps only, which is what `engine resume` relies on. A step too large to
hold in memory (an import's) is spilled part by part to Parquet files beside the log
(`spill`) and inserted from them in that same one transaction.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import duckdb

from engine.events import (
    Activation,
    CallRecord,
    Gradient,
    LossRecord,
    PromptVersion,
    Proposal,
    RunFinished,
    StepFinished,
    StructuredFallback,
)
from engine.llm.cache import Cache
from engine.runlog.lake import is_lake
from engine.runlog.schema import (
    RunLogError,
    check_writable,
    column_names,
    connect,
    ensure_schema,
    table_columns,
    write,
)

TABLE_OF = {
    CallRecord: "llm_calls",
    Activation: "node_outputs",
    LossRecord: "losses",
    Gradient: "gradients",
    Proposal: "updates",
    PromptVersion: "prompt_versions",
}


BATCH = 5000  # rows of a generator inserted at a time
# DuckDB's memory while it writes a spilled step or a run's examples (the rest goes to its
# temporary files, beside the log)
SPILLED_STEP_MEMORY = "64MB"


def batched(rows: Iterable[dict], size: int) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def open_for_writing(path: str | Path) -> None:
    """Create the file and schema if needed (raises RunLogError on a bad file). Only an
    empty file or a run log is opened for writing, and only where it can be written: all
    checked here, before a run makes any model call."""
    check_writable(path)
    with connect(path) as con:
        ensure_schema(con, str(path))


def insert_rows(con: Any, table: str, rows: list[dict], columns: list[str] | None = None
                ) -> None:
    """Bulk insert, one typed array of values a column (_register_rows: without pandas,
    which a process that only writes, as an import, never loads); columns missing from a
    row are NULL. `columns`: for a table outside the schema's TABLES (default: that
    table's columns there)."""
    if not rows:
        return
    columns = columns or column_names(table)
    _register_rows(con, rows, columns, table)
    try:
        con.execute(f"INSERT INTO {table} SELECT {', '.join(columns)} FROM _rows")
    finally:
        con.unregister("_rows")


def _arrays(rows: list[dict], columns: list[str]) -> dict[str, Any]:
    """The rows as one NumPy object array a column, which DuckDB scans as a table."""
    import numpy as np

    return {c: np.fromiter((row.get(c) for row in rows), dtype=object, count=len(rows))
            for c in columns}


# a column type of the log's schema as Arrow holds it (JSON as its text); an INTEGER column
# is read as 64 bits and narrowed by the insert's cast, as an object array would be
_ARROW_TYPES = {"VARCHAR": "string", "JSON": "string", "DOUBLE": "float64",
                "INTEGER": "int64", "BIGINT": "int64", "BOOLEAN": "bool_"}


def _register_rows(con: Any, rows: list[dict], columns: list[str],
                   table: str | None = None) -> None:
    """The rows as the view `_rows`: an Arrow table typed by `table`'s columns in the
    schema, which DuckDB reads without guessing. (An object array's type is guessed from a
    sample of its values, and where the sample holds only NULLs over 2,000 rows, as an
    `error` column that is set in one row or none, DuckDB 1.4.4 looks for a value with a
    pandas method and fails on NumPy.) A column whose values do not fit its type, or a
    table outside the schema, falls back to an object array whose every value is read."""
    import pyarrow as pa

    types = {}
    if table is not None:
        with contextlib.suppress(KeyError):
            types = dict(c.split(" ", 1) for c in table_columns(table).split(", "))
    arrays, untyped = {}, {}
    for c in columns:
        values = [row.get(c) for row in rows]
        kind = _ARROW_TYPES.get((types.get(c) or "?").split()[0].split("(")[0].upper())
        try:
            if kind is None:
                raise TypeError(c)
            arrays[c] = pa.array(values, type=getattr(pa, kind)())
        except (TypeError, ValueError, pa.ArrowException):
            untyped[c] = values
    if untyped:  # rare: every value read, so a sparse column is typed by what it holds
        con.execute(f"SET pandas_analyze_sample = {max(1000, len(rows))}")
        con.register("_rows", _arrays(rows, columns))
        return
    con.register("_rows", pa.table(arrays))


class RunLogWriter:
    """Listener that persists a run. Use `start_run`, pass events, then `finish`."""

    def __init__(self, path: str | Path, run_id: str, cache: Cache | None = None):
        self.path, self.run_id, self.cache = str(path), run_id, cache
        self._buffer: dict[str, list[dict]] = defaultdict(list)
        self._spilled: dict[str, list[str]] = defaultdict(list)  # table -> its Parquet parts
        self._spill_dir: Path | None = None
        # over a lake: the snapshot up to which other writers' replies joined the cache
        self._cache_seen = -1 if cache is not None and is_lake(path) else None

    def start_run(self, run_row: dict, examples: Iterable[dict]) -> None:
        """The run's row and its examples, in one transaction; `examples` may be a
        generator (an import's thousands of traces), inserted BATCH rows at a time."""
        with connect(self.path) as con:
            ensure_schema(con, self.path)
            # as a spilled step: many examples go to DuckDB's temporary files, not memory
            con.execute(f"SET memory_limit = '{SPILLED_STEP_MEMORY}'")
        examples = examples if isinstance(examples, list) or not is_lake(self.path) \
            else list(examples)  # a lake's conflicting commit inserts them again

        def body(con: Any) -> None:
            if is_lake(self.path) and con.execute(
                    "SELECT count(*) FROM runs WHERE run_id = ?", [self.run_id]).fetchone()[0]:
                raise RunLogError(f"{self.path}: a run '{self.run_id}' already exists")
            insert_rows(con, "runs", [run_row])
            for batch in batched(examples, BATCH):
                insert_rows(con, "examples", batch)

        self._write(body)
        self._join_lake_cache()

    def __call__(self, event: Any) -> None:
        table = TABLE_OF.get(type(event))
        if table is not None:
            self._buffer[table].append(_row(event))
        elif isinstance(event, StepFinished):
            self.flush(event)
        elif isinstance(event, StructuredFallback):  # kept as a metric of its step
            self._buffer["metrics"].append({"run_id": self.run_id, "step": event.step,
                                            "key": "structured_fallback", "value": 1.0})
        elif isinstance(event, RunFinished):
            self.finish(event.status, event.error)

    def spill(self) -> None:
        """Move the records buffered so far (and the new cache entries) out of memory, into
        Parquet files in a folder beside the log; the next flush writes them with the rest
        of the step in its one transaction. A step too large to hold (an import's
        thousands of traces) so still lands whole or not at all, and the log is
        checkpointed once for it, not once a part (each checkpoint rewrites the tables'
        last row groups: parts written one by one cost the square of the step)."""
        buffered, self._buffer = self._buffer, defaultdict(list)
        buffered["llm_cache"] = self.cache.drain() if self.cache else []
        if not any(buffered.values()):
            return
        if self._spill_dir is None:
            # beside a file log (its disk); a lake's step waits in the temporary folder
            folder = None if is_lake(self.path) else Path(self.path).resolve().parent
            name = "semback-lake" if folder is None else Path(self.path).name
            self._spill_dir = Path(tempfile.mkdtemp(prefix=f".{name}.spill-", dir=folder))
        with duckdb.connect() as mem:
            for table, rows in buffered.items():
                if not rows:
                    continue
                part = self._spill_dir / f"{table}-{len(self._spilled[table])}.parquet"
                # each column cast to its type in the log, as the insert would
                typed = ", ".join(f"CAST({c} AS {t}) AS {c}" for c, t in (
                    column.split(" ", 1) for column in table_columns(table).split(", ")))
                _register_rows(mem, rows, column_names(table), table)
                mem.execute(f"COPY (SELECT {typed} FROM _rows) TO '{part}' "
                            "(FORMAT parquet, COMPRESSION uncompressed)")
                mem.unregister("_rows")
                self._spilled[table].append(str(part))

    def _unspill(self) -> None:
        self._spilled = defaultdict(list)
        if self._spill_dir is not None:
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None

    def flush(self, step: StepFinished | None = None, metrics: dict[str, float] | None = None
              ) -> None:
        """Write everything buffered (and spilled), plus the step row, in one transaction."""
        buffered, self._buffer = self._buffer, defaultdict(list)
        cache_rows = self.cache.drain() if self.cache else []
        if step is not None:
            metrics = {**step.metrics, **(metrics or {})}

        def body(con: Any) -> None:
            if self._spilled:  # a step larger than memory: DuckDB keeps it on disk too
                con.execute(f"SET memory_limit = '{SPILLED_STEP_MEMORY}'")
            for table, parts in self._spilled.items():
                columns = ", ".join(column_names(table))
                con.execute(f"INSERT INTO {table} SELECT {columns} FROM read_parquet(?)",
                            [parts])
            for table, rows in buffered.items():
                insert_rows(con, table, rows)
            insert_rows(con, "llm_cache", cache_rows)
            if step is not None:
                insert_rows(con, "steps", [{
                    "run_id": self.run_id, "step": step.step, "train_score": step.train_score,
                    "val_score": step.val_score, "accepted": step.accepted,
                    "started_at": step.started_at, "ended_at": step.ended_at,
                }])
            number = step.step if step is not None else None
            insert_rows(con, "metrics", [
                {"run_id": self.run_id, "step": number, "key": k, "value": float(v)}
                for k, v in (metrics or {}).items()
            ])

        self._write(body)
        self._unspill()
        self._join_lake_cache()

    def _join_lake_cache(self) -> None:
        """Over a lake: the replies other writers committed since the last look join the
        cache (the first look, as the run starts, only notes where the lake stands: the
        cache was loaded whole just before)."""
        if self._cache_seen is None:
            return
        from engine.runlog.state import lake_cache_since

        self._cache_seen = lake_cache_since(self.path, self.cache, self._cache_seen
                                            if self._cache_seen >= 0 else 2**62)

    def save_cache(self) -> None:
        """Write the replies of the step in progress to the cache table only: a run stopped
        mid-step by its budget logs no partial step, and its resume gets those calls free."""
        rows = self.cache.drain() if self.cache else []
        if rows:
            self._write(lambda con: insert_rows(con, "llm_cache", rows))

    def discard(self) -> None:
        """Drop the step in progress: its buffered and spilled records (a step that failed
        part way writes nothing, as when it is held whole)."""
        self._buffer = defaultdict(list)
        self._unspill()

    def finish(self, status: str, error: str | None = None) -> None:
        ended = time.time()
        self._write(lambda con: con.execute(
            "UPDATE runs SET status = ?, ended_at = ?, error = ? WHERE run_id = ?",
            [status, ended, error, self.run_id]))

    def set_status(self, status: str) -> None:
        self._write(lambda con: con.execute(
            "UPDATE runs SET status = ?, ended_at = NULL, error = NULL WHERE run_id = ?",
            [status, self.run_id]))
        self._join_lake_cache()

    def _write(self, body: Callable[[Any], Any]) -> None:
        """One transaction; a lake that went away mid-run stops the run in one line that says
        how to go on (its last committed step is where `resume` starts)."""
        try:
            write(self.path, body)
        except RunLogError as exc:
            if is_lake(self.path) and "the lake's catalog" in str(exc):
                raise RunLogError(f"{exc}; the run stopped after its last committed step: "
                                  f"python -m engine resume {self.run_id} --db "
                                  f"'{self.path}' once the catalog is back") from None
            raise


def _row(event: Any) -> dict:
    """An event's fields as a row. Their values are text, numbers and None, so a shallow
    copy is the row (dataclasses.asdict deep-copies every value, a third of a large
    import's time)."""
    fields = getattr(event, "__dict__", None)
    return dict(fields) if fields is not None else asdict(event)


def run_row(run_id: str, graph: Any, config: dict, backend: str, model: str,
            optimizer_model: str, *, model_sha256: str | None = None,
            optimizer_model_sha256: str | None = None) -> dict:
    return {
        "run_id": run_id, "graph_name": graph.name, "graph_yaml": graph.yaml_text,
        "method": config["method"], "backend": backend, "model": model,
        "optimizer_model": optimizer_model, "model_sha256": model_sha256,
        "optimizer_model_sha256": optimizer_model_sha256, "seed": config["seed"],
        "config": json.dumps(config, sort_keys=True), "status": "running",
        "started_at": time.time(), "ended_at": None, "error": None,
    }


def add_notes(db: str | Path, run_id: str, lines: list[str]) -> None:
    """Append lines to a run's notes (runs.notes), each once: what the engine noticed
    about a run for its reader (a re-run's call that matched no node)."""
    with connect(db) as con:
        row = con.execute("SELECT notes FROM runs WHERE run_id = ?", [run_id]).fetchone()
        if row is None:
            raise RunLogError(f"{db}: no run {run_id!r}")
        have = (row[0] or "").splitlines()
        new = [line for line in dict.fromkeys(lines) if line not in have]
        if new:
            con.execute("UPDATE runs SET notes = ? WHERE run_id = ?",
                        ["\n".join([*have, *new]), run_id])


def set_notes(db: str | Path, run_id: str, notes: str | None, tags: list[str] | None
              ) -> None:
    """Replace a run's notes and tags (runs.notes, runs.tags as a JSON list): the one write
    the dashboard makes. One short transaction through `connect`, which retries while the
    engine holds the file, so a running run is not disturbed."""
    clean = sorted({t.strip() for t in tags or [] if t and t.strip()})
    with connect(db) as con:
        if not con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]
                           ).fetchone()[0]:
            raise RunLogError(f"{db}: no run {run_id!r}")
        con.execute("UPDATE runs SET notes = ?, tags = ? WHERE run_id = ?",
                    [notes or None, json.dumps(clean), run_id])
