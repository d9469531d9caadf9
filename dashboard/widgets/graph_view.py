"""The graph drawing (one vis-network component; a click selects a node), decorated for
the selected step."""

from __future__ import annotations

from dashboard import data
from dashboard.state import Selection
from dashboard.views.graph_spec import graph_spec
from dashboard.views.graph_view import decoration
from dashboard.widgets.graph_component import graph_drawing


def draw_graph(sel: Selection, graph: data.RunGraph, quantity: str, *,
               key: str = "graph_drawing", **kwargs) -> None:
    """The one drawing of the graph (vis-network component); clicking a node selects it."""
    deco = decoration(sel, graph, quantity, **kwargs)
    graph_drawing(graph_spec(graph.model, deco), key=key)
