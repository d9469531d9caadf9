"""Compare: two runs side by side (for example `semantic` against `textgrad` on the same
graph and seed): score curves on one chart, the same example's gradients per node side
by side, and each node's prompt diffed across the two runs."""
import pandas as pd
import streamlit as st

from dashboard import data
from dashboard.state import need_run, selection
from dashboard.views.figures import compare_curves
from dashboard.views.text import fmt, md, show_diff, show_text

OTHER_KEY = "other"


def default_other(runs: pd.DataFrame, run: str) -> str | None:
    """Another run of the same graph and seed, preferring a different method."""
    me = runs[runs["run_id"] == run].iloc[0]
    others = runs[runs["run_id"] != run].copy()
    if others.empty:
        return None
    others["rank"] = [(g != me["graph_name"], s != me["seed"], m == me["method"])
                      for g, s, m in zip(others["graph_name"], others["seed"], others["method"])]
    return others.sort_values("rank", kind="stable").iloc[0]["run_id"]


def summary(runs: pd.DataFrame, a: str, b: str) -> None:
    rows = runs.set_index("run_id").loc[[a, b]]
    table = pd.DataFrame({
        "run": [a, b], "graph": rows["graph_name"].values, "method": rows["method"].values,
        "seed": rows["seed"].values, "status": rows["status"].values,
        "steps": rows["steps"].values, "best val": rows["best_val"].values,
        "calls": rows["calls"].values, "tokens": rows["tokens"].values,
        "cost (USD)": rows["cost_usd"].values})
    st.dataframe(table, hide_index=True)


def gradients_side_by_side(sel, other: str, step: int, example: str) -> None:
    ga = data.example_gradients(sel.db, sel.run, step, example)
    gb = data.example_gradients(sel.db, other, step, example)
    nodes = list(dict.fromkeys([*ga["node_id"], *gb["node_id"]]))
    if not nodes:
        st.caption(f"Neither run back-propagated example {example} at step {step}.")
        return
    for node in nodes:
        st.markdown(f"**{md(node)}**")
        left, right = st.columns(2)
        for column, frame, name in ((left, ga, sel.run), (right, gb, other)):
            with column:
                rows = frame[(frame["node_id"] == node) & (frame["kind"] != "aggregate")]
                if rows.empty:
                    st.caption(f"{name}: no gradient")
                for r in rows.to_dict("records"):
                    show_text(f"{name} · {r['kind']} from {r['from_node_id']}", r["content"])


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
    st.session_state[OTHER_KEY] = wanted if wanted in choices else default_other(runs, sel.run)
other = st.selectbox("Compare with", choices, index=None, key=OTHER_KEY, bind="query-params")
if other is None:
    st.stop()
summary(runs, sel.run, other)
sa, sb = data.steps(sel.db, sel.run), data.steps(sel.db, other)
st.plotly_chart(compare_curves(sa, sb, "A", "B"), key="compare_curves")
st.caption(f"A = {md(sel.run)} (solid) · B = {md(other)} (dashed)")

st.subheader("Gradients per node, same example", divider="gray")
common_steps = sorted(set(sa["step"]) & set(sb["step"]))
if sel.step is None or not common_steps:
    st.caption("No step in common yet.")
else:
    step = sel.step if sel.step in common_steps else common_steps[-1]
    ea = data.step_examples(sel.db, sel.run, step)
    eb = data.step_examples(sel.db, other, step)
    both = [e for e in ea["example_id"] if e in set(eb["example_id"])]
    with_grads = [e for e in both if e in set(ea.loc[ea["gradients"] > 0, "example_id"])
                  | set(eb.loc[eb["gradients"] > 0, "example_id"])]
    if not both:
        st.caption("The two runs share no example at this step (different data or seed).")
    else:
        example = sel.example if sel.example in both else (with_grads or both)[0]
        st.caption(f"step {step} · example **{md(example)}** · A left, B right")
        gradients_side_by_side(sel, other, step, example)

st.subheader("Prompts: A's latest accepted version → B's", divider="gray")
prompts_diff(sel, other)
st.caption(f"Best validation: A {fmt(sa['val_score'].max())}, B {fmt(sb['val_score'].max())}")
