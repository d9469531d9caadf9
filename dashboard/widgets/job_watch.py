"""Background work followed where it was started: while a job the page cares about runs,
a fragment polls it and shows how long it has run and its newest progress line; when it
ends, the whole page reruns once, so what the engine wrote (probes, a new run's steps)
appears without a reload, and a failed job leaves its error line on the page.

The jobs a page watches are kept per slot in the session (the job's record file), so a
rerun, or leaving the page and coming back, still finds them."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from dashboard import jobs
from dashboard.views.text import md

WATCH_KEY = "_watched_jobs"  # slot -> [job record path, ...], this session

POLL_SECONDS = 1.5



def _slots() -> dict[str, list[str]]:
    return st.session_state.setdefault(WATCH_KEY, {})



def remember(slot: str, job: jobs.Job) -> None:
    """Watch this job in `slot` (a page's name for what it started)."""
    records = _slots().setdefault(slot, [])
    if str(job.record) not in records:
        records.insert(0, str(job.record))



def watched(slot: str) -> list[jobs.Job]:
    """The jobs watched in `slot`, newest first, exit codes refreshed."""
    found = [jobs.load(record) for record in _slots().get(slot, [])]
    return [job for job in found if job is not None]



def last_line(job: jobs.Job) -> str:
    """The newest non-empty line of the job's log (the engine's progress, or its error)."""
    rows = [row for row in jobs.log_tail(job, lines=8).splitlines() if row.strip()]
    return rows[-1].strip() if rows and not rows[-1].startswith("$ ") else ""



def describe(job: jobs.Job) -> str:
    """One line for a job: what it is, and how long it ran (or has run so far)."""
    on = _examples(job)
    if job.returncode is None:
        return f"{job.kind} {job.run_id} running · {int(job.seconds)} s so far{on}"
    how = "finished" if job.returncode == 0 else f"ended with status {job.returncode}"
    return f"{job.kind} {job.run_id} {how} in {int(job.seconds)} s{on}"



EXAMPLE_WORDS = {"val": "validation examples", "failing": "training examples",
                 "sampled": "back-propagated examples", "all": "training and validation "
                 "examples"}



def _examples(job: jobs.Job) -> str:
    """' · on validation examples' for a job started with `--examples val`, and so on;
    '' for one without the flag."""
    command = list(job.command or [])
    if "--examples" not in command[:-1]:
        return ""
    chosen = command[command.index("--examples") + 1]
    return f" · on {EXAMPLE_WORDS.get(chosen, f'examples {chosen}')}"



def follow(slot: str, extra: Callable[[], list[jobs.Job]] | None = None) -> list[jobs.Job]:
    """Show the jobs of `slot` (and those `extra` returns, e.g. started from the CLI): live
    while any runs, then once more when all have ended. Returns them, newest first."""
    listed = _merge(watched(slot), extra() if extra else [])
    if any(job.returncode is None for job in listed):
        _live(slot, extra)
        return listed
    if listed:
        newest = listed[0]
        if newest.returncode == 0:
            st.caption(f":material/check_circle: {md(describe(newest))}")
        else:
            st.error(f"{md(describe(newest))}: {md(last_line(newest) or 'see its log')}")
    return listed



def _merge(*groups: list[jobs.Job]) -> list[jobs.Job]:
    seen: dict[str, jobs.Job] = {}
    for group in groups:
        for job in group:
            seen.setdefault(job.log, job)
    return sorted(seen.values(), key=lambda j: j.started_at, reverse=True)



@st.fragment(run_every=POLL_SECONDS)
def _live(slot: str, extra: Callable[[], list[jobs.Job]] | None) -> None:
    listed = _merge(watched(slot), extra() if extra else [])
    running = [job for job in listed if job.returncode is None]
    if not running:  # it ended: rerun the page so it reads what the engine wrote
        st.rerun(scope="app")
    for job in running:
        line = last_line(job)
        st.info(f":material/hourglass_top: {md(describe(job))}"
                + (f" · {md(line)}" if line else ""))
