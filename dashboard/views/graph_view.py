"""The graph drawing (one vis-network component; a click selects a node), decorated for
the selected step."""

from __future__ import annotations

from dashboard import data, probe_data
from dashboard.state import Selection
from dashboard.views import graph_model as gh
from dashboard.views.colors import color_nodes
from dashboard.views.graph_component import graph_drawing
from dashboard.views.graph_spec import graph_spec
from dashboard.views.text import chars, fmt


def decoration(sel: Selection, graph: data.RunGraph, quantity: str, *,
               highlight: str | None = None, example_flows: bool = True,
               height: int = 440) -> gh.Decoration:
    """Colours, captions, tooltips and gradient flows for the graph at the selected step."""
    stats = node_rows(sel)
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


def node_rows(sel: Selection) -> list[dict]:
    """reader.node_step_stats rows with the probes' blame columns (probed, flips,
    edit_probed, edit_flips, leaks) merged in."""
    stats = data.node_stats(sel.db, sel.run, sel.step).to_dict("records")
    blame = {r["node_id"]: r for r in
             probe_data.node_blame(sel.db, sel.run, sel.step).to_dict("records")}
    return [{**r, **{k: v for k, v in blame.get(r["node_id"], {}).items() if k != "node_id"}}
            for r in stats]


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
        probed = r.get("probed")
        lines = [(f"blame: following its gradient fixed {r.get('flips', 0)} of {probed} "
                  "failing examples probed" if probed else "blame: no probes at this node yet"),
                 f"gradients received: {r.get('gradients', 0)}",
                 f"mean aggregated gradient: {chars(r.get('grad_chars'))}",
                 f"edit: {r.get('edit') or 'none'}",
                 f"calls {r.get('calls', 0)}, tokens {fmt(r.get('tokens'), '.0f')}"]
        if node in outputs:
            lines.append(f"output for {sel.example}: {outputs[node]}")
        tips[node] = "\n".join(lines)
    return tips


def draw_graph(sel: Selection, graph: data.RunGraph, quantity: str, *,
               key: str = "graph_drawing", **kwargs) -> None:
    """The one drawing of the graph (vis-network component); clicking a node selects it."""
    deco = decoration(sel, graph, quantity, **kwargs)
    graph_drawing(graph_spec(graph.model, deco), key=key)
