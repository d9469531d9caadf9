"""What one optimization step costs, on real questions: `sample_graphs/gsm8k.yaml` (two hint
nodes feeding a final node) on real GSM8K rows (the project's loader, `--data-dir`), 16
training and 16 validation questions, 2 back-propagated failures, one step, against a local
OpenAI-compatible server (127.0.0.1, 200 ms a request) whose replies depend on the whole
prompt (tests/support/fake_openai.py `prompt_responder`: a different prompt gets a different
reply, as a model's does, in the format the request asks for).

Each setting runs on an empty run log and a fresh server (so the server's prefix cache
starts empty). For step 1 it prints: requests (calls that reached the server), tokens
(prompt + completion, and the prompt tokens the server's prefix cache reported), dependent
rounds (the longest chain of requests each sent after the previous one returned, measured
from the run log's call times), wall (the step's time in the run log) and the
critical-path ratio (wall / (dependent rounds x latency)).

Each setting is then run again as `python -m engine run sample_graphs/gsm8k.yaml --backend
openai --base-url URL ...` in its own process against a fresh server (the `cli` rows), read
from its run log the same way: requests and tokens must be the same.

Goal: at default settings tokens <= 11.0k, what Trace 0.1.3.8 spent on the same
step (97 requests), the cheapest peer measured; with `--cache off` a ratio <= 1.1.

    .venv/bin/python benchmarks/step_cost.py [--data-dir ../shared/datasets] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.critical_path import server_process  # noqa: E402
from engine.runlog.reader import list_runs, step_call_costs, step_request_times  # noqa: E402
from engine.runs.execute import RunConfig, execute  # noqa: E402
from tests.support.fake_openai import prompt_responder  # noqa: E402

GRAPH = ROOT / "sample_graphs" / "gsm8k.yaml"
DATA = ROOT.parent / "shared" / "datasets"
TRAIN, VAL, STEP = 16, 16, 1
TRACE_TOKENS, RATIO_GOAL = 11_000, 1.1
# (label, run settings): the defaults first, then what each flag changes
SETTINGS = [
    ("defaults", {}),
    ("--cache off", {"cache": "off"}),
    ("--node-gates auto", {"node_gates": "auto"}),
    ("--cache off --node-gates auto", {"cache": "off", "node_gates": "auto"}),
    ("--node-gates on", {"node_gates": "on"}),
]


def dependent_rounds(calls: list[tuple[float, float]]) -> int:
    """The longest chain of calls (start, end) in which each starts after the one before it
    ended: the rounds the step waited for, one after another."""
    depth: list[tuple[float, int]] = []  # (end, chain length ending with that call)
    best = 0
    for start, end in sorted(calls):
        chain = 1 + max((d for e, d in depth if e <= start), default=0)
        depth.append((end, chain))
        best = max(best, chain)
    return best


def step_figures(db: str, run_id: str, latency: float) -> dict:
    """Step 1's requests, tokens, rounds, wall and ratio, from the run log."""
    step = next(row for row in step_call_costs(db, run_id) if row["step"] == STEP)
    rounds = dependent_rounds(step_request_times(db, run_id, STEP))
    wall = float(step["seconds"])
    return {"requests": int(step["calls"]), "prompt": int(step["prompt_tokens"]),
            "completion": int(step["completion_tokens"]),
            "prefix": int(step["provider_cached_tokens"]), "rounds": rounds, "wall": wall,
            "ratio": wall / (rounds * latency) if rounds else float("nan")}


def config_for(settings: dict, base_url: str, data_dir: str, db: str) -> RunConfig:
    return RunConfig(graph=str(GRAPH), backend="openai", base_url=base_url, steps=STEP,
                     train=TRAIN, val=VAL, test=0, data_dir=data_dir, db=db, **settings)


def cli_args(settings: dict, base_url: str, data_dir: str, db: str) -> list[str]:
    from engine.runs.settings import as_flags

    return [sys.executable, "-m", "engine", "run", str(GRAPH), "--backend", "openai",
            "--base-url", base_url, "--steps", str(STEP), "--train", str(TRAIN), "--val",
            str(VAL), "--test", "0", "--data-dir", data_dir, "--db", db, *as_flags(settings)]


def measure(settings: dict, latency: float, data_dir: str, via_cli: bool) -> dict:
    """One run of step 0 and step 1 on an empty run log against a fresh server."""
    os.environ.pop("OPENAI_API_KEY", None)
    with tempfile.TemporaryDirectory() as tmp, \
            server_process(latency, {"prefix_cache": True,
                                     "responder": prompt_responder}) as base_url:
        db = str(Path(tmp) / "runs.duckdb")
        if via_cli:
            done = subprocess.run(cli_args(settings, base_url, data_dir, db), cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)},
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"error: the CLI run failed: {done.stderr.strip()[-500:]}")
            run_id = list_runs(db)["run_id"].iloc[0]
        else:
            run_id = asyncio.run(execute(config_for(settings, base_url, data_dir, db))).run_id
        return step_figures(db, run_id, latency)


def row(label: str, run: dict) -> str:
    tokens = run["prompt"] + run["completion"]
    return (f"{label:<36} {run['requests']:>8} {tokens / 1000:>6.1f}k {run['prompt']:>7,} "
            f"{run['completion']:>6,} {run['prefix']:>7,} {run['rounds']:>6} "
            f"{run['wall']:>6.2f} {run['ratio']:>5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--data-dir", default=os.environ.get("SEMBACK_DATA_DIR", str(DATA)))
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per setting; the run of median wall is shown")
    parser.add_argument("--no-cli", action="store_true",
                        help="skip the same runs through `python -m engine run`")
    args = parser.parse_args()
    print(f"GSM8K step {STEP} ({TRAIN} train, {VAL} validation questions, real rows), "
          f"{args.latency * 1000:.0f} ms prompt-sensitive server, empty run log per run")
    print(f"{'settings':<36} {'requests':>8} {'tokens':>7} {'prompt':>7} {'compl.':>6} "
          f"{'prefix-cached':>7} {'rounds':>6} {'wall s':>6} {'ratio':>5}")
    results = {}
    for label, settings in SETTINGS:
        runs = sorted((measure(settings, args.latency, args.data_dir, False)
                       for _ in range(args.repeat)), key=lambda r: r["wall"])
        results[label] = run = runs[len(runs) // 2]
        print(row(label, run))
        if not args.no_cli:
            print(row("  same via `python -m engine run`",
                      measure(settings, args.latency, args.data_dir, True)))
    defaults, off = results["defaults"], results["--cache off"]
    tokens = defaults["prompt"] + defaults["completion"]
    walls = statistics.median([r["wall"] for r in results.values()])
    print(f"goal: tokens at defaults <= {TRACE_TOKENS / 1000:.1f}k (Trace 0.1.3.8's on the same "
          f"step): {tokens / 1000:.1f}k, "
          f"{'meets' if tokens <= TRACE_TOKENS else 'misses'}; critical-path ratio with "
          f"--cache off <= {RATIO_GOAL}: {off['ratio']:.2f}, "
          f"{'meets' if off['ratio'] <= RATIO_GOAL else 'misses'} (median wall of the "
          f"settings {walls:.2f} s)")


if __name__ == "__main__":
    main()
