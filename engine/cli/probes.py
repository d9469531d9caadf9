"""Command line of probes and blame (engine/probes/probe.py, engine/probes/blame.py):

    python -m engine probe RUN_ID --db DB --step S --node N --example E --output TEXT|@FILE
    python -m engine probe RUN_ID --db DB --step S --node N --example E --gradient
    python -m engine probe RUN_ID --db DB --step S --node N --edit proposed|@FILE
                                  [--examples failing|val|ID,ID]
    python -m engine blame RUN_ID --db DB [--step S] [--examples sampled|failing|val|all|ID,ID]
                                  [--method M1,M2] [--repeats R] [--json]

`probe --json` prints the probe rows (with their re-computed outputs) for machines such as
the dashboard's background jobs; `blame --json` prints one object (nodes, verdict, methods, edges).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.table import Column, Table

from engine.data.stats import bracketed
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
    p.add_argument("--examples", default="failing", metavar="failing|sampled|val|ID,ID",
                   help="examples for --edit (default, failing or sampled: those "
                        "back-propagated at the step)")
    p.add_argument("--json", action="store_true", help="print the probe rows as JSON")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("blame", help="follow every node's gradient on the failing examples "
                                     "of a step and see which one fixes them")
    p.add_argument("run_id", help="the run (python -m engine runs lists the ids)")
    p.add_argument("--db", default="runs.duckdb",
                   help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--step", type=int, help="one step (default: every backward step, pooled)")
    p.add_argument("--examples", default="failing", metavar="sampled|failing|val|all|ID,ID",
                   help="failing (default): every failing training example; sampled: those "
                        "back-propagated; val, all, or a list of ids")
    p.add_argument("--method", metavar="M1,M2",
                   help="also re-run these methods' backward passes on the same traces and "
                        "follow their gradients")
    p.add_argument("--repeats", type=int, default=1, metavar="R",
                   help="draw each probe R times (temperature > 0) and report agreement")
    p.add_argument("--exhaustive", action="store_true",
                   help="make every planned probe (default: adaptive, in rounds of a few "
                        "examples, stopping where the probes no longer decide anything)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
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
    from engine.probes.single import probe

    if args.output is not None:
        kind, text = "output", _text(args.output)
    elif args.gradient:
        kind, text = "gradient", None
    else:
        kind = "edit"
        text = "proposed" if args.edit == "proposed" else _text(args.edit)
    _say_if_busy(args.db, args.run_id, console)
    from engine.gateway.pipeline import with_rerun

    results = asyncio.run(with_rerun(args.db, args.run_id, lambda rerun: probe(
        args.db, args.run_id, args.step, args.node, kind, example=args.example, text=text,
        examples=args.examples, rerun=rerun)))
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
        line += " [the intervention carries the answer]"
    if r.in_sample:
        line += " [in-sample: the update call that wrote this prompt saw this example]"
    return line


def _short(text: str, limit: int = 70) -> str:
    text = " ".join((text or "").split())
    return repr(text if len(text) <= limit else text[:limit - 1] + "…")


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _say_if_busy(db: str, run_id: str, console: Any) -> None:
    """One line when another process may be writing the log (a running optimization)."""
    from engine.runlog.probing import running_runs
    from engine.runlog.schema import check_readable

    check_readable(db)
    running = running_runs(db)
    if running:
        console.print(f"note: run '{running[0]}' is marked running in {db}: probes read "
                      "committed steps only and write in one short transaction, retried "
                      "while that run holds the file; it is not disturbed", markup=False,
                      highlight=False)


def cmd_blame(args: argparse.Namespace) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from engine.console import console, out
    from engine.probes.blame import blame, parse_methods

    methods = parse_methods(args.method)
    if args.repeats < 1:  # said before the progress bar draws anything
        raise ProbeError(f"--repeats must be 1 or more, not {args.repeats}")
    _say_if_busy(args.db, args.run_id, console)
    bar = Progress(TextColumn("[bold]probes"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=console)
    task = bar.add_task("probes", total=None)
    started = time.monotonic()

    def progress(done: int, total: int) -> None:
        if console.is_terminal:
            if not bar.live.is_started:
                bar.start()
            bar.update(task, completed=done, total=total)
        elif done == total or done % -(-total // 10) == 0:  # a log file: about ten lines
            left = (time.monotonic() - started) / done * (total - done) if done else None
            console.print(f"probes {done}/{total} done"
                          + (f", about {left:.0f} s left" if left is not None and done < total
                             else ""), markup=False, highlight=False)

    def announce(line: str) -> None:
        if not args.json:
            console.print(line, markup=False, highlight=False)

    try:
        from engine.gateway.pipeline import with_rerun

        report = asyncio.run(with_rerun(args.db, args.run_id, lambda rerun: blame(
            args.db, args.run_id, args.step, args.examples, methods=methods,
            repeats=args.repeats, progress=progress, adaptive=not args.exhaustive,
            announce=announce, rerun=rerun)))
    finally:
        if bar.live.is_started:  # stopping a bar never shown prints a blank line
            bar.stop()
    if args.json:
        print(json.dumps(report.as_json(), ensure_ascii=False, indent=1))
        return 0
    for line in blame_lines(report, out):
        out.print(line, markup=False, highlight=False)
    return 0


def _rate(row: Any) -> tuple[str, str]:
    """flips over counted probes, and the 90% interval of that share."""
    return f"{row.flips}/{row.counted}", bracketed(row.interval)


def _change(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def _mark(report: Any) -> str:
    """The table's mark on the node the probes name, or on each node of a tie."""
    return "<- probes (tie)" if report.verdict.tied else "<- probes"


def blame_lines(report: Any, out: Any) -> list[str]:
    """Print the per-node tables; return the lines that follow them."""
    widest = max((len(row.node_id) for row in report.nodes), default=4)
    steps = f"step {report.steps[0]}" if len(report.steps) == 1 else \
        f"steps {', '.join(map(str, report.steps))} pooled"
    edits = {e.node_id: e for e in report.edits}
    table = Table(Column("node", no_wrap=True, min_width=widest), "probed",
                  Column("flips", no_wrap=True), Column("90%", no_wrap=True), "errors",
                  "leaks", Column("Δscore", no_wrap=True), "claimed", Column("", no_wrap=True),
                  title=f"blame: run {report.run_id}, {steps}, {len(report.examples)} "
                        f"failing examples ({report.which}): following each gradient")
    for row in report.nodes:
        marks = []
        if row.node_id in report.blamed and report.evidence == "gradient":
            marks.append(_mark(report))
        if row.node_id == report.claimed:
            marks.append("<- gradients")
        table.add_row(row.node_id, str(row.probed), *_rate(row), str(row.errors),
                      str(row.leaks), _change(row.mean_score_change),
                      f"{row.claimed}/{row.probed}", ", ".join(marks))
    out.print(table)
    table = Table(Column("node", no_wrap=True, min_width=widest), "probed",
                  Column("flips", no_wrap=True), Column("90%", no_wrap=True), "in-sample",
                  "errors", "leaks", "regressions", Column("", no_wrap=True),
                  title="each node's proposed edit alone")
    for row in report.nodes:
        edit = edits[row.node_id]
        if not edit.probed:
            table.add_row(row.node_id, "-", "copy-rejected" if edit.copy_rejected else
                          "no edit", "", "", "", "", "", "")
            continue
        named = report.evidence == "edit" and row.node_id in report.blamed
        table.add_row(row.node_id, str(edit.probed), *_rate(edit), str(edit.in_sample),
                      str(edit.errors), str(edit.leaks),
                      (f"{edit.regressions}/{edit.guarded}" if edit.guarded else "-")
                      + (f" ({edit.copy_rejected} copy-rejected)" if edit.copy_rejected
                         else ""), _mark(report) if named else "")
    out.print(table)
    lines = [f"  {node}'s edit probed: {origin}" for node, origin in report.edit_origins.items()]
    lines += ["gradient flips: failing examples made correct by following the node's gradient "
             "(leaks, rewrites that carry the answer, are not counted), with a 90% Wilson "
             "interval; edit flips: by the node's proposed edit alone, over the examples its "
             "update call did not see (those it saw are left out; in-sample counts the ones "
             "it fixed); regressions: passing validation "
             "examples the edit breaks; claimed: gradients that asked the node to change"]
    if report.methods:
        mt = Table(Column("method", no_wrap=True), Column("node", no_wrap=True), "probed",
                   "flips", Column("90%", no_wrap=True), "errors", "leaks", "Δscore",
                   "claimed", Column("", no_wrap=True),
                   title="gradient efficacy per method, on the same traces")
        for row in report.methods:
            found = report.method_verdicts[row.method]
            named = row.node_id == found.node or row.node_id in found.tied
            mt.add_row(row.method, row.node_id, str(row.probed), *_rate(row), str(row.errors),
                       str(row.leaks), _change(row.mean_score_change),
                       f"{row.claimed}/{row.probed}",
                       ("<- tied" if found.tied else "<- blamed") if named else "")
        out.print(mt)
    if report.edges:
        et = Table(Column("method", no_wrap=True), Column("edge", no_wrap=True), "probed",
                   "flips", Column("90%", no_wrap=True), "errors", "leaks", "claimed",
                   title="gradient efficacy per edge: the gradient a node received from one "
                         "successor, followed alone (one successor: the node's row)")
        for row in report.edges:
            et.add_row(row.method, f"{row.node_id} -> {row.edge}", str(row.probed),
                       *_rate(row), str(row.errors), str(row.leaks),
                       f"{row.claimed}/{row.probed}")
        out.print(et)
    evidence = f"{report.evidence} probes"
    lines.append(f"probes blame: {report.verdict.named} ({evidence}: "
                 f"{report.verdict.reason})")
    if report.evidence_note:
        lines.append(f"  the edit probes decide: {report.evidence_note}")
    seen = [e for e in report.edits if e.probed and not e.counted and e.seen]
    if seen and len(seen) == sum(1 for e in report.edits if e.probed):
        lines.append("  no edit probe counts: every example probed fed the update call (in "
                     "sample); `--examples val` tests the edits on held-out examples, where "
                     "the run has any")
    for name, v in report.method_verdicts.items():
        lines.append(f"  {name}: {v.named}" + ("" if v.node else f" ({v.reason})"))
    own, single, total = report.pointed
    if report.claimed:
        rest = f" ({total - single} point at no single node)" if single < total else ""
        claimed = f"{report.claimed}, on {own} of {total} examples{rest}"
    else:
        claimed = f"no single node ({single} of {total} examples point at one node)"
    agree = ("the same node" if report.claimed and report.claimed == report.verdict.node else
             "a different node" if report.claimed and report.verdict.node else
             "nothing to compare")
    lines.append(f"gradients point at: {claimed}; the node furthest upstream they ask to "
                 f"change, most often; probes and gradients: {agree}")
    if report.repeats_note:
        lines.append(report.repeats_note)
    lines.append(f"rewriter: the optimizer model ({report.rewriter}) follows each gradient; "
                 f"a strong rewriter can solve the example itself (forward model: "
                 f"{report.forward_model})")
    if report.spent:
        lines.append(f"adaptive: {report.spent.made} of {report.spent.planned} planned probes "
                     f"made (--exhaustive makes all)")
        lines += [f"  {note}" for note in report.spent.notes]
    lines.append(f"cost: {report.calls} calls ({report.model_calls} to the model, "
                 f"{report.tokens} tokens), {report.seconds:.1f} s")
    return lines


# --- forks (python -m engine run --fork RUN_ID --from-step S ...) ------------------------


def _print_fork_estimate(plan: Any, dry_run: bool) -> bool:
    """The fork's estimate, as `run` prints a run's (one line; with --dry-run, by phase,
    and False: do not run): its own steps, and its starting step's re-measure if any."""
    from engine.console import out
    from engine.runs.estimate import estimate_fork

    estimate = estimate_fork(plan)
    for line in estimate.printed(dry_run):
        out.print(line, markup=False, highlight=False)
    return not dry_run


def cmd_fork(args: argparse.Namespace, with_progress: Any) -> int:
    """Fork a run: every run setting typed on the command line replaces the parent's, also
    one equal to the command line's default (`--temperature 0` on a run made at 0.5)."""
    from engine.runs.fork import plan_fork, run_fork
    from engine.runs.settings import DEFAULTS, given_settings

    if not args.fork or args.from_step is None:
        raise ProbeError("a fork needs both --fork RUN_ID and --from-step S")
    if args.graph:
        raise ProbeError("a fork runs its parent's graph: drop the graph argument")
    overrides = given_settings(args)
    db = overrides.pop("db", DEFAULTS.db)  # the parent's run log, where the fork is written
    prompts = {}
    for item in args.set_prompt:
        node, sep, value = item.partition("=")
        if not sep or not node:
            raise ProbeError(f"--set-prompt expects NODE=TEXT or NODE=@FILE, not {item!r}")
        prompts[node] = _text(value)
    plan = plan_fork(db, args.fork, args.from_step, prompts, overrides)
    if not _print_fork_estimate(plan, getattr(args, "dry_run", False)):
        return 0
    # the bar counts the steps the fork logs: its starting step S again, then S+1, ...
    return with_progress(lambda listeners: run_fork(plan, listeners=listeners),
                         plan.config.steps, args.from_step, progress_file=args.progress_file,
                         db=db)
