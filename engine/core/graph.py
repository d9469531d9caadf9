"""Agentic graphs: the YAML format, validation with file/line/node errors, and topology.

A graph is a DAG of nodes. A node reads named inputs (example fields or other nodes)
and produces one text output. LLM nodes carry a prompt (the trainable parameter);
function nodes apply a named, registered Python function and are never trainable.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from engine.core.functions import FUNCTIONS
from engine.data.answers import first_answer_input

GRAPH_KEYS = {
    "name": "graph name, shown in the run log and the dashboard",
    "description": "free text shown in the dashboard",
    "dataset": "a named dataset (gsm8k, liar, bbh/<task>) or a .jsonl path relative to the file",
    "input_fields": "example fields that nodes may read",
    "target_field": "the example field holding the expected answer",
    "metric": "exact_match | numeric | choice | yes_no | auto | judge",
    "rubric": "grading rubric for metric: judge",
    "answer_format": "instruction appended to the output node's forward prompt",
    "splits": "default split sizes: {train, val, test}",
    "steps": "default number of optimization steps for `run` (its --steps; default 4)",
    "proposals": "default candidate prompt sets per step for `run` (its --proposals; default 1)",
    "contrast": "a sibling-blind method whose gradients `run` writes beside a sibling-aware "
                "method's (its --contrast: semantic-nosibling or textgrad)",
    "nodes": "the list of nodes",
}
# Sibling-blind methods whose gradients a sibling-aware run can write beside its own
# (`contrast:`, `run --contrast`): never used for an update; the Learn tour's "Without
# siblings" shows both from one run (engine/core/backward.py: contrast_gradients).
CONTRAST_METHODS = ("semantic-nosibling", "textgrad")

NODE_KEYS = {
    "id": "unique node id",
    "prompt": "the node's instruction (its trainable parameter)",
    "inputs": "names of example fields or node ids this node reads",
    "kind": "llm (default) or function",
    "function": "registered function name, for kind: function",
    "trainable": "false freezes the prompt (default true for llm nodes)",
    "output": "true on exactly one node: the graph's answer",
    "max_tokens": "generation limit for this node's forward call",
    "description": "what the node does; a function node's task in the backward pass",
    "recorded": "true for a call imported from traces: its messages are each example's "
                "recorded call, its inputs put back where the trace had them",
}
METRICS = ("exact_match", "numeric", "choice", "yes_no", "auto", "judge")
SPLIT_KEYS = ("train", "val", "test")


class GraphError(Exception):
    """A graph file problem, rendered as one line: FILE:LINE: node 'ID': problem."""

    def __init__(
        self, path: str | Path, message: str, node: str | None = None, line: int | None = None
    ):
        self.path, self.message, self.node, self.line = str(path), message, node, line
        where = self.path + (f":{line}" if line else "")
        who = f"node '{node}': " if node else ""
        super().__init__(f"{where}: {who}{message}")


@dataclass(frozen=True)
class Node:
    id: str
    prompt: str = ""
    inputs: tuple[str, ...] = ()
    kind: str = "llm"
    function: str | None = None
    trainable: bool = True
    output: bool = False
    max_tokens: int | None = None
    line: int | None = None
    description: str = ""
    # a call imported from traces (engine/traces): its forward messages are the example's
    # recorded call with its inputs in their slots (engine/prompts/recorded.py)
    recorded: bool = False
    # a Python callable bound to this function node (engine.api.builder); None: FUNCTIONS[function]
    fn: Callable[..., Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class _Topology:
    """A graph's edges and Kahn order, built once per GraphSpec in O((V + E) log V)."""

    order: tuple[str, ...]
    predecessors: dict[str, tuple[str, ...]]
    successors: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, nodes: tuple[Node, ...], index: dict[str, Node]) -> _Topology:
        position = {n.id: i for i, n in reversed(list(enumerate(nodes)))}
        preds = {i: tuple(x for x in index[i].inputs if x in index) for i in index}
        readers: dict[str, list[str]] = {i: [] for i in index}
        indegree = {}
        for node_id, inputs in preds.items():
            distinct = dict.fromkeys(inputs)
            indegree[node_id] = len(distinct)
            for name in distinct:
                readers[name].append(node_id)
        ready = [position[i] for i in index if indegree[i] == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            current = nodes[heapq.heappop(ready)].id
            order.append(current)
            for reader in readers[current]:
                indegree[reader] -= 1
                if indegree[reader] == 0:
                    heapq.heappush(ready, position[reader])
        rank = {node_id: i for i, node_id in enumerate(order)}
        successors = {i: tuple(sorted((r for r in readers[i] if r in rank), key=rank.get))
                      for i in index}
        return cls(tuple(order), preds, successors)


@dataclass(frozen=True)
class GraphSpec:
    name: str
    nodes: tuple[Node, ...]
    input_fields: tuple[str, ...]
    target_field: str
    metric: str
    dataset: str | None = None
    description: str = ""
    rubric: str = ""
    answer_format: str = ""
    splits: dict[str, int] = field(default_factory=dict)
    steps: int | None = None  # `run`'s default --steps for this graph (None: run's own)
    proposals: int | None = None  # `run`'s default --proposals for this graph
    contrast: str | None = None  # `run`'s default --contrast for this graph
    path: str = ""
    yaml_text: str = ""
    # a Python metric (engine.api.builder): (example, prediction) -> float | (float, feedback)
    metric_fn: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    # Graphs are immutable, so the id index and the topology are computed once, on first
    # use, and every query after that is a dictionary lookup: O(V + E) in all.
    @cached_property
    def _index(self) -> dict[str, Node]:
        index: dict[str, Node] = {}
        for n in self.nodes:
            index.setdefault(n.id, n)  # a duplicate id is refused by validate_structure
        return index

    @cached_property
    def _topology(self) -> _Topology:
        return _Topology.of(self.nodes, self._index)

    def node(self, node_id: str) -> Node:
        return self._index[node_id]

    @property
    def node_ids(self) -> list[str]:
        return [n.id for n in self.nodes]

    @property
    def output_node(self) -> Node:
        return next(n for n in self.nodes if n.output)

    def predecessors(self, node_id: str) -> list[str]:
        """Node inputs of `node_id` (example fields excluded), in declared order."""
        return list(self._topology.predecessors[node_id])

    def successors(self, node_id: str) -> list[str]:
        """Nodes that read `node_id`, in topological order (a fixed, documented order)."""
        return list(self._topology.successors[node_id])

    def topological_order(self) -> list[str]:
        """Kahn's algorithm; ties broken by declaration order, so the order is stable.
        Nodes on a cycle are left out (validate_structure reports them)."""
        return list(self._topology.order)

    def run_defaults(self) -> dict[str, int]:
        """The run settings this graph file sets for itself (`steps`, `proposals`,
        `contrast`), which `run` takes under its own flags."""
        return {name: value for name, value in (("steps", self.steps),
                                                ("proposals", self.proposals),
                                                ("contrast", self.contrast))
                if value is not None}

    @property
    def trainable_nodes(self) -> list[str]:
        return [n for n in self.topological_order() if self.node(n).trainable]

    def with_dataset(self, dataset: str) -> GraphSpec:
        return replace(self, dataset=dataset)


# --- loading -------------------------------------------------------------------------


def load_graph(path: str | Path, functions: Mapping[str, Callable[..., Any]] | None = None
               ) -> GraphSpec:
    """Read and validate a graph file; raises GraphError with one clear line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GraphError(path, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GraphError(path, f"cannot read file ({exc.__class__.__name__})") from None
    return parse_graph(text, path, functions)


def parse_graph(text: str, path: str | Path = "<graph>",
                functions: Mapping[str, Callable[..., Any]] | None = None) -> GraphSpec:
    """Parse and validate graph text; `functions` binds extra function names to Python
    callables (engine.api.builder); a graph file alone never imports code."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise GraphError(path, f"YAML syntax error: {problem}",
                         line=mark.line + 1 if mark else None) from None
    except RecursionError:
        raise GraphError(path, "YAML nested too deeply to be a graph file") from None
    _refuse_foreign_tags(root, path)
    if not isinstance(root, yaml.MappingNode):
        raise GraphError(path, "a graph file must be a YAML mapping with a 'nodes' list", line=1)
    top = _mapping(root, path, None)
    for key, (_, line) in top.items():
        if key not in GRAPH_KEYS:
            raise GraphError(path, f"unknown key {str(key)!r} (allowed: {', '.join(GRAPH_KEYS)})",
                             line=line)

    def scalar(key: str, default: Any = None, required: bool = False) -> Any:
        if key not in top:
            if required:
                raise GraphError(path, f"missing required key '{key}'", line=1)
            return default
        value, line = top[key]
        value = _plain(value, path, line, None)
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise GraphError(path, f"'{key}' must be a single value", line=line)
        if value is None and required:
            raise GraphError(path, f"'{key}' must not be empty", line=line)
        return value

    name = str(scalar("name", required=True))
    metric = str(scalar("metric", "exact_match"))
    if metric not in METRICS:
        raise GraphError(path, f"unknown metric '{metric}' (allowed: {', '.join(METRICS)})",
                         line=top["metric"][1])
    input_fields = _string_list(top, "input_fields", path, required=True)
    splits = _splits(top, path)
    steps = _whole(top, "steps", path, 0)
    proposals = _whole(top, "proposals", path, 1)
    contrast = None if scalar("contrast") is None else str(scalar("contrast"))
    if contrast is not None:
        if contrast not in CONTRAST_METHODS:
            raise GraphError(path, f"unknown contrast '{contrast}' (allowed: "
                                   f"{', '.join(CONTRAST_METHODS)})", line=top["contrast"][1])

    if "nodes" not in top:
        raise GraphError(path, "missing required key 'nodes'", line=1)
    nodes_node, nodes_line = top["nodes"]
    if not isinstance(nodes_node, yaml.SequenceNode) or not nodes_node.value:
        raise GraphError(path, "'nodes' must be a non-empty list", line=nodes_line)
    nodes = [_parse_node(item, path, functions or {}) for item in nodes_node.value]
    graph = GraphSpec(
        name=name,
        nodes=tuple(nodes),
        input_fields=tuple(input_fields),
        target_field=str(scalar("target_field", required=True)),
        metric=metric,
        dataset=None if scalar("dataset") is None else str(scalar("dataset")),
        description=str(scalar("description", "") or ""),
        rubric=str(scalar("rubric", "") or ""),
        answer_format=str(scalar("answer_format", "") or ""),
        splits=splits,
        steps=steps,
        proposals=proposals,
        contrast=contrast,
        path=str(path),
        yaml_text=text,
    )
    validate_structure(graph)
    return graph


# The tags `yaml.safe_load` builds plain data from; any other tag (e.g. !!python/object)
# is refused before anything is constructed, so a graph file never runs code.
SAFE_TAGS = frozenset(t for t in yaml.SafeLoader.yaml_constructors if t)


def _refuse_foreign_tags(root: yaml.Node | None, path: str | Path) -> None:
    """Walk the composed document (iteratively: it may be deep, or recursive through
    aliases) and refuse a tag that safe loading cannot build."""
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.tag not in SAFE_TAGS:
            raise GraphError(path, f"YAML tag '{node.tag}' is not allowed in a graph file "
                             "(only plain data)", line=node.start_mark.line + 1)
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(n for pair in node.value for n in pair)


def _plain(node: yaml.Node, path: str | Path, line: int, owner: str | None) -> Any:
    """The plain Python value of a YAML node, or one GraphError line."""
    try:
        return yaml.safe_load(yaml.serialize(node))
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError):
        raise GraphError(path, "cannot read this value", node=owner, line=line) from None


def _mapping(node: yaml.Node, path: str | Path, owner: str | None) -> dict[str, tuple]:
    """Keys of a YAML mapping -> (value node, 1-based line); duplicate keys are errors."""
    out: dict[str, tuple] = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise GraphError(path, "a key must be a plain name", node=owner, line=line)
        key = str(key_node.value)
        if key in out:
            raise GraphError(path, f"duplicate key '{key}'", node=owner, line=line)
        out[key] = (value_node, line)
    return out


def _string_list(top: dict, key: str, path, required=False, owner=None) -> list[str]:
    if key not in top:
        if required:
            raise GraphError(path, f"missing required key '{key}'", node=owner, line=1)
        return []
    value_node, line = top[key]
    names = _plain(value_node, path, line, owner)
    if not isinstance(names, list) or not all(
        isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).strip()
        for v in names
    ):
        raise GraphError(path, f"'{key}' must be a list of names, like [question]",
                         node=owner, line=line)
    return [str(v) for v in names]


def _splits(top: dict, path) -> dict[str, int]:
    if "splits" not in top:
        return {}
    value_node, line = top["splits"]
    if not isinstance(value_node, yaml.MappingNode):
        raise GraphError(path, "'splits' must be a mapping like {train: 20, val: 20}", line=line)
    out = {}
    for key, (v, kline) in _mapping(value_node, path, None).items():
        if key not in SPLIT_KEYS:
            raise GraphError(path, f"unknown split '{key}' (allowed: train, val, test)",
                             line=kline)
        try:
            out[key] = int(v.value)
        except (TypeError, ValueError):
            raise GraphError(path, f"split '{key}' must be a whole number", line=kline) from None
        if out[key] < 0:
            raise GraphError(path, f"split '{key}' must not be negative", line=kline)
    return out


def _whole(top: dict, key: str, path, least: int) -> int | None:
    """A top-level whole number of at least `least` (`steps`, `proposals`), or None."""
    if key not in top:
        return None
    value_node, line = top[key]
    try:
        value = int(value_node.value) if isinstance(value_node, yaml.ScalarNode) else -1
    except (TypeError, ValueError):
        value = -1
    if value < least:
        kind = "0 or more" if least == 0 else f"{least} or more"
        raise GraphError(path, f"'{key}' must be a whole number, {kind}", line=line)
    return value


def _parse_node(item: yaml.Node, path, bound: Mapping[str, Callable[..., Any]]) -> Node:
    line = item.start_mark.line + 1
    if not isinstance(item, yaml.MappingNode):
        raise GraphError(path, "each node must be a mapping with at least 'id'", line=line)
    fields = _mapping(item, path, None)
    if "id" not in fields:
        raise GraphError(path, "node without an 'id'", line=line)
    node_id = _plain(fields["id"][0], path, fields["id"][1], None)
    if isinstance(node_id, bool) or not isinstance(node_id, (str, int)) \
            or not str(node_id).strip():
        raise GraphError(path, "a node 'id' must be a plain name", line=fields["id"][1])
    node_id = str(node_id)
    for key, (_, kline) in fields.items():
        if key not in NODE_KEYS:
            raise GraphError(path, f"unknown key {str(key)!r} (allowed: {', '.join(NODE_KEYS)})",
                             node=node_id, line=kline)

    def value(key: str, default: Any = None) -> Any:
        if key not in fields:
            return default
        return _plain(fields[key][0], path, fields[key][1], node_id)

    kind = str(value("kind", "llm"))
    if kind not in ("llm", "function"):
        raise GraphError(path, f"unknown kind '{kind}' (allowed: llm, function)",
                         node=node_id, line=fields["kind"][1])
    function = value("function")
    if kind == "function":
        if not isinstance(function, str) or (function not in FUNCTIONS and function not in bound):
            raise GraphError(path, f"unknown function '{function}' (registered: "
                             f"{', '.join(sorted({*FUNCTIONS, *bound}))})", node=node_id,
                             line=line)
    elif function is not None:
        raise GraphError(path, "'function' is only allowed with kind: function",
                         node=node_id, line=fields["function"][1])
    prompt = value("prompt", "")
    recorded = value("recorded", False)
    if not isinstance(recorded, bool) or (recorded and kind != "llm"):
        raise GraphError(path, "'recorded' must be true or false, on an llm node",
                         node=node_id, line=fields["recorded"][1])
    if kind == "llm" and not recorded and not (isinstance(prompt, str) and prompt.strip()):
        raise GraphError(path, "an llm node needs a non-empty 'prompt'", node=node_id, line=line)
    for flag in ("trainable", "output"):
        if flag in fields and not isinstance(value(flag), bool):
            raise GraphError(path, f"'{flag}' must be true or false", node=node_id,
                             line=fields[flag][1])
    max_tokens = value("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or
                                   isinstance(max_tokens, bool) or max_tokens <= 0):
        raise GraphError(path, "'max_tokens' must be a positive whole number", node=node_id,
                         line=fields["max_tokens"][1])
    inputs = _string_list(fields, "inputs", path, owner=node_id)
    if not inputs:
        raise GraphError(path, "a node needs at least one input", node=node_id, line=line)
    return Node(
        id=node_id,
        prompt=str(prompt or ""),
        inputs=tuple(inputs),
        kind=kind,
        function=function,
        trainable=bool(value("trainable", True)) and kind == "llm",
        output=bool(value("output", False)),
        max_tokens=max_tokens,
        line=line,
        description=_description(value("description", ""), path, node_id, fields),
        fn=bound.get(function) if kind == "function" else None,
        recorded=recorded,
    )


def _description(text: Any, path, node_id: str, fields: dict) -> str:
    if text is not None and not isinstance(text, str):
        raise GraphError(path, "'description' must be text", node=node_id,
                         line=fields["description"][1])
    return text or ""


def validate_structure(graph: GraphSpec) -> None:
    """Ids, references, a single output, acyclicity and reachability of the output."""
    path = graph.path or "<graph>"
    seen: dict[str, Node] = {}
    for n in graph.nodes:
        if n.id in seen:
            raise GraphError(path, f"duplicate node id (first defined on line {seen[n.id].line})",
                             node=n.id, line=n.line)
        if n.id in graph.input_fields:
            raise GraphError(path, "node id clashes with an input field of the same name",
                             node=n.id, line=n.line)
        seen[n.id] = n
    for n in graph.nodes:
        for name in n.inputs:
            if name not in seen and name not in graph.input_fields:
                raise GraphError(path, f"input '{name}' names neither a node nor an input field",
                                 node=n.id, line=n.line)
            if name == n.id:
                raise GraphError(path, "node reads its own output (cycle)", node=n.id,
                                 line=n.line)
        if len(set(n.inputs)) < len(n.inputs):
            twice = next(name for name in n.inputs if n.inputs.count(name) > 1)
            raise GraphError(path, f"input '{twice}' is listed twice", node=n.id, line=n.line)
    outputs = [n for n in graph.nodes if n.output]
    if not outputs:
        raise GraphError(path, "no output node: mark exactly one node with 'output: true'")
    if len(outputs) > 1:
        names = ", ".join(n.id for n in outputs)
        raise GraphError(path, f"several output nodes ({names}); exactly one is allowed",
                         node=outputs[1].id, line=outputs[1].line)
    order = graph.topological_order()
    if len(order) < len(graph.nodes):
        placed = set(order)
        stuck = next(n for n in graph.nodes if n.id not in placed)
        raise GraphError(path, "cycle through this node", node=stuck.id, line=stuck.line)
    reaches = {outputs[0].id}
    for node_id in reversed(order):
        if any(s in reaches for s in graph.successors(node_id)):
            reaches.add(node_id)
    for n in graph.nodes:
        if n.id not in reaches:
            raise GraphError(path, f"cannot reach the output node '{outputs[0].id}'",
                             node=n.id, line=n.line)
    leak = first_answer_input(graph)
    if leak:
        node, name, what = leak
        raise GraphError(graph.path or "<graph>", f"input '{name}' is {what}: no node may "
                         "read the answer it is graded against", node=node.id, line=node.line)
