"""Estimate against actual: for sample graphs on the scripted backend, the model calls
`run` estimates before it starts (engine/runs/estimate.py) beside the model calls (cache
misses) the run then makes, and the relative error. Goal: within 15% on the GSM8K plan.
By default each graph runs at its own plan: its splits and 4 steps (`run`'s defaults);
`--steps`, `--train`, `--val` and `--test` override them for every graph.

    .venv/bin/python benchmarks/estimate_accuracy.py [--steps 2] [--train 16 --val 16 --test 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.graph import load_graph  # noqa: E402
from engine.events import StepFinished  # noqa: E402
from engine.runs.estimate import estimate_for  # noqa: E402
from engine.runs.execute import RunConfig, execute, load_splits  # noqa: E402

GRAPHS = ("gsm8k.yaml", "bbh.yaml", "liar.yaml", "diamond.yaml")
DATA = ROOT.parent / "shared" / "datasets"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=RunConfig.steps)
    parser.add_argument("--train", type=int, help="default: the graph's own")
    parser.add_argument("--val", type=int, help="default: the graph's own")
    parser.add_argument("--test", type=int, help="default: the graph's own")
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("graphs", nargs="*", default=list(GRAPHS))
    args = parser.parse_args()
    print(f"scripted backend, {args.steps} steps, default settings (cache readwrite, "
          f"--node-gates auto)")
    print(f"{'graph':<14} {'train/val/test':>14} {'estimate':>9} {'at most':>8} {'actual':>7} "
          f"{'error':>7} {'accepted steps':>15}")
    for name in args.graphs:
        with tempfile.TemporaryDirectory() as tmp:
            config = RunConfig(graph=str(ROOT / "sample_graphs" / name), backend="scripted",
                               steps=args.steps, train=args.train, val=args.val,
                               test=args.test, data_dir=args.data_dir,
                               db=str(Path(tmp) / "runs.duckdb"))
            graph = load_graph(config.graph)
            splits = load_splits(config, graph)
            sizes = f"{len(splits.train)}/{len(splits.val)}/{len(splits.test)}"
            estimate = estimate_for(config, graph, splits)
            result = asyncio.run(execute(config))
            actual = result.stats.calls - result.stats.cache_hits
            accepted = sum(1 for s in result.events.of(StepFinished) if s.accepted)
            expected = estimate.calls()
            print(f"{name:<14} {sizes:>14} {expected:>9,} {estimate.calls(upper=True):>8,} {actual:>7,} "
                  f"{(expected - actual) / actual:>+7.0%} {accepted:>15}")


if __name__ == "__main__":
    main()
