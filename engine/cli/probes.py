"""Command line of probes and blame (engine/probes/probe.py, engine/probes/blame.py):

    python -m engine probe RUN_ID --db DB --step S --node N --example E --output TEXT|@FILE
    python -m engine probe RUN_ID --db DB --step S --node N --example E --gradient
    python -m engine probe RUN_ID --db DB --step S --node N --edit proposed|@FILE
                                  [--examples failing|val|ID,ID]
    python -m engine blame RUN_ID --db DB --step S [--examples failing|val]

`probe --json` prints the probe rows (with their re-computed outputs) for machines such as
the dashboard's background jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from rich.table import Column, Table

from engine.probes.probe import ProbeError


def register_cli(sub: Any) -> None:
    p = sub.add_parser("probe", help="intervene on one node of a logged step and re-run "
                                     "what depends on it")
    p.add_argument("run_id", help="the run (python -m engine runs lists the ids)")
    p.add_argument("--db", default="runs.duckdb", help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--step", type=int, required=True,
                   help="the logged step whose calls are re-run (1 for the first update)")
    p.add_argument("--node", required=True, help="the node to intervene on")
    p.add_argument("--example", help="the example (output and gradient probes)")
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--output", metavar="TEXT|@FILE", help="replace the node's output")
    kind.add_argument("--gradient", action="store_true",
                      help="rewrite the node's output as its gradient says")
    kind.add_argument("--edit", metavar="proposed|@FILE",
                      help="run the node with the step's proposed prompt, or a prompt file")
    p.add_argument("--examples", default="failing", metavar="failing|val|ID,ID",
                   help="examples for --edit (default: those back-propagated at the step)")
    p.add_argument("--json", action="store_true", help="print the probe rows as JSON")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("blame", help="follow every node's gradient on the failing examples "
                                     "of a step and see which one fixes them")
    p.add_argument("run_id", help="the run (python -m engine runs lists the ids)")
    p.add_argument("--db", default="runs.duckdb", help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--step", type=int, required=True,
                   help="the logged step whose failing examples are checked")
    p.add_argument("--examples", choices=("failing", "val"), default="failing",
                   help="the examples back-propagated at the step (default), or every "
                        "validation example")
    p.set_defaults(func=cmd_blame)


def _text(value: str) -> str:
    """TEXT, or the contents of FILE for @FILE."""
    if value.startswith("@"):
        path = Path(value[1:])
        if not path.is_file():
            raise ProbeError(f"{path}: no such file")
        return path.read_text(encoding="utf-8")
    return value


def cmd_probe(args: argparse.Namespace) -> int:
    from engine.console import console, out
    from engine.probes.blame import probe

    if args.output is not None:
        kind, text = "output", _text(args.output)
    elif args.gradient:
        kind, text = "gradient", None
    else:
        kind = "edit"
        text = "proposed" if args.edit == "proposed" else _text(args.edit)
    _say_if_busy(args.db, args.run_id, console)
    results = asyncio.run(probe(args.db, args.run_id, args.step, args.node, kind,
                                example=args.example, text=text, examples=args.examples))
    if args.json:
        rows = [{**r.row(), "call_ids": r.call_ids,
                 "outputs": [vars(o) for o in r.outputs]} for r in results]
        print(json.dumps(rows, ensure_ascii=False, indent=1))
        return 0
    for r in results:
        out.print(describe(r), markup=False, highlight=False)
    flips = sum(r.flipped for r in results)
    out.print(f"{flips} of {len(results)} examples flipped to correct", markup=False)
    return 0


def describe(r: Any) -> str:
    change = {"output": "replaced its output with", "gradient": "followed its gradient:",
              "edit": "ran it with the prompt"}[r.kind]
    line = (f"probe {r.probe_id}: step {r.step}, example '{r.example_id}', node "
            f"'{r.node_id}': {change} {_short(r.intervention)}\n"
            f"  final output {_short(r.before_output)} (score {_score(r.before_score)}) -> "
            f"{_short(r.after_output)} (score {_score(r.after_score)})")
    if r.error:
        line += f"; error: {r.error}"
    elif r.flipped:
        line += "; flipped to correct"
    if r.leaks_target:
        line += " [the intervention contains the target]"
    return line


def _short(text: str, limit: int = 70) -> str:
    text = " ".join((text or "").split())
    return repr(text if len(text) <= limit else text[:limit - 1] + "…")


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _say_if_busy(db: str, run_id: str, console: Any) -> None:
    """One line when another process may be writing the log (a running optimization)."""
    from engine.runlog.schema import check_readable, connect

    check_readable(db)
    with connect(db, read_only=True) as con:
        running = [r[0] for r in con.execute(
            "SELECT run_id FROM runs WHERE status = 'running'").fetchall()]
    if running:
        console.print(f"note: run '{running[0]}' is marked running in {db}: probes read "
                      "committed steps only and write in one short transaction, retried "
                      "while that run holds the file; it is not disturbed", markup=False,
                      highlight=False)


def cmd_blame(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.console import console, out
    from engine.probes.blame import blame

    _say_if_busy(args.db, args.run_id, console)
    bar = Progress(TextColumn("[bold]probes"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console)
    task = bar.add_task("probes", total=None)

    def progress(done: int, total: int) -> None:
        if console.is_terminal:
            if not bar.live.is_started:
                bar.start()
            bar.update(task, completed=done, total=total)
        elif done == total or done % -(-total // 10) == 0:  # a log file: about ten lines
            console.print(f"probes {done}/{total} done", markup=False, highlight=False)

    try:
        report = asyncio.run(blame(args.db, args.run_id, args.step, args.examples,
                                   progress=progress))
    finally:
        bar.stop()
    for line in blame_lines(report, out):
        out.print(line, markup=False, highlight=False)
    return 0


def blame_lines(report: Any, out: Any) -> list[str]:
    """Print the per-node table; return the lines that follow it."""
    widest = max((len(row.node_id) for row in report.nodes), default=4)
    table = Table(Column("node", no_wrap=True, min_width=widest), "probed", "gradient flips",
                  "leaks", "edit flips", "grad chars", Column("", no_wrap=True),
                  title=f"blame: run {report.run_id}, step {report.step}, "
                        f"{len(report.examples)} failing examples")
    for row in report.nodes:
        marks = []
        if row.node_id in report.blamed:
            marks.append("<- probes")
        if row.node_id == report.by_gradients:
            marks.append("<- gradients")
        table.add_row(row.node_id, str(row.probed), f"{row.flips}/{row.probed}",
                      str(row.leaks),
                      f"{row.edit_flips}/{row.edit_probed}" if row.has_edit else "no edit",
                      f"{row.gradient_chars:.0f}", ", ".join(marks))
    out.print(table)
    lines = ["gradient flips: failing examples made correct by following the node's gradient, "
             "not counting leaks (rewrites that contain the target); edit flips: by the "
             "node's proposed edit alone; grad chars: mean length of the gradient it "
             "received (0 when it asked for no change)"]
    if not report.blamed:
        lines.append("probes blame: no node (no gradient probe flipped an example without "
                     "leaking the target)")
    elif len(report.blamed) > 1:
        lines.append(f"probes blame: a tie between {', '.join(report.blamed)}")
    else:
        lines.append(f"probes blame: {report.blamed[0]}")
    pointed = f"{report.by_gradients} (longest received gradient)" if report.by_gradients \
        else "no node (no gradient asked for a change)"
    verdict = ("the same node" if report.agree else "a different node" if report.blamed
               else "nothing to compare")
    lines.append(f"gradients singled out: {pointed}; probes and gradients: {verdict}")
    lines.append(f"cost: {report.calls} calls ({report.model_calls} to the model), "
                 f"{report.seconds:.1f} s")
    return lines


# --- forks (python -m engine run --fork RUN_ID --from-step S ...) ------------------------


def cmd_fork(args: argparse.Namespace, add_run_options: Any, with_progress: Any) -> int:
    """Fork a run: options given on the command line replace the parent's."""
    from dataclasses import fields

    from engine.runs.execute import RunConfig
    from engine.runs.fork import plan_fork, run_fork

    if not args.fork or args.from_step is None:
        raise ProbeError("a fork needs both --fork RUN_ID and --from-step S")
    if args.graph:
        raise ProbeError("a fork runs its parent's graph: drop the graph argument")
    defaults = argparse.ArgumentParser()
    add_run_options(defaults)
    default = vars(defaults.parse_args([]))
    known = {f.name for f in fields(RunConfig)}
    overrides = {k: v for k, v in vars(args).items()
                 if k in known and k in default and v != default[k]}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    prompts = {}
    for item in args.set_prompt:
        node, sep, value = item.partition("=")
        if not sep or not node:
            raise ProbeError(f"--set-prompt expects NODE=TEXT or NODE=@FILE, not {item!r}")
        prompts[node] = _text(value)
    plan = plan_fork(args.db, args.fork, args.from_step, prompts, overrides)
    return with_progress(lambda listeners: run_fork(plan, listeners=listeners),
                         plan.config.steps, args.from_step + 1)
