"""Node inspector for (run, step, example, node): prompt version, input messages, output,
the gradients received from each successor with the exact backward prompt that produced
them, the aggregated gradient, the proposed edit as a diff, and the call's costs."""

import streamlit as st

from dashboard import data, probe_data
from dashboard.state import need_run, need_step, selection
from dashboard.views.panes import candidate_count
from dashboard.views.text import md
from dashboard.widgets.blame import blame_button
from dashboard.widgets.panes import (
    aggregate_pane,
    call_metrics,
    forward_pane,
    gradients_received,
    gtbp_pane,
    sent_pane,
    update_pane,
)
from dashboard.widgets.text import show_text
from dashboard.widgets.whatif import fork_panel, whatif_panel

sel = selection()
graph = need_run(sel)
step = need_step(sel)
if not sel.example or not sel.node:
    st.info("Pick an example and a node in the sidebar.")
    st.stop()
view = data.node_view(sel.db, sel.run, step, sel.example, sel.node)
act = view["activation"]
split = act.iloc[0]["split"] if not act.empty else "?"
st.title(f"Node {sel.node}")
kind = ("function node" if sel.node in graph.model.functions else
        "trainable" if sel.node in graph.trainable else "frozen prompt")
st.caption(f"run **{md(sel.run)}** · step {step} · example **{md(sel.example)}** ({md(split)})"
           f" · {kind} · method {md(sel.method or '')}")
if not act.empty:
    call_metrics(act.iloc[0].to_dict())

is_function = sel.node in graph.model.functions
if is_function:
    st.subheader("Function", divider="gray")
    name, description = probe_data.function_node(sel.db, sel.run, sel.node) or ("", "")
    st.markdown(f"Python function **{md(name or sel.node)}**: no prompt, nothing to train; "
                "the backward pass passes gradients through it.")
    show_text("what it does", description or "(no description recorded)", expanded=True)
    if not act.empty:
        show_text("the input it got", act.iloc[0]["input_text"], expanded=True)
        show_text("what it returned", act.iloc[0]["output_text"], expanded=True)
st.subheader("Forward", divider="gray")
forward_pane(view)
st.subheader("Gradients received", divider="gray")
if not gradients_received(view):
    st.caption("No gradient reached this node for this example at this step (the example "
               "passed, was not sampled among the failures, or the method sends none).")
st.subheader("Aggregated gradient")
aggregate_pane(view)
gtbp_pane(view)
st.subheader("Update", divider="gray")
updates = view["update"]
if updates.empty:
    st.caption("No update was proposed for this node at this step.")
for update in updates.to_dict("records"):
    update_pane(update, node=sel.node,
                copies=probe_data.copies_training(sel.db, sel.run, update),
                candidates=candidate_count(updates))
st.subheader("Gradients this node sent to its predecessors", divider="gray")
sent_pane(view)
st.subheader("What if", divider="gray")
st.caption("Intervene on this node for this example and re-run only what depends on it "
           "(`python -m engine probe`, in the background; the engine writes the result). "
           f"Or check the blame of every node on every failing example of step {step}.")
blame_button(sel.db, sel.run, step, key="inspect_blame")
whatif_panel(sel, view, is_function)
st.subheader("Fork from here", divider="gray")
st.caption(f"A new run from the state after step {step}, with the prompt below for this "
           "node (`python -m engine run --fork`).")
fork_panel(sel, view, is_function, graph_name=data.run(sel.db, sel.run)["graph_name"])
