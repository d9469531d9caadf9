"""The agentic graph drawn with pyvis: a left-to-right layered layout computed in Python,
physics off, every resource inlined (works offline), every text escaped.

pyvis labels are drawn on the canvas, but its tooltips are HTML: this module always
renders them through pyvis' HTML popup (each tooltip carries a link to the node
inspector), so `escape` is what keeps a model reply such as
`<img src=x onerror=alert(1)>` a piece of text.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from urllib.parse import urlencode

from pyvis.network import Network

LOSS_ID = "__loss__"
FIELD_PREFIX = "__field__:"
GREY = "#d9d9d9"
HIGHLIGHT_BORDER = "#ff6f00"
FORWARD_EDGE = "#9e9e9e"
GRADIENT_EDGE = "#e65100"
X_GAP, Y_GAP = 170, 90
TOOLTIP_CHARS = 300


@dataclass(frozen=True)
class GraphModel:
    """The shape of a graph, reduced to what drawing needs (hashable, so cacheable)."""

    order: tuple[str, ...]  # node ids in topological order
    inputs: tuple[tuple[str, tuple[str, ...]], ...]  # (node, its inputs: fields and nodes)
    fields: tuple[str, ...]  # example fields the nodes read
    output: str
    functions: tuple[str, ...] = ()  # nodes of kind 'function'

    @classmethod
    def from_graph(cls, graph) -> GraphModel:
        """From an `engine.graph.Graph`."""
        used = [f for f in graph.input_fields if any(f in n.inputs for n in graph.nodes)]
        return cls(order=tuple(graph.topological_order()),
                   inputs=tuple((n.id, tuple(n.inputs)) for n in graph.nodes),
                   fields=tuple(used), output=graph.output_node.id,
                   functions=tuple(n.id for n in graph.nodes if n.kind == "function"))

    def predecessors(self, node_id: str) -> list[str]:
        nodes = set(self.order)
        return [i for i in dict(self.inputs).get(node_id, ()) if i in nodes]

    def successors(self, node_id: str) -> list[str]:
        return [n for n in self.order if node_id in dict(self.inputs).get(n, ())]


@dataclass(frozen=True)
class Decoration:
    """What one drawing shows on top of the shape. All mappings are tuples of pairs.

    colors: node -> fill colour; captions: node -> a short second label line (numbers,
    never model text); tooltips: node -> plain text (escaped here); flows: gradient
    messages (from_node, to_node, messages, mean_chars) with from_node 'loss' for the
    output; highlight: the node (or LOSS_ID) to outline; link: query parameters
    for the inspector link in each tooltip (without node)."""

    colors: tuple[tuple[str, str], ...] = ()
    captions: tuple[tuple[str, str], ...] = ()
    tooltips: tuple[tuple[str, str], ...] = ()
    flows: tuple[tuple[str, str, int, float], ...] = ()
    highlight: str | None = None
    link: tuple[tuple[str, str], ...] = field(default=())
    height: int = 440


def escape(text: object) -> str:
    """HTML-escape any text that reaches pyvis (labels, tooltips, link URLs)."""
    return html.escape("" if text is None else str(text), quote=True)


def layered_positions(model: GraphModel) -> dict[str, tuple[float, float]]:
    """x from the node's layer (longest path from the inputs), y spread within the layer;
    fields sit in a layer before the first node and the loss after the output node.

    Within a layer nodes are sorted by the mean y of their predecessors (barycentre),
    which keeps edges from crossing on common graph shapes."""
    layer: dict[str, int] = {}
    for node in model.order:
        preds = model.predecessors(node)
        layer[node] = 1 + max((layer[p] for p in preds), default=0)
    columns: dict[int, list[str]] = {0: [FIELD_PREFIX + f for f in model.fields]}
    for node in model.order:
        columns.setdefault(layer[node], []).append(node)
    columns.setdefault(layer.get(model.output, 0) + 1, []).append(LOSS_ID)
    positions: dict[str, tuple[float, float]] = {}
    for x in sorted(columns):
        names = columns[x]
        if x > 0:
            names = sorted(names, key=lambda n: (_barycentre(model, n, positions),
                                                 _rank(model, n)))
        top = -(len(names) - 1) * Y_GAP / 2
        for i, name in enumerate(names):
            positions[name] = (x * X_GAP, top + i * Y_GAP)
    return positions


def _barycentre(model: GraphModel, node: str, positions: dict) -> float:
    if node == LOSS_ID:
        sources = [model.output]
    else:
        sources = [FIELD_PREFIX + i if i in model.fields else i
                   for i in dict(model.inputs).get(node, ())]
    ys = [positions[s][1] for s in sources if s in positions]
    return sum(ys) / len(ys) if ys else 0.0


def _rank(model: GraphModel, node: str) -> int:
    return model.order.index(node) if node in model.order else len(model.order)


def vis_nodes(model: GraphModel, deco: Decoration) -> list[dict]:
    """The node dicts handed to pyvis (positions fixed, every text escaped)."""
    positions = layered_positions(model)
    colors, captions, tips = dict(deco.colors), dict(deco.captions), dict(deco.tooltips)
    nodes = []
    for name, (x, y) in positions.items():
        if name.startswith(FIELD_PREFIX):
            label = name[len(FIELD_PREFIX):]
            nodes.append(_node(name, escape(label), x, y, "#f3f3f3", "box",
                               f"<b>input field</b> {escape(label)}", deco.highlight, 16))
        elif name == LOSS_ID:
            nodes.append(_node(name, "loss", x, y, "#ffe0e0", "hexagon",
                               "<b>loss</b>: the metric on the output, and the output "
                               "gradient", deco.highlight, 18))
        else:
            label = escape(name) + (f"\n{escape(captions[name])}" if captions.get(name) else "")
            shape = "diamond" if name in model.functions else "box"
            title = _tooltip(name, tips.get(name, ""), deco.link)
            nodes.append(_node(name, label, x, y, colors.get(name, GREY), shape, title,
                               deco.highlight, 20))
    return nodes


def _node(node_id: str, label: str, x: float, y: float, color: str, shape: str, title: str,
          highlight: str | None, size: int) -> dict:
    chosen = node_id == highlight
    return {
        "id": node_id, "label": label, "x": x, "y": y, "physics": False, "shape": shape,
        "title": title, "borderWidth": 5 if chosen else 1,
        "color": {"background": color, "border": HIGHLIGHT_BORDER if chosen else "#555555",
                  "highlight": {"background": color, "border": HIGHLIGHT_BORDER}},
        "font": {"size": size + (4 if chosen else 0), "face": "monospace"},
        "margin": 10,
    }


def _tooltip(node: str, text: str, link: tuple[tuple[str, str], ...]) -> str:
    short = text if len(text) <= TOOLTIP_CHARS else text[:TOOLTIP_CHARS] + " …"
    body = "<br>".join(escape(line) for line in short.splitlines())
    href = escape("./inspect?" + urlencode([*link, ("node", node)]))
    return (f'<div style="max-width:360px;padding:6px;font:12px monospace;white-space:normal">'
            f"<b>{escape(node)}</b><br>{body}<br>"
            f'<a href="{href}" target="_blank" rel="noopener">open in the node inspector</a>'
            "</div>")


def vis_edges(model: GraphModel, deco: Decoration) -> list[dict]:
    """Forward edges (grey) plus one curved orange edge per gradient flow, drawn in the
    direction the gradient travelled (from the successor back to the node)."""
    edges = []
    for node, inputs in model.inputs:
        for source in inputs:
            src = FIELD_PREFIX + source if source in model.fields else source
            edges.append({"from": src, "to": node, "arrows": "to", "color": FORWARD_EDGE,
                          "width": 1.5, "smooth": False})
    edges.append({"from": model.output, "to": LOSS_ID, "arrows": "to", "color": FORWARD_EDGE,
                  "width": 1.5, "dashes": True, "smooth": False})
    for source, target, messages, chars in deco.flows:
        src = LOSS_ID if source == "loss" else source
        edges.append({
            "from": src, "to": target, "arrows": "to", "color": GRADIENT_EDGE,
            "width": min(1.5 + messages, 6), "dashes": [6, 4],
            "label": escape(f"{messages}× ∇ {int(chars or 0)}c"),
            "font": {"size": 10, "color": GRADIENT_EDGE, "strokeWidth": 3},
            "smooth": {"enabled": True, "type": "curvedCW", "roundness": 0.3},
        })
    return edges


_OPTIONS = {
    "physics": {"enabled": False},
    "interaction": {"hover": True, "tooltipDelay": 120, "dragNodes": True,
                    "zoomView": True, "navigationButtons": False},
    "layout": {"hierarchical": {"enabled": False}},
    "edges": {"selectionWidth": 2},
}
# The page template links Bootstrap from a CDN that the graph does not need: dropped so
# the page makes no network request.
_CDN_TAGS = re.compile(r"<link[^>]*cdn\.jsdelivr\.net[^>]*/?>|<script[^>]*cdn\.jsdelivr\.net"
                       r"[^>]*>\s*</script>", re.S)


def graph_html(model: GraphModel, deco: Decoration) -> str:
    """A self-contained HTML page (vis-network inlined, no CDN) drawing the graph."""
    net = Network(height=f"{deco.height}px", width="100%", directed=True,
                  cdn_resources="in_line", heading="", bgcolor="#ffffff")
    for node in vis_nodes(model, deco):
        net.add_node(node.pop("id"), **node)
    for edge in vis_edges(model, deco):
        net.add_edge(edge.pop("from"), edge.pop("to"), **edge)
    net.set_options(json.dumps(_OPTIONS))
    page = net.generate_html()
    page = _CDN_TAGS.sub("", page)
    # The template's empty <h1> headings take vertical space: drop them.
    return re.sub(r"<center>\s*<h1>\s*</h1>\s*</center>", "", page)
