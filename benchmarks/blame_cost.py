"""What `blame` costs: model calls and seconds, the first time and repeated (cache).

1. The demo graph (sample_graphs/demo.yaml) on the embedded SmolLM2-135M model: one
   optimization step with the demo's 8 training and 8 validation examples (no test split),
   then `blame` at step 1. Prints the blame table too.
2. The GSM8K graph (sample_graphs/gsm8k.yaml, 16 train / 16 validation examples from the
   data directory) against the fake OpenAI-compatible server at 200 ms a call.

    .venv/bin/python benchmarks/blame_cost.py [--skip-local] [--skip-gsm8k]
        [--latency 0.2] [--data-dir ../shared/datasets]
    .venv/bin/python benchmarks/blame_cost.py --adaptive 0,1 [--examples val]
        [--graph sample_graphs/case_rooms.yaml] [--keep DIR] [--only adaptive|exhaustive]

3. With --adaptive: the demo (or --graph, at its own settings) on the embedded pair
   (Qwen2.5-Coder-0.5B forward, 1.5B optimizer) per seed, then adaptive and exhaustive
   blame on the same run, each on its own copy of the run log: probes, model calls,
   seconds and the verdict of each.
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


def learned(db: str, run_id: str) -> str:
    """The run's validation score at step 0 and at its last step, and the prompts it kept."""
    import duckdb

    with duckdb.connect(db, read_only=True) as con:
        scores = con.execute("SELECT step, val_score FROM steps WHERE run_id = ? ORDER BY step",
                             [run_id]).fetchall()
        kept = con.execute("SELECT node_id, prompt FROM prompt_versions WHERE run_id = ? "
                           "AND version > 0 "
                           "AND accepted ORDER BY node_id", [run_id]).fetchall()
    edits = "; ".join(f"{node}: {text!r}" for node, text in kept) or "no edit kept"
    return f"validation {scores[0][1]:.3f} -> {scores[-1][1]:.3f}; kept {edits}"


def adaptive_against_exhaustive(tmp: str, seeds: list[int], examples: str,
                                graph: Path = ROOT / "sample_graphs" / "demo.yaml",
                                only: str | None = None) -> None:
    """The demo on the embedded pair (its defaults: one step), then blame on its `examples`
    twice, adaptive and exhaustive, each on its own copy of the run log (so neither is
    served the other's probes from the cache): calls, wall time and verdict of each. A run
    log already in `tmp` (`--keep`) is blamed again instead of running the seed anew;
    `only`: one of the two blames."""
    import shutil

    import duckdb

    rows = []
    for seed in seeds:
        db = Path(tmp) / f"demo-{seed}.duckdb"
        from engine.core.graph import load_graph

        if db.exists():
            with duckdb.connect(str(db), read_only=True) as con:
                run_id = con.execute("SELECT run_id FROM runs").fetchone()[0]
            print(f"seed {seed}: the run in {db}; {learned(str(db), run_id)}", flush=True)
        else:
            config = RunConfig(graph=str(graph), backend="local", seed=seed, db=str(db),
                               **load_graph(str(graph)).run_defaults())
            started = time.perf_counter()
            result = asyncio.run(execute(config))
            run_id = result.run_id
            print(f"seed {seed}: the {graph.stem} run took "
                  f"{time.perf_counter() - started:.0f} s, {result.stats.network_calls} model "
                  f"calls, status {result.status}; {learned(str(db), run_id)}", flush=True)
        for adaptive in (True, False):
            if only and only != ("adaptive" if adaptive else "exhaustive"):
                continue
            copy = Path(tmp) / f"demo-{seed}-{'adaptive' if adaptive else 'exhaustive'}.duckdb"
            shutil.copy(db, copy)
            report = asyncio.run(blame(str(copy), run_id, 1, examples,
                                       adaptive=adaptive, announce=print))
            probes = len(report.results)
            rows.append((seed, "adaptive" if adaptive else "exhaustive", probes,
                         report.model_calls, report.seconds, report.verdict.named))
            print(f"  {rows[-1][1]}: {probes} probes, {report.model_calls} model calls, "
                  f"{report.seconds:.0f} s; blames {report.verdict.named}", flush=True)
    print(f"\nblame on the {graph.stem} run's {examples} examples, embedded pair, step 1")
    print(f"{'seed':>4}  {'blame':<10} {'probes':>6} {'model calls':>11} {'seconds':>7}  verdict")
    for seed, how, probes, calls, seconds, named in rows:
        print(f"{seed:>4}  {how:<10} {probes:>6} {calls:>11} {seconds:>7.0f}  {named}")
    for seed in seeds:
        pair = [r for r in rows if r[0] == seed]
        if len(pair) < 2:
            continue
        same = pair[0][5] == pair[1][5]
        print(f"seed {seed}: the same verdict: {'yes' if same else 'NO'}; adaptive took "
              f"{pair[0][4] / max(pair[1][4], 1e-9):.0%} of exhaustive's time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets"))
    parser.add_argument("--skip-local", action="store_true")
    parser.add_argument("--skip-gsm8k", action="store_true")
    parser.add_argument("--adaptive", metavar="SEEDS",
                        help="only: adaptive against exhaustive blame on the demo run of each "
                             "seed (e.g. 0,1) on the embedded pair")
    parser.add_argument("--examples", default="val", help="with --adaptive: which examples")
    parser.add_argument("--graph", type=Path, default=ROOT / "sample_graphs" / "demo.yaml",
                        help="with --adaptive: the graph (default: the demo)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="with --adaptive: write the run logs into DIR and keep them "
                             "(default: a temporary folder); a seed's run log already there "
                             "is blamed again instead of running the seed anew")
    parser.add_argument("--only", choices=("adaptive", "exhaustive"),
                        help="with --adaptive: make one of the two blames")
    args = parser.parse_args()
    if args.adaptive:
        seeds = [int(s) for s in args.adaptive.split(",")]
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            adaptive_against_exhaustive(str(args.keep), seeds, args.examples, args.graph,
                                        args.only)
            return
        with tempfile.TemporaryDirectory() as tmp:
            adaptive_against_exhaustive(tmp, seeds, args.examples, args.graph, args.only)
        return
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_gsm8k:
            gsm8k_on_fake_server(tmp, args.latency, args.data_dir)
        if not args.skip_local:
            demo_on_local_model(tmp)


if __name__ == "__main__":
    main()
