"""Estimate against actual: for the demo, GSM8K and BBH graphs at their default plans and a
fork, the model calls, tokens (and, on the embedded model, wall time) that `run` estimates
before it starts (engine/runs/estimate.py: the same function prints `run`'s line and the
dashboard's Estimate) beside what the run then did, and the relative errors.
Goals: calls within 15%, tokens within 25%.

Plans: `sample_graphs/demo.yaml` on the default embedded pair (`--backend local`:
Qwen2.5-Coder-0.5B forward, 1.5B optimizer; the scripted demo model with `--no-local`), at
the graph's own settings (one step, two candidate prompt sets), as the demo button runs it;
`gsm8k.yaml` and `bbh.yaml` at their own splits and `run`'s default 4 steps against a local
OpenAI-compatible server whose replies depend on the whole prompt
(tests/support/fake_openai.py `prompt_responder`); the fork continues the GSM8K run from
step 1 with a hand-set `final` prompt.

Each graph runs twice, each time on a fresh run log: `first` with no earlier run (replies
sized by the backend's prior, which the estimate's line names: no rule knows how much an
unseen model writes; the fake server's replies are about a tenth of a real model's), then
`again` (seed 1: other examples) on a copy of the first run's log with its reply cache
emptied, so the estimate has the first run's history (reply sizes, token rate, accepted
steps, the local model's speed) and the run pays for every call as a first run does.
`bbh first, model seen`: BBH's first run in a copy of GSM8K's log (cache emptied), as on
a run log that has used the model before: its replies are sized from the model's GSM8K
calls, the rest is a first run's. A row outside the goals says whether what the run did
lies within the estimate's range by outcome, from no failing example to learn from to
every step accepted (outcomes no estimate can know; the line prints the range).

`--seeds N` runs `again` with seeds 1..N (each on its own copy of the first run's log) and
prints how many of the N rows meet both goals, with a 95% interval: one seed is one draw
of the outcome.

    .venv/bin/python benchmarks/estimate_accuracy.py [--data-dir ../shared/datasets] [--no-local]
        [--lines] [--seeds N] [GRAPH ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.critical_path import server_process  # noqa: E402
from engine.core.graph import load_graph  # noqa: E402
from engine.data.stats import Z95, wilson  # noqa: E402
from engine.runlog.schema import connect  # noqa: E402
from engine.runs.estimate import compact, estimate_for, estimate_fork  # noqa: E402
from engine.runs.execute import RunConfig, execute, load_splits  # noqa: E402
from engine.runs.fork import plan_fork, run_fork  # noqa: E402
from tests.support.fake_openai import prompt_responder  # noqa: E402

DATA = ROOT.parent / "shared" / "datasets"
GRAPHS = ROOT / "sample_graphs"
CALLS_GOAL, TOKENS_GOAL = 0.15, 0.25
LINES = False  # --lines: print each estimate's line (what `run` prints) under its row


def actual(db: str, run_id: str) -> tuple[int, int]:
    """(model calls, their tokens) of one run: cache misses only."""
    with connect(db, read_only=True) as con:
        calls, tokens = con.execute(
            "SELECT count(*), coalesce(sum(prompt_tokens + completion_tokens), 0) FROM "
            "llm_calls WHERE run_id = ? AND NOT cache_hit", [run_id]).fetchone()
    return int(calls), int(tokens)


def emptied_cache_copy(db: str, to: str) -> str:
    shutil.copy(db, to)
    with connect(to) as con:
        con.execute("DELETE FROM llm_cache")
    return to


def row(label: str, estimate, run_id: str, db: str, wall: float) -> tuple[str, float, float]:
    """The printed row, and the calls' and tokens' relative errors."""
    calls, tokens = actual(db, run_id)
    est_calls, est_tokens, est_wall = estimate.calls(), estimate.tokens(), estimate.seconds()
    calls_error, tokens_error = (est_calls - calls) / calls, (est_tokens - tokens) / tokens
    walls = (f"{est_wall:>7.0f} {wall:>6.0f} {(est_wall - wall) / wall:>+6.0%}"
             if est_wall is not None else f"{'-':>7} {wall:>6.0f} {'':>6}")
    flag = "" if inside(calls_error, tokens_error) else "  (outside)"
    if flag and estimate.by_outcome:  # the range the line gives, by the run's outcome
        (low, high), (few, many) = estimate.by_outcome
        in_range = low <= calls <= high and few <= tokens <= many
        flag += f" {'within' if in_range else 'beyond'} its range by outcome"
    if LINES:
        flag += "\n    " + estimate.line()
    return (f"{label:<22} {est_calls:>6,} {calls:>6,} {calls_error:>+6.0%} "
            f"{compact(est_tokens):>7} {compact(tokens):>7} {tokens_error:>+6.0%} "
            f"{walls}{flag}", calls_error, tokens_error)


def inside(calls_error: float, tokens_error: float) -> bool:
    return abs(calls_error) <= CALLS_GOAL and abs(tokens_error) <= TOKENS_GOAL


def seeds_summary(label: str, errors: list[tuple[float, float]]) -> str:
    """How many of the seeds' rows met both goals, with Wilson's 95% interval."""
    met = sum(inside(*e) for e in errors)
    low, high = wilson(met, len(errors), z=Z95)
    calls, tokens = [e[0] for e in errors], [e[1] for e in errors]
    return (f"{label}: within both goals on {met} of {len(errors)} seeds (95% interval "
            f"[{low:.2f}, {high:.2f}]); calls {min(calls):+.0%} to {max(calls):+.0%}, "
            f"tokens {min(tokens):+.0%} to {max(tokens):+.0%}")


def run_graph(name: str, settings: dict, data_dir: str, tmp: Path, seeds: int = 1
              ) -> list[str]:
    lines = []
    db = str(tmp / f"{name}-first.duckdb")
    errors = []  # the again rows' (calls, tokens) errors
    runs = [("first", 0, db)] + [("again" if seeds == 1 else f"again s{seed}", seed, None)
                                 for seed in range(1, seeds + 1)]
    for label, seed, log in runs:
        if log is None:
            log = emptied_cache_copy(db, str(tmp / f"{name}-again-{seed}.duckdb"))
        config = RunConfig(graph=str(GRAPHS / f"{name}.yaml"), data_dir=data_dir, db=log,
                           seed=seed, **settings)
        graph = load_graph(config.graph)
        estimate = estimate_for(config, graph, load_splits(config, graph))
        started = time.perf_counter()
        result = asyncio.run(execute(config))
        text, *error = row(f"{name} {label}", estimate, result.run_id, log,
                           time.perf_counter() - started)
        lines.append(text)
        if seed:
            errors.append(tuple(error))
        if name == "gsm8k" and seed == 1:
            lines.append(fork_row(log, result.run_id, tmp))
    if seeds > 1:
        lines.append(seeds_summary(f"{name} again", errors))
    return lines


def model_seen_row(name: str, seen: str, settings: dict, data_dir: str, tmp: Path) -> str:
    """`name`'s first run on a copy of `seen`'s first log (cache emptied): a new graph on a
    model the run log knows."""
    log = emptied_cache_copy(str(tmp / f"{seen}-first.duckdb"), str(tmp / f"{name}-seen.duckdb"))
    config = RunConfig(graph=str(GRAPHS / f"{name}.yaml"), data_dir=data_dir, db=log,
                       **settings)
    graph = load_graph(config.graph)
    estimate = estimate_for(config, graph, load_splits(config, graph))
    started = time.perf_counter()
    result = asyncio.run(execute(config))
    return row(f"{name} first, model seen", estimate, result.run_id, log,
               time.perf_counter() - started)[0]


def fork_row(db: str, parent: str, tmp: Path) -> str:
    plan = plan_fork(db, parent, 1, {"final": "Solve the problem step by step, then give "
                                               "the final number."})
    estimate = estimate_fork(plan)
    started = time.perf_counter()
    result = asyncio.run(run_fork(plan))
    return row("gsm8k fork", estimate, result.run_id, db, time.perf_counter() - started)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("SEMBACK_DATA_DIR", str(DATA)))
    parser.add_argument("--no-local", action="store_true",
                        help="the demo on the scripted demo model instead of the embedded one")
    parser.add_argument("--lines", action="store_true",
                        help="print each estimate's line, as `run` prints it, under its row")
    parser.add_argument("--seeds", type=int, default=1, metavar="N",
                        help="run `again` with seeds 1..N and count the rows within the goals")
    parser.add_argument("graphs", nargs="*", default=["demo", "gsm8k", "bbh"])
    args = parser.parse_args()
    global LINES
    LINES = args.lines
    os.environ.pop("OPENAI_API_KEY", None)
    demo = ({"backend": "scripted", "scripted_responder":
             str(GRAPHS / "demo_responder.py") + ":demo_responder"} if args.no_local
            else {"backend": "local"})
    print(f"{'run':<22} {'calls':>6} {'actual':>6} {'error':>6} {'tokens':>7} {'actual':>7} "
          f"{'error':>6} {'wall s':>7} {'actual':>6} {'error':>6}   (estimate, then actual)")
    with tempfile.TemporaryDirectory() as tmp, \
            server_process(0.0, {"responder": prompt_responder}) as base_url:
        for name in args.graphs:
            # the demo as its button runs it: the graph's own steps and candidates
            settings = ({**demo, **load_graph(str(GRAPHS / "demo.yaml")).run_defaults()}
                        if name == "demo" else
                        {"backend": "openai", "base_url": base_url})
            for line in run_graph(name, settings, args.data_dir, Path(tmp), args.seeds):
                print(line, flush=True)
        if {"gsm8k", "bbh"} <= set(args.graphs):
            print(model_seen_row("bbh", "gsm8k", {"backend": "openai", "base_url": base_url},
                                 args.data_dir, Path(tmp)), flush=True)
    print(f"goal: calls within {CALLS_GOAL:.0%} and tokens within {TOKENS_GOAL:.0%} of actual; "
          "rows outside say so")


if __name__ == "__main__":
    main()
