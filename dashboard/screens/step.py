"""Step through: one optimization step of one example, walked stop by stop: the forward
pass node by node in dependency order, the loss, the backward pass in reverse order,
then the update. The current node is outlined on the graph."""

import streamlit as st

from dashboard import data, probe_data
from dashboard.state import need_run, need_step, selection, set_node
from dashboard.views.panes import candidate_count
from dashboard.views.text import md
from dashboard.views.walk import walk
from dashboard.widgets.graph_view import draw_graph
from dashboard.widgets.panes import (
    aggregate_pane,
    forward_pane,
    gradients_received,
    loss_pane,
    sent_pane,
    update_pane,
)

WALK_KEY = "walk"
COLOR_BY_PHASE = {"forward": "blame", "loss": "blame", "backward": "grad_chars",
                  "update": "edit"}


def _move(delta: int, stops: list) -> None:
    position = int(st.session_state.get(WALK_KEY) or 0) + delta
    st.session_state[WALK_KEY] = min(max(position, 0), len(stops) - 1)
    _follow(stops)


def _follow(stops) -> None:
    """Keep the sidebar's node in step with the walk, so the inspector link matches."""
    stop = stops[int(st.session_state.get(WALK_KEY) or 0)]
    if stop.node_id:
        set_node(stop.node_id)


def show_stop(sel, graph, stop) -> None:
    if stop.phase == "forward":
        st.markdown(f"The forward pass reaches **{md(stop.node_id)}**: its prompt and the "
                    "outputs of its inputs become one call; the reply is its output.")
        forward_pane(data.node_view(sel.db, sel.run, sel.step, sel.example, stop.node_id))
    elif stop.phase == "loss":
        st.markdown(f"The metric (**{md(graph.metric)}**) compares the output of "
                    f"**{md(stop.node_id)}** with the target. For an exact metric the "
                    "feedback is the expected output; a judge writes a critique.")
        loss_pane(data.example_trace(sel.db, sel.run, sel.step, sel.example)["losses"],
                  graph.metric)
    elif stop.phase == "backward":
        view = data.node_view(sel.db, sel.run, sel.step, sel.example, stop.node_id)
        st.markdown(f"The backward pass reaches **{md(stop.node_id)}**: it collects the "
                    "messages of all its successors, and one call writes a gradient for each "
                    "of its LLM-produced inputs, with all of them (the siblings) in view.")
        st.subheader("Received")
        if not gradients_received(view):
            st.caption("Nothing: this example was not back-propagated at this step.")
        aggregate_pane(view)
        st.subheader("Sent to its predecessors")
        sent_pane(view)
    else:
        updates = data.updates(sel.db, sel.run, sel.step)
        st.markdown("Each trainable node's prompt is rewritten from the sampled failures and "
                    "their aggregated gradients; the candidate prompts are kept only if the "
                    "validation score improves.")
        if updates.empty:
            st.caption("No update at this step (step 0 only evaluates the initial prompts, or "
                       "no training example failed).")
        for update in updates.to_dict("records"):
            with st.container(border=True):
                update_pane(update, node=update["node_id"], show_call=False,
                            copies=probe_data.copies_training(sel.db, sel.run, update),
                            candidates=candidate_count(updates))


sel = selection()
graph = need_run(sel)
need_step(sel)
if not sel.example:
    st.info("Pick an example in the sidebar.")
    st.stop()
stops = walk(list(graph.model.order), graph.model.output, list(graph.trainable))
context = (sel.run, sel.step, sel.example)
if st.session_state.get("_walk_context") != context or st.session_state.get(WALK_KEY) is None:
    st.session_state["_walk_context"] = context
    st.session_state[WALK_KEY] = 0

st.title("Step through")
st.caption(f"run **{md(sel.run)}** · step {sel.step} · example **{md(sel.example)}**")
prev_col, next_col, where = st.columns([1, 1, 6])
prev_col.button("◀ Previous", key="walk_prev", on_click=_move, args=(-1, stops),
                disabled=st.session_state[WALK_KEY] == 0, width="stretch")
next_col.button("Next ▶", key="walk_next", on_click=_move, args=(1, stops),
                disabled=st.session_state[WALK_KEY] == len(stops) - 1, width="stretch")
current = stops[st.session_state[WALK_KEY]]
where.markdown(f"**{st.session_state[WALK_KEY] + 1} / {len(stops)}: {md(current.label)}**")

# full width: in a side column a graph of three layers shrinks below readable size
draw_graph(sel, graph, COLOR_BY_PHASE[current.phase], highlight=current.highlighted,
           height=320)
left, right = st.columns([1, 3])
with left:
    st.radio("Sequence", list(range(len(stops))), format_func=lambda i: stops[i].label,
             key=WALK_KEY, on_change=_follow, args=(stops,))
with right:
    show_stop(sel, graph, current)
