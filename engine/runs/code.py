"""Where a run's Python code comes from, so that later commands can bind it again.

A graph built in Python (engine.api.builder) names its tools and metric in the logged
YAML only by name; the code itself lives in the user's modules. A run records, in its
config's `code`, each function node's and the metric's origin: module and qualified name
(and the module's file, for a module that is not on the path later, such as a
`--functions` file). `probe`, `blame`, `run --fork` and `resume` call `bind_logged_graph`,
which imports them again; what cannot be imported is said in one line.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from engine.core.functions import load_functions
from engine.core.graph import METRICS, GraphSpec, parse_graph

FUNCTIONS_FILE_PREFIX = "semback_functions_"  # engine.core.functions.load_functions' modules


class CodeMissing(ValueError):
    """The run's Python code cannot be imported here (bad input: one line, exit 2)."""


def origin(fn: Callable[..., Any]) -> dict[str, str]:
    """{module, qualname, file} of a function; {missing: why} when no later process could
    import it (defined in a script's __main__, or inside another function)."""
    module = getattr(fn, "__module__", None) or ""
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "")
    if module == "__main__":
        return {"missing": "defined in a script's __main__"}
    if "<locals>" in qualname or not qualname:
        return {"missing": "defined inside a function"}
    found = {"module": module, "qualname": qualname}
    path = getattr(sys.modules.get(module), "__file__", None)
    if path:
        found["file"] = str(Path(path).resolve())
    return found


def code_origins(graph: GraphSpec) -> dict[str, Any]:
    """The `code` a run records: {"functions": {name: origin}, "metric": origin}."""
    functions = {n.function: origin(n.fn) for n in graph.nodes
                 if n.kind == "function" and n.fn is not None and n.function}
    code: dict[str, Any] = {}
    if functions:
        code["functions"] = functions
    if graph.metric_fn is not None:
        code["metric"] = origin(graph.metric_fn)
    return code


def _load(where: str, found: Mapping[str, str], functions: Mapping[str, Callable[..., Any]]
          ) -> Callable[..., Any]:
    name = found.get("qualname", "").rsplit(".", 1)[-1]
    if name in functions:  # the user's --functions file wins
        return functions[name]
    if "missing" in found:
        raise CodeMissing(f"{where} was {found['missing']}: pass --functions FILE.py with it")
    module_name, module = found["module"], None
    if not module_name.startswith(FUNCTIONS_FILE_PREFIX):
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - fall back to the recorded file below
            module = None
    if module is None and found.get("file") and Path(found["file"]).is_file():
        return _attribute(load_functions(found["file"]), found, where)
    if module is None:
        raise CodeMissing(f"{where}: cannot import module '{module_name}' here: pass "
                          "--functions FILE.py with it")
    return _attribute(vars(module), found, where)


def _attribute(namespace: Mapping[str, Any], found: Mapping[str, str], where: str
               ) -> Callable[..., Any]:
    parts = found["qualname"].split(".")
    value: Any = namespace.get(parts[0])
    for part in parts[1:]:
        value = getattr(value, part, None)
    if not callable(value):
        raise CodeMissing(f"{where}: '{found['qualname']}' is no longer in "
                          f"{found.get('module', 'its module')}: pass --functions FILE.py")
    return value


def bind_logged_graph(text: str, where: str, code: Mapping[str, Any] | None,
                      functions: Mapping[str, Callable[..., Any]] | None = None) -> GraphSpec:
    """Parse a logged graph with its Python functions and metric imported again from the
    run's recorded `code` (a `functions` mapping, e.g. a --functions file, wins)."""
    functions = dict(functions or {})
    code = dict(code or {})
    bound = dict(functions)
    for name, found in (code.get("functions") or {}).items():
        bound[name] = _load(f"function '{name}'", found, functions)
    doc = yaml.safe_load(text) if text else None
    metric = doc.get("metric") if isinstance(doc, dict) else None
    if isinstance(metric, str) and metric not in METRICS:
        found = code.get("metric")
        if not found:
            raise CodeMissing(f"the run's metric '{metric}' is Python code it did not record: "
                              "it cannot be graded here")
        fn = _load(f"metric '{metric}'", found, functions)
        placeholder = yaml.safe_dump({**doc, "metric": "exact_match"}, sort_keys=False)
        return replace(parse_graph(placeholder, where, bound), metric=metric, metric_fn=fn)
    return parse_graph(text, where, bound)


def _responder_parts(spec: str) -> tuple[str, str]:
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise CodeMissing(f"--scripted-responder expects FILE.py:NAME or MODULE:NAME, not "
                          f"{spec!r}")
    return where, name


def resolved_responder(spec: str) -> str:
    """`spec` with its file made absolute, as a run records it (a fork started from another
    folder, or by the dashboard, finds the same file)."""
    where, name = _responder_parts(spec)
    return f"{Path(where).resolve()}:{name}" if where.endswith(".py") else spec


def load_responder(spec: str) -> Callable[..., Any]:
    """The scripted backend's responder named by `FILE.py:NAME` or `MODULE:NAME`: NAME is
    called with no arguments and returns `responder(request) -> str | None`
    (engine/llm/scripted.py). Raises CodeMissing (one line) when it cannot be had."""
    where, name = _responder_parts(spec)
    if where.endswith(".py"):
        namespace: Mapping[str, Any] = load_functions(where)
    else:
        try:
            namespace = vars(importlib.import_module(where))
        except Exception as exc:  # noqa: BLE001 - whatever the import raises, one line
            raise CodeMissing(f"--scripted-responder: cannot import module '{where}': "
                              f"{exc.__class__.__name__}: {exc}") from None
    factory = namespace.get(name)
    if not callable(factory):
        raise CodeMissing(f"--scripted-responder: {where} has no function '{name}'")
    responder = factory()
    if not callable(responder):
        raise CodeMissing(f"--scripted-responder: {name}() must return a function of the "
                          "request")
    return responder
