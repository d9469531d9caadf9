"""Traces: one switch runs the OTLP/HTTP receiver (`python -m engine collect`) on this run
log; a pipeline whose exporter points at it (OTEL_EXPORTER_OTLP_ENDPOINT) shows here as its
spans arrive, per service and per trace; **Import as a run** makes a run of them
(`python -m engine import-traces --collected`) and links to it."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import data, jobs, trace_jobs
from dashboard.state import selection
from dashboard.views.collected import Collected, ago
from dashboard.views.text import md
from dashboard.widgets import job_watch

TOGGLE_KEY = "receive_traces"
IMPORT_SLOT = "import-traces"
POLL_SECONDS = 1.5
SHOWN_TRACES = 200  # the newest; the counts cover all


def receiver_switch(db: str) -> jobs.Job | None:
    """The one switch: on while this run log's receiver runs. Returns the receiver."""
    job = trace_jobs.receiver(db)
    st.session_state[TOGGLE_KEY] = job is not None
    st.toggle(f"Receive traces (OTLP on {trace_jobs.HOST}:{trace_jobs.collect_port()})",
              key=TOGGLE_KEY, on_change=_switched, args=(db,),
              help="Runs `python -m engine collect` on this run log, on this machine only; "
                   f"it stops when switched off or when the dashboard stops. "
                   f"${trace_jobs.PORT_ENV} sets another port.")
    if job is None and (why := trace_jobs.failed_receiver(db)):
        st.error(f"The receiver stopped: {md(why)}", icon=":material/error:")
    return job


def _switched(db: str) -> None:
    running = trace_jobs.receiver(db)
    if st.session_state.get(TOGGLE_KEY):
        if running is None:
            try:
                trace_jobs.start_collect(db)
            except OSError as exc:
                st.session_state["_receiver_error"] = f"Could not start the receiver: {exc}"
    elif running is not None:
        jobs.stop(running)


def receiver_line(job: jobs.Job | None) -> None:
    if job is None:
        st.caption("Not receiving. Switch it on, then run your pipeline with "
                   "OTEL_EXPORTER_OTLP_ENDPOINT set to the address it shows.")
        return
    url = trace_jobs.listening_on(job)
    if url is None:
        st.caption(":material/hourglass_top: starting the receiver…")
        return
    st.markdown(f":material/sensors: **Receiving** on `{url}/v1/traces` · "
                f"{int(job.seconds)} s · run your pipeline with")
    st.code(f"OTEL_EXPORTER_OTLP_ENDPOINT={url}", language="bash")


def services_table(seen: Collected, now: float) -> None:
    st.dataframe(pd.DataFrame({
        "service": [s.service or "(unnamed)" for s in seen.services],
        "traces": [s.traces for s in seen.services],
        "spans": [s.spans for s in seen.services],
        "LLM calls": [s.llm_calls for s in seen.services],
        "last span received": [f"{datetime.fromtimestamp(s.last_received):%H:%M:%S} "
                               f"({ago(now - s.last_received)})" for s in seen.services],
    }), hide_index=True, key="collected_services")


def traces_table(seen: Collected) -> None:
    shown = seen.traces[:SHOWN_TRACES]
    if len(seen.traces) > len(shown):
        st.caption(f"The newest {len(shown)} of {len(seen.traces):,} traces.")
    st.dataframe(pd.DataFrame({
        "trace id": [t.trace_id for t in shown],
        "service": [t.service or "(unnamed)" for t in shown],
        "spans": [t.spans for t in shown],
        "LLM calls": [t.llm_calls for t in shown],
        "first span": [datetime.fromtimestamp(t.first_received) for t in shown],
        "root input": [t.root_input or "" for t in shown],
    }), hide_index=True, key="collected_traces", column_config={
        "trace id": st.column_config.TextColumn(width=290, help="whole, 32 hex digits"),
        "first span": st.column_config.DatetimeColumn(format="HH:mm:ss",
                                                      help="when its first span arrived"),
        "root input": st.column_config.TextColumn(
            width="large", help="the input of its root span: what targets match"),
    })


def live_view(db: str, services: tuple[str, ...]) -> None:
    """What arrived, refreshed while the receiver runs; the page reruns when the receiver
    starts or ends, or a new service appears (the import's service picker lists it)."""
    running = trace_jobs.receiver(db) is not None
    st.fragment(_live_body, run_every=POLL_SECONDS if running else None)(db, running,
                                                                          services)


def _live_body(db: str, running: bool, services: tuple[str, ...]) -> None:
    job = trace_jobs.receiver(db)
    if (job is not None) != running:
        st.rerun(scope="app")
    receiver_line(job)
    try:
        seen = data.collected(db)
    except Exception as exc:  # noqa: BLE001 - e.g. the file held too long: next poll
        st.caption(f"Cannot read {md(db)} now: {md(str(exc))}")
        return
    if tuple(s.service for s in seen.services) != services:
        st.rerun(scope="app")
    st.markdown(f"**{seen.line()}**" if seen.traces else seen.line())
    if seen.traces:
        services_table(seen, time.time())
        traces_table(seen)


def import_panel(db: str, seen: Collected) -> None:
    from engine.core.graph import METRICS

    st.subheader("Import as a run")
    st.caption("Makes a run of the traces received so far, as `python -m engine "
               "import-traces --collected` does: one example per trace, scored against "
               "the targets when given; backprop, blame and every page then work on it.")
    c1, c2, c3 = st.columns([2, 1, 1])
    targets = c1.file_uploader(
        "Targets (JSONL, optional)", type=["jsonl"], key="import_targets",
        help='one JSON object a line: {"trace_id": "<32 hex>", "target": "..."} or '
             '{"input": "<root input>", "target": "..."}')
    metrics = [m for m in METRICS if m != "judge"]
    metric = c2.selectbox("Metric", metrics, index=metrics.index("exact_match"),
                          key="import_metric")
    names = [s.service for s in seen.services]
    service = None
    if len(names) > 1:
        picked = c3.selectbox("Service", ["all services", *names], key="import_service")
        service = None if picked == "all services" else picked
    listed = job_watch.watched(IMPORT_SLOT)
    busy = any(j.returncode is None for j in listed)
    if st.button("Import as a run", type="primary", icon=":material/input:",
                 disabled=busy, key="import_collected"):
        path = None
        if targets is not None:
            folder = jobs.jobs_dir(db) / "uploads"
            folder.mkdir(exist_ok=True)
            path = folder / Path(targets.name).name
            path.write_bytes(targets.getvalue())
        job_watch.remember(IMPORT_SLOT, trace_jobs.start_import(db, path, service, metric))
        st.rerun()
    import_status()


def import_status() -> None:
    """The newest import: live while it runs; then its run, linked, or its one-line
    refusal."""
    listed = job_watch.watched(IMPORT_SLOT)
    if not listed:
        return
    newest = listed[0]
    if newest.returncode is None:
        _import_running()
        return
    run_id, why = trace_jobs.import_outcome(newest)
    if why is not None:
        st.error(f"Import refused: {md(why)}", icon=":material/error:")
        return
    report = jobs.job_report(newest) or {}
    st.success(f"Imported {report.get('traces', '?')} traces as run **{md(run_id)}**: "
               f"{len(report.get('nodes') or [])} call sites, {report.get('scored', 0)} scored, "
               f"{report.get('failing', 0)} failing.", icon=":material/check_circle:")
    c1, c2 = st.columns(2)
    with c1:
        st.page_link("screens/runs.py", label=f"Open run {run_id}", icon=":material/table:",
                     query_params={"run": run_id})
    with c2:
        st.page_link("screens/graph.py", label="Its graph", icon=":material/account_tree:",
                     query_params={"run": run_id})


@st.fragment(run_every=POLL_SECONDS)
def _import_running() -> None:
    listed = job_watch.watched(IMPORT_SLOT)
    if not listed or listed[0].returncode is not None:
        st.rerun(scope="app")  # ended: the sidebar lists the new run
    st.info(f":material/hourglass_top: importing the collected traces · "
            f"{int(listed[0].seconds)} s so far")


sel = selection()
st.title("Traces")
st.caption("Your own pipeline's OpenTelemetry traces, live: any OTLP/HTTP exporter (e.g. "
           "opentelemetry-exporter-otlp-proto-http with only OTEL_EXPORTER_OTLP_ENDPOINT set) "
           "sends its spans to the receiver, which stores them in this run log as they "
           "arrive (docs/traces.md).")
if error := st.session_state.pop("_receiver_error", None):
    st.error(error)
receiver_switch(sel.db)
try:
    collected = data.collected(sel.db)
except Exception as exc:  # noqa: BLE001 - the sidebar says what is wrong with the file
    st.error(f"Cannot read {sel.db}: {exc}")
    st.stop()
live_view(sel.db, tuple(s.service for s in collected.services))
import_panel(sel.db, collected)
