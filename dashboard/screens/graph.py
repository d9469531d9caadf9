"""Graph: the agentic graph at the selected step, nodes coloured by a per-node quantity
(blame from probes, gradient length, edit fate), gradient flows drawn as labelled orange
edges; clicking a node in the drawing (or the sidebar picker) selects it."""

import json

import pandas as pd
import streamlit as st

from dashboard import data, links, probe_data
from dashboard.state import need_run, need_step, selection
from dashboard.views.blame import interval_text, unprobed_edit
from dashboard.views.colors import QUANTITIES
from dashboard.views.graph_view import coloring, llm_nodes, node_rows
from dashboard.views.text import md, round_chars
from dashboard.widgets.blame import blame_button, just_finished, show_verdict
from dashboard.widgets.graph_view import draw_graph
from dashboard.widgets.method_compare import compare_section, latest_report
from dashboard.widgets.text import show_text
from engine.runs.settings import edge_sources_line

FLOWS = {"example": "this example", "all": "all sampled examples"}


def graph_panel(sel, graph, quantity: str) -> None:
    """The drawing; a click on a node selects it. The flows choice is kept in the
    address (`flows=`), like the colour (`color=`), so a copied link keeps both."""
    links.page_option("flows", "example", list(FLOWS))
    scope = st.segmented_control(
        "Gradient flows", list(FLOWS), format_func=FLOWS.get, key="flows", required=True,
        help="Which backward messages the orange edges count")
    draw_graph(sel, graph, quantity, example_flows=scope != "all")
    st.caption("Click a node to select it. Grey arrows: the forward pass. Dashed orange "
               "arrows: gradients, drawn from the node that wrote them to the node they are "
               "about (count × ∇, mean characters). Dashed rounded boxes (ƒ): Python functions. "
               "Hover a node for its numbers and output.")
    st.caption("Two lengths, two things: a node's ∇ chars is its aggregated gradient, the "
               "mean over every example back-propagated at the step; an edge's is what one "
               "successor sent, before aggregation, for "
               + ("the selected example" if scope != "all" else "all sampled examples")
               + ". They agree only where a node has one successor and the scopes match.")
    st.caption(coloring(sel, graph, quantity).legend)
    found = edge_sources_line(json.loads((data.run(sel.db, sel.run) or {}).get("config")
                                         or "{}"))
    if found:  # an imported run: how each grey arrow was found
        st.caption(found)


def node_summary(sel, graph) -> None:
    node = sel.node
    if not node:
        st.caption("Select a node.")
        return
    st.subheader(f"Node {node}")
    stats = data.node_stats(sel.db, sel.run, sel.step)
    row = stats[stats["node_id"] == node]
    r = row.iloc[0].to_dict() if not row.empty else {}
    blame = probe_data.node_blame(sel.db, sel.run, sel.step)
    b = blame[blame["node_id"] == node]
    b = b.iloc[0].to_dict() if not b.empty else {}
    c1, c2, c3 = st.columns(3)
    c1.metric("fixed by its gradient", f"{int(b.get('flips') or 0)} / {int(b.get('probed') or 0)}"
              if b.get("probed") else "not probed",
              help="Of the failing examples probed at this node, how many turned correct "
              "when its output was rewritten the way its gradient said (python -m engine "
              "blame)")
    c2.metric("fixed by its edit alone", f"{int(b.get('edit_flips') or 0)} / "
              f"{int(b.get('edit_probed') or 0)}" if b.get("edit_probed") else
              unprobed_edit(node in probe_data.edited(sel.db, sel.run, sel.step)))
    if b.get("probed") or b.get("edit_probed"):
        c1.caption(f"90% interval {interval_text(b.get('flips'), b.get('probed'))}")
        c2.caption(f"90% interval {interval_text(b.get('edit_flips'), b.get('edit_probed'))}")
    c3.metric("gradients in", int(r.get("gradients") or 0))
    edit = r.get("edit") if isinstance(r.get("edit"), str) else (
        "none (a function node has no prompt)" if node in graph.model.functions
        else "none proposed")
    st.markdown(f"edit at step {sel.step}: **{md(edit)}**")
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
        st.markdown(graph.description)  # its `node` names and file names as code
probes = probe_data.node_blame(sel.db, sel.run, step)
has_probes = not probes.empty
if just_finished(sel.run, step):  # the blame just checked here: show it
    st.session_state["color"] = "blame"
links.page_option("color", "blame" if has_probes else "grad_chars", list(QUANTITIES))
quantity = st.radio("Colour nodes by", list(QUANTITIES), format_func=QUANTITIES.get,
                    horizontal=True, key="color")
# One block for what changes as a blame job starts, runs and ends (the hint, the button or
# the job's progress, the verdict): the drawing below keeps its place among the page's
# elements. Moved, it would be a new frame, and Streamlit can drop the new frame's first
# message, leaving the drawing blank until a reload.
with st.container():
    if not has_probes:
        st.caption(f"No probes at step {step} yet: checking the blame follows each node's "
                   "gradient on every failing example and records which one fixes the "
                   "answer.")
    blame_button(sel.db, sel.run, step, key="graph_blame", primary=not has_probes)
    if has_probes:  # what the counts below add up to, as `engine blame` and Learn say
        # the same rows, updates and nodes as the drawing's colours (graph_view.step_blame)
        show_verdict(sel.db, sel.run, step, probes.to_dict("records"), llm_nodes(graph))
graph_panel(sel, graph, quantity)
with st.expander("Compare methods: each method's gradient efficacy per node",
                 expanded=bool(latest_report(sel.db, sel.run, step)[1])):
    compare_section(sel.db, sel.run, step, key="graph_compare", label="Compare methods")
node_summary(sel, graph)
st.subheader(f"Nodes at step {step}")
table = pd.DataFrame(node_rows(sel)).drop(columns=["fail_share"], errors="ignore")
if "grad_chars" in table:  # rounded as the drawing's labels are
    table["grad_chars"] = [round_chars(v) for v in table["grad_chars"]]
for column in ("probed", "flips", "edit_probed", "edit_flips", "leaks"):  # no "None" cells
    if column in table:
        table[column] = table[column].fillna(0).astype(int)
if "edit" in table:
    table["edit"] = table["edit"].fillna("none proposed")
if "flips" in table:  # each count with its 90% interval, as `engine blame` prints it
    table.insert(list(table.columns).index("flips") + 1, "flips_interval",
                 [interval_text(k, n) for k, n in zip(table["flips"], table["probed"])])
if "edit_flips" in table:
    table.insert(list(table.columns).index("edit_flips") + 1, "edit_interval",
                 [interval_text(k, n) for k, n in zip(table["edit_flips"], table["edit_probed"])])
st.dataframe(
    table,
    hide_index=True, column_config={
        "node_id": "node", "activations": "activations", "errors": "errors",
        "grad_chars": st.column_config.NumberColumn("mean gradient (chars)", format="%.0f"),
        "gradients": "gradients received", "edit": "edit",
        "calls": "calls", "tokens": "tokens",
        "cost_usd": st.column_config.NumberColumn("cost (USD)", format="%.5f"),
        "probed": "failing examples probed", "flips": "fixed by following its gradient",
        "flips_interval": "90% interval",
        "edit_probed": "probed with its edit alone", "edit_flips": "fixed by its edit alone",
        "edit_interval": "90% interval (edit)",
        "leaks": "fixes that leak the target"})
