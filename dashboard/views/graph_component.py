"""The one graph drawing every page uses: a bidirectional Streamlit component around
vis-network, served from `dashboard/components/graph/` (no CDN). Clicking a node sends
its id back; the callback makes it the selected node (the sidebar picker and the `node`
query parameter follow).

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/graph_component.py."""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parents[1] / "components" / "graph"



def clicked(value: object) -> str | None:
    """The node id in a value the component sent ({"node": id, "clicks": n}), or None."""
    if isinstance(value, dict) and isinstance(value.get("node"), str):
        return value["node"]
    return None
