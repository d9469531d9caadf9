"""Helpers the pages share: the selection made in the sidebar, safe text display, the
clickable node chart and the graph fragment.

Model-produced text is shown with `st.code` (plain text) or, for diffs, as HTML built by
`dashboard.views.diff`, which escapes every piece; never through Markdown, which would
follow links and load images from a reply.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from dashboard import data
from dashboard.views import graph_html as gh
from dashboard.views.colors import color_nodes
from dashboard.views.diff import diff_html
from dashboard.views.figures import node_chart

SELECTION_KEY = "_selection"
NODE_KEY = "node"  # the sidebar node picker, bound to the `node` query parameter
PENDING_RUN_KEY = "_pending_run"  # a run just started: select it once it is logged
COLLAPSE_AT = 400  # characters: longer texts start collapsed


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
        st.page_link("pages/runs.py", label="Go to Runs", icon=":material/table:")
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


def md(text: object) -> str:
    """Escape a value for use inside Markdown (no links, images or emphasis)."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!<>|~])", r"\\\1", str(text))


def set_node(node: str | None) -> None:
    """Select a node: the one place that writes the shared `selected_node`."""
    if node:
        st.session_state[NODE_KEY] = node
        st.session_state["selected_node"] = node


# --- text --------------------------------------------------------------------------------


def show_text(label: str, text: object, *, collapse_at: int = COLLAPSE_AT,
              expanded: bool = False) -> None:
    """Show a text as plain text; long ones collapsed behind an expander."""
    value = "" if text is None or (isinstance(text, float) and pd.isna(text)) else str(text)
    if not value:
        st.caption(f"{label}: (empty)")
        return
    if len(value) <= collapse_at:
        st.caption(label)
        st.code(value, language=None, wrap_lines=True)
        return
    with st.expander(f"{label} · {len(value):,} characters", expanded=expanded):
        st.code(value, language=None, wrap_lines=True)


def show_messages(label: str, messages_json: object, *, expanded: bool = False) -> None:
    """Chat-style rendering of a call's messages (the JSON list of {role, content})."""
    try:
        messages = json.loads(messages_json) if isinstance(messages_json, str) else []
    except ValueError:
        messages = []
    if not messages:
        st.caption(f"{label}: not recorded")
        return
    total = sum(len(str(m.get("content", ""))) for m in messages)
    with st.expander(f"{label} · {len(messages)} messages, {total:,} characters",
                     expanded=expanded):
        for message in messages:
            role = str(message.get("role", "user"))
            with st.chat_message("assistant" if role == "assistant" else
                                 "user" if role == "user" else "ai",
                                 avatar=":material/settings:" if role == "system" else None):
                st.caption(role)
                st.code(str(message.get("content", "")), language=None, wrap_lines=True)


def show_diff(old: str, new: str, *, only_changes: bool = False) -> None:
    st.html(diff_html(old or "", new or "", only_changes=only_changes))


def fmt(value: object, spec: str = ".3f", empty: str = "–") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NA:
        return empty
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


# --- graph -------------------------------------------------------------------------------


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


# --- panes: what happened at one node, reused by the inspector, step-through and tour ----


def _first(frame: pd.DataFrame) -> dict | None:
    return None if frame.empty else frame.iloc[0].to_dict()


def call_metrics(row: dict) -> None:
    """Tokens, latency, cost and cache hit of one call."""
    c1, c2, c3, c4, c5 = st.columns(5)
    c1.metric("prompt tokens", fmt(row.get("prompt_tokens"), ".0f"))
    c2.metric("completion tokens", fmt(row.get("completion_tokens"), ".0f"))
    c3.metric("latency", f"{fmt(row.get('latency_ms'), ',.0f')} ms")
    c4.metric("cost", f"${fmt(row.get('cost_usd'), '.5f')}")
    hit = row.get("cache_hit")
    c5.metric("cache hit", "–" if hit is None or pd.isna(hit) else ("yes" if hit else "no"))


def forward_pane(view: dict[str, pd.DataFrame], *, messages: bool = True) -> None:
    """The node's prompt version, its inputs (and the exact messages sent), its output."""
    act = _first(view["activation"])
    if act is None:
        st.info("This node did not run on this example at this step.")
        return
    st.markdown(f"**Prompt, version {int(act['prompt_version'])}**")
    show_text("prompt", act.get("prompt") or "(function node: no prompt)")
    show_text("inputs", act.get("input_text"))
    if messages:
        show_messages("input messages as sent", act.get("messages"))
    if act.get("error"):
        st.error(f"error: {act['error']}")
    show_text("output", act.get("output_text"), expanded=True)
    if act.get("parse_error"):
        st.warning(f"parse: {act['parse_error']}")
        show_text("raw reply", act.get("raw_text"))


def loss_pane(loss: pd.DataFrame, metric: str = "") -> None:
    row = _first(loss)
    if row is None:
        st.info("No loss was recorded for this example at this step.")
        return
    c1, c2 = st.columns(2)
    c1.metric("score", fmt(row.get("score"), ".2f"))
    c2.metric("split", str(row.get("split")))
    if metric:
        st.caption(f"metric: {md(metric)}")
    left, right = st.columns(2)
    with left:
        show_text("prediction (the output node's output)", row.get("prediction"))
    with right:
        show_text("target", row.get("target"))
    if row.get("error"):
        st.error(f"error: {row['error']}")
    show_text("output gradient (feedback the loss sends to the output node)",
              row.get("feedback"), expanded=True)


def gradients_received(view: dict[str, pd.DataFrame], *, expanded: bool = False) -> int:
    """Each successor's message (a gradient; for gtbp a target) with the exact backward
    prompt that produced it; returns how many were shown."""
    received = view["received"]
    grads = received[received["kind"].isin(["gradient", "target"])]
    for row in grads.to_dict("records"):
        source, what = row["from_node_id"], ("Target" if row["kind"] == "target"
                                             else "Gradient")
        with st.container(border=True):
            title = ("from the loss (output gradient)" if source == "loss"
                     else f"from successor {md(source)}")
            st.markdown(f"**{what} {title}** · method {md(row.get('method') or '')}")
            show_text(what.lower(), row["content"], expanded=True)
            if isinstance(row.get("parse_error"), str) and row["parse_error"]:
                st.warning(f"parse: {row['parse_error']}")
            if isinstance(row.get("messages"), str):
                show_messages(f"backward prompt sent by {source} (its inputs, siblings "
                              "included)", row["messages"], expanded=expanded)
                show_text("backward reply", row.get("response"))
            elif source != "loss":
                st.caption("passed on unchanged (no backward call)")
    return len(grads)


def aggregate_pane(view: dict[str, pd.DataFrame]) -> None:
    received = view["received"]
    agg = received[received["kind"] == "aggregate"]
    if agg.empty:
        st.caption("No aggregated gradient: this example was not back-propagated at this step.")
        return
    show_text("aggregated gradient (what the update acts on)", agg.iloc[0]["content"],
              expanded=True)


def gtbp_pane(view: dict[str, pd.DataFrame]) -> None:
    """gtbp: the target the node acted on beside its actual output (and as a diff), and
    the inferred input: what would have made the node produce its target."""
    received = view["received"]
    targets = received[received["kind"] == "target"]
    inferred = received[received["kind"] == "inferred_input"]
    if targets.empty and inferred.empty:
        return
    st.subheader("Target and inferred input (gtbp)")
    act = _first(view["activation"]) or {}
    aggregate = received[received["kind"] == "aggregate"]
    target = (aggregate if not aggregate.empty else targets).iloc[0]["content"] \
        if not (aggregate.empty and targets.empty) else None
    if target is not None:
        left, right = st.columns(2)
        with left:
            show_text("target output", target, expanded=True)
        with right:
            show_text("actual output", act.get("output_text"), expanded=True)
        st.caption("actual → target, word by word")
        show_diff(act.get("output_text") or "", target or "")
    for row in inferred.to_dict("records"):
        show_text("inferred input (what would have produced the target)", row["content"],
                  expanded=True)
        if isinstance(row.get("messages"), str):
            show_messages("the call that inferred it", row["messages"])


def sent_pane(view: dict[str, pd.DataFrame]) -> None:
    sent = view["sent"]
    if sent.empty:
        st.caption("This node sent no gradient (it has no LLM-produced inputs, or it "
                   "received no feedback).")
        return
    for row in sent.to_dict("records"):
        with st.container(border=True):
            st.markdown(f"**to {md(row['node_id'])}** ({md(row['kind'])})")
            show_text("gradient", row["content"], expanded=True)
    first = sent.iloc[0]
    if isinstance(first.get("messages"), str):
        show_messages("the backward prompt (one joint call for all predecessors)",
                      first["messages"])
        show_text("backward reply", first.get("response"))


def _number(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if pd.isna(number) else number


def update_pane(update: dict, *, node: str | None = None, show_call: bool = True) -> None:
    """The proposed edit as a word-level diff, its fate and the validation scores."""
    changed = (update.get("new_prompt") or "") != (update.get("old_prompt") or "")
    verdict = ("accepted" if update.get("accepted") else
               "rejected by the validation gate" if changed else "no change proposed")
    color = "green" if update.get("accepted") else ("red" if changed else "gray")
    st.markdown(f":{color}-badge[{verdict}]" + (f" · node **{md(node)}**" if node else ""))
    before, after = _number(update.get("val_before")), _number(update.get("val_after"))
    c1, c2 = st.columns(2)
    c1.metric("validation before", fmt(before))
    c2.metric("validation after (candidate)", fmt(after),
              delta=None if before is None or after is None else round(after - before, 3))
    only = st.toggle("show only what changed", key=f"only_{node}_{update.get('step')}")
    show_diff(update.get("old_prompt") or "", update.get("new_prompt") or "", only_changes=only)
    if update.get("parse_error") and not pd.isna(update["parse_error"]):
        st.caption(f"note: {update['parse_error']}")
    show_text("reasoning", update.get("reasoning"))
    if show_call and isinstance(update.get("messages"), str):
        show_messages("update prompt", update["messages"])
