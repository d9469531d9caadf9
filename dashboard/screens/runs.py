"""Runs: every run in the run log (filter, sort, pick one), new runs started as
background processes with live progress and a Stop button, and the one-click demo."""
import os
from datetime import datetime
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import data, jobs
from dashboard.live import live_progress, steps_line
from dashboard.state import (
    DEMO_DONE_KEY,
    DEMO_RUN_KEY,
    PENDING_RUN_KEY,
    PENDING_VIEW_KEY,
    selection,
)
from dashboard.views.models import model_offer
from dashboard.views.runlog_path import path_problem
from dashboard.views.text import fmt, md
from dashboard.widgets.run_panel import run_panel
from engine.runlog import lake

SAMPLE_GRAPHS = jobs.ROOT / "sample_graphs"
UPLOAD = "(upload a graph file)"
RUN_WIDTH = 300  # px: the Runs table's run column


def runs_table(runs: pd.DataFrame, tests: dict[str, float]) -> None:
    c1, c2, c3, c4 = st.columns([2, 1, 1, 1])
    text = c1.text_input("Filter", placeholder="run id or graph contains…", key="runs_filter")
    statuses = c2.multiselect("Status", sorted(runs["status"].dropna().unique()),
                              key="runs_status")
    methods = c3.multiselect("Method", sorted(runs["method"].dropna().unique()),
                             key="runs_method")
    graphs = c4.multiselect("Graph", sorted(runs["graph_name"].dropna().unique()),
                            key="runs_graph")
    # the figures first, the settings after them: at 1,400 px (a sidebar beside the
    # table) the columns up to the cost are in view next to a generated run id
    table = pd.DataFrame({
        "run": runs["run_id"], "status": runs["status"], "steps": runs["steps"],
        "best validation": runs["best_val"],
        "test": [tests.get(r) for r in runs["run_id"]],
        "calls": runs["calls"], "tokens": runs["tokens"], "cost (USD)": runs["cost_usd"],
        "graph": runs["graph_name"], "method": runs["method"],
        "models": [m if (o is None or o == m) else f"{m} / {o}"
                   for m, o in zip(runs["model"], runs["optimizer_model"])],
        "backend": runs["backend"], "cache hits": runs["cache_hits"],
        "probe calls": runs.get("probe_calls"),
        "started": [datetime.fromtimestamp(t) if pd.notna(t) else None
                    for t in runs["started_at"]],
    })
    keep = pd.Series(True, index=table.index)
    if text:
        keep &= (table["run"].str.contains(text, case=False, regex=False)
                 | table["graph"].fillna("").str.contains(text, case=False, regex=False))
    for column, chosen in (("status", statuses), ("method", methods), ("graph", graphs)):
        if chosen:
            keep &= table[column].isin(chosen)
    table = table[keep]
    s1, s2 = st.columns([1, 3])
    by = s1.selectbox("Sort by", list(table.columns), index=list(table.columns).index("started"),
                      key="runs_sort")
    descending = s2.toggle("Descending", value=True, key="runs_desc")
    table = table.sort_values(by, ascending=not descending, na_position="last",
                              kind="stable").reset_index(drop=True)
    st.caption(f"{len(table)} of {len(runs)} runs · select a row to open it")
    st.dataframe(
        table, hide_index=True, key="runs_table", on_select=lambda: _pick_row(table),
        selection_mode="single-row",
        column_config={
            # wide enough for a generated id (graph-method-date-time-hex), kept in view
            # while the table scrolls sideways
            "run": st.column_config.TextColumn(width=RUN_WIDTH, pinned=True),
            "best validation": st.column_config.NumberColumn(format="%.3f"),
            "test": st.column_config.NumberColumn(format="%.3f", help="test-split score"),
            "cost (USD)": st.column_config.NumberColumn(format="$%.4f"),
            "calls": st.column_config.NumberColumn(
                format="%d", help="the run's own model calls (cache misses): what was paid "
                                  "for; probes and diffs made on it later are counted apart"),
            "probe calls": st.column_config.NumberColumn(
                format="%d", help="model calls of the probes (blame, What-if) and diffs "
                                  "made on this run after it ran"),
            "tokens": st.column_config.NumberColumn(
                format="%d", help="prompt and completion tokens of the model calls"),
            "cache hits": st.column_config.NumberColumn(
                format="%d", help="calls answered from the run log's cache: free"),
            "started": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss"),
        })


def _pick_row(table: pd.DataFrame) -> None:
    rows = st.session_state["runs_table"].selection.rows
    if rows:
        st.session_state["run"] = table.iloc[rows[0]]["run"]


def start_demo(db: str) -> None:
    spec = jobs.RunSpec(graph=str(jobs.DEMO_GRAPH), db=db, **jobs.DEMO_OPTIONS)
    try:
        job = jobs.start(spec)
    except Exception as exc:  # noqa: BLE001 - shown to the user
        st.error(f"Could not start the demo: {exc}")
        return
    st.session_state[DEMO_RUN_KEY] = job.run_id
    _started(job)


def demo_finished(db: str, run_id: str) -> None:
    """The demo ended well: select its back-propagated failing example at the step that
    proposed edits, and lead on to the tour and the graph (see lead_on)."""
    step = data.default_step(data.steps(db, run_id))
    example = data.lead_example(db, run_id, step) if step is not None else None
    st.session_state[PENDING_VIEW_KEY] = {"run": run_id, "step": step, "example": example}
    st.session_state[DEMO_DONE_KEY] = run_id


def lead_on(sel) -> None:
    """After the demo: where to go next, with the example worth looking at selected."""
    if st.session_state.get(DEMO_DONE_KEY) != sel.run or sel.run is None:
        return
    with st.container(border=True):
        st.success(f"The demo finished. Step {sel.step}, example {md(sel.example)}: a failing "
                   "example it back-propagated, so there are gradients and an edit to see.",
                   icon=":material/flag:")
        c1, c2 = st.columns(2)
        with c1:
            st.page_link("screens/learn.py", label="Take the tour (Learn)",
                         icon=":material/school:", query_params=sel.link())
        with c2:
            st.page_link("screens/graph.py", label="Open the graph",
                         icon=":material/account_tree:", query_params=sel.link())


def _started(job) -> None:
    """Select the new run as soon as it is in the run log, say so on the next run, and
    rerun so the background-run panel starts polling."""
    st.session_state[PENDING_RUN_KEY] = job.run_id
    st.session_state["_runs_flash"] = f"Started {job.run_id} (process {job.pid})"
    st.rerun()


def jobs_panel(db: str) -> None:
    listed = jobs.list_jobs(db)
    if not listed:
        return
    running = any(j.returncode is None for j in listed)
    st.fragment(_jobs_body, run_every=1.5 if running else None)(db)


def _jobs_body(db: str) -> None:
    st.subheader("Background runs")
    seen = st.session_state.setdefault("_jobs_seen", {})
    try:
        runs = data.runs(db)
    except Exception:  # noqa: BLE001 - the engine is creating the file: try next poll
        runs = pd.DataFrame()
    changed = False
    for job in jobs.list_jobs(db)[:8]:
        alive = jobs.poll(job)
        steps_done, baseline, status = 0, False, "starting"
        if not runs.empty and job.run_id in set(runs["run_id"]):
            steps_done = data.steps_done(db, job.run_id)
            baseline = data.baseline_done(db, job.run_id)
            status = runs.loc[runs["run_id"] == job.run_id, "status"].iloc[0]
        if not alive and status in ("starting", "running"):
            status = f"ended (exit code {job.returncode})"
        elif alive and (job.stopped or status == "stopped"):
            # the run log says 'stopped' as soon as the engine is told, but the calls in
            # flight (a local model's can take a minute) end before the process does
            status = "stopping: the calls in flight end first"
        total = job.steps
        with st.container(border=True):
            head, button = st.columns([5, 1])
            head.markdown(f"**{md(job.run_id)}** · {md(status)} · {int(job.seconds)} s")
            head.progress(min(steps_done / total, 1.0) if total else float(not alive),
                          text=live_progress(job.progress_file).line(steps_done, total,
                                                                     baseline)
                          if alive else steps_line(steps_done, total, baseline))
            if alive and button.button("Stop", key=f"stop_{job.run_id}",
                                       disabled=job.stopped):
                jobs.stop(job)
                st.toast(f"Sent SIGTERM to {job.run_id}")
            elif not alive and button.button("Dismiss", key=f"forget_{job.run_id}"):
                jobs.forget(job)
                st.rerun(scope="app")
            failed = None if alive or job.returncode in (0, None) else jobs.error_line(job)
            if failed:  # why it ended, where it is seen (the log below is collapsed)
                st.error(failed, icon=":material/error:")
            with st.expander("log"):
                st.code(jobs.log_tail(job) or "(empty)", language=None)
        state = (status, steps_done, alive)
        changed |= job.run_id in seen and seen[job.run_id] != state
        ended_now = job.run_id in seen and seen[job.run_id][2] and not alive
        if ended_now and status == "finished" and \
                st.session_state.get(DEMO_RUN_KEY) == job.run_id:
            demo_finished(db, job.run_id)
        seen[job.run_id] = state
    if changed:  # a step was written or a run ended: refresh the table and the sidebar
        st.rerun(scope="app")


def form_settings(data_dir: str, options: dict[str, int]) -> dict[str, object]:
    """Run settings the form adds: the data directory, and the method's own options."""
    settings: dict[str, object] = {"data_dir": data_dir.strip()} if data_dir.strip() else {}
    if options:
        settings["method_options"] = {k: int(v) for k, v in options.items()}
    return settings


def show_estimate(spec: jobs.RunSpec) -> None:
    ok, lines = jobs.estimate(spec)
    if not ok:
        st.error(f"Could not estimate the run: {lines[0] if lines else 'no output'}")
        return
    summary = [ln for ln in lines if ln.startswith("estimate:")]
    st.info(summary[0] if summary else "no estimate", icon=":material/payments:")
    st.code("\n".join(ln for ln in lines if not ln.startswith("estimate:")), language=None)


def new_run_form(db: str) -> None:
    from engine.llm.factory import BACKENDS, default_backend_kind
    from engine.llm.models import DEFAULT_MODEL, list_models
    from engine.methods import METHODS
    from engine.runs.settings import DEFAULTS

    offered, not_installed = model_offer(list_models(), DEFAULT_MODEL)

    samples = sorted(p.name for p in SAMPLE_GRAPHS.glob("*.yaml"))
    with st.expander("New run", expanded=False, icon=":material/play_arrow:"):
        # outside the form, so that choosing a method shows only that method's fields
        method = st.selectbox("Method", sorted(METHODS), key="new_run_method",
                              index=sorted(METHODS).index(DEFAULTS.method))
        # Enter in a field must not start a run (Streamlit submits a form on Enter by
        # default): only the buttons do
        with st.form("new_run", enter_to_submit=False):
            c1, c2 = st.columns(2)
            choice = c1.selectbox("Graph", [*samples, UPLOAD],
                                  index=samples.index("demo.yaml") if "demo.yaml" in samples
                                  else 0)
            upload = c2.file_uploader("Graph file (YAML)", type=["yaml", "yml"])
            dataset = c2.file_uploader("Dataset (JSONL, optional)", type=["jsonl"])
            s1, s2, s3 = st.columns(3)
            train = s1.number_input("Train examples", min_value=0, value=None,
                                    placeholder="graph's default")
            val = s2.number_input("Validation examples", min_value=0, value=None,
                                  placeholder="graph's default")
            test = s3.number_input("Test examples", min_value=0, value=None,
                                   placeholder="graph's default")
            b1, b2, b3 = st.columns(3)
            backend = b1.selectbox("Backend", BACKENDS,
                                   index=list(BACKENDS).index(default_backend_kind()))
            model = b2.selectbox(
                "Model", offered, index=None, accept_new_options=True,
                placeholder="backend's default",
                help="with the local backend: an installed model, or a GGUF file's path; "
                     "with openai: the provider's model name (type it)")
            optimizer_model = b3.text_input("Optimizer model", placeholder="same as model")
            if not_installed:
                st.caption(not_installed)
            m2, m3 = st.columns(2)
            steps = m2.number_input("Steps", min_value=0, value=None,
                                    placeholder="graph's default",
                                    help="optimization steps (empty: the graph's own "
                                         f"`steps`, else {DEFAULTS.steps})")
            seed = m3.number_input("Seed", value=DEFAULTS.seed, step=1)
            data_dir = st.text_input(
                "Data directory", value=os.environ.get("SEMBACK_DATA_DIR", ""),
                placeholder="where gsm8k/, liar/ and bbh/ live (for the paper's graphs)")
            options = {}
            declared = METHODS[method].form_options  # the options the method itself offers
            for column, (name, label, default) in zip(
                    st.columns(len(declared)) if declared else [], declared):
                options[name] = column.number_input(label, min_value=1, value=default)
            b_start, b_estimate = st.columns([1, 1])
            submitted = b_start.form_submit_button("Start run", type="primary")
            estimated = b_estimate.form_submit_button(
                "Estimate cost", help="model calls, tokens and cost by phase, before any "
                                      "call (python -m engine run --dry-run)")
    if not (submitted or estimated):
        return
    graph_path = SAMPLE_GRAPHS / choice if choice != UPLOAD else None
    folder = jobs.jobs_dir(db) / "uploads"
    if upload is not None:
        folder.mkdir(exist_ok=True)
        graph_path = folder / Path(upload.name).name
        graph_path.write_bytes(upload.getvalue())
    if graph_path is None:
        st.error("Choose a sample graph or upload a graph file.")
        return
    dataset_path = None
    if dataset is not None:
        folder.mkdir(exist_ok=True)
        dataset_path = folder / Path(dataset.name).name
        dataset_path.write_bytes(dataset.getvalue())
    if steps is None:  # the graph's own setting (demo.yaml's is 1), as `run` would take it
        steps = graph_steps(graph_path)
    spec = jobs.RunSpec(graph=str(graph_path), db=db, method=method, backend=backend,
                        model=model or None, optimizer_model=optimizer_model or None,
                        steps=int(steps), train=train, val=val, test=test, seed=int(seed),
                        dataset=str(dataset_path) if dataset_path else None,
                        settings=form_settings(data_dir, options))
    if estimated:
        show_estimate(spec)
        return
    try:
        job = jobs.start(spec)
    except Exception as exc:  # noqa: BLE001 - a bad graph file: one line for the user
        st.error(f"Could not start the run: {exc}")
        return
    _started(job)


def graph_steps(path: Path) -> int:
    """The steps a run of this graph takes by default: its `steps`, else run's default
    (a graph that does not load: run's default, and the run says what is wrong)."""
    from engine.core.graph import GraphError, load_graph
    from engine.runs.settings import DEFAULTS

    try:
        return load_graph(path).steps or DEFAULTS.steps
    except (GraphError, OSError, ValueError):
        return DEFAULTS.steps


sel = selection()
st.title("Runs")
if flash := st.session_state.pop("_runs_flash", None):
    st.success(flash)
lead_on(sel)
jobs_panel(sel.db)  # a running job's progress above the table, not below the fold
try:
    all_runs = data.runs(sel.db)
except Exception as exc:  # noqa: BLE001 - the sidebar already says what is wrong
    st.error(f"Cannot read {sel.db}: {exc}")
    st.stop()
problem = path_problem(sel.db, lake.is_lake(sel.db))
if problem and not problem[1]:  # no run log can be made there: say so, offer nothing
    st.error(problem[0])
    st.stop()
if problem:
    st.warning(problem[0])
if all_runs.empty:
    st.info(f"**{md(sel.db)}** has no runs yet. The demo optimizes a three-node graph "
            "(sample_graphs/demo.yaml) with the embedded models (Qwen2.5-Coder-0.5B for the "
            "pipeline's calls, the 1.5B for the optimizer's): no key, no network, "
            f"{jobs.DEMO_DURATION}.")
    if not any(j.returncode is None for j in jobs.list_jobs(sel.db)):
        if st.button("Run the demo", type="primary", icon=":material/rocket_launch:",
                     key="run_demo"):
            start_demo(sel.db)
else:
    runs_table(all_runs, data.test_scores(sel.db))
    if sel.run:
        row = all_runs[all_runs["run_id"] == sel.run]
        if not row.empty and isinstance(row.iloc[0]["error"], str) and row.iloc[0]["error"]:
            st.warning(f"{md(sel.run)}: {md(row.iloc[0]['error'])}")
        if not row.empty:
            st.caption(f"Selected: **{md(sel.run)}** · best validation "
                       f"{fmt(row.iloc[0]['best_val'])}")
            run_panel(sel.db, sel.run)
new_run_form(sel.db)
