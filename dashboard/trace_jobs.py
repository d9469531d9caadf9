"""The Traces page's background processes, on dashboard.jobs' machinery: the OTLP/HTTP
receiver (`python -m engine collect`), bound to 127.0.0.1 and ended with the dashboard, and
`python -m engine import-traces --collected --json`, which makes a run of what it
received. No Streamlit here."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from dashboard import jobs

HOST = "127.0.0.1"  # this machine only: the receiver takes spans from anyone who reaches it
DEFAULT_PORT = 4318  # OTLP/HTTP's
PORT_ENV = "SEMBACK_COLLECT_PORT"
# the line `collect` prints once it listens: "collecting OTLP/HTTP spans on URL/v1/traces"
_LISTENING = re.compile(r"spans on (http://\S+?)/v1/traces")
# the command line's words for what the dashboard's user sets instead
_TERMS = (("(--port to choose another)",
           f"(start the dashboard with {PORT_ENV}=N to choose another port)"),)


def collect_port() -> int:
    """The receiver's port: $SEMBACK_COLLECT_PORT, else OTLP/HTTP's 4318."""
    try:
        port = int(os.environ.get(PORT_ENV) or DEFAULT_PORT)
    except ValueError:
        return DEFAULT_PORT
    return port if 0 < port < 65536 else DEFAULT_PORT


def collect_command(db: str | Path, port: int) -> list[str]:
    """`python -m engine collect --db DB --host 127.0.0.1 --port N`."""
    return [sys.executable, "-m", "engine", "collect", "--db", str(db), "--host", HOST,
            "--port", str(port)]


def start_collect(db: str | Path, port: int | None = None) -> jobs.Job:
    """Start the receiver for this run log; it ends when it is stopped or the dashboard
    ends."""
    db = jobs.absolute(db)
    port = collect_port() if port is None else port
    return jobs.launch(collect_command(db, port), "receiver", db, 0,
                       jobs.job_name("collect", db, port), "collect", with_dashboard=True)


def receivers(db: str | Path) -> list[jobs.Job]:
    """The receivers started for this run log, newest first."""
    return jobs.list_jobs(db, kinds=("collect",))


def receiver(db: str | Path) -> jobs.Job | None:
    """The receiver of this run log that runs and was not told to stop, if any."""
    return next((j for j in receivers(db) if j.returncode is None and not j.stopped), None)


def listening_on(job: jobs.Job) -> str | None:
    """The address the receiver listens on (http://127.0.0.1:N), once it does."""
    found = _LISTENING.search(jobs.log_tail(job, lines=400))
    return found[1] if found else None


def error_line(job: jobs.Job) -> str | None:
    """The engine's `error:` line in the job's log, in the dashboard's terms, or None."""
    lines = [ln.strip() for ln in jobs.log_tail(job, lines=400).splitlines()
             if ln.strip().startswith("error:")]
    if not lines:
        return None
    line = lines[-1].removeprefix("error:").strip()
    for flag, words in _TERMS:
        line = line.replace(flag, words)
    return line


def failed_receiver(db: str | Path) -> str | None:
    """Why the newest receiver ended on its own (e.g. its port is in use), or None. One
    that ended with a dashboard that is gone (status unknown here, -1) is no failure."""
    listed = receivers(db)
    if not listed or listed[0].returncode in (None, 0) or listed[0].stopped:
        return None
    job = listed[0]
    return error_line(job) or (f"the receiver ended with status {job.returncode}"
                               if job.returncode > 0 else None)


def import_command(db: str | Path, targets: str | Path | None = None,
                   service: str | None = None, metric: str | None = None) -> list[str]:
    """`python -m engine import-traces --collected --db DB [--targets F] [--service S]
    [--metric M] --json`."""
    cmd = [sys.executable, "-m", "engine", "import-traces", "--collected", "--db", str(db)]
    for flag, value in (("--targets", targets), ("--service", service), ("--metric", metric)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd + ["--json"]


def start_import(db: str | Path, targets: str | Path | None = None,
                 service: str | None = None, metric: str | None = None) -> jobs.Job:
    """Make a run of the collected spans, in the background; its JSON report (the new run's
    id, or {"error": ...}) ends its log (jobs.job_report)."""
    db = jobs.absolute(db)
    name = jobs.job_name("import", db, targets, service)
    return jobs.launch(import_command(db, targets, service, metric), name, db, 0, name,
                       "import")


def import_outcome(job: jobs.Job) -> tuple[str | None, str | None]:
    """A finished import: (the new run's id, None), or (None, why it was refused, one
    line)."""
    report = jobs.job_report(job) or {}
    if job.returncode == 0 and isinstance(report.get("run_id"), str):
        return report["run_id"], None
    why = report.get("error") or error_line(job) or \
        f"import-traces ended with status {job.returncode}"
    return None, " ".join(str(why).split())
