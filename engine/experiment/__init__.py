"""The experiment harness: `python -m engine experiment PLAN` runs a plan of benchmark runs
(the paper's protocol is benchmarks/plans/paper.yaml) and writes results.md and results.csv.

A plan is a YAML file: `name`, `description` and a list of `entries`. Each entry is a graph
run with several methods (or named variants of a method, for ablations) on one dataset, or
on every BBH task (`tasks: all`), for one or more seeds. Each (entry, task, variant, seed)
is one run: `engine.runs.execute.execute`, logged in the run log like any other run. Finished runs
are found again in the run log by their run id prefix and configuration and skipped, so an
interrupted experiment continues where it stopped. Results are always read back from the
run log. The harness is one workflow, one module per stage: plan -> cells (estimate) ->
runs -> results; this module is its command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from engine.experiment.cells import (
    BAD_INPUT,
    SAME_CONFIG,
    Cell,
    expand,
    finished_runs,
    prepare,
    resolved_models,
    run_cell,
    run_cells,
)
from engine.experiment.estimate import (
    FORWARD_TOKENS,
    OPTIMIZER_TOKENS,
    Estimate,
    backward_calls_per_example,
    confirm,
    estimate_run,
    estimate_table,
)
from engine.experiment.plan import (
    ENTRY_KEYS,
    GROUPS,
    NAME,
    PLAN_KEYS,
    VARIANT_KEYS,
    Entry,
    Plan,
    PlanError,
    Variant,
    load_plan,
)
from engine.experiment.results import (
    COLUMNS,
    markdown_table,
    result_rows,
    results_markdown,
    write_results,
)
from engine.runlog.experiments import run_metrics
from engine.runs.settings import RunConfig, add_run_flags, given_settings, positive_int

__all__ = [
    "BAD_INPUT", "COLUMNS", "ENTRY_KEYS", "FORWARD_TOKENS", "GROUPS", "NAME", "OPTIMIZER_TOKENS",
    "PLAN_KEYS", "SAME_CONFIG", "VARIANT_KEYS", "Cell", "Entry", "Estimate", "Plan",
    "PlanError", "Variant", "backward_calls_per_example", "cmd_experiment", "confirm",
    "estimate_run", "estimate_table", "expand", "finished_runs", "load_plan", "prepare",
    "register_cli", "resolved_models", "result_rows", "results_markdown", "run_cell",
    "run_cells", "run_metrics", "write_results",
]


# --- command line ---------------------------------------------------------------------


def register_cli(subparsers: Any) -> None:
    p = subparsers.add_parser("experiment", help="run a plan of benchmark runs (the paper's "
                                                 "protocol) and write a results table")
    p.add_argument("plan", help="plan file, e.g. benchmarks/plans/paper.yaml")
    # the run settings an experiment takes from its command line (the plan sets the rest)
    add_run_flags(p, only=("db", "data_dir", "backend", "model", "optimizer_model", "base_url",
                           "concurrency"))
    p.add_argument("--out", help="folder for results.md and results.csv "
                                 "(default: results/<plan name>/)")
    p.add_argument("--yes", action="store_true", help="start without asking")
    p.add_argument("--parallel", type=positive_int, default=1, metavar="N",
                   help="runs at once, in this process, under one shared concurrency limit "
                        "(results are the same as one at a time)")
    p.add_argument("--limit-tasks", type=positive_int, metavar="N",
                   help="only the first N BBH tasks (alphabetical), for trying a plan")
    # the budget: for the whole plan, not per run
    add_run_flags(p, only=("max_calls", "max_cost"))
    p.add_argument("--methods", metavar="A,B",
                   help="only run these methods or variants (the table still shows the rest)")
    p.set_defaults(func=cmd_experiment)


def _selected(cells: list[Cell], methods: str | None) -> list[Cell]:
    if not methods:
        return cells
    wanted = {m.strip() for m in methods.split(",") if m.strip()}
    known = {n for c in cells for n in (c.variant.name, c.variant.method)}
    unknown = sorted(wanted - known)
    if unknown:
        raise PlanError(f"--methods: '{unknown[0]}' is no method or variant of this plan "
                        f"(plan has: {', '.join(sorted(known))})")
    return [c for c in cells if c.variant.name in wanted or c.variant.method in wanted]


def cmd_experiment(args: argparse.Namespace) -> int:
    from engine.console import console, out
    from engine.llm.factory import default_backend_kind

    plan = load_plan(args.plan)
    settings = given_settings(args)
    settings.setdefault("backend", default_backend_kind())
    base = RunConfig(graph="", **settings)
    args.db, args.data_dir, args.concurrency = base.db, base.data_dir, base.concurrency
    cells = expand(plan, args.data_dir, args.limit_tasks)
    prepare(cells, base)
    finished_runs(args.db, cells)
    pending = [c for c in _selected(cells, args.methods) if not c.run_id]
    table, total = estimate_table(cells, pending)
    out.print(table)
    out.print(f"{len(cells)} runs in plan '{plan.name}': {len(cells) - len(pending)} already "
              f"finished or filtered out, {len(pending)} to run. Each run's figures are "
              f"the 'at most' ones `run` would print for it, its tokens from the prompts "
              f"it will send.", markup=False, highlight=False)
    if not confirm(total, args.yes, sys.stdin, console):
        console.print("not started", markup=False)
        return 1
    from engine.llm.budget import Budget

    budget = Budget(base.max_calls, base.max_cost)  # a negative --max-cost: ValueError here
    failed = run_cells(pending, console, args.parallel, args.concurrency, budget) \
        if pending else []
    metrics = run_metrics(args.db, [c.run_id for c in cells if c.run_id])
    rows = result_rows(cells, metrics)
    out_dir = Path(args.out) if args.out else Path("results") / plan.name
    md_path, csv_path = write_results(out_dir, plan, rows, metrics, args.db, cells)
    out.print("\n".join(markdown_table([r for r in rows if r["level"] != "task"], True)),
              markup=False, highlight=False)
    out.print(f"results: {md_path} and {csv_path}; open any run with the dashboard "
              f"(run log {args.db})", markup=False, highlight=False)
    if failed:
        console.print(f"{len(failed)} runs did not finish: {', '.join(failed)}; run the same "
                      f"command again to retry them", markup=False, highlight=False)
        return 1
    return 0
