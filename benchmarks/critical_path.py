"""Critical-path ratio of one optimization step against a fake OpenAI-compatible server.

Starts the project's fake server with a fixed latency (200 ms), runs step 0 and one
optimization step of the paper's GSM8K graph shape (two hint nodes feeding a final node;
16 train and 16 validation examples) through the real `openai` SDK, and prints

    ratio = wall time of step 1 / (dependent call rounds x latency)

Step 1 has 6 dependent rounds: forward on train (hints, then final), the final node's
backward call, the update calls, forward on validation (hints, then final). The cache is
off so that every round reaches the server. Goal: ratio <= 1.25.

    .venv/bin/python benchmarks/critical_path.py [--latency 0.2] [--concurrency 16 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.events import StepFinished  # noqa: E402
from engine.run import RunConfig, execute  # noqa: E402
from tests.support.fake_openai import FakeOpenAIServer  # noqa: E402

GRAPH = """
name: gsm8k-2x2
dataset: data.jsonl
input_fields: [question]
target_field: answer
metric: numeric
nodes:
  - id: hint_a
    prompt: Work out an intermediate step that helps solve the problem.
    inputs: [question]
  - id: hint_b
    prompt: Work out an intermediate step that helps solve the problem.
    inputs: [question]
  - id: final
    prompt: Solve the problem.
    inputs: [question, hint_a, hint_b]
    output: true
"""
ROUNDS = 6
# calls per dependent round of step 1, in order: train hints, train finals, backward,
# updates, validation hints, validation finals
ROUND_SIZES = (32, 16, 2, 3, 32, 16)


def _serve(latency: float, urls: multiprocessing.Queue, stop: multiprocessing.Event) -> None:
    with FakeOpenAIServer(latency=latency) as server:
        urls.put((server.base_url, None))
        stop.wait()


@contextmanager
def server_process(latency: float):
    """The fake server in its own process, as a real server would be: in the same process
    its request handling would compete with the engine for the interpreter lock."""
    ctx = multiprocessing.get_context("spawn")
    urls, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(latency, urls, stop), daemon=True)
    proc.start()
    try:
        yield urls.get(timeout=60)[0]
    finally:
        stop.set()
        proc.join(timeout=10)


def measure(latency: float, concurrency: int) -> tuple[float, float, int]:
    os.environ.pop("OPENAI_API_KEY", None)
    with tempfile.TemporaryDirectory() as tmp, server_process(latency) as base_url:
        graph = Path(tmp) / "graph.yaml"
        graph.write_text(GRAPH)
        with open(Path(tmp) / "data.jsonl", "w") as fh:
            for i in range(40):
                fh.write(json.dumps({"id": f"q{i}", "question": f"Tom has {i} apples and buys "
                                     f"{i + 3} more. How many?", "answer": str(2 * i + 3)}) + "\n")
        config = RunConfig(graph=str(graph), backend="openai", base_url=base_url,
                           model="fake-small", optimizer_model="fake-large", steps=1, train=16,
                           val=16, cache="off", concurrency=concurrency,
                           db=str(Path(tmp) / "runs.duckdb"))
        result = asyncio.run(execute(config))
        step = next(e for e in result.events.of(StepFinished) if e.step == 1)
        wall = step.ended_at - step.started_at
        calls = result.stats.network_calls
        return wall, wall / (ROUNDS * latency), calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()
    bound = ROUNDS * args.latency
    print(f"dependency bound: {ROUNDS} rounds x {args.latency * 1000:.0f} ms = {bound:.2f} s")
    for limit in args.concurrency:
        wall, ratio, requests = measure(args.latency, limit)
        verdict = "meets" if ratio <= 1.25 else "misses"
        waves = sum(-(-size // limit) for size in ROUND_SIZES)
        print(f"--concurrency {limit:>3}: step 1 took {wall:.2f} s, critical-path ratio "
              f"{ratio:.2f} ({verdict} the 1.25 goal; {requests} requests in the run)")
        if waves > ROUNDS:
            print(f"    with {limit} calls in flight the step needs {waves} waves "
                  f"({waves * args.latency:.2f} s): {wall / (waves * args.latency):.2f} of that")


if __name__ == "__main__":
    main()
