"""The run-log schema (documented column by column in docs/runlog.md), its version, and
connections that tolerate the single-writer lock of DuckDB.

Protocol: neither the writer nor a reader keeps a connection open. A writer connects,
writes one step in one transaction and disconnects; a reader connects read-only, runs
its queries and disconnects. Both retry with backoff while the other holds the lock.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from engine.runlog import lake

T = TypeVar("T")

SCHEMA_VERSION = 9

TABLES: dict[str, str] = {
    "schema_version": "version INTEGER, applied_at DOUBLE",
    "runs": """run_id VARCHAR, graph_name VARCHAR, graph_yaml VARCHAR, method VARCHAR,
        backend VARCHAR, model VARCHAR, optimizer_model VARCHAR, seed BIGINT, config JSON,
        status VARCHAR, started_at DOUBLE, ended_at DOUBLE, error VARCHAR,
        parent_run_id VARCHAR, fork_step INTEGER, notes VARCHAR, tags JSON,
        model_sha256 VARCHAR, optimizer_model_sha256 VARCHAR""",
    "steps": """run_id VARCHAR, step INTEGER, train_score DOUBLE, val_score DOUBLE,
        accepted BOOLEAN, started_at DOUBLE, ended_at DOUBLE""",
    "examples": """run_id VARCHAR, split VARCHAR, example_id VARCHAR, position INTEGER,
        fields JSON, target VARCHAR""",
    "prompt_versions": """run_id VARCHAR, node_id VARCHAR, version INTEGER, prompt VARCHAR,
        step INTEGER, accepted BOOLEAN""",
    "node_outputs": """run_id VARCHAR, step INTEGER, split VARCHAR, example_id VARCHAR,
        node_id VARCHAR, prompt_version INTEGER, input_text VARCHAR, output_text VARCHAR,
        error VARCHAR, raw_text VARCHAR, parse_error VARCHAR, call_id VARCHAR""",
    "losses": """run_id VARCHAR, step INTEGER, split VARCHAR, example_id VARCHAR,
        prediction VARCHAR, target VARCHAR, score DOUBLE, feedback VARCHAR, error VARCHAR,
        call_id VARCHAR""",
    "gradients": """run_id VARCHAR, step INTEGER, example_id VARCHAR, node_id VARCHAR,
        from_node_id VARCHAR, method VARCHAR, content VARCHAR, call_id VARCHAR,
        kind VARCHAR, parse_error VARCHAR, asks_change BOOLEAN, claim_source VARCHAR""",
    "updates": """run_id VARCHAR, step INTEGER, node_id VARCHAR, old_prompt VARCHAR,
        new_prompt VARCHAR, accepted BOOLEAN, val_before DOUBLE, val_after DOUBLE,
        call_id VARCHAR, parse_error VARCHAR, reasoning VARCHAR, val_alone DOUBLE,
        reject_reason VARCHAR, candidate INTEGER""",
    "llm_calls": """call_id VARCHAR, run_id VARCHAR, step INTEGER, example_id VARCHAR,
        node_id VARCHAR, purpose VARCHAR, backend VARCHAR, model VARCHAR, messages JSON,
        response VARCHAR, prompt_tokens INTEGER, completion_tokens INTEGER,
        latency_ms DOUBLE, cache_hit BOOLEAN, retries INTEGER, error VARCHAR,
        started_at DOUBLE, cost_usd DOUBLE, cache_key VARCHAR, temperature DOUBLE,
        max_tokens INTEGER, constrained BOOLEAN, finish_reason VARCHAR, cached_tokens INTEGER,
        response_model VARCHAR, queued_ms DOUBLE""",
    "metrics": "run_id VARCHAR, step INTEGER, key VARCHAR, value DOUBLE",
    # Counterfactual probes (docs/runlog.md): one row per intervention, and the node
    # outputs a probe re-computed, kept apart from the run's own activations.
    "probes": """probe_id VARCHAR, run_id VARCHAR, step INTEGER, example_id VARCHAR,
        node_id VARCHAR, kind VARCHAR, intervention VARCHAR, before_output VARCHAR,
        after_output VARCHAR, before_score DOUBLE, after_score DOUBLE, created_at DOUBLE,
        call_ids JSON, leaks_target BOOLEAN, error VARCHAR""",
    "probe_outputs": """probe_id VARCHAR, run_id VARCHAR, step INTEGER, example_id VARCHAR,
        node_id VARCHAR, output_text VARCHAR, error VARCHAR, call_id VARCHAR""",
    "llm_cache": """key VARCHAR, backend VARCHAR, model VARCHAR, request JSON, response VARCHAR,
        prompt_tokens INTEGER, completion_tokens INTEGER, created_at DOUBLE""",
}

# Tables a feature creates when it first writes to a log (CREATE TABLE IF NOT EXISTS, as the
# diffs' tables are), so that a log that never used it has none of them and needs no
# upgrade, and older engines read a log that has them.
ON_DEMAND_TABLES: dict[str, str] = {
    # the spans `collect` received over OTLP/HTTP (engine/runlog/collected.py), one row per
    # (trace_id, span_id), for `import-traces --collected`
    "collected_spans": """trace_id VARCHAR, span_id VARCHAR, parent_id VARCHAR, name VARCHAR,
        start_ns BIGINT, end_ns BIGINT, attributes JSON, service VARCHAR, received_at DOUBLE,
        position INTEGER""",
}

# version -> list of statements that bring a database from version-1 to version.
MIGRATIONS: dict[int, list[str]] = {
    # 2: probes and forks, notes and tags, per-node gates, constrained replies.
    # New tables come from CREATE TABLE IF NOT EXISTS; new columns are appended.
    2: [
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS parent_run_id VARCHAR",
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS fork_step INTEGER",
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS notes VARCHAR",
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS tags JSON",
        "ALTER TABLE updates ADD COLUMN IF NOT EXISTS val_alone DOUBLE",
        "ALTER TABLE updates ADD COLUMN IF NOT EXISTS reject_reason VARCHAR",
        "ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS constrained BOOLEAN",
    ],
    # 3: why each reply ended (the provider's finish reason), which trace viewers need.
    3: [
        "ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS finish_reason VARCHAR",
    ],
    # 4: prompt tokens the provider served from its prefix cache (OpenAI's
    # usage.prompt_tokens_details.cached_tokens), priced apart.
    4: [
        "ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS cached_tokens INTEGER",
    ],
    # 5: what each gradient claims (asks its input to change or not) and where that was
    # read: the structured reply's field, or the gradient's text. Older rows stay NULL.
    5: [
        "ALTER TABLE gradients ADD COLUMN IF NOT EXISTS asks_change BOOLEAN",
        "ALTER TABLE gradients ADD COLUMN IF NOT EXISTS claim_source VARCHAR",
    ],
    # 6: the model a reply named (an OpenAI-compatible server's `model`), which trace
    # viewers show as the response model; NULL where no reply named one.
    6: [
        "ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS response_model VARCHAR",
    ],
    # 7: which model file each run ran: the SHA-256 of a local model (a name alone does not
    # say, two files may share one). Older rows and provider models stay NULL.
    7: [
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS model_sha256 VARCHAR",
        "ALTER TABLE runs ADD COLUMN IF NOT EXISTS optimizer_model_sha256 VARCHAR",
    ],
    # 8: which of a step's candidate prompt sets (--proposals) each proposal belongs to;
    # older rows (one candidate a step) stay NULL, read as 0.
    8: [
        "ALTER TABLE updates ADD COLUMN IF NOT EXISTS candidate INTEGER",
    ],
    # 9: of a call's latency, the time it waited for its turn before the model started on
    # it (the run's concurrency limit, the embedded model's slots, its server's start);
    # older rows stay NULL (not measured).
    9: [
        "ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS queued_ms DOUBLE",
    ],
}


class RunLogError(Exception):
    """A run-log problem worth one clear line: not a DuckDB file, newer schema, no run."""


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "lock" in text or "conflicting" in text or "being used by another" in text


def dict_rows(con: Any, sql: str, params: list) -> list[dict[str, Any]]:
    """A query's rows as dicts keyed by column name: the one row helper of the run log."""
    cursor = con.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


@contextmanager
def connect(path: str | Path, read_only: bool = False, timeout: float = 30.0
            ) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection, retried with jittered backoff while another process holds
    the file. Read-only connections to a missing file raise RunLogError. A lake
    (`ducklake:…`, engine/runlog/lake.py) is not locked: its connection is a cursor of the
    process's attached lake, whose tables exist at this engine's schema once it returns."""
    path = str(path)
    if lake.is_lake(path):
        with _lake_connection(path, timeout) as con:
            yield con
        return
    if read_only and not Path(path).exists():
        raise RunLogError(f"{path}: no such run log")
    if read_only and path not in _CURRENT:
        _upgrade_older_log(path, timeout)
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            con = duckdb.connect(path, read_only=read_only)
            break
        except duckdb.Error as exc:
            if read_only and "different configuration" in str(exc):
                # this process already holds the file read-write (the gateway recording a
                # re-run's calls while a probe reads the run): share that instance
                read_only = False
                continue
            if not _is_lock_error(exc):
                if not read_only and _is_permission_error(exc):
                    raise RunLogError(f"{path}: cannot write to the run log: the file or its "
                                      f"folder is read-only or immutable ({_first_line(exc)})"
                                      ) from None
                raise RunLogError(f"{path}: not a readable DuckDB run log ({_first_line(exc)})"
                                  ) from None
            if time.monotonic() > deadline:
                raise RunLogError(f"{path}: still locked by another process after "
                                  f"{timeout:g} s") from None
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 1.6, 0.2)
    try:
        yield con
    except CORRUPTION_ERRORS as exc:  # a truncated or damaged file fails on first read
        raise RunLogError(f"{path}: the run log is damaged or truncated "
                          f"({_first_line(exc)})") from None
    finally:
        con.close()


@contextmanager
def _lake_connection(db: str, timeout: float) -> Iterator[duckdb.DuckDBPyConnection]:
    try:
        try:
            con = lake.cursor(db)
        except duckdb.Error:  # the attachment this process held lost its catalog (a
            lake.forget(db)   # restarted Postgres): attach afresh, once
            con = lake.cursor(db)
    except lake.LakeError as exc:
        raise RunLogError(str(exc)) from None
    except duckdb.Error as exc:
        raise _lost(db, exc) from None
    try:
        if db not in _CURRENT:  # the first use in this process: tables, migrations
            _retry_conflicts(db, lambda: ensure_schema(con, db), timeout)
            _CURRENT.add(db)
        yield con
    except duckdb.Error as exc:
        if lake.is_unreachable(exc):
            raise _lost(db, exc) from None
        raise
    finally:
        con.close()


def _lost(db: str, exc: Exception) -> RunLogError:
    lake.forget(db)  # the next connection attaches afresh
    return RunLogError(f"{db}: lost the lake's catalog ({lake.reason(exc)[:200]})")


def _retry_conflicts(db: str, body: Callable[[], T], timeout: float) -> T:
    """`body()`, run again (with jittered backoff) while its commit loses a race with another
    writer of the same lake; a file log runs it once."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            return body()
        except duckdb.Error as exc:
            if not (lake.is_lake(db) and lake.is_conflict(exc)) or time.monotonic() > deadline:
                raise
        time.sleep(delay * random.uniform(0.5, 1.5))
        delay = min(delay * 1.6, 0.5)


def write(db: str | Path, body: Callable[[duckdb.DuckDBPyConnection], T],
          timeout: float = 60.0) -> T:
    """`body(con)` in one transaction, committed. Over a lake, a commit that conflicts with
    another writer's is rolled back and the whole body runs again (it must only insert what
    it was handed), so nothing is dropped; a file log's lock is waited for by `connect`."""
    db = str(db)

    def once() -> T:
        with connect(db, timeout=timeout) as con:
            con.execute("BEGIN TRANSACTION")
            try:
                out = body(con)
                con.execute("COMMIT")
            except BaseException:
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                raise
            return out

    return _retry_conflicts(db, once, timeout)


def user_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The tables of the connection's default catalog (a file's, or the lake's)."""
    return {r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = "
        "current_database() AND table_schema = 'main'").fetchall()}


def log_exists(db: str | Path) -> bool:
    """The run log is there to read: a file, or a lake (a Postgres catalog is always taken
    to be: connecting says otherwise in one line)."""
    return lake.exists(str(db)) if lake.is_lake(db) else Path(db).exists()


CORRUPTION_ERRORS = (duckdb.IOException, duckdb.SerializationException,
                     duckdb.InternalException)
_HEADER_BYTES = 3 * 4096  # DuckDB's file header and its two database headers


def _is_permission_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return any(s in text for s in ("permission denied", "operation not permitted",
                                   "read-only file system"))


def check_intact(con: duckdb.DuckDBPyConnection, path: str | Path) -> None:
    """Refuse a file shorter than the blocks its header promises (a truncated copy): such a
    file opens, but its later blocks fail on read, and a write would go to a WAL that no
    reader could replay."""
    if lake.is_lake(path) or not Path(path).is_file():
        return
    block_size = con.execute("SELECT block_size FROM pragma_database_size()").fetchall()[0][0]
    tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                        "WHERE table_schema = 'main'").fetchall()]
    last = -1  # the highest data block any table uses (metadata only: no data is read)
    for table in tables:
        row = con.execute("SELECT max(block_id) FROM pragma_storage_info(?) WHERE persistent",
                          [table]).fetchall()
        last = max(last, row[0][0] if row and row[0][0] is not None else -1)
    needed = _HEADER_BYTES + int(block_size or 0) * (last + 1)
    size = Path(path).stat().st_size
    if size < needed:
        raise RunLogError(f"{path}: the run log is truncated ({size:,} of {needed:,} bytes); "
                          "restore it from a copy or use another --db")


_CURRENT: set[str] = set()  # run logs seen at this engine's schema version


def _upgrade_older_log(path: str, timeout: float) -> None:
    """A run log written by an older engine gains the new tables and columns the first time
    this process reads it, so that readers can select every current column."""
    if _older(path, timeout):
        with connect(path, read_only=False, timeout=timeout) as con:
            ensure_schema(con, path)
    _CURRENT.add(path)


def _older(path: str, timeout: float) -> bool:
    _CURRENT.add(path)  # the nested read-only connect must not recurse
    try:
        with connect(path, read_only=True, timeout=timeout) as con:
            if "schema_version" not in user_tables(con):
                return False
            version = con.execute("SELECT max(version) FROM schema_version").fetchall()[0][0]
            return int(version or 0) < SCHEMA_VERSION
    finally:
        _CURRENT.discard(path)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__


def ensure_schema(con: duckdb.DuckDBPyConnection, path: str = "") -> None:
    """Create missing tables and apply migrations; refuse a newer schema."""
    existing = user_tables(con)
    if "schema_version" in existing:
        row = con.execute("SELECT max(version) FROM schema_version").fetchone()
        version = int(row[0] or 0)
        if version > SCHEMA_VERSION:
            raise RunLogError(f"{path}: run log schema version {version} is newer than this "
                              f"engine's ({SCHEMA_VERSION}); upgrade the engine")
        if version == SCHEMA_VERSION and existing >= set(TABLES):
            return
    else:
        version = 0
    con.execute("BEGIN TRANSACTION")
    for name, columns in TABLES.items():
        con.execute(f"CREATE TABLE IF NOT EXISTS {name} ({columns})")
    for v in range(version + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS.get(v, []):
            con.execute(statement)
    if version < SCHEMA_VERSION:
        con.execute("INSERT INTO schema_version VALUES (?, ?)", [SCHEMA_VERSION, time.time()])
    con.execute("COMMIT")


def check_readable(path: str | Path) -> None:
    """Raise RunLogError unless `path` is a run log this engine can read."""
    if lake.is_lake(path) and not lake.exists(str(path)):
        raise RunLogError(f"{path}: no such lake")
    with connect(path, read_only=True) as con:
        check_intact(con, path)
        if "schema_version" not in user_tables(con):
            raise RunLogError(f"{path}: a DuckDB file, but not a run log (no schema_version)")
        version = con.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
        if version > SCHEMA_VERSION:
            raise RunLogError(f"{path}: run log schema version {version} is newer than this "
                              f"engine's ({SCHEMA_VERSION}); upgrade the engine")


def check_writable(path: str | Path) -> None:
    """Raise RunLogError unless a run can be written to `path`: its folder takes new files
    (DuckDB's write-ahead log), the file itself can be opened for writing, and it is new,
    empty or a run log (another program's DuckDB file is left alone). A lake: its catalog
    answers, and holds a run log this engine can write."""
    if lake.is_lake(path):
        with connect(path):
            return
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise RunLogError(f"{path}: the folder {folder} does not exist")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        raise RunLogError(f"{path}: cannot write in the folder {folder} ({exc.strerror}); "
                          "the run log needs it for its write-ahead log") from None
    if not path.exists():
        return
    try:
        path.open("r+b").close()
    except OSError as exc:
        raise RunLogError(f"{path}: cannot write to the run log: the file is read-only or "
                          f"immutable ({exc.strerror})") from None
    if path.stat().st_size == 0:
        return
    with connect(path, read_only=True) as con:
        check_intact(con, path)
        tables = user_tables(con)
    if tables and "schema_version" not in tables:
        raise RunLogError(f"{path}: a DuckDB file, but not a run log (it holds "
                          f"{', '.join(sorted(tables)[:3])}); refusing to add run-log tables "
                          "to it: choose another --db")


def column_names(table: str) -> list[str]:
    return [part.split()[0] for part in table_columns(table).split(", ")]


def table_columns(table: str) -> str:
    """A table's column definitions, as CREATE TABLE takes them (`name TYPE, ...`)."""
    return " ".join((TABLES[table] if table in TABLES else ON_DEMAND_TABLES[table]).split())
