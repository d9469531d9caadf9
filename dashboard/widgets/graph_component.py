"""The one graph drawing every page uses: a bidirectional Streamlit component around
vis-network, served from `dashboard/components/graph/` (no CDN). Clicking a node sends
its id back; the callback makes it the selected node (the sidebar picker and the `node`
query parameter follow)."""

from __future__ import annotations

from functools import partial

import streamlit as st
import streamlit.components.v1 as components

from dashboard.state import set_node
from dashboard.views.graph_component import FOLDER, clicked

_draw = components.declare_component("semback_graph", path=str(FOLDER))



def _on_click(key: str) -> None:
    set_node(clicked(st.session_state.get(key)))



def graph_drawing(spec: dict, *, key: str = "graph_drawing") -> None:
    """Draw `spec` (from `graph_spec.graph_spec`); a click on a node selects it."""
    _draw(spec=spec, key=key, default=None, on_change=partial(_on_click, key))
