"""Comparing the backward methods on the same traces, from the Learn tour and the Graph
page: a button starts `python -m engine blame RUN --step S --method ... --json` in the
background, its progress shows live, and its JSON report becomes, per node, each method's
gradient efficacy (flips over probed failing examples, with the 90% interval) and one
sentence of what the evidence says. Both pages read the numbers from `comparison_rows`,
so the two cannot disagree. A finished comparison of the step is shown without re-running."""

from __future__ import annotations

import streamlit as st

from dashboard import jobs
from dashboard.views.method_compare import (
    LABEL,
    by_node,
    comparison_rows,
    edge_rows,
    slot,
    verdict,
)
from dashboard.views.text import md
from dashboard.widgets import job_watch


def latest_report(db: str, run: str, step: int) -> tuple[jobs.Job | None, dict | None]:
    """The newest finished comparison of (run, step) with a readable report."""
    for job in jobs.compare_jobs(db, run, step):
        if job.returncode == 0:
            report = jobs.job_report(job)
            if report is not None:
                return job, report
    return None, None



def _running_elsewhere(db: str, run: str, step: int) -> list[jobs.Job]:
    return [j for j in jobs.compare_jobs(db, run, step) if j.returncode is None]



def compare_button(db: str, run: str, step: int, *, key: str, label: str = LABEL) -> bool:
    """The button, or the live progress of the comparison it started; True while one runs."""
    watched = job_watch.follow(slot(run, step),
                               extra=lambda: _running_elsewhere(db, run, step))
    if any(job.returncode is None for job in watched):
        return True
    if st.button(label, key=key, icon=":material/compare_arrows:",
                 help=f"Re-run each method's backward pass ({', '.join(jobs.COMPARE_METHODS)})"
                 f" on the failing examples of step {step} and follow its gradients "
                 f"(python -m engine blame {run} --step {step} --method ... --json), in "
                 "the background"):
        job = jobs.start_compare(run, db, step)
        job_watch.remember(slot(run, step), job)
        st.rerun()
    return False



def show_comparison(report: dict | None, *, key: str) -> None:
    """The per-node table of each method's gradient efficacy, and the sentences."""
    rows = comparison_rows(report)
    if rows.empty:
        st.caption("The comparison found no node to probe (no failing example at this step).")
        return
    st.markdown("**Gradient efficacy per method**: failing examples fixed by following the "
                "method's gradient / failing examples probed, [90% interval].")
    st.table(by_node(rows).set_index("node"))
    for node in dict.fromkeys(rows["node"]):
        st.markdown(md(verdict(rows, node)))
    edges = edge_rows(report)
    if not edges.empty:
        st.markdown("**Per edge** (a successor's gradient followed alone):")
        st.table(edges.pivot(index="edge", columns="method", values="efficacy")
                 .reindex(columns=list(dict.fromkeys(edges["method"]))))



def compare_section(db: str, run: str, step: int, *, key: str, label: str = LABEL) -> None:
    """The button (or its live progress) and the newest finished comparison's result."""
    running = compare_button(db, run, step, key=key, label=label)
    job, report = latest_report(db, run, step)
    if report is not None and not running:
        if not job_watch.watched(slot(run, step)):  # started elsewhere: say which job
            st.caption(f"Comparison of step {step} ({md(job_watch.describe(job))}).")
        show_comparison(report, key=key)
