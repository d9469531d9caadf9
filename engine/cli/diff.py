"""Command line of run diffs (engine/probes/diff.py):

    python -m engine diff RUN_A RUN_B --db DB [--step-a S] [--step-b T] [--split train|val]
                          [--examples differing|ID,ID] [--bound K] [--json]

RUN_B may be omitted or equal RUN_A with another step: `diff RUN --step-a S` diffs step S
against step S-1 (what did that step's accepted edit change?).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from rich.table import Column, Table

from engine.probes.diff import DEFAULT_BOUND, DiffReport


def register_cli(sub: Any) -> None:
    p = sub.add_parser("diff", help="why do two runs (or two steps) differ? patch node "
                                    "outputs from A into B and find the change that matters")
    p.add_argument("run_a", help="the run whose behaviour is reproduced (A)")
    p.add_argument("run_b", nargs="?", help="default: RUN_A (then --step-b is --step-a - 1)")
    p.add_argument("--db", default="runs.duckdb",
                   help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--step-a", type=int, help="A's prompts after this step (default: last)")
    p.add_argument("--step-b", type=int, help="B's prompts after this step (default: last)")
    p.add_argument("--split", choices=("train", "val"), default="val",
                   help="which split's examples to compare (default: val)")
    p.add_argument("--examples", default="differing", metavar="differing|ID,ID",
                   help="examples to explain (default: every shared one whose score differs)")
    p.add_argument("--bound", type=int, default=DEFAULT_BOUND,
                   help="the largest set of source changes patched together")
    p.add_argument("--json", action="store_true", help="print the diff as one JSON object")
    p.set_defaults(func=cmd_diff)


def cmd_diff(args: argparse.Namespace) -> int:
    from engine.console import out
    from engine.probes.diff import diff

    report = asyncio.run(diff(args.db, args.run_a, args.run_b, step_a=args.step_a,
                              step_b=args.step_b, split=args.split, examples=args.examples,
                              bound=args.bound))
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False, indent=1))
        return 0
    for item in diff_lines(report, out):
        out.print(item, markup=False, highlight=False)
    return 0


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def diff_lines(report: DiffReport, out: Any) -> list[str]:
    """Print the per-example and per-node tables; return the lines that follow them."""
    title = (f"diff: A = {report.run_a} step {report.step_a}, B = {report.run_b} step "
             f"{report.step_b}, {report.split}: {len(report.differing)} of "
             f"{len(report.examples)} shared examples score differently")
    table = Table(Column("example", no_wrap=True), "A", "B", "source changes",
                  "explained by", "patched", title=title)
    for e in report.differing:
        explained = ", ".join(e.explained_by) if e.explained_by is not None else \
            "not patched (models differ)" if report.model_change else \
            f"none of <= {report.bound}"
        table.add_row(e.example, _score(e.score_a), _score(e.score_b),
                      ", ".join(e.sources) or "none", explained, _score(e.patched_score))
    out.print(table)
    nodes = Table(Column("node", no_wrap=True), "explains", "source change in",
                  "downstream in", title="per node (differing examples)")
    for row in report.nodes():
        nodes.add_row(row["node"], f"{row['explains']}/{row['of']}", str(row["of"]),
                      str(row["downstream"]))
    out.print(nodes)
    lines = ["source change: the node's own behaviour differs (prompt, model, or output from "
             "the same inputs); downstream: only its inputs differ (never patched, nor "
             "counted as an explanation); patched: B's score with the explaining set's "
             "outputs taken from A and their descendants re-run in B"]
    unexplained = [e.example for e in report.differing if e.explained_by is None]
    if report.model_change:
        lines.append(f"{report.model_change[0].upper()}{report.model_change[1:]}; "
                     f"{len(unexplained)} of {len(report.differing)} differing examples "
                     "left unexplained")
    elif unexplained:
        lines.append(f"{len(unexplained)} of {len(report.differing)} differing examples not "
                     f"explained within the bound ({report.bound} source changes together): "
                     f"{', '.join(unexplained)}")
    if report.not_compared:
        lines.append(f"not compared (in one graph only): {', '.join(report.not_compared)}")
    costs = "; ".join(f"run {run}: {c['calls']} calls ({c['model_calls']} to the model), "
                      f"{c['tokens']:,.0f} tokens"
                      + (f", {c['seconds']:.1f} s" if c.get("seconds") else "")
                      for run, c in report.run_costs.items())
    lines.append(f"cost: {report.calls} calls ({report.model_calls} to the model), "
                 f"{report.tokens:,} tokens, {report.seconds:.1f} s"
                 + (f"; the runs themselves: {costs}" if costs else ""))
    return lines
