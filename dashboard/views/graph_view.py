"""The graph drawing and the clickable node chart, decorated for the selected step."""

from __future__ import annotations

import streamlit as st

from dashboard import data
from dashboard.state import Selection, set_node
from dashboard.views import graph_html as gh
from dashboard.views.colors import color_nodes
from dashboard.views.figures import node_chart
from dashboard.views.text import fmt


def decoration(sel: Selection, graph: data.RunGraph, quantity: str, *,
               highlight: str | None = None, example_flows: bool = True,
               height: int = 440) -> gh.Decoration:
    """Colours, captions, tooltips and gradient flows for the graph at the selected step."""
    stats = data.node_stats(sel.db, sel.run, sel.step).to_dict("records")
    coloring = color_nodes(stats, quantity)
    flows = data.flows(sel.db, sel.run, sel.step, sel.example if example_flows else None)
    tooltips = node_tooltips(sel, graph, stats)
    return gh.Decoration(
        colors=tuple(coloring.colors.items()), captions=tuple(coloring.captions.items()),
        tooltips=tuple(tooltips.items()),
        flows=tuple((r.from_node_id, r.node_id, int(r.messages), float(r.mean_chars or 0))
                    for r in flows.itertuples()),
        highlight=highlight if highlight is not None else sel.node,
        link=tuple(sel.link(node=None).items()), height=height)


def node_tooltips(sel: Selection, graph: data.RunGraph, stats: list[dict]) -> dict[str, str]:
    """Plain-text tooltip per node: its numbers at the step and, for the selected
    example, the start of its output (model text: escaped by the drawing)."""
    by_node = {r["node_id"]: r for r in stats}
    outputs: dict[str, str] = {}
    if sel.example:
        acts = data.example_trace(sel.db, sel.run, sel.step, sel.example)["activations"]
        outputs = dict(zip(acts["node_id"], acts["output_text"].fillna("")))
    tips = {}
    for node in graph.model.order:
        r = by_node.get(node, {})
        lines = [f"failing: {fmt(r.get('fail_share'), '.0%')}",
                 f"gradients received: {r.get('gradients', 0)}",
                 f"mean aggregated gradient: {fmt(r.get('grad_chars'), '.0f')} chars",
                 f"edit: {r.get('edit') or 'none'}",
                 f"calls {r.get('calls', 0)}, tokens {fmt(r.get('tokens'), '.0f')}"]
        if node in outputs:
            lines.append(f"output for {sel.example}: {outputs[node]}")
        tips[node] = "\n".join(lines)
    return tips


def draw_graph(sel: Selection, graph: data.RunGraph, quantity: str, **kwargs) -> None:
    deco = decoration(sel, graph, quantity, **kwargs)
    st.iframe(data.graph_page(graph.model, deco), height=deco.height + 20)


def clicked_node(state: object) -> str | None:
    """The node id of the first point in a plotly selection state (customdata)."""
    selection_ = state.get("selection", {}) if isinstance(state, dict) else getattr(
        state, "selection", {})
    points = selection_.get("points", []) if isinstance(selection_, dict) else []
    for point in points:
        node = point.get("customdata")
        if isinstance(node, list):
            node = node[0] if node else None
        if isinstance(node, str):
            return node
    return None


def _chart_clicked(chart_key: str) -> None:
    set_node(clicked_node(st.session_state.get(chart_key) or {}))


def clickable_node_chart(sel: Selection, graph: data.RunGraph, quantity: str,
                         key: str = "node_chart") -> None:
    """Plotly node chart; clicking a node selects it (pyvis cannot report clicks)."""
    stats = data.node_stats(sel.db, sel.run, sel.step).to_dict("records")
    coloring = color_nodes(stats, quantity)
    hover = {n: f"{n}\n{coloring.captions.get(n, '')}" for n in graph.model.order}
    fig = node_chart(graph.model, coloring.colors, hover, sel.node)
    st.plotly_chart(fig, key=key, on_select=lambda: _chart_clicked(key),
                    selection_mode="points", config={"displayModeBar": False})
    st.caption(coloring.legend)
