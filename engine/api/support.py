"""What the Python API (engine.api.builder) needs besides the graph builder: rows to examples,
backends from names or objects, binding functions from a user's file, reading a logged
graph whose Python functions this process does not have, and running an optimization."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import yaml

from engine.core.functions import FUNCTIONS, load_functions
from engine.core.graph import METRICS, parse_graph
from engine.llm.base import Backend
from engine.runs.settings import DEFAULTS

if TYPE_CHECKING:
    import pandas

    from engine.core.graph import GraphSpec
    from engine.data.examples import Example

Data = Union[Sequence[Mapping[str, Any]], "pandas.DataFrame", str]
"""Rows (a list of dicts, or a pandas DataFrame) or a dataset name (`gsm8k/train`, a .jsonl)."""
Metric = Callable[[dict[str, str], str], float | tuple[float, str]]
"""`(example, prediction) -> score` or `(score, feedback_text)`; the feedback becomes the
output node's gradient."""

__all__ = ["Backend", "Data", "Metric", "OptimizeResult", "examples_from", "function_name",
           "load_functions", "make_backends", "read_logged_graph", "run_optimization"]


@dataclass(frozen=True)
class OptimizeResult:
    """What `optimize` returns. The full record (every activation, gradient, call and
    proposal) is in the run log `db` under `run_id`."""

    run_id: str
    status: str  # finished | stopped
    prompts: dict[str, str]  # the accepted prompt of every LLM node
    val_score: float | None
    train_score: float | None
    test_score: float | None  # None without test data
    steps: int  # optimization steps completed
    db: str


def function_name(fn: Callable[..., Any], node_id: str,
                  bound: Mapping[str, Callable[..., Any]]) -> tuple[str, Callable[..., Any] | None]:
    """The name a function node writes for `fn`, and the callable to bind (None for a
    registered function). A Python function never takes a registered function's name,
    nor another bound function's, so it never inherits a registered backward rule."""
    for registered, known in FUNCTIONS.items():
        if fn is known:
            return registered, None
    name = getattr(fn, "__name__", "")
    if not name.isidentifier():
        name = "".join(c if c.isalnum() else "_" for c in node_id) or "function"
    base, n = name, 1
    while name in FUNCTIONS or (name in bound and bound[name] is not fn):
        n += 1
        name = f"{base}_{n}"
    return name, fn


def read_logged_graph(text: str, where: str = "<run>") -> GraphSpec:
    """Parse the graph YAML a run logged, for reading (the dashboard): Python functions and
    a Python metric it names are shown by name; calling such a function here raises."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    if not isinstance(doc, dict):
        return parse_graph(text, where)  # the loader's own error
    names = {str(n.get("function")) for n in doc.get("nodes") or []
             if isinstance(n, dict) and n.get("kind") == "function"} - set(FUNCTIONS)
    metric = doc.get("metric")
    if isinstance(metric, str) and metric not in METRICS:
        text = yaml.safe_dump({**doc, "metric": "exact_match"}, sort_keys=False)
    graph = parse_graph(text, where, {n: _unbound(n) for n in names})
    return replace(graph, metric=metric) if isinstance(metric, str) else graph


def _unbound(name: str) -> Callable[..., Any]:
    def unbound(*values: str) -> str:
        raise RuntimeError(f"function '{name}' is Python code not bound in this process")
    unbound.__name__ = name
    return unbound


# --- data ----------------------------------------------------------------------------


def examples_from(data: Data, split: str, graph: GraphSpec, need_target: bool = True,
                  data_dir: str | Path | None = None) -> list[Example]:
    """Rows, a DataFrame or a dataset name -> Examples with the graph's target.
    DatasetError names the first row without an input field or the target."""
    from engine.data.datasets import DatasetError, load_examples
    from engine.data.examples import Example

    if isinstance(data, (str, Path)):
        loaded = load_examples(str(data), data_dir=None if data_dir is None else str(data_dir),
                               graph_dir=".")
        rows: list[tuple[str, dict[str, str]]] = [(e.id, dict(e.fields)) for e in loaded]
    else:
        if hasattr(data, "columns") and hasattr(data, "to_dict"):
            data = data.to_dict("records")
        rows = [_row(row, split, i) for i, row in enumerate(data)]
    wanted = [*graph.input_fields, *([graph.target_field] if need_target else [])]
    out, seen = [], set()
    for i, (example_id, fields) in enumerate(rows):
        missing = [f for f in wanted if f not in fields]
        if missing:
            raise DatasetError(f"{split} row {i} ('{example_id}') has no field '{missing[0]}' "
                               f"(its fields: {', '.join(sorted(fields)) or 'none'})")
        if example_id in seen:
            raise DatasetError(f"{split} row {i}: duplicate id '{example_id}'")
        seen.add(example_id)
        out.append(Example(example_id, fields, fields.get(graph.target_field, "")))
    return out


def _row(row: Any, split: str, index: int) -> tuple[str, dict[str, str]]:
    from engine.data.datasets import DatasetError

    if not isinstance(row, Mapping):
        raise DatasetError(f"{split} row {index} is a {type(row).__name__}, not a dict of fields")
    fields = {}
    for key, value in row.items():
        if value is None or (isinstance(value, float) and value != value):  # None, NaN: absent
            continue
        fields[str(key)] = value if isinstance(value, str) else (
            json.dumps(value, ensure_ascii=False) if isinstance(value, (list, dict))
            else str(value))
    return fields.get("id") or f"{split}-{index}", fields


# --- backends ------------------------------------------------------------------------


def make_backends(backend: str | Backend | None, optimizer_backend: str | Backend | None, *,
                  model: str | None = None, optimizer_model: str | None = None,
                  base_url: str | None = None, api_key: str | None = None,
                  timeout: float | None = DEFAULTS.timeout, chat_format: str | None = None,
                  local_serving: str = DEFAULTS.local_serving
                  ) -> tuple[Backend, Backend | None, dict[str, Any]]:
    """(forward backend, optimizer backend or None for the same, names for RunConfig).
    The API key goes into the backend object only, never into the names. With backend
    "local", `model` is a named embedded model (engine/llm/models.py) or a GGUF file's path
    (`chat_format` for one without a template)."""
    from engine.llm.factory import default_backend_kind, default_model, make_backend

    def build(spec: str | Backend) -> tuple[Backend, str, str | None]:
        if isinstance(spec, str):
            local = ({"model": model, "chat_format": chat_format, "serving": local_serving}
                     if spec == "local" else {})
            return (make_backend(spec, base_url=base_url, api_key=api_key, timeout=timeout,
                                 **local), spec, default_model(spec))
        if not callable(getattr(spec, "complete", None)):
            raise ValueError(f"backend must be a name or an object with async complete(request), "
                             f"not {type(spec).__name__}")
        name = str(getattr(spec, "name", type(spec).__name__))
        return spec, name, getattr(spec, "model", None)

    forward, kind, default = build(backend or default_backend_kind())
    # A named backend resolves its default model when the run starts, as on the command line,
    # so the stored settings match; an object's model is all a run log can know of it.
    named = isinstance(backend or "", str)
    names = {"backend": kind, "model": model if named else (model or default or kind),
             "optimizer_backend": None,
             "optimizer_model": optimizer_model}
    optimizer = None
    if optimizer_backend is not None:
        optimizer, opt_kind, opt_default = build(optimizer_backend)
        names["optimizer_backend"] = opt_kind
        names["optimizer_model"] = optimizer_model or opt_default or opt_kind
    return forward, optimizer, names


# --- running -------------------------------------------------------------------------


async def run_optimization(spec: GraphSpec, train: Data | None, val: Data | None,
                           test: Data | None, *, backend: str | Backend | None = None,
                           optimizer_backend: str | Backend | None = None,
                           model: str | None = None, optimizer_model: str | None = None,
                           base_url: str | None = None, api_key: str | None = None,
                           splits: Mapping[str, int] | None = None,
                           listeners: Iterable[Callable[[Any], None]] = (),
                           **config: Any) -> OptimizeResult:
    """engine.api.builder.aoptimize's body: build the RunConfig and the splits, then execute."""
    from engine.data.examples import Splits
    from engine.runs.execute import execute
    from engine.runs.settings import RunConfig

    forward, optimizer, names = make_backends(
        backend, optimizer_backend, model=model, optimizer_model=optimizer_model,
        base_url=base_url, api_key=api_key, timeout=config.get("timeout", DEFAULTS.timeout),
        chat_format=config.get("chat_format"),
        local_serving=config.get("local_serving", DEFAULTS.local_serving))
    config["db"] = str(config.get("db", DEFAULTS.db))
    if config.get("data_dir") is not None:
        config["data_dir"] = str(config["data_dir"])
    config["method_options"] = dict(config.get("method_options") or {})
    unknown = sorted(set(config) - {f.name for f in dataclasses.fields(RunConfig)})
    if unknown:
        raise ValueError(f"unknown run option '{unknown[0]}' (see engine.runs.execute.RunConfig)")
    run = RunConfig(graph=spec.path, base_url=base_url, **names, **config,
                    **{k: v for k, v in (splits or {}).items() if k in ("train", "val", "test")})
    given = None
    if train is not None:
        def part(data: Data | None, name: str) -> list:
            return [] if data is None else examples_from(data, name, spec,
                                                         data_dir=run.data_dir)
        given = Splits(part(train, "train"), part(val, "val"), part(test, "test"))
    elif val is not None or test is not None:
        raise ValueError("give train data with val and test data, or none of them to cut "
                         "the graph's dataset into splits")
    result = await execute(run, forward_backend=forward, optimizer_backend=optimizer,
                           listeners=tuple(listeners), splits=given, graph=spec)
    state = result.state
    text = state.prompts.text if state else {n.id: n.prompt for n in spec.nodes}
    return OptimizeResult(
        run_id=result.run_id, status=result.status,
        prompts={n.id: text[n.id] for n in spec.nodes if n.kind == "llm"},
        val_score=state.val_score if state else None,
        train_score=state.train_score if state else None,
        test_score=result.test_score, steps=state.step if state else 0, db=run.db)
