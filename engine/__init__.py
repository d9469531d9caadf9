"""Semantic backpropagation for language-based agentic systems.

The Python API (see docs/python.md):

    from engine import Graph, optimize

    g = Graph(name="calc", input_fields=["question"], target_field="answer", metric="numeric")
    g.llm("plan", prompt="Write the arithmetic expression.", inputs=["question"])
    g.function("calc", fn=calculate, inputs=["plan"], description="Evaluates arithmetic.")
    g.llm("final", prompt="Give the final number.", inputs=["question", "calc"], output=True)
    result = optimize(g, train=train_rows, val=val_rows, backend="scripted", steps=2)

Names are imported on first use, so `import engine` and `python -m engine` stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from engine.api.builder import Graph, aoptimize, optimize
    from engine.api.support import (
        Backend,
        Data,
        Metric,
        OptimizeResult,
        load_functions,
        read_logged_graph,
    )
    from engine.core.graph import GraphError
    from engine.core.loss import MetricError

_EXPORTS = {
    "Graph": "engine.api.builder", "optimize": "engine.api.builder", "aoptimize": "engine.api.builder",
    "GraphError": "engine.core.graph", "MetricError": "engine.core.loss",
    "OptimizeResult": "engine.api.support", "Backend": "engine.api.support",
    "Data": "engine.api.support", "Metric": "engine.api.support",
    "load_functions": "engine.api.support", "read_logged_graph": "engine.api.support",
}
__all__ = ["Backend", "Data", "Graph", "GraphError", "Metric", "MetricError", "OptimizeResult",
           "aoptimize", "load_functions", "optimize", "read_logged_graph"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
