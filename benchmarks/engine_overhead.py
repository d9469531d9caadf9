"""Engine overhead: node executions per second with the scripted backend at zero latency.

Measures (1) the forward pass alone (no run log) and (2) whole optimization steps with the
run log written, on the teaching diamond shape (three nodes feeding one: tests/support/
graphs.py's DIAMOND).

    .venv/bin/python benchmarks/engine_overhead.py [--examples 500] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.forward import Prompts, RunContext, forward_pass  # noqa: E402
from engine.core.graph import parse_graph  # noqa: E402
from engine.data.examples import Example  # noqa: E402
from engine.llm.client import LLMClient  # noqa: E402
from engine.llm.scripted import ScriptedBackend  # noqa: E402
from engine.runs.execute import RunConfig, execute  # noqa: E402
from tests.support.graphs import DIAMOND, write_graph  # noqa: E402


def examples(n: int) -> list[Example]:
    return [Example(f"q{i}", {"question": f"Tom has {i} apples and buys {i + 3} more."},
                    str(2 * i + 3)) for i in range(n)]


async def forward_only(n: int) -> float:
    graph = parse_graph(DIAMOND)
    client = LLMClient(forward_backend=ScriptedBackend(), forward_model="scripted",
                       concurrency=16)
    ctx = RunContext(graph, client, lambda event: None, "bench", 0)
    started = time.perf_counter()
    await forward_pass(ctx, Prompts.initial(graph), examples(n), "train")
    return len(graph.nodes) * n / (time.perf_counter() - started)


def full_run(n: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        rows = [{"id": ex.id, **ex.fields, "answer": ex.target} for ex in examples(2 * n)]
        graph = write_graph(Path(tmp), DIAMOND, rows)
        config = RunConfig(graph=str(graph), backend="scripted", steps=2, train=n, val=n,
                           db=str(Path(tmp) / "runs.duckdb"), cache="off")
        started = time.perf_counter()
        result = asyncio.run(execute(config))
        elapsed = time.perf_counter() - started
        activations = sum(1 for e in result.events.events if type(e).__name__ == "Activation")
        return activations / elapsed, activations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rates = [asyncio.run(forward_only(args.examples)) for _ in range(args.repeats)]
    print(f"forward pass only: {statistics.median(rates):,.0f} node executions/s "
          f"(median of {args.repeats}, {4 * args.examples} activations each)")
    rate, count = full_run(args.examples // 2)
    print(f"full run with run log (2 steps, train=val={args.examples // 2}): "
          f"{rate:,.0f} node executions/s ({count} activations, incl. backward, updates, "
          "DuckDB writes)")


if __name__ == "__main__":
    main()
