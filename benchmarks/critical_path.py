"""Critical-path ratio of one optimization step against a fake OpenAI-compatible server.

Starts the project's fake server with a fixed latency (200 ms), runs step 0 and one
optimization step of the paper's GSM8K graph shape (two hint nodes feeding a final node:
tests/support/graphs.py's TWO_HINTS, on its arithmetic rows; 16 train and 16 validation
examples) through the real `openai` SDK, and prints

    ratio = wall time of step 1 / (dependent call rounds x latency)

Step 1 has 6 dependent rounds: forward on train (hints, then final), the final node's
backward call, the update calls, forward on validation (hints, then final). The cache is
off so that every round reaches the server. Goal: ratio <= 1.25.

    .venv/bin/python benchmarks/critical_path.py [--latency 0.2] [--concurrency 16 64]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.llm.limits import AdaptiveLimit  # noqa: E402
from engine.runlog.schema import connect  # noqa: E402
from engine.runs.execute import SHARED_LIMIT, RunConfig, execute  # noqa: E402
from tests.support.fake_openai import FakeOpenAIServer  # noqa: E402
from tests.support.graphs import TWO_HINTS, arithmetic_rows, write_graph  # noqa: E402

ROUNDS = 6
# calls per dependent round of step 1, in order: train hints, train finals, backward,
# updates, validation hints, validation finals
ROUND_SIZES = (32, 16, 2, 3, 32, 16)


def _serve(latency: float, urls: multiprocessing.Queue, stop: multiprocessing.Event,
           options: dict | None = None) -> None:
    with FakeOpenAIServer(latency=latency, **(options or {})) as server:
        urls.put((server.base_url, None))
        stop.wait()


@contextmanager
def server_process(latency: float, options: dict | None = None):
    """The fake server in its own process, as a real server would be: in the same process
    its request handling would compete with the engine for the interpreter lock."""
    ctx = multiprocessing.get_context("spawn")
    urls, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(latency, urls, stop, options), daemon=True)
    proc.start()
    try:
        yield urls.get(timeout=60)[0]
    finally:
        stop.set()
        proc.join(timeout=10)


def measure(latency: float, concurrency: int | None = None) -> tuple[float, float, int]:
    """(step 1 wall, ratio, requests in the run)."""
    run = measure_run(latency, concurrency)
    return run["wall"], run["ratio"], run["requests"]


def measure_run(latency: float, concurrency: int | str | None = None,
                server: dict | None = None, node_gates: str = "off") -> dict:
    """One run (step 0 and step 1) against a fresh server; step 1's wall time from the run
    log's `steps` table, with step 1's retries (llm_calls) and the run's requests."""
    os.environ.pop("OPENAI_API_KEY", None)
    with tempfile.TemporaryDirectory() as tmp, server_process(latency, server) as base_url:
        graph = write_graph(Path(tmp), TWO_HINTS, arithmetic_rows(40))
        config = RunConfig(graph=str(graph), backend="openai", base_url=base_url,
                           model="fake-small", optimizer_model="fake-large", steps=1, train=16,
                           val=16, cache="off", node_gates=node_gates,
                           concurrency=None if concurrency == "fixed" else concurrency,
                           db=str(Path(tmp) / "runs.duckdb"))
        if concurrency == "fixed":  # a limit of 64 that never adapts, for comparison
            SHARED_LIMIT.set(AdaptiveLimit(start=64, ceiling=64, floor=64))
        try:
            result = asyncio.run(execute(config))
        finally:
            SHARED_LIMIT.set(None)
        with connect(config.db, read_only=True) as con:
            wall = con.execute("SELECT ended_at - started_at FROM steps WHERE run_id = ? AND "
                               "step = 1", [result.run_id]).fetchall()[0][0]
            retries = con.execute("SELECT sum(retries) FROM llm_calls WHERE run_id = ? AND "
                                  "step = 1", [result.run_id]).fetchall()[0][0] or 0
        return {"wall": wall, "ratio": wall / (ROUNDS * latency), "retries": retries,
                "requests": result.stats.network_calls, "status": result.status,
                "failed": result.stats.failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[],
                        help="also measure these fixed limits (default: only the adaptive "
                             "default)")
    parser.add_argument("--share-429", type=float, default=0.2,
                        help="share of requests the push-back server answers with 429")
    args = parser.parse_args()
    bound = ROUNDS * args.latency
    print(f"dependency bound: {ROUNDS} rounds x {args.latency * 1000:.0f} ms = {bound:.2f} s")
    # --node-gates off (the default) is the six-round step the 1.2 s bound describes; auto
    # adds per-node validation rounds after a rejected step that changed several prompts
    for limit, gates in [(None, "off"), (None, "auto"), *((n, "off") for n in args.concurrency)]:
        run = measure_run(args.latency, limit, node_gates=gates)
        verdict = "meets" if run["ratio"] <= 1.25 else "misses"
        label = ("default (adaptive)" if limit is None else f"--concurrency {limit}") + \
            f", --node-gates {gates}"
        print(f"{label:>38}: step 1 took {run['wall']:.2f} s, critical-path ratio "
              f"{run['ratio']:.2f} ({verdict} the 1.25 goal; {run['requests']} requests)")
    wait = round(args.latency, 3)
    for name, server in ((f"{args.share_429:.0%} of requests get 429 (Retry-After "
                          f"{wait:g} s)", {"rate_limit_share": args.share_429,
                                           "retry_after": wait}),
                         (f"429 above 24 requests in flight (Retry-After {wait:g} s)",
                          {"capacity": 24, "retry_after": wait})):
        print(name + ":")
        for limit in (None, "fixed"):
            run = measure_run(args.latency, limit, server, node_gates="off")
            label = "default (adaptive)" if limit is None else "fixed 64 (no AIMD)"
            print(f"{label:>20}: step 1 took {run['wall']:.2f} s (ratio {run['ratio']:.2f}), "
                  f"{run['retries']} retries in step 1, {run['requests']} requests in the "
                  f"run, {run['failed']} calls failed; run {run['status']}")


if __name__ == "__main__":
    main()
