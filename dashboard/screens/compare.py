"""Compare: two runs side by side (for example `semantic` against `textgrad` on the same
graph and seed): score curves on one chart, the same example's gradients per node side
by side, and each node's prompt diffed across the two runs."""
import json

import pandas as pd
import streamlit as st

from dashboard import data, links
from dashboard.state import need_run, selection
from dashboard.views.figures import compare_curves
from dashboard.views.text import fmt, md, show_diff, show_side_by_side

OTHER_KEY = "other"
PAIR_KEY = "pair"  # the example whose gradients are paired (a row picked in the table)


def default_other(runs: pd.DataFrame, run: str, db: str = "") -> str | None:
    """A fork's parent (runs.parent_run_id), else a fork of this run, else another run
    of the same graph and seed, preferring a different method."""
    me = runs[runs["run_id"] == run].iloc[0]
    others = runs[runs["run_id"] != run].copy()
    if others.empty:
        return None
    parent = (data.run(db, run) or {}).get("parent_run_id") if db else None
    if isinstance(parent, str) and parent in set(others["run_id"]):
        return parent
    children = data.forks(db, run) if db else []
    if children:
        return children[0]
    others["rank"] = [(g != me["graph_name"], s != me["seed"], m == me["method"])
                      for g, s, m in zip(others["graph_name"], others["seed"], others["method"])]
    return others.sort_values("rank", kind="stable").iloc[0]["run_id"]


def summary(runs: pd.DataFrame, a: str, b: str, tests: dict[str, float]) -> None:
    rows = runs.set_index("run_id").loc[[a, b]]
    table = pd.DataFrame({
        "run": [a, b], "graph": rows["graph_name"].values, "method": rows["method"].values,
        "seed": rows["seed"].values, "status": rows["status"].values,
        "steps": rows["steps"].values, "best validation": rows["best_val"].values,
        "test": [tests.get(r) for r in (a, b)],
        "calls": rows["calls"].values, "tokens": rows["tokens"].values,
        "cost (USD)": rows["cost_usd"].values})
    st.dataframe(table, hide_index=True)


def _prompt_text(messages_json: object) -> str:
    """A call's messages as one text (role lines then content), for diffing."""
    try:
        messages = json.loads(messages_json) if isinstance(messages_json, str) else []
    except ValueError:
        messages = []
    return "\n\n".join(f"[{m.get('role', '')}]\n{m.get('content', '')}" for m in messages)


def paired_backward(sel, other: str, step: int, example: str) -> None:
    """Where both runs back-propagated `example`: per (node, sender) both gradients and
    both backward prompts side by side, A's words missing from B in red, B's new words
    in green."""
    ga = data.backward_calls(sel.db, sel.run, step, example)
    gb = data.backward_calls(sel.db, other, step, example)
    if ga.empty or gb.empty:
        who = "either run" if ga.empty and gb.empty else ("A" if ga.empty else "B")
        st.caption(f"{who} did not back-propagate example {example} at step {step}: "
                   "pick an example both runs back-propagated (column 'both back-propagated').")
        return
    only = st.toggle("show only what changed", key="compare_grad_only")
    keys = list(dict.fromkeys([*zip(ga["node_id"], ga["from_node_id"]),
                               *zip(gb["node_id"], gb["from_node_id"])]))
    for node, sender in keys:
        ra = ga[(ga["node_id"] == node) & (ga["from_node_id"] == sender)]
        rb = gb[(gb["node_id"] == node) & (gb["from_node_id"] == sender)]
        st.markdown(f"**{md(node)}** ← {md(sender)}")
        a = ra.iloc[0].to_dict() if not ra.empty else {}
        b = rb.iloc[0].to_dict() if not rb.empty else {}
        show_side_by_side(a.get("content") or "", b.get("content") or "",
                          labels=(f"A gradient ({a.get('method') or 'none'})",
                                  f"B gradient ({b.get('method') or 'none'})"),
                          only_changes=only)
        pa, pb = _prompt_text(a.get("messages")), _prompt_text(b.get("messages"))
        if pa or pb:
            with st.expander(f"backward prompts sent by {sender}: A | B"
                             + (" (identical)" if pa == pb else "")):
                show_side_by_side(pa, pb, labels=("A backward prompt", "B backward prompt"),
                                  only_changes=only)


def _example_clicked() -> None:
    state = st.session_state.get("compare_table")
    rows = getattr(getattr(state, "selection", None), "rows", None) or []
    ids = st.session_state.get("_compare_rows", [])
    if rows and rows[0] < len(ids):
        st.session_state[PAIR_KEY] = ids[rows[0]]


def per_example(sel, other: str, step: int) -> str | None:
    """Both runs' prediction and score per shared example; returns the example to pair."""
    rows = data.compare_rows(sel.db, sel.run, other, step, step)
    if rows.empty:
        st.caption("The two runs share no example at this step (different data or seed).")
        return None
    links.page_option("disagree", False, [True, False], cast=links.flag)
    disagree = st.toggle("only examples where the runs disagree", key="disagree",
                         help="different pass/fail or a different prediction")
    shown = rows[rows["disagree"]] if disagree else rows
    st.session_state["_compare_rows"] = list(shown["example_id"])
    table = pd.DataFrame({
        "split": shown["split"], "example": shown["example_id"],
        "A prediction": shown["prediction_a"], "A score": shown["score_a"],
        "B prediction": shown["prediction_b"], "B score": shown["score_b"],
        "disagree": shown["disagree"],
        "both back-propagated": shown["backprop_a"] & shown["backprop_b"]})
    st.dataframe(table, hide_index=True, key="compare_table", on_select=_example_clicked,
                 selection_mode="single-row")
    st.caption(f"{int(rows['disagree'].sum())} of {len(rows)} shared examples disagree at "
               f"step {step}. Select a row to pair its gradients below (by default an "
               "example both runs back-propagated).")
    both = list(rows.loc[rows["backprop_a"] & rows["backprop_b"], "example_id"])
    shared = list(rows["example_id"])
    chosen = links.page_option(PAIR_KEY, "")  # a row picked here, kept in the address
    for candidate in (chosen, sel.example if sel.example in both else None, *both[:1],
                      sel.example, shared[0]):
        if candidate in shared:
            return candidate
    return None


def prompts_diff(sel, other: str) -> None:
    pa, pb = data.current_prompts(sel.db, sel.run), data.current_prompts(sel.db, other)
    only = st.toggle("show only what changed", key="compare_only")
    for node in dict.fromkeys([*pa, *pb]):
        a, b = pa.get(node, ""), pb.get(node, "")
        st.markdown(f"**{md(node)}**" + (" · identical" if a == b else ""))
        show_diff(a, b, only_changes=only)


sel = selection()
need_run(sel)
runs = data.runs(sel.db)
choices = [r for r in runs["run_id"] if r != sel.run]
st.title("Compare")
if not choices:
    st.info("Only one run in this run log: start another (for example the same graph and "
            "seed with method textgrad) on the Runs page.")
    st.stop()
if st.session_state.get(OTHER_KEY) not in choices:
    wanted = st.query_params.get(OTHER_KEY)
    st.session_state[OTHER_KEY] = (wanted if wanted in choices
                                   else default_other(runs, sel.run, sel.db))
other = st.selectbox("Compare with", choices, index=None, key=OTHER_KEY, bind="query-params")
if other is None:
    st.stop()
summary(runs, sel.run, other, data.test_scores(sel.db))
sa, sb = data.steps(sel.db, sel.run), data.steps(sel.db, other)
st.plotly_chart(compare_curves(sa, sb, "A", "B"), key="compare_curves")
st.caption(f"A = {md(sel.run)} (solid) · B = {md(other)} (dashed)")

st.subheader("Per example", divider="gray")
common_steps = sorted(set(sa["step"]) & set(sb["step"]))
if sel.step is None or not common_steps:
    st.caption("No step in common yet.")
else:
    step = sel.step if sel.step in common_steps else common_steps[-1]
    example = per_example(sel, other, step)
    if example is not None:
        st.subheader(f"Gradients and backward prompts · example {example} · step {step}",
                     divider="gray")
        st.caption("A left, B right; words of A missing from B in red, B's new words in "
                   "green.")
        paired_backward(sel, other, step, example)

st.subheader("Prompts: A's latest accepted version → B's", divider="gray")
prompts_diff(sel, other)
st.caption(f"Best validation: A {fmt(sa['val_score'].max())}, B {fmt(sb['val_score'].max())}")
