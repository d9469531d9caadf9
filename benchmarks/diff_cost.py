"""What `engine diff` costs against the runs it compares: calls, model calls, tokens and
seconds, the first time and repeated (every reply then comes from the cache).

1. The GSM8K graph (sample_graphs/gsm8k.yaml, scripted backend, seed 0, 24 train and 24
   validation examples from the data directory): one optimization step whose edit passes
   the gate, then `diff RUN --step-a 1` (step 1 against step 0) on validation and on the
   training split (where step 1's prompts have no logged trace, so the diff runs them).
2. With `--local`, the demo graph on the embedded SmolLM2-135M model: a run of one step
   with the gate off (its edits accepted) and the same diffs (slow on a few cores).

    .venv/bin/python benchmarks/diff_cost.py [--data-dir ../shared/datasets] [--local]
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

from rich.console import Console  # noqa: E402

from engine.cli.diff import diff_lines  # noqa: E402
from engine.probes.diff import diff  # noqa: E402
from engine.runs.execute import RunConfig, execute  # noqa: E402


def run_and_diff(console: Console, config: RunConfig) -> None:
    started = time.perf_counter()
    asyncio.run(execute(config))
    run_seconds = time.perf_counter() - started
    console.print(f"run {config.run_id}: {run_seconds:.1f} s", markup=False)
    for split in ("val", "train"):
        for attempt in ("first", "repeated"):
            report = asyncio.run(diff(config.db, config.run_id, step_a=1, split=split))
            console.print(f"--- diff {config.run_id} --step-a 1 --split {split} ({attempt})",
                          markup=False)
            for line in diff_lines(report, console):
                console.print(line, markup=False, highlight=False)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets"))
    parser.add_argument("--local", action="store_true", help="also the demo on the embedded "
                                                             "model")
    args = parser.parse_args()
    console = Console(width=110)
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "diff.duckdb")
        run_and_diff(console, RunConfig(
            graph=str(ROOT / "sample_graphs" / "gsm8k.yaml"), db=db, backend="scripted",
            steps=1, train=24, val=24, test=0, seed=0, run_id="gsm",
            data_dir=args.data_dir))
        if args.local:
            run_and_diff(console, RunConfig(
                graph=str(ROOT / "sample_graphs" / "demo.yaml"), db=db, backend="local",
                steps=1, test=0, gate=False, run_id="demo-nogate"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
