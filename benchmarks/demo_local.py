"""The one-click demo on the embedded model: its scores and how long it takes.

Runs sample_graphs/demo.yaml with `--backend local --steps 1` (what the dashboard's
"Run the demo" button starts) on the default seed into a temporary run log and prints
the wall time, each step's train and validation score, the accepted edits and the test
score.

    .venv/bin/python benchmarks/demo_local.py [--steps 1] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.events import Proposal, StepFinished  # noqa: E402
from engine.run import RunConfig, execute  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = RunConfig(graph=str(ROOT / "sample_graphs" / "demo.yaml"), backend="local",
                           steps=args.steps, seed=args.seed, db=str(Path(tmp) / "runs.duckdb"))
        started = time.perf_counter()
        result = asyncio.run(execute(config))
        wall = time.perf_counter() - started
    print(f"demo on the embedded model: {result.status} in {wall:.1f} s "
          f"({result.stats.calls} calls, {result.stats.completion_tokens} generated tokens)")
    for step in result.events.of(StepFinished):
        print(f"step {step.step}: train {step.train_score:.3f}  val {step.val_score:.3f}  "
              f"{'accepted' if step.accepted else ''}")
    for p in result.events.of(Proposal):
        verdict = "accepted" if p.accepted else "rejected"
        print(f"  step {p.step} {p.node_id}: {verdict} (val {p.val_before} -> {p.val_after})")
    if result.test_score is not None:
        print(f"test score: {result.test_score:.3f}")


if __name__ == "__main__":
    main()
