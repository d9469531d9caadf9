"""Wall time of the smoke plan (benchmarks/plans/smoke.yaml, 14 runs) with
`python -m engine experiment --parallel 1` and `--parallel 4`, against the fake
OpenAI-compatible server at 200 ms a call (in its own process), cache off by a fresh run
log per measurement. Needs the benchmark data (../shared/datasets or --data-dir).

    .venv/bin/python benchmarks/experiment_parallel.py [--latency 0.2] [--parallel 1 4]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.critical_path import server_process  # noqa: E402
from engine.cli import main as cli_main  # noqa: E402
from engine.runlog.schema import connect  # noqa: E402

PLAN = REPO / "benchmarks" / "plans" / "smoke.yaml"


def measure(parallel: int, latency: float, data_dir: str) -> tuple[float, int, int]:
    """(wall seconds, runs finished, model calls) of one experiment."""
    os.environ.pop("OPENAI_API_KEY", None)
    with tempfile.TemporaryDirectory() as tmp, server_process(latency) as base_url:
        db = Path(tmp) / "runs.duckdb"
        args = ["experiment", str(PLAN), "--backend", "openai", "--base-url", base_url,
                "--model", "fake", "--data-dir", data_dir, "--db", str(db), "--out",
                str(Path(tmp) / "results"), "--yes", "--parallel", str(parallel)]
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = cli_main(args)
        wall = time.perf_counter() - started
        if code != 0:
            raise SystemExit(f"the experiment failed (status {code})")
        with connect(db, read_only=True) as con:
            finished = con.execute("SELECT count(*) FROM runs WHERE status = 'finished'"
                                   ).fetchall()[0][0]
            calls = con.execute("SELECT count(*) FROM llm_calls").fetchall()[0][0]
    return wall, finished, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "datasets"))
    args = parser.parse_args()
    print(f"smoke plan against the fake server at {args.latency * 1000:.0f} ms a call")
    first = None
    for n in args.parallel:
        wall, finished, calls = measure(n, args.latency, args.data_dir)
        first = first or wall
        print(f"--parallel {n}: {wall:.1f} s for {finished} runs ({calls} model calls), "
              f"{first / wall:.2f}x the first")


if __name__ == "__main__":
    main()
