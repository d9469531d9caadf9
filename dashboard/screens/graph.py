"""Graph: the agentic graph at the selected step, nodes coloured by a per-step quantity,
gradient flows drawn as orange edges; a clickable node chart and the sidebar picker
select a node."""

import streamlit as st

from dashboard import data
from dashboard.state import need_run, need_step, selection
from dashboard.views.colors import QUANTITIES
from dashboard.views.graph_view import clickable_node_chart, draw_graph
from dashboard.views.text import fmt, md, show_text


@st.fragment
def graph_panel(sel, graph, quantity: str) -> None:
    """The pyvis drawing, isolated: its own controls rerun only this fragment."""
    scope = st.segmented_control(
        "Gradient flows", ["this example", "all sampled examples"], default="this example",
        key="graph_flows", help="Which backward messages the orange edges count")
    draw_graph(sel, graph, quantity, example_flows=scope != "all sampled examples")
    st.caption("Grey arrows: the forward pass. Dashed orange arrows: gradients, drawn from "
               "the node that wrote them to the node they are about (count × ∇, mean "
               "characters). Hover a node for its numbers and output.")


def node_summary(sel, graph) -> None:
    node = sel.node
    if not node:
        st.caption("Select a node.")
        return
    st.subheader(f"Node {node}")
    stats = data.node_stats(sel.db, sel.run, sel.step)
    row = stats[stats["node_id"] == node]
    r = row.iloc[0].to_dict() if not row.empty else {}
    c1, c2 = st.columns(2)
    c1.metric("failing", fmt(r.get("fail_share"), ".0%"))
    c2.metric("gradients in", int(r.get("gradients") or 0))
    st.markdown(f"edit at step {sel.step}: **{md(r.get('edit') or 'none proposed')}**")
    kind = "function" if node in graph.model.functions else (
        "trainable" if node in graph.trainable else "frozen")
    reads = ", ".join(md(x) for x in dict(graph.model.inputs).get(node, ()))
    readers = ", ".join(md(s) for s in graph.model.successors(node)) or "the loss"
    st.caption(f"{kind} · reads {reads} · read by {readers}")
    if sel.example:
        view = data.node_view(sel.db, sel.run, sel.step, sel.example, node)
        act = view["activation"]
        if not act.empty:
            show_text(f"Output for {sel.example}", act.iloc[0]["output_text"], collapse_at=240)
        agg = view["received"]
        agg = agg[agg["kind"] == "aggregate"]
        if not agg.empty:
            show_text("Aggregated gradient", agg.iloc[0]["content"], collapse_at=240)
    st.page_link("screens/inspect.py", label="Open in the node inspector",
                 icon=":material/search:", query_params=sel.link())


sel = selection()
graph = need_run(sel)
step = need_step(sel)
st.title("Graph")
st.caption(f"Run **{md(sel.run)}** · step {step}"
           + (f" · example {md(sel.example)}" if sel.example else ""))
if graph.description:
    with st.expander("About this graph"):
        st.text(graph.description)
quantity = st.radio("Colour nodes by", list(QUANTITIES), format_func=QUANTITIES.get,
                    horizontal=True, key="graph_quantity")
left, right = st.columns([3, 2])
with left:
    graph_panel(sel, graph, quantity)
with right:
    clickable_node_chart(sel, graph, quantity)
    node_summary(sel, graph)
st.subheader(f"Nodes at step {step}")
st.dataframe(data.node_stats(sel.db, sel.run, step), hide_index=True,
             column_config={"fail_share": st.column_config.ProgressColumn(
                 "failing", format="percent", min_value=0, max_value=1)})
