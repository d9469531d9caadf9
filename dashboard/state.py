"""The selection the sidebar makes (run, step, example, node), shared by every page,
and the guards a page calls when it needs a run or a step."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from dashboard import data

SELECTION_KEY = "_selection"
NODE_KEY = "node"  # the sidebar node picker, bound to the `node` query parameter
PENDING_RUN_KEY = "_pending_run"  # a run just started: select it once it is logged
PENDING_VIEW_KEY = "_pending_view"  # {run, step, example} to select on the next run
DEMO_RUN_KEY = "_demo_run"  # the demo this session started from the Runs page
DEMO_DONE_KEY = "_demo_done"  # ... once it has finished: the page leads on from it


@dataclass(frozen=True)
class Selection:
    """What the sidebar selectors (in app.py) chose for this script run."""

    db: str
    run: str | None = None
    step: int | None = None
    example: str | None = None
    node: str | None = None
    status: str | None = None
    method: str | None = None

    def link(self, **override) -> dict[str, str]:
        """Query parameters that reopen this exact view (for st.page_link)."""
        values = {"run": self.run, "step": self.step, "example": self.example,
                  "node": self.node, **override}
        return {k: str(v) for k, v in values.items() if v is not None}


def selection() -> Selection:
    sel = st.session_state.get(SELECTION_KEY)
    # duck-typed: a module reload (file watcher) makes a new Selection class
    return sel if hasattr(sel, "link") else Selection(db="runs.duckdb")


def need_run(sel: Selection) -> data.RunGraph:
    """The selected run's graph, or a hint and st.stop() when no run is selected."""
    if not sel.run:
        st.info("No run selected. Start one on the Runs page, or pick a run log in the "
                "sidebar.")
        st.page_link("screens/runs.py", label="Go to Runs", icon=":material/table:")
        st.stop()
    graph = data.graph(sel.db, sel.run)
    if graph is None:
        st.error(f"The graph of run {sel.run!r} is missing from the run log or cannot be "
                 "read by this version of the engine.")
        st.stop()
    return graph


def need_step(sel: Selection) -> int:
    if sel.step is None:
        st.info("This run has no completed step yet; the page fills in as soon as step 0 "
                "is written.")
        st.stop()
    return sel.step


def set_node(node: str | None) -> None:
    """Select a node: the one place that writes the shared `selected_node`."""
    if node:
        st.session_state[NODE_KEY] = node
        st.session_state["selected_node"] = node
