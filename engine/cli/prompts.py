"""Command line of the prompts a run keeps (engine/runs/handback.py):

    python -m engine prompts RUN_ID --db DB [--format yaml|json|dspy] [--out FILE]
                             [--program FILE.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register_cli(sub: Any) -> None:
    from engine.runs.handback import FORMATS

    p = sub.add_parser("prompts", help="write the prompts a run keeps, each with the step and "
                                       "validation that kept it (YAML, JSON, or a DSPy "
                                       "program's state)")
    p.add_argument("run_id", help="the run (python -m engine runs lists the ids)")
    p.add_argument("--db", default="runs.duckdb",
                   help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--format", choices=FORMATS, default="yaml",
                   help="yaml or json: {run_id, nodes: {node: {prompt, original, changed, step, "
                        "evidence}}}; dspy: the --program file with each changed node's "
                        "predictor given the kept prompt as its instructions, for "
                        "program.load(FILE) (default: yaml)")
    p.add_argument("--program", metavar="FILE.json",
                   help="with --format dspy: the program's own program.save('FILE.json'); "
                        "each node is its predictor whose instructions are the node's original "
                        "prompt, else whose fields are the node's")
    p.add_argument("--out", metavar="FILE",
                   help="write to this file (default: standard output)")
    p.set_defaults(func=cmd_prompts)


def cmd_prompts(args: argparse.Namespace) -> int:
    from engine.runs.handback import HandBackError, kept_prompts, render

    if args.program and args.format != "dspy":
        raise HandBackError("--program goes with --format dspy")
    hand = kept_prompts(args.db, args.run_id)
    text, matched = render(hand, args.format, args.program)
    if not args.out:
        print(text, end="")
        return 0
    Path(args.out).write_text(text, encoding="utf-8")
    changed = [n.node_id for n in hand.nodes if n.changed]
    print(f"wrote the kept prompts of run '{args.run_id}' as {args.format} to {args.out}: "
          f"{len(hand.nodes)} nodes, {len(changed)} changed"
          f"{' (' + ', '.join(changed) + ')' if changed else ''}")
    for node, (predictor, by) in matched.items():
        print(f"  {node} -> predictor {predictor} (matched by {by})")
    return 0
