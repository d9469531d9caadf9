"""The Python API: build a pipeline in code, with your own tools and metric, and optimize it.

    from engine import Graph, optimize

    g = Graph(name="calc", input_fields=["question"], target_field="answer", metric="numeric")
    g.llm("plan", prompt="Write the arithmetic expression.", inputs=["question"])
    g.function("calc", fn=calculate, inputs=["plan"], description="Evaluates arithmetic.")
    g.llm("final", prompt="Give the final number.", inputs=["question", "calc"], output=True)
    result = optimize(g, train=rows[:8], val=rows[8:16], backend="scripted", steps=2)

A `Graph` builds exactly the graph a YAML file describes (`engine.core.graph`), through the same
loader, so it is validated the same way and refused with the same one-line `GraphError`.
Python callables are bound by name: a graph file alone still never imports code.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from engine.api.support import (
    Backend,
    Data,
    Metric,
    OptimizeResult,
    examples_from,
    function_name,
    load_functions,
    make_backends,
    read_logged_graph,
)
from engine.core import graph as G
from engine.core.graph import GraphError
from engine.runs.settings import DEFAULTS

if TYPE_CHECKING:
    from engine.events import Activation

__all__ = ["Graph", "GraphError", "OptimizeResult", "optimize", "aoptimize", "load_functions",
           "read_logged_graph", "Data", "Metric", "Backend", "ExampleRow"]

ExampleRow = Mapping[str, Any]
T = TypeVar("T")


class Graph:
    """A pipeline of LLM nodes and function nodes, built in Python.

    Nodes are added in any order with `llm()` and `function()`; each returns the graph, so
    calls chain. Each node is checked when it is added (its keys, and a function's
    signature against its inputs); the whole graph (references, one output node, no cycle,
    every node reaching the output) is checked by `validate()` and before it runs.
    """

    def __init__(self, name: str, input_fields: Sequence[str], target_field: str,
                 metric: str | Metric = "exact_match", *, dataset: str | None = None,
                 description: str = "", rubric: str = "", answer_format: str = "",
                 splits: Mapping[str, int] | None = None) -> None:
        """`metric` is a name (exact_match, numeric, choice, yes_no, auto, judge) or a
        callable `(example: dict, prediction: str) -> float | (float, feedback_text)`;
        1.0 means correct. `dataset` and `splits` are used when `optimize` gets no rows."""
        self.name, self.target_field = name, target_field
        self.input_fields = [str(f) for f in input_fields]
        self.dataset, self.description, self.rubric = dataset, description, rubric
        self.answer_format, self.splits = answer_format, dict(splits or {})
        self.metric: str | Metric = metric
        self._where = f"<graph {name}>"
        if callable(metric):
            _check_metric(self._where, metric)
        self._nodes: list[dict[str, Any]] = []
        self._functions: dict[str, Callable[..., Any]] = {}
        self._spec: G.GraphSpec | None = None
        self._probe({"id": "probe-node", "prompt": "p", "inputs": ["probe-field"]}, {})

    # --- building --------------------------------------------------------------------

    def llm(self, id: str, prompt: str, inputs: Sequence[str], *, output: bool = False,
            trainable: bool = True, max_tokens: int | None = None,
            description: str = "") -> Graph:
        """Add an LLM node: its `prompt` (the trainable parameter) applied to `inputs`,
        which name example fields or other nodes. Mark exactly one node `output=True`."""
        return self._add({"id": id, "prompt": prompt, "inputs": list(inputs),
                          "trainable": trainable, "output": output, "max_tokens": max_tokens,
                          "description": description})

    def function(self, id: str, fn: Callable[..., Any] | str, inputs: Sequence[str], *,
                 description: str = "", output: bool = False) -> Graph:
        """Add a function node: `fn(*input_values)` in the order of `inputs`, sync or
        async, returning text (anything else is turned into text; None into '').

        `fn` may also be the name of a registered function (extract_number, ...). With a
        `description` (what the tool does), the backward pass asks the optimizer model how
        the tool's inputs should change, as for an LLM node; without one, its inputs receive
        its feedback unchanged. An exception fails that example, recorded in the run log.
        Raises GraphError, naming the node, when `fn` cannot take the node's inputs."""
        if isinstance(fn, str):
            name, bound = fn, None
        elif not callable(fn):
            raise GraphError(self._where, f"'fn' must be a function, not {type(fn).__name__}",
                             node=str(id))
        else:
            name, bound = function_name(fn, str(id), self._functions)
            _check_signature(self._where, str(id), fn, list(inputs))
        node = {"id": id, "kind": "function", "function": name, "inputs": list(inputs),
                "output": output, "description": description}
        return self._add(node, {name: bound} if bound is not None else {})

    def _add(self, node: dict[str, Any], functions: Mapping[str, Callable[..., Any]] = {}
             ) -> Graph:
        if any(str(n["id"]) == str(node["id"]) for n in self._nodes):
            raise GraphError(self._where, "duplicate node id", node=str(node["id"]))
        if str(node["id"]) in self.input_fields:
            raise GraphError(self._where, "node id clashes with an input field of the same name",
                             node=str(node["id"]))
        bound = {**self._functions, **functions}
        self._probe(node, bound)
        self._nodes.append(node)
        self._functions, self._spec = bound, None
        return self

    def _probe(self, node: dict[str, Any], bound: Mapping[str, Callable[..., Any]]) -> None:
        """Check the top-level values and one node as the loader sees them (the same
        checks, the same messages): the node alone, its inputs read as fields."""
        fields = [*self.input_fields, *(i for i in node["inputs"]
                                        if i not in self.input_fields and i != node["id"])]
        probe = {**self._top(placeholder_metric=True), "input_fields": fields or ["probe-field"],
                 "nodes": [{**_clean(node), "output": True}]}
        _parse(yaml.safe_dump(probe, sort_keys=False), self._where, bound)

    # --- the engine's graph ----------------------------------------------------------

    @property
    def nodes(self) -> list[str]:
        """Node ids in the order they were added."""
        return [str(n["id"]) for n in self._nodes]

    @property
    def spec(self) -> G.GraphSpec:
        """The validated engine graph (`engine.core.graph.GraphSpec`); raises GraphError."""
        if self._spec is None:
            spec = _parse(self._yaml(placeholder_metric=True), self._where, self._functions)
            metric_fn = self.metric if callable(self.metric) else None
            self._spec = replace(spec, metric=self._metric_name(), metric_fn=metric_fn,
                                 yaml_text=self._yaml(), path=self._where)
        return self._spec

    def validate(self) -> Graph:
        """Check the whole graph; raises GraphError with one line naming the node."""
        _ = self.spec
        return self

    @classmethod
    def from_yaml(cls, path: str | Path,
                  functions: Mapping[str, Callable[..., Any]] | None = None) -> Graph:
        """Load a graph file; `functions` binds the names used by its `kind: function`
        nodes to Python callables (checked against each node's inputs). Names that are
        neither bound nor registered are refused, as without `functions`."""
        bound = dict(functions or {})
        spec = G.load_graph(path, bound)
        for node in spec.nodes:
            if node.fn is not None:
                _check_signature(str(path), node.id, node.fn, list(node.inputs), node.line)
        graph = cls(spec.name, spec.input_fields, spec.target_field, spec.metric,
                    dataset=spec.dataset, description=spec.description, rubric=spec.rubric,
                    answer_format=spec.answer_format, splits=spec.splits)
        graph._nodes = [_node_dict(n) for n in spec.nodes]
        graph._functions = {n.function: n.fn for n in spec.nodes if n.fn is not None}
        graph._where, graph._spec = str(path), spec
        return graph

    def to_yaml(self, path: str | Path | None = None) -> str:
        """The graph as YAML text (also written to `path` when given). A graph with
        Python functions or a Python metric cannot be written: a graph file names only
        registered functions. Raises GraphError."""
        python = [n["id"] for n in self._nodes if n.get("function") in self._functions]
        if python:
            raise GraphError(self._where, f"node '{python[0]}' wraps a Python function; a graph "
                             "file can name only registered functions", node=str(python[0]))
        if callable(self.metric):
            raise GraphError(self._where, "a Python metric cannot be written to a graph file")
        self.validate()
        text = self._yaml()
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    # --- running ---------------------------------------------------------------------

    def forward(self, example: ExampleRow, backend: str | Backend | None = None, *,
                prompts: Mapping[str, str] | None = None, model: str | None = None,
                **backend_options: Any) -> dict[str, Activation]:
        """Run the graph once on one example (a dict of fields) and return every node's
        activation (`engine.events.Activation`: input_text, output_text, error), keyed by
        node id in topological order. `backend` as for `optimize` (default: openai when
        OPENAI_API_KEY or OPENAI_BASE_URL is set, else the embedded local model); `prompts`
        replaces node prompts, e.g. with `optimize(...).prompts`. Nothing is logged."""
        return _run_sync(self.aforward(example, backend, prompts=prompts, model=model,
                                       **backend_options), "aforward")

    async def aforward(self, example: ExampleRow, backend: str | Backend | None = None, *,
                       prompts: Mapping[str, str] | None = None, model: str | None = None,
                       **backend_options: Any) -> dict[str, Activation]:
        """`forward` for code that already runs an event loop (a notebook)."""
        from engine.core.forward import Prompts, RunContext, forward_example
        from engine.llm.client import LLMClient

        spec = self.spec
        [ex] = examples_from([dict(example)], "forward", spec, need_target=False)
        fwd, _, config = make_backends(backend, None, model=model, **backend_options)
        client = LLMClient(forward_backend=fwd, forward_model=config["model"])
        ctx = RunContext(spec, client, lambda event: None, "forward", 0)
        initial = Prompts.initial(spec)
        text = {**initial.text, **{k: v for k, v in (prompts or {}).items() if k in initial.text}}
        try:
            trace = await forward_example(ctx, replace(initial, text=text), ex, "forward")
        finally:
            await client.aclose()
        return {n: trace.activations[n] for n in spec.topological_order()}

    # --- rendering -------------------------------------------------------------------

    def _metric_name(self) -> str:
        if callable(self.metric):
            return "python:" + getattr(self.metric, "__name__", type(self.metric).__name__)
        return str(self.metric)

    def _top(self, placeholder_metric: bool = False) -> dict[str, Any]:
        # the loader knows metric names only; a callable metric is kept beside the graph
        metric = "exact_match" if placeholder_metric and callable(self.metric) \
            else self._metric_name()
        top = {"name": self.name, "description": self.description, "dataset": self.dataset,
               "input_fields": list(self.input_fields), "target_field": self.target_field,
               "metric": metric, "rubric": self.rubric,
               "answer_format": self.answer_format, "splits": self.splits or None}
        return {k: v for k, v in top.items() if v not in (None, "")}

    def _yaml(self, placeholder_metric: bool = False) -> str:
        return yaml.safe_dump({**self._top(placeholder_metric),
                               "nodes": [_clean(n) for n in self._nodes]},
                              sort_keys=False, allow_unicode=True, width=100)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, nodes={self.nodes})"


# --- optimize ----------------------------------------------------------------------------


def optimize(graph: Graph | None = None, train: Data | None = None,
             val: Data | int | None = None, test: Data | None = None, *,
             pipeline: Callable[..., Any] | str | None = None,
             data: Data | str | Path | None = None, metric: str = "exact_match",
             method: str = DEFAULTS.method,
             backend: str | Backend | None = None, steps: int = DEFAULTS.steps,
             db: str | Path = DEFAULTS.db, model: str | None = DEFAULTS.model,
             optimizer_model: str | None = DEFAULTS.optimizer_model,
             optimizer_backend: str | Backend | None = None,
             base_url: str | None = DEFAULTS.base_url, api_key: str | None = None,
             dataset: str | None = DEFAULTS.dataset, splits: Mapping[str, int] | None = None,
             data_dir: str | Path | None = DEFAULTS.data_dir, seed: int = DEFAULTS.seed,
             failures_per_step: int = DEFAULTS.failures_per_step, gate: bool = DEFAULTS.gate,
             update_mode: str = DEFAULTS.update_mode,
             concurrency: int | None = DEFAULTS.concurrency, cache: str = DEFAULTS.cache,
             temperature: float = DEFAULTS.temperature,
             max_tokens: int | None = DEFAULTS.max_tokens,
             optimizer_max_tokens: int | None = DEFAULTS.optimizer_max_tokens,
             run_id: str | None = DEFAULTS.run_id,
             method_options: Mapping[str, Any] | None = None,
             listeners: Iterable[Callable[[Any], None]] = (),
             **run_options: Any) -> OptimizeResult:
    """Optimize a graph's prompts with semantic gradient descent; log the run to `db`.

        result = optimize(graph, train=rows[:20], val=rows[20:40], backend="scripted",
                          steps=2, db="runs.duckdb")
        result.run_id, result.prompts, result.val_score

    Data: `train`, `val` and `test` are each a list of dicts, a pandas DataFrame, or a
    dataset name (`gsm8k/train`, `bbh/<task>`, a .jsonl path). Every row needs the graph's
    input fields and target field; a row's `id` field, if any, names it. Without `train`,
    the graph's (or `dataset=`) named dataset is cut into seeded, disjoint splits of the
    sizes in `splits` (default: the graph's, else 20/20/0), as `python -m engine run`
    does. `data_dir` says where named datasets live.

    Models: `backend` is "scripted" (offline, deterministic), "local" (an embedded model:
    `model="qwen2.5-coder-0.5b"`, the default, "qwen2.5-coder-1.5b", "smollm2-135m" or a
    GGUF file's path), "openai" (any OpenAI-compatible server: `base_url`, `api_key`, `model`,
    `optimizer_model`; the key is never stored) or a backend object with
    `async complete(request)`; default: openai when OPENAI_API_KEY or OPENAI_BASE_URL is
    set, else local. `optimizer_backend` and `optimizer_model` serve the loss, backward and
    update calls (default: the forward ones).

    Method: `method` is a credit-assignment method (semantic, the default; the others are
    in docs/methods.md); `steps`, `failures_per_step`, `gate`, `update_mode`, `seed`,
    `concurrency`, `cache`, `temperature` and the token limits mean what the command
    line's options of the same names do, with the same defaults (both come from
    `engine.runs.settings.RunConfig`). `run_options` passes any other run setting by its
    RunConfig name (e.g. timeout=30, max_retries=2; the budget: max_calls=N model calls,
    max_cost=USD on priced models; a run that reaches it ends with status "budget").
    `listeners` receive
    every event (`engine.events`) as it happens.

    Returns an `OptimizeResult`: run_id, status, prompts (the accepted prompt of every
    LLM node), val_score, train_score, test_score (when `test` rows or split are given),
    steps. Open the run in the dashboard with the same `db`.

    Raises GraphError for a bad graph, DatasetError for bad rows, MetricError when a
    Python metric returns something other than a number or a (number, text) pair
    (the run is then marked failed in the log), and ValueError for other bad arguments.

    Your own pipeline instead of a graph (docs/pipelines.md): `pipeline` is a function
    defined in a module file (or "MODULE:FUNCTION"), called with each row's input fields as
    keyword arguments through the gateway; `data` its rows (dicts with the input fields
    and "target", or a .jsonl path); `val` how many of the last rows to hold out; `metric`
    a grader name or FILE.py:NAME; the upstream model is `base_url` or `backend="local"`.
    It returns what `optimize --json` prints: run_id, nodes, edges, validation before
    and after, steps, prompts, changed, notes.
    """
    if pipeline is not None:
        if graph is not None:
            raise ValueError("optimize takes a graph or a pipeline=, not both")
        return _optimize_pipeline(pipeline, data, val=int(val or 0), steps=steps, db=db,
                                  base_url=base_url, backend=backend, metric=metric,
                                  method=method, run_id=run_id,
                                  concurrency=concurrency or 4)
    if graph is None:
        raise ValueError("optimize needs a graph (engine.Graph) or pipeline=FUNCTION")
    return _run_sync(aoptimize(
        graph, train, val, test, method=method, backend=backend, steps=steps, db=db,
        model=model, optimizer_model=optimizer_model, optimizer_backend=optimizer_backend,
        base_url=base_url, api_key=api_key, dataset=dataset, splits=splits,
        data_dir=data_dir, seed=seed, failures_per_step=failures_per_step, gate=gate,
        update_mode=update_mode, concurrency=concurrency, cache=cache,
        temperature=temperature, max_tokens=max_tokens,
        optimizer_max_tokens=optimizer_max_tokens, run_id=run_id,
        method_options=method_options, listeners=listeners, **run_options), "aoptimize")


def _optimize_pipeline(pipeline: Callable[..., Any] | str, data: Any, *, val: int,
                       steps: int, db: str | Path, base_url: str | None, backend: Any,
                       metric: str, method: str, run_id: str | None,
                       concurrency: int) -> dict[str, Any]:
    import json
    import os
    import tempfile

    from engine.gateway.pipeline import optimize_pipeline, upstream_of
    from engine.gateway.runner import PipelineSpec

    if isinstance(pipeline, str):
        where = pipeline
    else:
        try:
            path = inspect.getfile(pipeline)
        except TypeError:
            path = ""
        if getattr(pipeline, "__module__", "") == "__main__" or not path.endswith(".py") \
                or "<" in getattr(pipeline, "__qualname__", "<"):
            raise ValueError("pipeline= needs a function defined at the top level of a "
                             "module file (the runner imports it in its workers), not in "
                             "__main__, a notebook cell or another function; or give "
                             "'MODULE:FUNCTION'")
        where = f"{path}:{pipeline.__name__}"
    if data is None:
        raise ValueError("pipeline= needs data=: rows of input fields and 'target', or a "
                         ".jsonl file")
    url, server, model = upstream_of(base_url, backend if backend == "local" else None)
    try:
        with tempfile.TemporaryDirectory() as folder:
            if isinstance(data, (str, Path)):
                rows = Path(data)
            else:
                rows = Path(folder) / "data.jsonl"
                records = data.to_dict("records") if hasattr(data, "to_dict") else data
                rows.write_text("".join(json.dumps(dict(r), ensure_ascii=False) + "\n"
                                        for r in records), encoding="utf-8")
            return optimize_pipeline(PipelineSpec(where, None, os.getcwd()), rows, db,
                                     upstream=url, metric=metric, val=val, steps=steps,
                                     method=method, run_id=run_id, concurrency=concurrency,
                                     upstream_model=model, local=server is not None)
    finally:
        if server is not None:
            server.stop()


async def aoptimize(graph: Graph, train: Data | None = None, val: Data | None = None,
                    test: Data | None = None, **options: Any) -> OptimizeResult:
    """`optimize` for code that already runs an event loop (a notebook): same arguments."""
    from engine.api.support import run_optimization

    spec = graph.spec if isinstance(graph, Graph) else graph  # or an engine.core.graph.GraphSpec
    return await run_optimization(spec, train, val, test, **options)


# --- helpers -----------------------------------------------------------------------------


def _run_sync(coro: Coroutine[Any, Any, T], async_name: str) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError(f"an event loop is already running here (a notebook?): use "
                       f"`await {async_name}(...)` instead")


def _parse(text: str, where: str, functions: Mapping[str, Callable[..., Any]]) -> G.GraphSpec:
    """Validate through the YAML loader; a built graph has no file lines to show."""
    try:
        return G.parse_graph(text, where, functions)
    except GraphError as exc:
        raise GraphError(exc.path, exc.message, node=exc.node) from None


def _clean(node: Mapping[str, Any]) -> dict[str, Any]:
    """A node as a graph file writes it: defaults left out."""
    defaults = {"kind": "llm", "trainable": True, "output": False, "max_tokens": None,
                "description": "", "prompt": ""}
    return {k: v for k, v in node.items() if k not in defaults or v != defaults[k]}


def _node_dict(node: G.Node) -> dict[str, Any]:
    out: dict[str, Any] = {"id": node.id, "prompt": node.prompt, "inputs": list(node.inputs),
                           "kind": node.kind,
                           "trainable": node.trainable or node.kind == "function",  # default
                           "output": node.output, "max_tokens": node.max_tokens,
                           "description": node.description}
    if node.kind == "function":
        out["function"] = node.function
    return out


def _check_signature(where: str, node_id: str, fn: Callable[..., Any], inputs: list[str],
                     line: int | None = None) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: trust them
        return
    try:
        signature.bind(*inputs)
    except TypeError:
        name = getattr(fn, "__name__", type(fn).__name__)
        count = f"{len(inputs)} input{'s' if len(inputs) != 1 else ''}"
        raise GraphError(where, f"function '{name}{signature}' cannot take the node's {count} "
                         f"({', '.join(inputs)}), passed in that order", node=node_id,
                         line=line) from None


def _check_metric(where: str, metric: Callable[..., Any]) -> None:
    try:
        inspect.signature(metric).bind("example", "prediction")
    except TypeError:
        name = getattr(metric, "__name__", type(metric).__name__)
        raise GraphError(where, f"metric '{name}' must take (example, prediction)") from None
    except ValueError:
        pass

