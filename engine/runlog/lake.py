"""A run log as a DuckLake: the catalog in Postgres (a team's, `ducklake:postgres:dbname=…
host=…`) or in a local file (`ducklake:FILE.ducklake`), the rows as Parquet files under a
data path (a folder every writer sees, or `s3://…`). Many processes on many machines write
one lake at once: each commit is a snapshot, appends from several writers merge, and the
run log only ever appends (or updates its own run's row).

Everything else in `engine.runlog` is the same SQL over a lake as over a DuckDB file:
`schema.connect` hands out a cursor of this process's one attached lake, whose default
catalog is the lake (`USE`), so unqualified table names are the lake's tables.

Credentials never come through `--db`: a `password=` there is refused, and libpq reads
`PGPASSWORD`, `PGPASSFILE` or `~/.pgpass` itself, so no secret reaches a run's config,
an export or an error line. See docs/team.md.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from pathlib import Path

import duckdb

PREFIX = "ducklake:"
ALIAS = "runlog"
DATA_PATH_ENV = "SEMBACK_DATA_PATH"
_SECRET = re.compile(r"(?i)\b(password|passfile|sslpassword)\s*=")
_lock = threading.Lock()
_open: dict[tuple[str, str], duckdb.DuckDBPyConnection] = {}


class LakeError(Exception):
    """A lake that cannot be opened: one line naming the catalog (never a secret)."""


def is_lake(db: str | Path | None) -> bool:
    return str(db or "").startswith(PREFIX)


def catalog(db: str) -> str:
    """What follows `ducklake:`: `postgres:dbname=… host=…`, or a `.ducklake` file."""
    return str(db)[len(PREFIX):]


def is_postgres(db: str) -> bool:
    return catalog(db).startswith("postgres:")


def catalog_file(db: str) -> Path | None:
    """The catalog's file for a one-machine lake; None for a Postgres catalog."""
    if is_postgres(db):
        return None
    rest = catalog(db)
    return Path(rest[len("duckdb:"):] if rest.startswith("duckdb:") else rest)


def data_path(db: str) -> str | None:
    """Where the lake's Parquet files go: $SEMBACK_DATA_PATH (`--data-path` sets it), else
    (a file catalog) the folder DuckLake itself picks beside it; None for a Postgres
    catalog without one (an existing catalog remembers its own)."""
    given = os.environ.get(DATA_PATH_ENV, "").strip()
    if not given:
        return None
    if "://" in given:
        return given if given.endswith("/") else given + "/"
    # absolute: the catalog stores it, and every process must find the same folder
    return str(Path(given).expanduser().resolve()) + "/"


def check_target(db: str) -> None:
    """Refuse what would put a secret where the run log keeps its address."""
    if not catalog(db).strip():
        raise LakeError(f"{db}: name the catalog after 'ducklake:' (postgres:dbname=… "
                        "host=…, or a FILE.ducklake)")
    if _SECRET.search(catalog(db)):
        raise LakeError("ducklake: the catalog names a password; give it in PGPASSWORD or "
                        "~/.pgpass instead, so it never reaches the run log, exports or errors")


def extension_directory() -> str:
    """The folder the `duckdb-ext-*` packages install DuckDB's extensions into (they load
    from there, offline; DuckDB never downloads one)."""
    try:
        import duckdb_ext  # the namespace package of duckdb-ext-ducklake and friends
    except ImportError:
        raise LakeError("the DuckLake extensions are not installed (pip install "
                        "duckdb-ext-ducklake duckdb-ext-postgres duckdb-ext-httpfs)") from None
    for folder in duckdb_ext.__path__:
        if (Path(folder) / "extensions").is_dir():
            return str(Path(folder) / "extensions")
    raise LakeError("the DuckLake extensions' folder is missing (reinstall duckdb-ext-ducklake)")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def reason(exc: Exception) -> str:
    """libpq's own words where the catalog was out of reach; else DuckDB's first line."""
    text = " ".join(str(exc).split())
    for marker in ("failed: ", "Unable to connect to Postgres at "):
        if marker in text:
            tail = text.split(marker, 1)[1]
            return ("connection failed: " + tail) if marker == "failed: " else tail
    return text.split(" LINE ", 1)[0]


def _attach(db: str, tries: int = 20) -> duckdb.DuckDBPyConnection:
    """Attach the lake; when several processes meet a new catalog at once, the ones that lose
    the race to create its metadata tables attach again to what the winner made."""
    for attempt in range(tries):
        try:
            return _attach_once(db)
        except _Raced:
            time.sleep(0.05 * (attempt + 1) * random.uniform(0.5, 1.5))
    return _attach_once(db, raced_is_final=True)


class _Raced(Exception):
    pass


def _attach_once(db: str, raced_is_final: bool = False) -> duckdb.DuckDBPyConnection:
    con = new_connection()
    try:
        attach(con, db, ALIAS)
        con.execute(f"USE {ALIAS}")
    except duckdb.Error as exc:
        con.close()
        if not raced_is_final and ("already exists" in str(exc) or is_conflict(exc)):
            raise _Raced() from None
        if is_locked(exc):
            raise _Locked() from None
        raise _attach_error(db, exc) from None
    except LakeError:
        con.close()
        raise
    return con


def new_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that loads the extensions from their packages, never the web."""
    return duckdb.connect(config={"extension_directory": extension_directory(),
                                  "autoinstall_known_extensions": False,
                                  "autoload_known_extensions": True})


def attach(con: duckdb.DuckDBPyConnection, db: str, alias: str) -> None:
    """Attach the lake `db` to `con` as `alias`, with its data path (a new lake's is made;
    an existing lake's folder must be there: a shared folder not mounted on this machine is
    refused, never replaced by an empty local one)."""
    check_target(db)
    con.execute("LOAD ducklake")
    if is_postgres(db):
        con.execute("LOAD postgres")
    if os.environ.get("AWS_ACCESS_KEY_ID") or str(data_path(db) or "").startswith("s3://"):
        _s3(con)  # the catalog may remember an s3:// data path the variables unlock
    where = data_path(db)
    if where and "://" not in where:
        Path(where).mkdir(parents=True, exist_ok=True)
    options = f" (DATA_PATH {_quote(where)})" if where else ""
    con.execute(f"ATTACH {_quote(db)} AS {alias}{options}")
    stored = con.execute(f"SELECT value FROM __ducklake_metadata_{alias}.ducklake_metadata "
                         "WHERE key = 'data_path'").fetchone()
    folder = stored[0] if stored else None
    if folder and "://" not in folder and not Path(folder).is_dir():
        con.execute(f"DETACH {alias}")
        raise LakeError(f"{db}: the lake's data folder {folder} is not on this machine "
                        "(mount the shared folder at that path)")


def _attach_error(db: str, exc: Exception) -> LakeError:
    if "data_path is not set" in str(exc):
        return LakeError(f"{db}: a new lake needs a data path: --data-path or "
                         f"${DATA_PATH_ENV} (a folder every writer sees, or s3://…)")
    return LakeError(f"{db}: cannot open the lake's catalog ({reason(exc)})")


def is_locked(exc: Exception) -> bool:
    """A one-machine catalog file another process holds open (DuckDB's file lock)."""
    text = str(exc).lower()
    return "conflicting lock" in text or "could not set lock" in text


class _Locked(Exception):
    pass


def _s3(con: duckdb.DuckDBPyConnection) -> None:
    """S3 through httpfs, with the credentials of the standard AWS variables (they stay in
    this process's memory: a DuckDB secret, never the run log)."""
    con.execute("LOAD httpfs")
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not (key and secret):
        return
    parts = [f"KEY_ID {_quote(key)}", f"SECRET {_quote(secret)}"]
    if os.environ.get("AWS_REGION"):
        parts.append(f"REGION {_quote(os.environ['AWS_REGION'])}")
    if os.environ.get("AWS_ENDPOINT_URL"):
        endpoint = os.environ["AWS_ENDPOINT_URL"].split("://", 1)[-1]
        parts += [f"ENDPOINT {_quote(endpoint)}", "URL_STYLE 'path'",
                  f"USE_SSL {str(not os.environ['AWS_ENDPOINT_URL'].startswith('http:')).lower()}"]
    con.execute(f"CREATE OR REPLACE SECRET semback_s3 (TYPE s3, {', '.join(parts)})")


def cursor(db: str, timeout: float = 30.0) -> duckdb.DuckDBPyConnection:
    """A cursor of this process's attached lake (attached on first use: a few hundred
    milliseconds; later cursors cost nothing). Each thread takes its own cursor. A catalog
    in a local file is attached for each use and let go when the cursor closes, as a
    DuckDB run log is (one process at a time holds the file: the others wait)."""
    check_target(db)
    if catalog_file(db) is not None:
        return _attach_waiting(db, timeout)
    key = (db, data_path(db) or "")
    with _lock:
        con = _open.get(key)
        if con is None:
            con = _open[key] = _attach(db)
    cur = con.cursor()
    cur.execute(f"USE {ALIAS}")  # the default catalog is each connection's own
    return cur


def _attach_waiting(db: str, timeout: float) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            return _attach(db)
        except _Locked:
            if time.monotonic() > deadline:
                raise LakeError(f"{db}: still locked by another process after {timeout:g} s "
                                "(a catalog file serves one process at a time; a team's "
                                "lake has its catalog in Postgres)") from None
        time.sleep(delay * random.uniform(0.5, 1.5))
        delay = min(delay * 1.6, 0.2)


def forget(db: str) -> None:
    """Drop this process's attachment (after the catalog went away): the next cursor
    attaches afresh."""
    with _lock:
        for key in [k for k in _open if k[0] == db]:
            try:
                _open.pop(key).close()
            except duckdb.Error:
                pass


def exists(db: str) -> bool:
    """A file catalog exists as a file; a Postgres catalog is taken to exist (connecting to
    it says otherwise, in one line)."""
    check_target(db)
    path = catalog_file(db)
    if path is not None:
        return path.is_file()
    return True


def snapshot(db: str) -> int:
    """The lake's newest snapshot id: it grows with every commit (the dashboard's stamp)."""
    con = cursor(db)
    try:
        return int(con.execute(f"SELECT id FROM {ALIAS}.current_snapshot()").fetchone()[0])
    finally:
        con.close()


def is_conflict(exc: Exception) -> bool:
    """A commit that lost a race with another writer: worth running again."""
    text = str(exc).lower()
    return "conflict" in text and ("transaction" in text or "commit" in text)


def is_unreachable(exc: Exception) -> bool:
    text = str(exc).lower()
    return any(s in text for s in ("server closed the connection", "connection refused",
                                   "could not connect", "unable to connect", "no connection",
                                   "terminating connection", "connection to server"))
