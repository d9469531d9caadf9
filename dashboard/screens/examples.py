"""Examples: one row per example at the selected step (split, input, prediction, target,
score, flipped since the previous step, errors and parse fallbacks, blame from probes),
filtered, searched and paged in the database; select a row to open that example in
Step through, the node inspector, or its trace (every call made for it at the step)."""

import json

import pandas as pd
import streamlit as st

from dashboard import data, links
from dashboard.state import need_run, need_step, selection
from dashboard.views.blame import blame_cell
from dashboard.views.text import fmt, md
from dashboard.views.trace import model_ms, trace_header
from dashboard.widgets.blame import blame_button
from dashboard.widgets.text import show_messages, show_text

PAGE_SIZE = 50
SPLITS = ["all", "train", "val", "test"]
VIEWS = ["table", "trace"]
TABLE_KEY = "examples_table"
ROWS_KEY = "_examples_rows"  # the example ids of the page shown, for the click callback

LABELS = {
    "split": "split", "example_id": "example", "input": "input", "prediction": "prediction",
    "target": "target", "score": st.column_config.NumberColumn("score", format="%.2f"),
    "flipped": st.column_config.TextColumn(
        "flipped", help="pass/fail changed since the previous step: fixed or broke"),
    "errors": st.column_config.NumberColumn("errors", help="node or loss errors"),
    "fallbacks": st.column_config.NumberColumn(
        "parse fallbacks", help="replies that needed a parse fallback"),
    "gradients": st.column_config.NumberColumn("gradients", help="gradients it sent back"),
    "blame": st.column_config.TextColumn(
        "blame (probes)", help="nodes whose probe raised its score, with the change, as "
        "python -m engine blame credits them; 'not probed', or 'probed, nothing fixed it'; "
        "fixes that leaked the target and in-sample edits are named apart, not credited"),
}
# The blame column right after the score, so it is on screen without scrolling sideways.
COLUMNS = ["split", "example_id", "score", "blame", "flipped", "prediction", "target",
           "input", "errors", "fallbacks", "gradients"]
CANDIDATE = "val (gate's candidate)"


def rejected_candidate(steps, step: int) -> float | None:
    """At a step whose edits the gate rejected, its validation rows are the candidate's
    (the rejected prompts), not the prompts kept: the score kept, else None."""
    row = steps[steps["step"] == step]
    if row.empty or int(step) == 0:
        return None
    r = row.iloc[0]
    if int(r["proposed"] or 0) == 0 or bool(r["accepted"]):
        return None
    return float(r["val_score"]) if r["val_score"] == r["val_score"] else None


def _row_clicked() -> None:
    """A row of the table was selected: make its example the shared selection."""
    state = st.session_state.get(TABLE_KEY)
    rows = getattr(getattr(state, "selection", None), "rows", None)
    if rows is None and isinstance(state, dict):
        rows = state.get("selection", {}).get("rows", [])
    ids = st.session_state.get(ROWS_KEY, [])
    if rows and rows[0] < len(ids):
        st.session_state["example"] = ids[rows[0]]


def filters() -> dict:
    c1, c2, c3, c4, c5 = st.columns([1.2, 1, 1, 1, 3])
    links.page_option("split", "all", SPLITS)
    split = c1.selectbox("Split", SPLITS, key="split")
    options = {}
    for column, key, label, help_ in (
            (c2, "failing", "failing", "score below 1 or an error"),
            (c3, "flipped", "flipped", "pass/fail changed since the previous step"),
            (c4, "errored", "errored", "an error or a parse fallback")):
        links.page_option(key, False, [True, False], cast=links.flag)
        options[key] = column.toggle(label, key=key, help=help_)
    links.page_option("q", "")
    search = c5.text_input("Search inputs, outputs and gradients", key="q",
                           placeholder="text to find (case-insensitive)")
    return {"split": None if split == "all" else split, "search": search, **options}


def input_preview(fields_json: object, fields: tuple[str, ...]) -> str:
    """The input fields the graph reads (not the target), joined, cut to 160 chars."""
    try:
        record = json.loads(fields_json) if isinstance(fields_json, str) else {}
    except ValueError:
        record = {}
    text = " · ".join(str(record[f]) for f in fields if f in record) or str(fields_json or "")
    return text if len(text) <= 160 else text[:159] + "…"


def table(sel, step: int, fields: tuple[str, ...]) -> None:
    options = filters()
    links.page_option("page", 1, cast=int)
    page = max(1, int(st.session_state["page"]))
    rows = data.example_rows(sel.db, sel.run, step, limit=PAGE_SIZE,
                             offset=(page - 1) * PAGE_SIZE, **options)
    total = int(rows["total"].iloc[0]) if not rows.empty else 0
    pages = max(1, -(-total // PAGE_SIZE))
    if page > pages:  # the filters shrank the result: back to its last page
        st.session_state["page"] = page = pages
        links.write({"page": page})
        rows = data.example_rows(sel.db, sel.run, step, limit=PAGE_SIZE,
                                 offset=(page - 1) * PAGE_SIZE, **options)
    st.session_state[ROWS_KEY] = list(rows["example_id"])
    rows["input"] = [input_preview(text, fields) for text in rows["input"]]
    rows["blame"] = [blame_cell(b, n, leak, inside) for b, n, leak, inside in zip(
        rows["blame"], rows["probes"], rows["leaked"], rows["in_sample"])]
    rows["flipped"] = rows["flipped"].fillna("")
    kept = rejected_candidate(data.steps(sel.db, sel.run), step)
    if kept is not None:
        rows.loc[rows["split"] == "val", "split"] = CANDIDATE
        st.warning(f"The gate rejected step {step}'s edits: its validation rows show the "
                   f"rejected candidate's predictions. The prompts kept score "
                   f"{fmt(kept)} on validation (as on Curves and Runs).",
                   icon=":material/block:")
    st.dataframe(rows[[c for c in COLUMNS if c in rows.columns]], hide_index=True,
                 column_config=LABELS, key=TABLE_KEY, on_select=_row_clicked,
                 selection_mode="single-row")
    left, right = st.columns([1, 3])
    left.number_input(f"Page (of {pages})", min_value=1, max_value=pages, key="page")
    right.caption(f"{total:,} examples match at step {step}; {PAGE_SIZE} per page. "
                  "Select a row to open that example.")


def open_example(sel) -> None:
    if not sel.example:
        return
    st.markdown(f"**Example {md(sel.example)}** at step {sel.step}")
    c1, c2, c3 = st.columns(3)
    with c1:
        st.page_link("screens/step.py", label="Open in Step through",
                     icon=":material/footprint:", query_params=sel.link())
    with c2:
        st.page_link("screens/inspect.py", label="Open in the node inspector",
                     icon=":material/search:", query_params=sel.link())
    with c3:
        st.page_link("screens/examples.py", label="Its trace (every call)",
                     icon=":material/timeline:", query_params={**sel.link(), "view": "trace"})


PHASES = ["forward", "loss", "backward", "update", "probe"]


def trace(sel, step: int) -> None:
    """Every call made for the selected example at the step, phase by phase."""
    if not sel.example:
        st.info("No example selected.")
        return
    calls = data.example_calls(sel.db, sel.run, step, sel.example)
    st.subheader(f"Trace of example {sel.example} at step {step}", divider="gray")
    if calls.empty:
        st.caption("No model call was made for this example at this step (function nodes "
                   "and exact metrics make none).")
        return
    start = calls["started_at"].min()
    summary = pd.DataFrame({
        "at (ms)": ((calls["started_at"] - start) * 1000).round(1),
        "phase": calls["purpose"], "node": calls["node_id"],
        "latency (ms)": model_ms(calls).round(1),
        "waited (ms)": calls["queued_ms"].round(1),
        "tokens in": calls["prompt_tokens"], "tokens out": calls["completion_tokens"],
        "cost (USD)": calls["cost_usd"], "cache hit": calls["cache_hit"],
        "retries": calls["retries"], "parse fallback": calls["parse_fallback"],
        "error": calls["error"]})
    st.dataframe(summary, hide_index=True)
    st.caption(trace_header(calls) + " Update calls are the step's, for the nodes this "
               "example sent gradients to.")
    order = [p for p in PHASES if p in set(calls["purpose"])] + sorted(
        set(calls["purpose"]) - set(PHASES))
    calls = calls.assign(model_ms=model_ms(calls))
    for phase in order:
        st.markdown(f"**{md(phase)}**")
        for call in calls[calls["purpose"] == phase].to_dict("records"):
            hit = " · cache hit" if call["cache_hit"] is True else ""
            with st.expander(f"{phase} · {call['node_id'] or '–'} · "
                             f"{fmt(call['model_ms'], ',.0f')} ms · "
                             f"{fmt(call['prompt_tokens'], '.0f')}+"
                             f"{fmt(call['completion_tokens'], '.0f')} tokens{hit}"):
                if isinstance(call.get("parse_fallback"), str):
                    st.warning(f"parse fallback: {call['parse_fallback']}")
                if isinstance(call.get("error"), str):
                    st.error(f"error: {call['error']}")
                show_messages("messages", call["messages"], expanded=True)
                show_text("reply", call["response"], expanded=True)


sel = selection()
graph = need_run(sel)
step = need_step(sel)
st.title("Examples")
st.caption(f"run **{md(sel.run)}** · step {step}")
blame_button(sel.db, sel.run, step, key="examples_blame")
links.page_option("view", "table", VIEWS)
view = st.segmented_control("View", VIEWS, key="view",
                            format_func={"table": "Examples", "trace": "Trace"}.get)
if view == "trace":
    open_example(sel)
    trace(sel, step)
else:
    table(sel, step, graph.model.fields)
    open_example(sel)
