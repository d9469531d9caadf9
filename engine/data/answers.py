"""Fields that hold the answer, which no node may read.

A graph's `target_field` holds the answer; so do some fields the named loaders keep
beside it (GSM8K's `answer`, LIAR's `is_lie`, BBH's `target`). A node that reads one of
them would see what it is graded against. The loaders already drop the fields that only
restate the answer (GSM8K's worked `solution`, LIAR's six-way `label`); these are listed
too, so a graph naming them is refused just the same.
"""

from __future__ import annotations

from typing import Any

ANSWER_FIELDS: dict[str, tuple[str, ...]] = {
    "gsm8k": ("answer", "solution"),
    "liar": ("is_lie", "label"),
    "bbh": ("target",),
}


def answer_fields(target_field: str, dataset: str | None) -> set[str]:
    """The target field, and the answer-bearing fields of a named dataset."""
    fields = {target_field}
    dataset = (dataset or "").strip()
    if dataset and not dataset.endswith(".jsonl"):
        fields.update(ANSWER_FIELDS.get(dataset.partition("/")[0], ()))
    return fields


def first_answer_input(graph: Any) -> tuple[Any, str, str] | None:
    """(node, field, what the field is) for the first node of a graph spec that reads a
    field holding the answer; None when no node does. The graph module turns it into its
    GraphError."""
    forbidden = answer_fields(graph.target_field, graph.dataset) - set(graph.node_ids)
    for node in graph.nodes:
        leaked = [name for name in node.inputs if name in forbidden]
        if leaked:
            what = ("the target field" if leaked[0] == graph.target_field
                    else "a field that holds the answer or label")
            return node, leaked[0], what
    return None
