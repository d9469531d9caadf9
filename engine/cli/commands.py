"""Command line: python -m engine {validate,run,resume,runs,export,import,experiment,models}.

Bad input (a graph, a dataset, a database, a run id) prints one line starting with
"error:" and exits with status 2; nothing already written is lost. Under --json the same
message is also printed on standard output as {"error": "..."}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import traceback
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from engine.cli.summary import changes, fmt, print_summary
from engine.console import console, out
from engine.core.graph import GraphError, load_graph
from engine.data.examples import SplitError
from engine.events import CallRecord, Proposal, StepFinished
from engine.events import Progress as PhaseProgress
from engine.runs.progress import progress_line
from engine.runs.settings import add_run_flags, given_settings, non_negative_int

EXIT_BAD_INPUT = 2
FUNCTIONS_HELP = ("a Python file to import: the graph's kind: function nodes bind to its "
                  "functions by name")


PROGRESS_FILE_HELP = ("also append the run's progress events to this file, one JSON object a "
                      "line (how the dashboard follows a run it started)")


class UsageError(Exception):
    """Bad input from the user: one line, status 2."""


def _bad_input_errors() -> tuple[type[BaseException], ...]:
    from engine.data.datasets import DatasetError
    from engine.llm.base import LLMError
    from engine.runlog.lake import LakeError
    from engine.runlog.schema import RunLogError

    return (GraphError, DatasetError, SplitError, RunLogError, LakeError, LLMError, UsageError,
            ValueError, FileNotFoundError)


# --- subcommands -----------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    from engine.data.datasets import DATA_DIR_ENV

    graph = _graph_with_functions(args) or load_graph(args.graph)
    # The dataset is checked whenever it can be found without the network: a .jsonl path
    # (relative to the graph), or a named dataset with a data directory.
    resolvable = bool(graph.dataset) and (
        graph.dataset.strip().endswith(".jsonl") or args.data_dir is not None
        or bool(os.environ.get(DATA_DIR_ENV)))
    checked = ""
    if resolvable or args.check_data:
        from engine.runs.execute import RunConfig, load_splits

        load_splits(RunConfig(graph=args.graph, data_dir=args.data_dir, train=0, val=0,
                              test=0), graph)
        checked = f"; dataset '{graph.dataset}' checked, every row"
    trainable = len(graph.trainable_nodes)
    out.print(f"{args.graph}: ok: graph '{graph.name}', {len(graph.nodes)} nodes "
              f"({trainable} trainable), output '{graph.output_node.id}', metric "
              f"{graph.metric}{checked}", markup=False, highlight=False)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from engine.llm.factory import default_backend_kind
    from engine.runs.execute import execute
    from engine.runs.settings import RunConfig, given_settings

    if args.fork or args.from_step is not None or args.set_prompt:
        from engine.cli.probes import cmd_fork

        return cmd_fork(args, _with_progress)
    if not args.graph:
        raise UsageError("run needs a graph file (or --fork RUN_ID --from-step S)")
    settings = given_settings(args)
    settings.setdefault("backend", default_backend_kind())
    if settings.get("contrast"):
        method = settings.get("method", "semantic")
        if not _contrastable(method):
            raise UsageError(f"--contrast writes sibling-blind gradients beside a "
                             f"sibling-aware method's (semantic, semantic-evaluative); "
                             f"--method {method} has none to contrast")
    graph = _graph_with_functions(args)
    # the graph's own defaults (the demo's: 1 step, 2 candidates), under --steps, --proposals
    for name, value in (graph or load_graph(args.graph)).run_defaults().items():
        if name != "contrast" or _contrastable(settings.get("method", "semantic")):
            settings.setdefault(name, value)  # a graph's contrast: only where it applies
    config = RunConfig(graph=args.graph, **settings)
    _check_local_models(config)
    if not args.dry_run:  # a run log it cannot write: its refusal is the only line printed
        from engine.runlog.schema import check_writable

        check_writable(config.db)
    if not _print_estimate(config, graph, args.dry_run):
        return 0
    return _with_progress(lambda listeners: execute(config, listeners=listeners, graph=graph),
                          config.steps, progress_file=args.progress_file, db=config.db)


def _contrastable(method: str) -> bool:
    """The method writes sibling-aware gradients that a sibling-blind method's can be
    written beside (--contrast)."""
    from engine.methods import METHODS

    return method in METHODS and METHODS[method].contrastable


def _check_local_models(config: Any) -> None:
    """A local model named wrong (no such name, no such file) is refused before the
    estimate is printed: its error is the only line."""
    from engine.llm.models import check_model_spec

    if config.backend == "local":
        check_model_spec(config.model)
    if (config.optimizer_backend or config.backend) == "local":
        check_model_spec(config.optimizer_model)


def _print_estimate(config: Any, graph: Any, dry_run: bool) -> bool:
    """Print the run's estimate (one line; with --dry-run, by phase); False: do not run.
    Reads the graph and its data only: no model call, no run log."""
    from engine.runs.estimate import estimate_for
    from engine.runs.execute import load_splits

    graph = graph or load_graph(config.graph)
    estimate = estimate_for(config, graph, load_splits(config, graph))
    for line in estimate.printed(dry_run):
        out.print(line, markup=False, highlight=False)
    return not dry_run


def _graph_with_functions(args: argparse.Namespace) -> Any:
    """--functions FILE.py: import the file the user chose and bind the graph's function
    names to its functions. Without it, a graph file never imports code."""
    if not getattr(args, "functions", None):
        return None
    from engine.api.builder import Graph
    from engine.api.support import load_functions

    return Graph.from_yaml(args.graph, functions=load_functions(args.functions)).spec


def cmd_resume(args: argparse.Namespace) -> int:
    from engine.runlog.schema import RunLogError
    from engine.runlog.state import load_resume_state
    from engine.runs.execute import RunConfig, resume

    point = load_resume_state(args.db, args.run_id)
    if point.status == "finished":
        raise RunLogError(f"run '{args.run_id}' has already finished; nothing to resume")
    steps = RunConfig.from_json(point.config).steps
    done = 0 if point.state is None else point.state.step + 1
    functions = None
    if getattr(args, "functions", None):
        from engine.api.support import load_functions

        functions = load_functions(args.functions)
    budget = given_settings(args)
    return _with_progress(lambda listeners: resume(
        args.db, args.run_id, listeners=listeners, functions=functions,
        max_calls=budget.get("max_calls"), max_cost=budget.get("max_cost")), steps, done,
        progress_file=args.progress_file, db=args.db)


def cmd_runs(args: argparse.Namespace) -> int:
    import pandas as pd

    from engine.runlog.reader import list_runs
    from engine.runlog.schema import check_readable

    check_readable(args.db)
    runs = list_runs(args.db).iloc[::-1]  # oldest first, as they were started

    def value(v: Any) -> Any:
        # NULL reads as None, NaN or pd.NA (a run stopped before step 0 was written has
        # no steps, so no step count and no score): `v != v` is ambiguous for pd.NA
        return None if v is None or pd.isna(v) else v

    rows = [(r.run_id, r.graph_name, r.method, value(r.model), r.status,
             None if value(r.steps) is None else int(r.steps), value(r.best_val))
            for r in runs.itertuples()]
    if args.json:
        keys = ("run_id", "graph", "method", "model", "status", "steps", "best_val")
        sys.stdout.write(json.dumps([dict(zip(keys, row, strict=True)) for row in rows],
                                    indent=2) + "\n")
        return 0
    # The id is what resume, blame, export and --fork take: its column is never cut, in a
    # narrow terminal or piped to a file (80 columns); the other columns wrap instead.
    widest = max((len(row[0]) for row in rows), default=3)
    table = Table(Column("run", no_wrap=True, min_width=widest),
                  *(Column(name, overflow="fold")
                    for name in ("graph", "method", "model", "status", "steps", "best val")))
    for run_id, graph, method, model, status, steps, best in rows:
        table.add_row(run_id, graph, method, model or "", status,
                      "" if steps is None else str(steps), fmt(best))
    out.print(table if rows else f"{args.db}: no runs yet")
    return 0


# --- progress and summary --------------------------------------------------------------


def _with_progress(start: Callable[[tuple], Any], steps: int, done: int = 0,
                   progress_file: str | None = None, db: str = "runs.duckdb") -> int:
    """Run with a progress bar that appears on the first event, so that input refused
    before the run starts prints only its one error line. With `progress_file`, the
    progress events also go there as JSON lines (what the dashboard follows)."""
    calls = {"n": 0}
    accepted: dict[int, int] = defaultdict(int)  # accepted proposals per step
    # In a log file (piped, CI, a dashboard job): one line per phase, written when the
    # next phase starts (or the step ends), with the phase's last count
    phase_line: dict[str, Any] = {"last": None}
    # each call's phase as the progress line names it (gate, test, ...), for the summary:
    # the tracker's Progress for a call follows that CallRecord
    phase_of: dict[str, str] = {}
    latest_call: dict[str, str | None] = {"id": None}

    def write_phase_line() -> None:
        if phase_line["last"] is not None:
            console.print(progress_line(phase_line["last"]), markup=False, highlight=False)
            phase_line["last"] = None

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[calls]} calls"),
                        TimeElapsedColumn(), console=console)
    task = progress.add_task("optimizing", total=steps + 1, completed=done, calls=0)

    def listener(event: Any) -> None:
        if not progress.live.is_started:
            progress.start()
        if isinstance(event, CallRecord):
            calls["n"] += 1
            latest_call["id"] = event.call_id
            progress.update(task, calls=calls["n"])
        elif isinstance(event, PhaseProgress):
            if latest_call["id"] is not None:
                phase_of[latest_call["id"]] = event.phase
                latest_call["id"] = None
            of = f"/{event.calls_expected}" if event.calls_expected else ""
            progress.update(task, description=f"step {event.step} {event.phase} "
                                              f"{event.calls_done}{of}")
            last = phase_line["last"]
            if not console.is_terminal:
                if last is not None and (last.step, last.phase) != (event.step, event.phase):
                    write_phase_line()
                phase_line["last"] = event
        elif isinstance(event, Proposal):
            accepted[event.step] += int(event.accepted)
        elif isinstance(event, StepFinished):
            progress.update(task, advance=1, description=f"step {event.step} done")
            if not console.is_terminal:  # a log file (e.g. a dashboard job): one line a step
                write_phase_line()
                console.print(f"step {event.step} done: train {fmt(event.train_score)}, "
                              f"val {fmt(event.val_score)}"
                              f"{changes(accepted[event.step], event)}; "
                              f"{calls['n']} calls so far", markup=False, highlight=False)

    listeners: tuple = (listener,)
    if progress_file:
        from engine.runs.progress import ProgressFile

        listeners += (ProgressFile(progress_file),)
    try:
        result = asyncio.run(start(listeners))
    finally:
        if not console.is_terminal:
            write_phase_line()  # a run stopped mid-phase: where it was
        if progress.live.is_started:  # stopping a bar never shown prints a blank line
            progress.stop()
    print_summary(result, db, phase_of)
    return 0 if result.status == "finished" else 1


# --- argument helpers ------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine",
                                     description="Semantic backpropagation for agentic graphs.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check a graph file")
    p.add_argument("graph", help="the graph file (YAML)")
    p.add_argument("--data-dir", help="where named datasets live")
    p.add_argument("--check-data", action="store_true", help="also load the graph's dataset")
    p.add_argument("--functions", metavar="FILE.py", help=FUNCTIONS_HELP)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("run", help="optimize a graph's prompts")
    p.add_argument("graph", nargs="?", help="the graph file (not with --fork)")
    p.add_argument("--fork", metavar="RUN_ID", help="start from another run's state "
                                                    "(with --from-step)")
    p.add_argument("--from-step", type=non_negative_int, metavar="S",
                   help="the parent's step to fork from")
    p.add_argument("--set-prompt", action="append", default=[], metavar="NODE=@FILE",
                   help="with --fork: a hand-edited prompt for a node (repeatable)")
    p.add_argument("--functions", metavar="FILE.py", help=FUNCTIONS_HELP)
    p.add_argument("--progress-file", metavar="FILE.jsonl", help=PROGRESS_FILE_HELP)
    p.add_argument("--dry-run", action="store_true",
                   help="print the estimate by phase and exit: no model call, no run log")
    add_run_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("resume", help="continue a run from its last complete step")
    p.add_argument("run_id", help="the run to continue (python -m engine runs lists them)")
    p.add_argument("--db", default="runs.duckdb", help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--functions", metavar="FILE.py", help=FUNCTIONS_HELP)
    p.add_argument("--progress-file", metavar="FILE.jsonl", help=PROGRESS_FILE_HELP)
    add_run_flags(p, only=("max_calls", "max_cost"))
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("runs", help="list the runs in a run log")
    p.add_argument("--json", action="store_true",
                   help="print the rows as a JSON list, for scripts")
    p.add_argument("--db", default="runs.duckdb", help="the run log, a DuckDB file (default: runs.duckdb)")
    p.set_defaults(func=cmd_runs)

    from engine import experiment
    from engine.cli import collect as collect_cli
    from engine.cli import diff as diff_cli
    from engine.cli import gateway as gateway_cli
    from engine.cli import mcp as mcp_cli
    from engine.cli import models as models_cli
    from engine.cli import probes as probe_cli
    from engine.cli import prompts as prompts_cli
    from engine.cli import runlog as runlog_cli
    from engine.cli import traces as traces_cli

    _register_export(sub)
    experiment.register_cli(sub)
    probe_cli.register_cli(sub)
    diff_cli.register_cli(sub)
    models_cli.register_cli(sub)
    traces_cli.register_cli(sub)
    prompts_cli.register_cli(sub)
    collect_cli.register_cli(sub)
    gateway_cli.register_cli(sub)
    mcp_cli.register_cli(sub)
    runlog_cli.register_cli(sub)
    _lake_flags(sub)
    return parser


def _lake_flags(sub: argparse._SubParsersAction) -> None:
    """Every command that takes --db: its default is $SEMBACK_DB (else runs.duckdb), and it
    takes --data-path for a lake (`ducklake:…`), which sets $SEMBACK_DATA_PATH."""
    for parser in sub.choices.values():
        action = next((a for a in parser._actions if "--db" in a.option_strings), None)
        if action is None:
            continue
        if action.default != argparse.SUPPRESS:  # a run's flags: only what is typed (main)
            action.default = os.environ.get("SEMBACK_DB") or action.default
        shown = "runs.duckdb" if action.default == argparse.SUPPRESS else action.default
        action.help = ("the run log: a DuckDB file, or a lake (ducklake:postgres:dbname=… "
                       "host=…, ducklake:FILE.ducklake; docs/team.md) (default: "
                       f"{shown}; $SEMBACK_DB)")
        if "--data-path" not in parser._option_string_actions:
            parser.add_argument("--data-path", metavar="FOLDER|s3://…",
                                help="a new lake's data folder ($SEMBACK_DATA_PATH)")


def cmd_export(args: argparse.Namespace) -> int:
    from engine.runlog import export, otel

    if args.format != "otel" and (args.endpoint or args.header or args.project
                                  or not args.content):
        raise UsageError("--endpoint, --header, --project and --no-content go with "
                         "--format otel")
    if args.endpoint:
        headers = _headers(args.header)
        url, spans, requests, copy = otel.send_otel(args.db, args.run_id, args.endpoint,
                                                    headers, args.project,
                                                    content=args.content)
        project = f" (project '{args.project}')" if args.project else ""
        print(f"sent run '{args.run_id}' to {url}{project}: {spans} spans in "
              f"{requests} requests")
        if copy:  # Phoenix files a trace id under the project that first got it
            print(f"project '{args.project}' gets a copy of the run with its own trace id; "
                  "a copy sent earlier to another project stays there")
        if args.out:  # the file as well, when asked for
            path = otel.export_otel(args.db, args.run_id, args.out, args.project,
                                    content=args.content)
            print(f"exported run '{args.run_id}' as otel to {path}")
        return 0
    if args.format == "otel":
        path = otel.export_otel(args.db, args.run_id, args.out, args.project,
                                content=args.content)
    else:
        write = {"json": export.export_json, "parquet": export.export_parquet}[args.format]
        path = write(args.db, args.run_id, args.out)
    print(f"exported run '{args.run_id}' as {args.format} to {path}")
    return 0


def _headers(items: list[str]) -> dict[str, str]:
    """--header k=v, repeatable: extra HTTP headers for the OTLP receiver."""
    headers = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--header {item.split('=')[0]!r}: expected NAME=VALUE")
        headers[key.strip()] = value.strip()
    return headers


def cmd_import(args: argparse.Namespace) -> int:
    from engine.runlog import export

    run_id = export.import_json(args.file, args.db, args.as_id)
    print(f"imported run '{run_id}' into {args.db}")
    return 0


def _register_export(subparsers: Any) -> None:
    from engine.runlog import export

    p = subparsers.add_parser("export", help="write a whole run as JSON, Parquet or "
                                             "OpenTelemetry spans")
    p.add_argument("run_id", help="the run (python -m engine runs lists the ids)")
    p.add_argument("--db", default="runs.duckdb", help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--format", choices=export.FORMATS, default="json",
                   help="json (one file, re-importable), parquet (one file per table) or "
                        "otel (OpenTelemetry spans); default: json")
    p.add_argument("--out", help="file (json, otel) or folder (parquet); default: "
                                 "<run_id>.json, <run_id>_parquet/, <run_id>.otel.jsonl; "
                                 "with --endpoint, a file only when given")
    p.add_argument("--endpoint", metavar="URL",
                   help="with --format otel: send the spans as OTLP/HTTP protobuf to this "
                        "receiver (Phoenix: http://localhost:6006/v1/traces; a URL not "
                        "ending in /v1/traces gets it appended)")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                   help="with --endpoint: an HTTP header for the receiver (repeatable)")
    p.add_argument("--project", help="with --format otel: the Phoenix project "
                                     "(openinference.project.name; default: the graph's "
                                     "name); another project gets a copy with its own ids")
    p.add_argument("--no-content", dest="content", action="store_false",
                   help="with --format otel: leave out the messages sent, the replies and "
                        "the probes' texts (GenAI and OpenInference make content opt-in)")
    p.set_defaults(func=cmd_export)

    p = subparsers.add_parser("import", help="read a JSON export into a run log")
    p.add_argument("file", help="a JSON export (python -m engine export RUN_ID)")
    p.add_argument("--db", default="runs.duckdb", help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--as", dest="as_id", metavar="NEW_ID",
                   help="store the run under another id (when its id already exists)")
    p.set_defaults(func=cmd_import)


def _one_line(exc: BaseException) -> str:
    """An error's message on one line (a library's message may span several)."""
    return " ".join(part.strip() for part in str(exc).splitlines() if part.strip())


def _error(message: str, as_json: bool, details: dict | None = None) -> None:
    """An error: one `error:` line on standard error, and under --json the same message as
    one JSON object, {"error": "...", ...details}, on standard output, where the command's
    result would have been (a script reads one or the other, never a traceback)."""
    console.print(f"error: {message}", markup=False, highlight=False)
    if as_json:
        print(json.dumps({"error": message, **(details or {})}, ensure_ascii=False))


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """argparse's own refusals (an unknown flag, a bad value: its usage and an error line,
    status 2) also come as JSON on standard output when the command line has --json."""
    words = sys.argv[1:] if argv is None else list(argv)
    if "--json" not in words:
        return parser.parse_args(argv)
    import contextlib
    import io

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return parser.parse_args(argv)
    except SystemExit as exc:
        sys.stderr.write(said.getvalue())
        if exc.code:
            lines = [ln for ln in said.getvalue().splitlines() if ": error: " in ln]
            message = lines[-1].split(": error: ", 1)[1] if lines else "bad arguments"
            print(json.dumps({"error": message}, ensure_ascii=False))
        raise


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    as_json = bool(getattr(args, "json", False))
    if getattr(args, "data_path", None):
        os.environ["SEMBACK_DATA_PATH"] = args.data_path
    if not hasattr(args, "db") and os.environ.get("SEMBACK_DB") and \
            "--db" in command_parser(parser, args.command)._option_string_actions:
        args.db = os.environ["SEMBACK_DB"]  # as if typed: a run's flags default to nothing
    try:
        return args.func(args)
    except _bad_input_errors() as exc:
        _error(_one_line(exc) + _hint(parser, args, exc), as_json,
               getattr(exc, "details", None))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        console.print("interrupted", markup=False)
        return 130
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if os.environ.get("SEMBACK_DEBUG"):
            traceback.print_exc()
        _error(f"unexpected {exc.__class__.__name__}: {_one_line(exc)} "
               "(set SEMBACK_DEBUG=1 for the traceback)", as_json)
        return 1


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The subcommand's own parser (its flags), e.g. for `backprop`."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[command]


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}


def _hint(parser: argparse.ArgumentParser, args: argparse.Namespace,
          exc: BaseException) -> str:
    """What the command itself offers against missing model credentials: the flags it
    takes, never another command's (the model layer cannot know which command runs)."""
    from engine.llm.base import MissingCredentials

    if not isinstance(exc, MissingCredentials) or not getattr(args, "command", None):
        return ""
    flags = flags_of(command_parser(parser, args.command))
    offers = [text for flag, text in (
        ("--base-url", "give --base-url URL (an OpenAI-compatible server)"),
        ("--backend", "use --backend local (the embedded model)")) if flag in flags]
    return f"; or {', or '.join(offers)}" if offers else ""


if __name__ == "__main__":
    sys.exit(main())
