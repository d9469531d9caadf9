"""The graph drawing (one vis-network component; a click selects a node), decorated for
the selected step.

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/graph_view.py."""

from __future__ import annotations

from dashboard import data, probe_data
from dashboard.state import Selection
from dashboard.views import graph_model as gh
from dashboard.views.colors import Coloring, color_nodes
from dashboard.views.text import chars, fmt
from engine.probes.verdict import LoggedBlame, NodeFact, logged_blame


def decoration(sel: Selection, graph: data.RunGraph, quantity: str, *,
               highlight: str | None = None, example_flows: bool = True,
               height: int = 440) -> gh.Decoration:
    """Colours, captions, tooltips and gradient flows for the graph at the selected step."""
    stats = node_rows(sel)
    found = step_blame(sel, graph)
    coloring = color_nodes(stats, quantity, found.facts)
    flows = data.flows(sel.db, sel.run, sel.step, sel.example if example_flows else None)
    tooltips = node_tooltips(sel, graph, stats, found)
    return gh.Decoration(
        colors=tuple(coloring.colors.items()), captions=tuple(coloring.captions.items()),
        tooltips=tuple(tooltips.items()),
        flows=tuple((r.from_node_id, r.node_id, int(r.messages), float(r.mean_chars or 0))
                    for r in flows.itertuples()),
        highlight=highlight if highlight is not None else sel.node,
        link=tuple(sel.link(node=None).items()), height=height)


def llm_nodes(graph: data.RunGraph) -> list[str]:
    """The graph's LLM nodes (those blame probes), in topological order."""
    return [n for n in graph.model.order if n not in graph.model.functions]


def step_blame(sel: Selection, graph: data.RunGraph) -> LoggedBlame:
    """The probes' verdict at the selected step and what it rests on per node: the one
    function (engine.probes.verdict.logged_blame) behind the banner (views.blame
    .show_verdict, fed the same rows) and the drawing's blame colours and labels."""
    rows = probe_data.node_blame(sel.db, sel.run, sel.step).to_dict("records")
    updates = data.updates(sel.db, sel.run, sel.step).to_dict("records")
    return logged_blame(rows, updates, llm_nodes(graph))


def coloring(sel: Selection, graph: data.RunGraph, quantity: str) -> Coloring:
    """The drawing's colours, labels and legend for `quantity` at the selected step."""
    return color_nodes(node_rows(sel), quantity, step_blame(sel, graph).facts)


def node_rows(sel: Selection) -> list[dict]:
    """reader.node_step_stats rows with the probes' blame columns (probed, flips,
    edit_probed, edit_flips, leaks) merged in."""
    stats = data.node_stats(sel.db, sel.run, sel.step).to_dict("records")
    blame = {r["node_id"]: r for r in
             probe_data.node_blame(sel.db, sel.run, sel.step).to_dict("records")}
    return [{**r, **{k: v for k, v in blame.get(r["node_id"], {}).items() if k != "node_id"}}
            for r in stats]


def blame_line(fact: NodeFact | None, row: dict) -> str:
    """A tooltip's blame line: the count the verdict weighed for the node, in words, and
    the other kind of probe's count beside it."""
    def fixed(flips: object, probed: object) -> str:
        return f"fixed {int(flips or 0)} of {int(probed or 0)} failing examples probed"

    gradient = (f"following its gradient {fixed(row.get('flips'), row.get('probed'))}"
                if row.get("probed") else "")
    edit = ("its proposed prompt, run alone, "
            f"{fixed(row.get('edit_flips'), row.get('edit_probed'))}"
            if row.get("edit_probed") else "")
    if fact is None or fact.standing == "not probed":
        return "blame: no probes at this node yet" if not (gradient or edit) else \
            f"blame: not compared ({gradient or edit})"
    if fact.standing == "copied":
        return "blame: its proposal copied training examples: not probed, not compared"
    said = {"blamed": " (the probes blame this node)",
            "tied": " (a tie: the fault lies in one or more of the tied nodes)"}
    if fact.standing == "unchanged":
        weighed = (f"its update left the prompt as it was, so its edit fixed 0 of "
                   f"{fact.counted} failing examples")
    elif fact.kind == "edit":
        weighed = f"its proposed prompt, run alone, {fixed(fact.flips, fact.counted)}"
    else:
        weighed = f"following its gradient {fixed(fact.flips, fact.counted)}"
    other = gradient if fact.kind == "edit" else edit
    return (f"blame ({fact.kind} probes decide): {weighed}{said.get(fact.standing, '')}"
            + (f"\nalso: {other}" if other else ""))


def node_tooltips(sel: Selection, graph: data.RunGraph, stats: list[dict],
                  found: LoggedBlame | None = None) -> dict[str, str]:
    """Plain-text tooltip per node: its numbers at the step (its blame line from the
    verdict's facts) and, for the selected example, the start of its output (model text:
    escaped by the drawing)."""
    by_node = {r["node_id"]: r for r in stats}
    facts = {f.node: f for f in (found or step_blame(sel, graph)).facts}
    outputs: dict[str, str] = {}
    if sel.example:
        acts = data.example_trace(sel.db, sel.run, sel.step, sel.example)["activations"]
        outputs = dict(zip(acts["node_id"], acts["output_text"].fillna("")))
    tips = {}
    for node in graph.model.order:
        r = by_node.get(node, {})
        lines = [blame_line(facts.get(node), r),
                 f"gradients received: {r.get('gradients', 0)}",
                 f"mean aggregated gradient: {chars(r.get('grad_chars'))}",
                 f"edit: {r.get('edit') or 'none'}",
                 f"calls {r.get('calls', 0)}, tokens {fmt(r.get('tokens'), '.0f')}"]
        if node in outputs:
            lines.append(f"output for {sel.example}: {outputs[node]}")
        tips[node] = "\n".join(lines)
    return tips
