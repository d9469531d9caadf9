"""What `blame` costs: model calls and seconds, the first time and repeated (cache).

1. The demo graph (sample_graphs/demo.yaml) on the embedded SmolLM2-135M model: one
   optimization step with the demo's 8 training and 8 validation examples (no test split),
   then `blame` at step 1. Prints the blame table too.
2. The GSM8K graph (sample_graphs/gsm8k.yaml, 16 train / 16 validation examples from the
   data directory) against the fake OpenAI-compatible server at 200 ms a call.

    .venv/bin/python benchmarks/blame_cost.py [--skip-local] [--skip-gsm8k]
        [--latency 0.2] [--data-dir ../shared/datasets]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from rich.console import Console  # noqa: E402

from engine.cli.probes import blame_lines  # noqa: E402
from engine.probes.blame import blame  # noqa: E402
from engine.runs.execute import RunConfig, execute  # noqa: E402


def run_then_blame(config: RunConfig, label: str, show_table: bool) -> None:
    started = time.perf_counter()
    result = asyncio.run(execute(config))
    run_seconds = time.perf_counter() - started
    print(f"{label}: the run took {run_seconds:.1f} s, {result.stats.calls} calls "
          f"({result.stats.network_calls} to the model); status {result.status}")
    for attempt in ("blame", "blame again"):
        report = asyncio.run(blame(config.db, result.run_id, 1, "sampled"))
        probes = len(report.results)
        print(f"  {attempt}: {probes} probes on {len(report.examples)} failing examples x "
              f"{len(report.nodes)} LLM nodes: {report.calls} calls "
              f"({report.model_calls} to the model), {report.seconds:.1f} s")
        if show_table and attempt == "blame":
            console = Console(width=110)
            for line in blame_lines(report, console):
                console.print(line, markup=False, highlight=False)


def demo_on_local_model(tmp: str) -> None:
    config = RunConfig(graph=str(ROOT / "sample_graphs" / "demo.yaml"), backend="local",
                       steps=1, test=0, db=str(Path(tmp) / "demo.duckdb"))
    run_then_blame(config, "demo graph, embedded SmolLM2-135M, 1 step (8 train, 8 val)", True)


def gsm8k_on_fake_server(tmp: str, latency: float, data_dir: str) -> None:
    from critical_path import server_process

    os.environ.pop("OPENAI_API_KEY", None)
    with server_process(latency) as base_url:
        config = RunConfig(graph=str(ROOT / "sample_graphs" / "gsm8k.yaml"), backend="openai",
                           base_url=base_url, model="fake-small", optimizer_model="fake-large",
                           steps=1, train=16, val=16, test=0, data_dir=data_dir,
                           db=str(Path(tmp) / "gsm8k.duckdb"))
        run_then_blame(config, f"GSM8K graph, fake server at {latency * 1000:.0f} ms a call, "
                               "1 step (16 train, 16 val)", False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets"))
    parser.add_argument("--skip-local", action="store_true")
    parser.add_argument("--skip-gsm8k", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_gsm8k:
            gsm8k_on_fake_server(tmp, args.latency, args.data_dir)
        if not args.skip_local:
            demo_on_local_model(tmp)


if __name__ == "__main__":
    main()
