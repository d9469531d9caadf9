"""Checking the blame in one click, from any page that shows a step: a button starts
`python -m engine blame RUN --step S` in the background (follow the gradient at every
LLM node for every failing example), its progress shows live, and the page rereads the
probes when it ends. One slot per (run, step), so the Graph page, the Examples page, the
inspector and the Learn tour all see the same job."""

from __future__ import annotations

import streamlit as st

from dashboard import jobs
from dashboard.views import job_watch

LABEL = "Check the blame"


def slot(run: str, step: int) -> str:
    return f"blame|{run}|{int(step)}"


def _running_elsewhere(db: str, run: str) -> list[jobs.Job]:
    """Running blame jobs of this run started from another page or another session."""
    return [j for j in jobs.probe_jobs(db, run) if j.kind == "blame" and j.returncode is None]


def blame_button(db: str, run: str, step: int, *, key: str, label: str = LABEL,
                 primary: bool = False) -> bool:
    """The button, or the live progress of the blame job it started; True while one runs."""
    watched = job_watch.follow(slot(run, step), extra=lambda: _running_elsewhere(db, run))
    if any(job.returncode is None for job in watched):
        return True
    if st.button(label, key=key, type="primary" if primary else "secondary",
                 icon=":material/troubleshoot:",
                 help=f"Follow the gradient at every node for every failing example of step "
                 f"{step} (python -m engine blame {run} --step {step}), in the background"):
        job = jobs.start_blame(run, db, step)
        job_watch.remember(slot(run, step), job)
        st.rerun()
    return False


def blame_cell(blame: object, probes: object, leaked: object = None,
               in_sample: object = None) -> str:
    """The Examples table's blame column: which nodes' probes raised the example's score
    (as `engine blame` credits them), or which of the two empty cases it is; gains that
    leaked the target or came from an edit the update call wrote after seeing this
    example are named apart, never as blame."""
    count = int(probes) if isinstance(probes, int | float) and probes == probes else 0
    if count == 0:
        return "not probed"
    parts = [blame] if isinstance(blame, str) and blame else [
        f"probed ({count}), nothing fixed it"]
    if isinstance(leaked, str) and leaked:
        parts.append(f"leaked the target: {leaked}")
    if isinstance(in_sample, str) and in_sample:
        parts.append(f"in-sample edit: {in_sample}")
    return " · ".join(parts)


APPLIED_KEY = "_blame_seen"  # blame jobs whose end a page has already acted on


def just_finished(run: str, step: int) -> bool:
    """True once, on the first page run after a blame job of (run, step) that this session
    started ended well: the Graph page then switches its colours to the new blame."""
    seen = st.session_state.setdefault(APPLIED_KEY, set())
    done = [job.log for job in job_watch.watched(slot(run, step)) if job.returncode == 0]
    fresh = [log for log in done if log not in seen]
    seen.update(fresh)
    return bool(fresh)
