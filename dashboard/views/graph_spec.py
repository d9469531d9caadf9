"""What the graph drawing shows, as plain data for the vis-network component
(`dashboard/components/graph/index.html`): node boxes sized from their labels and placed
left to right by topological layer so that none overlap, forward and gradient edges with
labels, and a text colour per node chosen for WCAG AA contrast against its fill.

Every text here is drawn by vis-network on a canvas, or put into a tooltip with
`textContent`: nothing is ever parsed as HTML, so model text needs no escaping.
"""

from __future__ import annotations

from dashboard.views.graph_model import FIELD_PREFIX, LOSS_ID, Decoration, GraphModel
from dashboard.views.graph_model import layered_positions as _layer_order
from dashboard.views.text import chars as chars_text

GREY = "#d9d9d9"
FIELD_FILL = "#f3f3f3"
LOSS_FILL = "#ffe0e0"
SELECTED_BORDER = "#e65100"
FORWARD_EDGE = "#8a8a8a"
GRADIENT_EDGE = "#e65100"
GRADIENT_LABEL = "#8f3200"  # 7.4:1 on white: readable edge labels
NODE_FONT, FIELD_FONT = 16, 14
CHAR_WIDTH = 0.62  # of the font size: monospace advance, rounded up
LINE_HEIGHT = 1.3  # of the font size
MARGIN = 10  # px of padding inside a box, each side
H_GAP, V_GAP = 170, 44  # px between columns (room for an edge label), between boxes
TOOLTIP_CHARS = 600
# a node's column is laid out as if its caption were at least this long, so that a caption
# that changes on a live update ("∇ 82 chars" -> "tie · edit fixes 17/24") moves no box and
# the drawing's frame, fitted once, still holds every box (the component never refits then)
CAPTION_ROOM = 24


def _channel(value: int) -> float:
    c = value / 255
    return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4


def luminance(color: str) -> float:
    """Relative luminance (WCAG 2) of a #rrggbb colour."""
    r, g, b = (int(color.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4))
    return 0.2126 * _channel(r) + 0.7152 * _channel(g) + 0.0722 * _channel(b)


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio between two colours (1 to 21)."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def text_color(fill: str) -> str:
    """Black or white, whichever contrasts more with `fill` (always at least 4.58:1)."""
    return "#000000" if contrast(fill, "#000000") >= contrast(fill, "#ffffff") else "#ffffff"


def box_size(label: str, font: int) -> tuple[float, float]:
    """Width and height (px) of a box around a monospace label, padding included."""
    lines = label.split("\n")
    width = max(len(line) for line in lines) * font * CHAR_WIDTH + 2 * MARGIN + 4
    height = len(lines) * font * LINE_HEIGHT + 2 * MARGIN + 4
    return width, height


def _bare(model: GraphModel, node: str) -> str:
    """A node's label without a caption."""
    return f"ƒ {node}" if node in model.functions else node


def _labels(model: GraphModel, deco: Decoration) -> dict[str, str]:
    """One line per box: vis-network clips the descenders of every line but the last of a
    multi-line label in some fonts (an underscore vanishes, "failing" reads "failino")."""
    captions = dict(deco.captions)
    labels = {FIELD_PREFIX + f: f for f in model.fields}
    for node in model.order:
        label = _bare(model, node)
        if captions.get(node):
            label += f" · {captions[node]}"
        labels[node] = " ".join(label.split())
    labels[LOSS_ID] = "loss"
    return labels


def placed_boxes(model: GraphModel, deco: Decoration
                 ) -> dict[str, tuple[float, float, float, float]]:
    """Centre x, centre y, width and height of every box: layers left to right (the
    order within a layer from `graph_model.layered_positions`), each column as wide as
    its widest box plus a gap, boxes stacked with a gap: no two boxes overlap."""
    labels = _labels(model, deco)
    order = _layer_order(model)  # x: layer * constant, y: rank within the layer
    columns: dict[float, list[str]] = {}
    for name, (x, _y) in sorted(order.items(), key=lambda item: (item[1][0], item[1][1])):
        columns.setdefault(x, []).append(name)
    boxes: dict[str, tuple[float, float, float, float]] = {}
    left = 0.0
    for x in sorted(columns):
        names = columns[x]
        sizes = {n: box_size(labels[n], FIELD_FONT if n.startswith(FIELD_PREFIX)
                             else NODE_FONT) for n in names}
        room = [box_size(_bare(model, n) + " · " + "0" * CAPTION_ROOM, NODE_FONT)[0]
                for n in names if n in model.order]
        width = max([w for w, _ in sizes.values()] + room)
        total = sum(h for _, h in sizes.values()) + V_GAP * (len(names) - 1)
        top = -total / 2
        for n in names:
            w, h = sizes[n]
            boxes[n] = (left + width / 2, top + h / 2, w, h)
            top += h + V_GAP
        left += width + H_GAP
    return boxes


def graph_spec(model: GraphModel, deco: Decoration) -> dict:
    """Nodes, edges and the selected node, as the component expects them."""
    labels, boxes = _labels(model, deco), placed_boxes(model, deco)
    colors, tips = dict(deco.colors), dict(deco.tooltips)
    nodes = []
    for name, (x, y, _, _) in boxes.items():
        if name.startswith(FIELD_PREFIX):
            kind, fill, tip = "field", FIELD_FILL, f"input field {labels[name]}"
        elif name == LOSS_ID:
            kind, fill = "loss", LOSS_FILL
            tip = "loss: the metric on the output, and the output gradient"
        else:
            kind = "function" if name in model.functions else "llm"
            fill = colors.get(name, GREY)
            tip = tips.get(name, "")
            tip = f"{name}\n{tip[:TOOLTIP_CHARS]}{' …' if len(tip) > TOOLTIP_CHARS else ''}"
        nodes.append({
            "id": name, "label": labels[name], "x": round(x, 1), "y": round(y, 1),
            "kind": kind, "fill": fill, "text": text_color(fill), "tooltip": tip,
            "font": FIELD_FONT if kind == "field" else NODE_FONT,
            "selected": name == deco.highlight,
        })
    top = min((y - h / 2 for _, y, _, h in boxes.values()), default=0)
    bottom = max((y + h / 2 for _, y, _, h in boxes.values()), default=0)
    height = int(min(max(bottom - top + 120, 220), max(deco.height, 220)))
    return {"nodes": nodes, "edges": _edges(model, deco), "selected": deco.highlight,
            "height": height, "frame": frame(model, deco, boxes)}


def frame(model: GraphModel, deco: Decoration,
          boxes: dict[str, tuple[float, float, float, float]] | None = None) -> list[float]:
    """[left, top, right, bottom] of what the component fits into view: every column at
    the width it is laid out with (room for a caption of CAPTION_ROOM characters, see
    placed_boxes), so a longer caption on a later update still shows whole."""
    boxes = boxes if boxes is not None else placed_boxes(model, deco)
    xs, ys = [], []
    for name, (x, y, w, h) in boxes.items():
        if name in model.order:
            w = max(w, box_size(_bare(model, name) + " · " + "0" * CAPTION_ROOM,
                                NODE_FONT)[0])
        xs += [x - w / 2, x + w / 2]
        ys += [y - h / 2, y + h / 2]
    if not xs:
        return [0.0, 0.0, 0.0, 0.0]
    return [round(min(xs), 1), round(min(ys), 1), round(max(xs), 1), round(max(ys), 1)]


def _edges(model: GraphModel, deco: Decoration) -> list[dict]:
    """Forward edges (grey) and one dashed, labelled edge per gradient flow, drawn in the
    direction the gradient travelled (from the successor back to the node)."""
    edges = []
    for node, inputs in model.inputs:
        for source in inputs:
            src = FIELD_PREFIX + source if source in model.fields else source
            edges.append({"from": src, "to": node, "kind": "forward"})
    edges.append({"from": model.output, "to": LOSS_ID, "kind": "forward"})
    for source, target, messages, chars in deco.flows:
        edges.append({"from": LOSS_ID if source == "loss" else source, "to": target,
                      "kind": "gradient", "width": min(1.5 + messages, 6),
                      "label": f"{messages}× ∇ {chars_text(chars)}"})
    return edges
