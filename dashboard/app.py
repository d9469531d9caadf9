"""Entry point of the dashboard: navigation and the selectors every page shares.

    streamlit run dashboard/app.py

The sidebar chooses the run log (default `runs.duckdb` in the working directory, or
$SEMBACK_DB), the run, the step, the example and the node. The last four are bound to
the query parameters `run`, `step`, `example` and `node`, so a URL such as
`/inspect?run=R&step=1&example=E&node=N` opens that exact view. Pages read the choice
with `dashboard.state.selection()`.

The run log may be a team's lake (docs/team.md): `ducklake:postgres:dbname=… host=…`
or `ducklake:FILE.ducklake`. Its password comes from PGPASSWORD or ~/.pgpass and a new
lake's data folder from $SEMBACK_DATA_PATH, both read from the dashboard's environment
(runs it starts inherit them); neither is a field of the page.
"""
# ruff: noqa: E402 (the path must be set before the dashboard's imports)

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run` puts only dashboard/ on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st

from dashboard import data, links, live_view
from dashboard.state import NODE_KEY, PENDING_RUN_KEY, PENDING_VIEW_KEY, SELECTION_KEY, Selection
from dashboard.views.runlog_path import path_problem
from dashboard.views.text import fmt, md, plural
from engine.runlog import lake

# Runs is the default page, served at the root (Streamlit ignores a default page's path)
RUNS = st.Page("screens/runs.py", title="Runs", url_path="runs-table", default=True)


def runs_alias() -> None:
    """/runs, the page's name typed or in a link, opens Runs at the root with the address's
    options, instead of Streamlit's "Page not found"."""
    st.switch_page(RUNS, query_params=st.query_params.to_dict())


PAGES = [
    RUNS,
    st.Page("screens/graph.py", title="Graph", url_path="graph"),
    st.Page("screens/step.py", title="Step through",
            url_path="step"),
    st.Page("screens/inspect.py", title="Node inspector",
            url_path="inspect"),
    st.Page("screens/examples.py", title="Examples", url_path="examples"),
    st.Page("screens/history.py", title="Prompt history", url_path="history"),
    st.Page("screens/curves.py", title="Curves", url_path="curves"),
    st.Page("screens/compare.py", title="Compare",
            url_path="compare"),
    st.Page("screens/learn.py", title="Learn", url_path="learn"),
    st.Page("screens/traces.py", title="Traces", url_path="traces"),
    st.Page(runs_alias, title="Runs", url_path="runs", visibility="hidden"),
]


DB_HELP = ("A DuckDB file (default: runs.duckdb in the working directory, or $SEMBACK_DB), "
           "or a team's lake: `ducklake:postgres:dbname=… host=… user=…` or "
           "`ducklake:FILE.ducklake`. The lake's password comes from PGPASSWORD or "
           "~/.pgpass (never type it here), a new lake's data folder from "
           "$SEMBACK_DATA_PATH, as the dashboard was started.")


def default_db() -> str:
    return os.environ.get("SEMBACK_DB") or "runs.duckdb"


def keep_valid(key: str, options: list, default, cast=str, **kwargs) -> None:
    """Before a picker kept in the address is drawn: the URL's new value when valid,
    else the session's value when still valid, else `default` (see dashboard.links)."""
    links.choose(key, options, default, cast=cast, **kwargs)


def unknown_run(run_ids: list[str]) -> bool:
    """A link naming a run that is not in this run log: warn and offer the newest run,
    never show another run silently."""
    wanted = links.from_url("run")
    if wanted is None or wanted in run_ids:
        return False
    st.warning(f"Run `{wanted}` is not in this run log.", icon=":material/link_off:")
    picked = st.selectbox("Run", run_ids, index=None, key="run_instead",
                          placeholder="pick a run")
    if st.button(f"Open the newest run, {run_ids[0]}", key="open_newest"):
        picked = run_ids[0]
    if picked is not None:
        links.write({"run": picked})
        st.session_state["run"] = picked
        st.rerun()
    links.warn(f"The link names run `{wanted}`, which is not in this run log "
               f"({st.session_state.get('db')}). Pick a run in the sidebar, or open the "
               f"newest, `{run_ids[0]}`.")
    return True


default_step = data.default_step


def sidebar() -> Selection:
    db = st.text_input("Run log (DuckDB file or lake)", value=default_db(), key="db",
                       help=DB_HELP).strip()
    try:
        runs = data.runs(db)
    except Exception as exc:  # noqa: BLE001 - any unreadable file: say so in one line
        st.error(f"Cannot read {db}: {exc}")
        return Selection(db=db)
    run_ids = list(runs["run_id"])
    if not run_ids:
        problem = path_problem(db, lake.is_lake(db))
        st.caption(problem[0] if problem else "No runs in this run log yet.")
        return Selection(db=db)
    if st.session_state.get(PENDING_RUN_KEY) in run_ids:  # started from the Runs page
        st.session_state["run"] = st.session_state.pop(PENDING_RUN_KEY)
    view = st.session_state.get(PENDING_VIEW_KEY)
    if isinstance(view, dict) and view.get("run") in run_ids:  # a finished demo's lead
        st.session_state.pop(PENDING_VIEW_KEY)
        for key in ("run", "step", "example"):
            if view.get(key) is not None:
                st.session_state[key] = view[key]
    if unknown_run(run_ids):
        return Selection(db=db)
    keep_valid("run", run_ids, run_ids[0], what="run")
    run = st.selectbox("Run", run_ids, index=None, key="run")
    if run is None:
        return Selection(db=db)
    row = runs[runs["run_id"] == run].iloc[0]
    st.caption(f"{md(row['graph_name'])} · {md(row['method'])} · **{md(row['status'])}**")
    steps = data.steps(db, run)
    step_ids = [int(s) for s in steps["step"]]
    step = example = node = None
    follow = False
    if step_ids:
        keep_valid("step", step_ids, default_step(steps), int, what="step",
                   nearest=links.nearest_number(step_ids))
        follow = live_view.follow_newest(run, row["status"], step_ids)
        step = st.selectbox("Step", step_ids, index=None, key="step",
                            on_change=live_view.pin, args=(run,))
    if step is not None:
        examples = data.step_examples(db, run, step)
        example_ids = list(dict.fromkeys(examples["example_id"]))
        if example_ids:
            keep_valid("example", example_ids, example_ids[0], what="example")
            example = st.selectbox("Example", example_ids, index=None, key="example",
                                   help="Back-propagated examples first, then train, val")
            match = examples[examples["example_id"] == example]
            if not match.empty:
                r = match.iloc[0]
                st.caption(f"{md(r['split'])} · score {fmt(r['score'], '.2f')} · "
                           f"{plural(int(r['gradients']), 'gradient')}")
    graph = data.graph(db, run)
    if graph is not None:
        order = list(graph.model.order)
        keep_valid(NODE_KEY, order, graph.model.output, what="node")
        node = st.selectbox("Node", order, index=None, key=NODE_KEY,
                            help="Also set by clicking a node in the graph drawing")
        st.session_state["selected_node"] = node
    links.write({"run": run, "step": step, "example": example, "node": node,
                 "follow": 1 if follow else None})
    if row["status"] == "running":
        live_view.live_panel(db, run, data.stamp(db))
    return Selection(db=db, run=run, step=step, example=example, node=node,
                     status=row["status"], method=row["method"])


# No :material: page icons: the current page's icon becomes the favicon, which the
# browser would fetch from a font CDN (the dashboard must work offline).
st.set_page_config(page_title="Semantic backprop workbench", page_icon="🔁",
                   layout="wide")
navigation = st.navigation(PAGES)
with st.sidebar:
    st.session_state[SELECTION_KEY] = sidebar()
    links.copy_link_button()
links.show_warnings()
navigation.run()
