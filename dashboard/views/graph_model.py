"""The shape of an agentic graph for drawing (GraphModel), what a drawing shows on top of
it (Decoration), and the left-to-right layered order of its nodes.

`graph_spec` turns these into the data of the one drawing (the vis-network component).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOSS_ID = "__loss__"
FIELD_PREFIX = "__field__:"
X_GAP, Y_GAP = 170, 90


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
        """From an `engine.core.graph.GraphSpec`."""
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
