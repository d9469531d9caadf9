"""What one optimization step costs: the GSM8K step of benchmarks/critical_path.py (two
hint nodes feeding a final node, 16 train and 16 validation examples, a fake
OpenAI-compatible server with 200 ms latency), at default settings and beside
`--node-gates on` and `off`. For step 1 it prints wall time, critical-path ratio (wall /
6 dependent rounds x latency), requests (calls that reached the server) and tokens (their
prompt + completion tokens, from the run log's llm_calls).

The server reports prefix-cache hits as OpenAI does (usage.prompt_tokens_details
.cached_tokens: the longest prefix shared with an earlier request), shown as
"prefix-cached" (part of tokens, billed at the cached price where one is known).

Two cache settings: `off` (every call reaches the server; the figures the issue's table
compares with other systems) and `readwrite` (the default: step 1's train forward repeats
step 0's and is answered from the cache). Goal at defaults: tokens <= 18.9k (TextGrad's on
the same step) with ratio <= 1.25.

    .venv/bin/python benchmarks/step_cost.py [--latency 0.2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.critical_path import GRAPH, ROUNDS, server_process  # noqa: E402
from engine.runlog.reader import step_call_costs  # noqa: E402
from engine.runs.execute import RunConfig, execute  # noqa: E402


def measure(latency: float, node_gates: str, cache: str) -> dict:
    os.environ.pop("OPENAI_API_KEY", None)
    with tempfile.TemporaryDirectory() as tmp, \
            server_process(latency, {"prefix_cache": True}) as base_url:
        graph = Path(tmp) / "graph.yaml"
        graph.write_text(GRAPH)
        with open(Path(tmp) / "data.jsonl", "w") as fh:
            for i in range(40):
                fh.write(json.dumps({"id": f"q{i}", "question": f"Tom has {i} apples and buys "
                                     f"{i + 3} more. How many?", "answer": str(2 * i + 3)}) + "\n")
        config = RunConfig(graph=str(graph), backend="openai", base_url=base_url,
                           model="fake-small", optimizer_model="fake-large", steps=1, train=16,
                           val=16, cache=cache, node_gates=node_gates,
                           db=str(Path(tmp) / "runs.duckdb"))
        result = asyncio.run(execute(config))
        steps = {row["step"]: row for row in step_call_costs(config.db, result.run_id)}
        one = steps[1]
        return {"wall": one["seconds"], "ratio": one["seconds"] / (ROUNDS * latency),
                "requests": one["calls"], "tokens": one["prompt_tokens"]
                + one["completion_tokens"], "hits": one["cache_hits"],
                "prefix": one["provider_cached_tokens"], "status": result.status}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per setting; the fastest step is shown (the others were "
                             "slowed by whatever else the machine was doing)")
    args = parser.parse_args()
    print(f"GSM8K step 1, {args.latency * 1000:.0f} ms server; ratio = wall / ({ROUNDS} rounds "
          f"x latency)")
    print(f"{'settings':<44} {'wall s':>7} {'ratio':>6} {'requests':>9} {'tokens':>8} "
          f"{'prefix-cached':>13} {'cache hits':>10}")
    for cache in ("off", "readwrite"):
        for gates in ("auto", "on", "off"):
            run = min((measure(args.latency, gates, cache) for _ in range(args.repeat)),
                      key=lambda r: r["wall"])
            label = f"--node-gates {gates}{' (default)' if gates == 'auto' else ''}, " \
                    f"--cache {cache}"
            print(f"{label:<44} {run['wall']:>7.2f} {run['ratio']:>6.2f} "
                  f"{run['requests']:>9.0f} {run['tokens'] / 1000:>7.1f}k "
                  f"{run['prefix'] / 1000:>12.1f}k {run['hits']:>10.0f}")
    print("goal at defaults: tokens <= 18.9k, ratio <= 1.25")


if __name__ == "__main__":
    main()
