"""A real PostgreSQL server for the lake tests: started on 127.0.0.1 on a free port in a
temporary folder, with password (SCRAM) authentication, and stopped by the test session.

The binaries are Debian's (`pg_config --bindir`, else /usr/lib/postgresql/N/bin); `./dev
setup` installs them (apt-get install postgresql). PostgreSQL refuses to run as root: as
root, the server runs as the `postgres` user (or `nobody`) through runuser.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

USER = "semback"
PASSWORD = "lake-test-secret"  # a test cluster's, on 127.0.0.1 only


def bindir() -> Path | None:
    """Where initdb and pg_ctl are, or None."""
    found = shutil.which("pg_config")
    if found:
        try:
            out = subprocess.run([found, "--bindir"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
            if out and (Path(out) / "initdb").exists():
                return Path(out)
        except (OSError, subprocess.SubprocessError):
            pass
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    return None


def postgres_missing() -> str | None:
    if bindir() is None:
        return ("no PostgreSQL server binaries (initdb, pg_ctl): ./dev setup installs them "
                "(apt-get install postgresql)")
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runas() -> list[str]:
    if os.geteuid() != 0:
        return []
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return ["runuser", "-u", name, "--"]
        except KeyError:
            continue
    raise RuntimeError("running as root, and no 'postgres' or 'nobody' user to run PostgreSQL as")


@dataclass
class Postgres:
    """One running cluster; `lake(name)` makes a database for a fresh lake."""

    folder: Path
    port: int
    bin: Path
    runas: list[str]

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def env(self) -> dict[str, str]:
        """What a process needs to reach it: the password through libpq's variable."""
        return {**os.environ, "PGPASSWORD": PASSWORD}

    def dsn(self, dbname: str) -> str:
        return f"dbname={dbname} host=127.0.0.1 port={self.port} user={USER}"

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        return subprocess.run(
            [str(self.bin / "psql"), "-X", "-q", "-At", "-h", "127.0.0.1", "-p", str(self.port),
             "-U", USER, "-d", dbname, "-c", sql],
            env=self.env(), capture_output=True, text=True, check=True, timeout=60).stdout

    def create_database(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{name}"')
        return name

    def pg_ctl(self, *args: str) -> None:
        subprocess.run([*self.runas, str(self.bin / "pg_ctl"), "-D", str(self.data), *args],
                       check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self.pg_ctl("-w", "-l", str(self.folder / "server.log"), "-o",
                    f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
                    "-c fsync=off -c max_connections=200", "start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-w", "-m", mode, "stop")

    def kill(self) -> None:
        """Kill the server at once (SIGKILL to the postmaster and its children), as a crash."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        subprocess.run(["pkill", "-KILL", "-P", str(pid)], check=False)
        os.kill(pid, 9)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        (self.data / "postmaster.pid").unlink(missing_ok=True)


def start_postgres() -> Postgres:
    """initdb into a new temporary folder and start the server on a free 127.0.0.1 port."""
    found = bindir()
    if found is None:
        raise RuntimeError(postgres_missing())
    runas = _runas()
    folder = Path(tempfile.mkdtemp(prefix="semback-pg-"))
    os.chmod(folder, 0o777)  # the server's user writes its socket and log here
    pwfile = folder / "pw"
    pwfile.write_text(PASSWORD + "\n")
    os.chmod(pwfile, 0o644)
    if runas:
        shutil.chown(folder, user=runas[2])
    subprocess.run([*runas, str(found / "initdb"), "-D", str(folder / "data"), "-U", USER,
                    "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8",
                    "--no-sync"], check=True, capture_output=True, timeout=120)
    pwfile.unlink()
    server = Postgres(folder, _free_port(), found, runas)
    server.start()
    return server


def stop_postgres(server: Postgres) -> None:
    try:
        server.stop("immediate")
    except (subprocess.SubprocessError, OSError):
        pass
    shutil.rmtree(server.folder, ignore_errors=True)
