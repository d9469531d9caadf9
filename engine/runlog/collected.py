"""The SQL of collected spans: what `collect` (engine/traces/collect.py) receives over
OTLP/HTTP, stored as it arrives, and read back by `import-traces --collected`.

`collected_spans` holds one row per span, keyed by (trace_id, span_id) with ids in lowercase
hex. A span that arrives again (an exporter re-sending a batch whose reply it never got, the
receiver having been killed or restarted) is not stored twice: the first copy stays. The
spans of one trace may arrive in any number of requests, before and after a restart; they
meet in this table, so a trace is whole whenever its last span has arrived.

Each request's spans are written in one transaction, committed before the receiver
replies, so a span the exporter saw acknowledged is on disk. The connection is the run
log's (schema.connect, retried while another process holds the file), kept only while
batches keep coming (`SpanStore`), so a reader in another process (`import-traces
--collected` while `collect` runs) gets in between them.

Rows go in and come out as plain tuples (`ROW`); engine/traces/collect.py turns them into
spans.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine.runlog.schema import ON_DEMAND_TABLES, column_names, connect, user_tables
from engine.runlog.writer import open_for_writing

TABLE = "collected_spans"  # created by the first `collect` on a log (schema.ON_DEMAND_TABLES)
COLUMNS = column_names(TABLE)
_CREATE = f"CREATE TABLE IF NOT EXISTS {TABLE} ({ON_DEMAND_TABLES[TABLE]})"
# what a caller gives and gets: the columns but received_at and position, which the store sets
ROW = ("trace_id", "span_id", "parent_id", "name", "start_ns", "end_ns", "attributes",
       "service")

_INSERT = (  # new spans only: the first copy of each (trace_id, span_id), in the batch too
    f"INSERT INTO {TABLE} SELECT {', '.join(COLUMNS)} FROM ("
    "SELECT *, row_number() OVER (PARTITION BY trace_id, span_id ORDER BY position) AS nth "
    "FROM _spans) AS r WHERE nth = 1 AND NOT EXISTS ("
    f"SELECT 1 FROM {TABLE} AS c WHERE c.trace_id = r.trace_id AND c.span_id = r.span_id)")


_APPEND = f"INSERT INTO {TABLE} SELECT {', '.join(COLUMNS)} FROM _spans"
# the writer's connection: DuckDB's buffer pool kept small, and a checkpoint each 64 MB of
# write-ahead log rather than each 16 MB (at 16 MB a busy receiver spent a third of its
# time checkpointing; closing the connection, every `hold` seconds at most, checkpoints
# too). Measured with benchmarks/collect_rate.py (docs/traces.md)
WRITER_SETTINGS = ("SET memory_limit = '128MB'", "SET checkpoint_threshold = '64MB'")
_APPEND_ROW = (f"INSERT INTO {TABLE} ({', '.join((*ROW, 'received_at', 'position'))}) "
               f"VALUES ({', '.join('?' * (len(ROW) + 2))})")


def open_for_collecting(db: str | Path) -> None:
    """Make `db` a run log that takes collected spans: the run log's schema (refused, in one
    RunLogError line, for a file that is not a run log), and the table."""
    open_for_writing(db)
    with connect(db) as con:
        con.execute(_CREATE)


class SpanStore:
    """The one writer of collected spans in a process: `store` writes one request's spans
    in one transaction and returns once they are committed.

    Opening the file costs more than writing a batch (tens of milliseconds, and closing it
    checkpoints), so the connection is kept while batches keep coming, and let go when none
    came for `idle` seconds, or after it was held `hold` seconds, when the next batch waits
    `pause` seconds: the gap where another process (`import-traces --collected`, a run on
    the same log) gets the file. A write that finds the file held elsewhere retries for
    `timeout` seconds, then raises RunLogError. Committed spans survive the process being
    killed (DuckDB replays its write-ahead log on the next open)."""

    def __init__(self, db: str | Path, idle: float = 0.1, hold: float = 2.0,
                 pause: float = 0.3, timeout: float = 30.0) -> None:
        self.db, self.idle, self.hold, self.pause, self.timeout = \
            str(db), idle, hold, pause, timeout
        self._lock = threading.Lock()
        self._stack: ExitStack | None = None
        self._con: Any = None
        self._opened = self._used = self._released = 0.0
        self._closed = threading.Event()
        self._reaper = threading.Thread(target=self._let_go_when_idle, daemon=True,
                                        name="collected-spans")
        self._reaper.start()

    def store(self, rows: list[tuple], received_at: float | None = None) -> int:
        """Write one request's spans (tuples in `ROW`'s order, attributes as a JSON string)
        in one transaction; the count of spans that were new."""
        return self._write(rows, _INSERT, received_at)

    def append(self, rows: list[tuple], received_at: float | None = None) -> int:
        """Write spans whose ids the writer minted itself (the gateway's: never sent
        twice), in one transaction, without looking for earlier copies; their count."""
        return self._write(rows, _APPEND, received_at)

    def _write(self, rows: list[tuple], sql: str, received_at: float | None) -> int:
        if not rows:
            return 0
        when = time.time() if received_at is None else received_at
        if sql is _APPEND and len(rows) < 8:  # a few rows: as parameters, no Arrow table
            with self._holding() as con:
                if len(rows) == 1:  # one statement commits itself
                    con.execute(_APPEND_ROW, [*rows[0], when, 0])
                else:
                    _in_transaction(con, lambda: [con.execute(_APPEND_ROW, [*row, when, i])
                                                  for i, row in enumerate(rows)])
            return len(rows)
        columns = {name: list(values) for name, values in zip(ROW, zip(*rows))}
        columns["received_at"] = [when] * len(rows)
        columns["position"] = list(range(len(rows)))
        with self._holding() as con:
            con.register("_spans", pa.table(columns))
            try:
                if sql is _APPEND:
                    _in_transaction(con, lambda: con.execute(sql))
                    added = len(rows)
                else:  # the count of rows the insert added (repeats are left out)
                    added = _in_transaction(con, lambda: con.execute(sql).fetchone()[0])
            finally:
                con.unregister("_spans")
        return int(added)

    @contextmanager
    def _holding(self) -> Iterator[Any]:
        """The connection, held under the lock for one write; let go after a failure,
        or when it has been held `hold` seconds."""
        with self._lock:
            con = self._connection()
            try:
                yield con
            except BaseException:
                self._let_go()
                raise
            self._used = time.monotonic()
            if self._used - self._opened > self.hold:
                self._let_go()

    def _connection(self) -> Any:
        if self._con is None:
            wait = self._released + self.pause - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            stack = ExitStack()
            con = stack.enter_context(connect(self.db, timeout=self.timeout))
            try:
                for setting in WRITER_SETTINGS:
                    con.execute(setting)
                con.execute(_CREATE)  # cheap, and a table dropped meanwhile comes back
            except BaseException:
                stack.close()
                raise
            self._con, self._stack, self._opened = con, stack, time.monotonic()
        return self._con

    def _let_go(self) -> None:
        stack, self._stack, self._con = self._stack, None, None
        if stack is not None:
            self._released = time.monotonic()
            stack.close()

    def _let_go_when_idle(self) -> None:
        while not self._closed.wait(self.idle / 2):
            if self._con is not None and time.monotonic() - self._used > self.idle:
                with self._lock:
                    if self._con is not None and time.monotonic() - self._used > self.idle:
                        self._let_go()

    def release(self) -> None:
        """Let go of the file now (after a write in progress); the next batch opens it
        again. A read in this process needs it: DuckDB refuses a read-only connection
        beside this one."""
        with self._lock:
            self._let_go()

    def close(self) -> None:
        """Let go of the file (after a write in progress) for good."""
        self._closed.set()
        with self._lock:
            self._let_go()


def _in_transaction(con: Any, work: Callable[[], Any]) -> Any:
    """`work()` in one transaction, rolled back when it raises."""
    con.execute("BEGIN TRANSACTION")
    try:
        result = work()
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return result


def _has_table(con) -> bool:
    return TABLE in user_tables(con)


def collected_spans(db: str | Path, service: str | None = None, since: float | None = None,
                    trace_ids: list[str] | None = None) -> list[tuple]:
    """Every collected span (tuples in `ROW`'s order), in the order they arrived, of whole
    traces: with `service`, the traces that have a span of that service (OTLP's
    `service.name`); with `since` (seconds since the epoch), the traces whose first span
    arrived at or after it; with `trace_ids`, those traces only. Without `trace_ids`, the
    traces of the gateway's re-runs and interventions are left out. Empty for a log that
    never collected."""
    with connect(db, read_only=True) as con:
        if not _has_table(con):
            return []
        where, params = [], []
        if trace_ids is not None:
            con.register("_wanted", pa.table({"trace_id": list(trace_ids)}))
            return con.execute(f"SELECT {', '.join(ROW)} FROM {TABLE} WHERE trace_id IN "
                               "(SELECT trace_id FROM _wanted) "
                               "ORDER BY received_at, position").fetchall()
        if service is not None:
            where.append("bool_or(service = ?)")
            params.append(service)
        if since is not None:
            where.append("min(received_at) >= ?")
            params.append(since)
        # the gateway's re-runs and interventions (a candidate's calls) are not the
        # pipeline's own traffic: their traces are left out
        where.append("NOT bool_or(coalesce(json_exists(attributes, "
                     "'$.\"semback.gateway.candidate\"'), false))")
        chosen = (f"WHERE trace_id IN (SELECT trace_id FROM {TABLE} GROUP BY trace_id "
                  f"HAVING {' AND '.join(where)})")
        return con.execute(f"SELECT {', '.join(ROW)} FROM {TABLE} {chosen} "
                           "ORDER BY received_at, position", params).fetchall()


def collected_counts(db: str | Path) -> dict[str, int]:
    """Spans, traces and services collected so far (zeros for a log that never collected)."""
    with connect(db, read_only=True) as con:
        if not _has_table(con):
            return {"spans": 0, "traces": 0, "services": 0}
        spans, traces, services = con.execute(
            f"SELECT count(*), count(DISTINCT trace_id), count(DISTINCT service) FROM {TABLE}"
        ).fetchone()
    return {"spans": spans, "traces": traces, "services": services}


# what a live view reads of each span: the attributes that say whether it is an LLM call
# (engine.traces.otlp.is_llm_span) and what its trace's input is (infer.root_input); a
# root's input.value only, so no message payload is read
HEAD = ("service", "trace_id", "span_id", "parent_id", "received_at", "kind", "operation",
        "semback_run", "input")


def collected_heads(db: str | Path) -> list[tuple]:
    """One row per collected span, in the order they arrived, as tuples in `HEAD`'s order:
    OpenInference's span kind, GenAI's operation name, whether it carries semback.run_id,
    and (root spans only) its input.value when that is a string. Empty for a log that
    never collected."""
    def text(key: str) -> str:
        return f"json_extract_string(attributes, '$.\"{key}\"')"

    with connect(db, read_only=True) as con:
        if not _has_table(con):
            return []
        return con.execute(
            f"SELECT service, trace_id, span_id, parent_id, received_at, "
            f"{text('openinference.span.kind')}, {text('gen_ai.operation.name')}, "
            "json_exists(attributes, '$.\"semback.run_id\"'), "
            "CASE WHEN coalesce(parent_id, '') = '' AND "
            "json_type(attributes, '$.\"input.value\"') = 'VARCHAR' "
            f"THEN {text('input.value')} END "
            f"FROM {TABLE} ORDER BY received_at, position").fetchall()


def gateway_replies(db: str | Path) -> list[tuple[str, str]]:
    """(request key, completion JSON) of every call the gateway answered from upstream:
    its reply cache, which lives in the spans it recorded (engine/gateway/server.py)."""
    with connect(db, read_only=True) as con:
        if not _has_table(con):
            return []
        return con.execute(
            "SELECT json_extract_string(attributes, '$.\"semback.gateway.key\"'), "
            "json_extract_string(attributes, '$.\"output.value\"') "
            f"FROM {TABLE} WHERE service = 'semback-gateway' AND "
            "json_exists(attributes, '$.\"semback.gateway.key\"') "
            "ORDER BY received_at, position").fetchall()
