"""Time the run-log queries the dashboard needs on a synthetic log of realistic size.

    python benchmarks/runlog_queries.py [--steps 100] [--examples 50] [--nodes 10]
                                        [--other-runs 2] [--repeat 15] [--db PATH]

Builds a run of STEPS x EXAMPLES x NODES activations, each with its forward call, one loss
call per example, and backward calls and gradients ('gradient' and 'aggregate') for
FAILURES sampled examples per step, written the way the engine writes (one bulk
transaction per step), next to OTHER_RUNS smaller runs. Then times, as the dashboard
calls them (each opens its own short-lived read-only connection), the four queries of
engine/runlog/reader.py: step_table, node_activations, example_trace, token_totals.
Prints the median and worst wall time of REPEAT runs each, and the median CPU time (less
sensitive to other work on the machine). Goal: each median under 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.runlog import reader  # noqa: E402
from engine.runlog.schema import connect  # noqa: E402
from engine.runlog.writer import insert_rows, open_for_writing  # noqa: E402

GOAL_MS = 50.0
FAILURES = 5
WORDS = ("the of and to in is that for it as with was on be by this are or from at which "
         "number answer step total first second larger check input output prompt result "
         "question value each because then therefore compare sum difference order").split()


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(WORDS, k=words)) + f" {rng.getrandbits(32):x}"


def step_rows(rng: random.Random, run_id: str, step: int, examples: int, nodes: int
              ) -> dict[str, list[dict]]:
    """Every row one optimization step writes (activations, calls, losses, gradients...)."""
    rows: dict[str, list[dict]] = {t: [] for t in (
        "node_outputs", "llm_calls", "losses", "gradients", "updates", "prompt_versions")}
    now = time.time()

    def call(purpose: str, node: str | None, example: str | None) -> str:
        call_id = uuid.UUID(int=rng.getrandbits(128)).hex
        messages = [{"role": "system", "content": text(rng, 60)},
                    {"role": "user", "content": text(rng, 180)}]
        prompt_tokens = rng.randint(200, 600)
        rows["llm_calls"].append({
            "call_id": call_id, "run_id": run_id, "step": step, "example_id": example,
            "node_id": node, "purpose": purpose, "backend": "openai", "model": "gpt-4o-mini",
            "messages": json.dumps(messages), "response": text(rng, 40),
            "prompt_tokens": prompt_tokens, "completion_tokens": rng.randint(10, 120),
            "latency_ms": rng.uniform(200, 2000), "cache_hit": rng.random() < 0.2,
            "retries": 0, "error": None, "started_at": now, "cost_usd": 1e-4,
            "cache_key": uuid.UUID(int=rng.getrandbits(128)).hex, "temperature": 0.0,
            "max_tokens": 512})
        return call_id

    node_ids = [f"node{n}" for n in range(nodes)]
    for e in range(examples):
        example = f"ex-{e}"
        split = "train" if e < examples // 2 else "val"
        for node in node_ids:
            rows["node_outputs"].append({
                "run_id": run_id, "step": step, "split": split, "example_id": example,
                "node_id": node, "prompt_version": step // 3, "input_text": text(rng, 80),
                "output_text": text(rng, 30), "error": None, "raw_text": text(rng, 40),
                "parse_error": None, "call_id": call("forward", node, example)})
        rows["losses"].append({
            "run_id": run_id, "step": step, "split": split, "example_id": example,
            "prediction": "42", "target": "41", "score": float(rng.random() < 0.5),
            "feedback": text(rng, 30), "error": None, "call_id": call("loss", None, example)})
    for e in rng.sample(range(examples // 2), FAILURES) if step else []:
        for node in node_ids:
            call_id = call("backward", node, f"ex-{e}")
            for kind, source in (("gradient", node_ids[-1]), ("aggregate", None)):
                rows["gradients"].append({
                    "run_id": run_id, "step": step, "example_id": f"ex-{e}", "node_id": node,
                    "from_node_id": source, "method": "semantic", "content": text(rng, 60),
                    "call_id": call_id, "kind": kind, "parse_error": None})
    for node in node_ids if step else []:
        old, new = text(rng, 30), text(rng, 35)
        rows["updates"].append({
            "run_id": run_id, "step": step, "node_id": node, "old_prompt": old,
            "new_prompt": new, "accepted": step % 3 == 0, "val_before": 0.5, "val_after": 0.6,
            "call_id": call("update", node, None), "parse_error": None, "reasoning": ""})
        rows["prompt_versions"].append({"run_id": run_id, "node_id": node, "version": step,
                                        "prompt": new, "step": step,
                                        "accepted": step % 3 == 0})
    return rows


def build(db: Path, run_id: str, steps: int, examples: int, nodes: int, seed: int
          ) -> list[float]:
    """Write one run step by step, as the engine does; returns seconds per step write."""
    rng = random.Random(seed)
    with connect(db) as con:
        insert_rows(con, "runs", [{"run_id": run_id, "graph_name": "synthetic",
                                   "method": "semantic", "status": "finished",
                                   "config": "{}", "started_at": time.time()}])
    write_times = []
    for step in range(steps):
        rows = step_rows(rng, run_id, step, examples, nodes)
        started = time.perf_counter()
        with connect(db) as con:
            con.execute("BEGIN TRANSACTION")
            for table, table_rows in rows.items():
                insert_rows(con, table, table_rows)
            insert_rows(con, "steps", [{
                "run_id": run_id, "step": step, "train_score": rng.random(),
                "val_score": rng.random(), "accepted": step % 3 == 0,
                "started_at": time.time(), "ended_at": time.time()}])
            con.execute("COMMIT")
        write_times.append(time.perf_counter() - started)
    return write_times


def connect_only(db: Path) -> None:
    with connect(db, read_only=True):
        pass


def timed(queries: dict[str, Callable[[], object]], repeat: int
          ) -> dict[str, tuple[list[float], list[float]]]:
    """Wall and CPU milliseconds per query; the queries take turns, so that a change in
    the machine's load touches them all alike."""
    for fn in queries.values():
        fn()  # warm the OS file cache, as a dashboard that has already drawn a page would
    times: dict[str, tuple[list[float], list[float]]] = {q: ([], []) for q in queries}
    for _ in range(repeat):
        for name, fn in queries.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            times[name][0].append((time.perf_counter() - wall) * 1000)
            times[name][1].append((time.process_time() - cpu) * 1000)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--examples", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--other-runs", type=int, default=2,
                        help="smaller runs (a tenth of the steps) in the same file")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--db", help="where to build the log (default: a temporary file)")
    parser.add_argument("--reuse", action="store_true",
                        help="time the queries on an existing --db built by an earlier run")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(args.db or Path(tmp) / "bench.duckdb")
        if args.reuse and db.exists():
            writes, built = [], 0.0
        else:
            if db.exists():
                db.unlink()
            open_for_writing(db)
            started = time.perf_counter()
            for i in range(args.other_runs):
                build(db, f"other-{i}", max(1, args.steps // 10), args.examples, args.nodes,
                      i + 1)
            writes = build(db, "bench", args.steps, args.examples, args.nodes, 0)
            built = time.perf_counter() - started
        with connect(db, read_only=True) as con:
            counts = {t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = 'bench'"
                                     ).fetchall()[0][0]
                      for t in ("node_outputs", "llm_calls", "gradients", "losses")}
        size_mb = db.stat().st_size / 1e6
        print(f"log: {args.steps} steps x {args.examples} examples x {args.nodes} nodes; "
              + ", ".join(f"{t} {n}" for t, n in counts.items())
              + f"; {args.other_runs} other runs; file {size_mb:.0f} MB; built in {built:.1f} s")
        if writes:
            print(f"write one step (one transaction, bulk): median "
                  f"{statistics.median(writes) * 1000:.1f} ms, worst "
                  f"{max(writes) * 1000:.1f} ms")

        middle = args.steps // 2
        queries = {
            "step_table": lambda: reader.step_table(db, "bench"),
            "node_activations": lambda: reader.node_activations(db, "bench", "node3"),
            "example_trace": lambda: reader.example_trace(db, "bench", middle, "ex-2"),
            "token_totals": lambda: reader.token_totals(db, "bench"),
            "(connect only)": lambda: connect_only(db),
        }
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"{args.repeat} runs each, {os.cpu_count()} CPUs, load average {load:.1f}; "
              f"goal: median under {GOAL_MS:g} ms")
        print(f"{'query':<20}{'median ms':>10}{'worst ms':>10}{'CPU ms':>10}")
        missed = []
        for name, (wall, cpu) in timed(queries, args.repeat).items():
            median = statistics.median(wall)
            flag = "" if name.startswith("(") or median < GOAL_MS else "  MISSED"
            if flag:
                missed.append(name)
            print(f"{name:<20}{median:>10.1f}{max(wall):>10.1f}"
                  f"{statistics.median(cpu):>10.1f}{flag}")
        if missed:
            print(f"over the goal: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
