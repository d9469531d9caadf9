"""Fields that hold the answer, which no node may read.

A graph's `target_field` holds the answer; so do some fields the named loaders keep
beside it (GSM8K's `answer`, LIAR's `is_lie`, BBH's `target`). A node that reads one of
them would see what it is graded against. The loaders already drop the fields that only
restate the answer (GSM8K's worked `solution`, LIAR's six-way `label`); these are listed
too, so a graph naming them is refused just the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.graph import Graph

ANSWER_FIELDS: dict[str, tuple[str, ...]] = {
    "gsm8k": ("answer", "solution"),
    "liar": ("is_lie", "label"),
    "bbh": ("target",),
}


def answer_fields(graph: Graph) -> set[str]:
    """The graph's target field, and the answer-bearing fields of its named dataset."""
    fields = {graph.target_field}
    dataset = (graph.dataset or "").strip()
    if dataset and not dataset.endswith(".jsonl"):
        fields.update(ANSWER_FIELDS.get(dataset.partition("/")[0], ()))
    return fields


def check_no_answer_inputs(graph: Graph) -> None:
    """Raise GraphError naming the first node that reads a field holding the answer."""
    from engine.core.graph import GraphError

    forbidden = answer_fields(graph) - set(graph.node_ids)
    for node in graph.nodes:
        leaked = [name for name in node.inputs if name in forbidden]
        if leaked:
            what = ("the target field" if leaked[0] == graph.target_field
                    else "a field that holds the answer or label")
            raise GraphError(graph.path or "<graph>", f"input '{leaked[0]}' is {what}: no "
                             "node may read the answer it is graded against",
                             node=node.id, line=node.line)
