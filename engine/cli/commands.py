"""Command line: python -m engine {validate,run,resume,runs,export,import,experiment}.

Bad input (a graph, a dataset, a database, a run id) prints one line starting with
"error:" and exits with status 2; nothing already written is lost.
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

from engine.console import console, out
from engine.core.graph import GraphError, load_graph
from engine.data.examples import SplitError
from engine.events import CallRecord, Proposal, StepFinished
from engine.events import Progress as PhaseProgress
from engine.runs.progress import progress_line

EXIT_BAD_INPUT = 2
FUNCTIONS_HELP = ("a Python file to import: the graph's kind: function nodes bind to its "
                  "functions by name")


class UsageError(Exception):
    """Bad input from the user: one line, status 2."""


def _bad_input_errors() -> tuple[type[BaseException], ...]:
    from engine.data.datasets import DatasetError
    from engine.llm.base import LLMError
    from engine.runlog.schema import RunLogError

    return (GraphError, DatasetError, SplitError, RunLogError, LLMError, UsageError, ValueError,
            FileNotFoundError)


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


def add_run_options(p: argparse.ArgumentParser) -> None:
    from engine.llm.factory import BACKENDS
    from engine.methods import METHODS

    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="model backend (default: openai if OPENAI_API_KEY or OPENAI_BASE_URL "
                        "is set, else the embedded local model)")
    p.add_argument("--model", help="model for forward calls; with --backend local, a GGUF "
                                   "file's path (default: the packaged SmolLM2-135M)")
    p.add_argument("--chat-format", metavar="NAME",
                   help="with --backend local: the chat format (llama-cpp-python's names, "
                        "e.g. chatml) of a GGUF file that has no chat template")
    p.add_argument("--optimizer-backend", choices=BACKENDS, default=None,
                   help="backend for loss, backward and update calls (default: --backend)")
    p.add_argument("--optimizer-model", help="model for loss, backward and update calls")
    p.add_argument("--base-url", help="OpenAI-compatible server URL (default: OPENAI_BASE_URL)")
    p.add_argument("--method", choices=sorted(METHODS), default="semantic",
                   help="credit-assignment method (default: semantic; docs/methods.md)")
    p.add_argument("--prompts", choices=("default", "paper"), default="default",
                   help="prompt set: ours, or the paper reference code's structure "
                        "(docs/methods.md)")
    p.add_argument("--steps", type=_non_negative, default=4,
                   help="optimization steps (default: 4; 0 only scores the starting prompts)")
    p.add_argument("--train", type=_non_negative, help="training examples (default: graph's)")
    p.add_argument("--val", type=_non_negative, help="validation examples (default: graph's)")
    p.add_argument("--test", type=_non_negative, help="test examples (default: graph's)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the splits, the sampled failures and the model (default: 0)")
    p.add_argument("--dataset", help="override the graph's dataset")
    p.add_argument("--failures", type=_positive, default=2, dest="failures_per_step",
                   help="failing examples back-propagated per step (k)")
    p.add_argument("--no-gate", action="store_false", dest="gate",
                   help="accept every proposal (ablation)")
    p.add_argument("--update-mode", choices=("all", "one"), default="all",
                   help="update every trainable prompt per step, or one at a time")
    p.add_argument("--node-gates", choices=("auto", "on", "off"), default="auto",
                   help="also score each changed prompt alone on validation (auto: when a "
                        "step changes 2 to 4 prompts)")
    p.add_argument("--structured", choices=("auto", "on", "off"), default="auto",
                   help="JSON-schema replies for backward, update and gtbp calls (auto: where "
                        "the backend supports them, text formats after a server refuses)")
    p.add_argument("--allow-copies", action="store_true",
                   help="apply proposed prompts that copy training examples (few-shot style)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of every call (default: 0, greedy)")
    p.add_argument("--max-tokens", type=_positive, help="forward generation limit")
    p.add_argument("--optimizer-max-tokens", type=_positive,
                   help="generation limit of loss, backward and update calls")
    p.add_argument("--cache", choices=("off", "read", "readwrite"), default="readwrite",
                   help="reuse identical calls from the run log's cache (default: readwrite)")
    p.add_argument("--concurrency", type=_positive, default=None,
                   help="the most calls in flight at once, across all backends (default: "
                        "adaptive, from 64 up to 256, halved when the server pushes back)")
    p.add_argument("--backend-limit", action="append", default=[], metavar="BACKEND=N",
                   help="a lower limit for one backend, e.g. openai=4 (repeatable)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per call")
    p.add_argument("--max-retries", type=_non_negative, default=4,
                   help="retries of a call that fails or times out (default: 4)")
    p.add_argument("--run-id", help="name the run (default: generated)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="method option, e.g. m0=2 for gtbp (repeatable)")


def cmd_run(args: argparse.Namespace) -> int:
    from engine.llm.factory import default_backend_kind
    from engine.runs.execute import RunConfig, execute

    if args.fork or args.from_step is not None or args.set_prompt:
        from engine.cli.probes import cmd_fork

        return cmd_fork(args, add_run_options, _with_progress)
    if not args.graph:
        raise UsageError("run needs a graph file (or --fork RUN_ID --from-step S)")
    config = RunConfig(
        graph=args.graph, method=args.method, backend=args.backend or default_backend_kind(),
        model=args.model, optimizer_backend=args.optimizer_backend,
        optimizer_model=args.optimizer_model, steps=args.steps, train=args.train, val=args.val,
        test=args.test, seed=args.seed, db=args.db, data_dir=args.data_dir,
        dataset=args.dataset, cache=args.cache, concurrency=args.concurrency,
        backend_limits=_limits(args.backend_limit),
        failures_per_step=args.failures_per_step, gate=args.gate,
        update_mode=args.update_mode, node_gates=args.node_gates,
        temperature=args.temperature, max_tokens=args.max_tokens,
        optimizer_max_tokens=args.optimizer_max_tokens, base_url=args.base_url,
        timeout=args.timeout, max_retries=args.max_retries, run_id=args.run_id,
        method_options=_options(args.option), prompts=args.prompts,
        structured=args.structured, allow_copies=args.allow_copies)
    graph = _graph_with_functions(args)
    return _with_progress(lambda listeners: execute(config, listeners=listeners, graph=graph),
                          config.steps)


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
    return _with_progress(lambda listeners: resume(args.db, args.run_id, listeners=listeners,
                                                   functions=functions), steps, done)


def cmd_runs(args: argparse.Namespace) -> int:
    from engine.runlog.schema import check_readable, connect

    check_readable(args.db)
    with connect(args.db, read_only=True) as con:
        rows = con.execute("""
            SELECT r.run_id, r.graph_name, r.method, r.model, r.status,
                   (SELECT max(step) FROM steps s WHERE s.run_id = r.run_id),
                   (SELECT max(val_score) FROM steps s WHERE s.run_id = r.run_id)
            FROM runs r ORDER BY r.started_at""").fetchall()
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
                      "" if steps is None else str(steps), _fmt(best))
    out.print(table if rows else f"{args.db}: no runs yet")
    return 0


# --- progress and summary --------------------------------------------------------------


def _with_progress(start: Callable[[tuple], Any], steps: int, done: int = 0) -> int:
    """Run with a progress bar that appears on the first event, so that input refused
    before the run starts prints only its one error line."""
    calls = {"n": 0}
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[calls]} calls"),
                        TimeElapsedColumn(), console=console)
    task = progress.add_task("optimizing", total=steps + 1, completed=done, calls=0)

    def listener(event: Any) -> None:
        if not progress.live.is_started:
            progress.start()
        if isinstance(event, CallRecord):
            calls["n"] += 1
            progress.update(task, calls=calls["n"])
        elif isinstance(event, PhaseProgress):
            of = f"/{event.calls_expected}" if event.calls_expected else ""
            progress.update(task, description=f"step {event.step} {event.phase} "
                                              f"{event.calls_done}{of}")
            if not console.is_terminal and _progress_worth_a_line(event, calls):
                console.print(progress_line(event), markup=False, highlight=False)
        elif isinstance(event, StepFinished):
            progress.update(task, advance=1, description=f"step {event.step} done")
            if not console.is_terminal:  # a log file (e.g. a dashboard job): one line a step
                console.print(f"step {event.step} done: train {_fmt(event.train_score)}, "
                              f"val {_fmt(event.val_score)}"
                              f"{', edit accepted' if event.accepted else ''}; "
                              f"{calls['n']} calls so far", markup=False, highlight=False)

    try:
        result = asyncio.run(start((listener,)))
    finally:
        if progress.live.is_started:  # stopping a bar never shown prints a blank line
            progress.stop()
    print_summary(result)
    return 0 if result.status == "finished" else 1


def _progress_worth_a_line(event: Any, state: dict) -> bool:
    """In a log file: a line when a phase starts, every 5 calls, and when it completes."""
    phase = (event.step, event.phase)
    first, state["phase"] = state.get("phase") != phase, phase
    return first or event.calls_done % 5 == 0 or event.calls_done == event.calls_expected


def print_summary(result: Any) -> None:
    per_step: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for call in result.events.of(CallRecord):
        per_step[call.step][0] += 1
        per_step[call.step][1] += call.prompt_tokens + call.completion_tokens
    edits: dict[int, int] = defaultdict(int)
    for p in result.events.of(Proposal):
        edits[p.step] += int(p.accepted)
    table = Table("step", "train", "val", "accepted edits", "calls", "tokens",
                  title=f"run {result.run_id}: {result.status}")
    for s in result.events.of(StepFinished):
        table.add_row(str(s.step), _fmt(s.train_score), _fmt(s.val_score), str(edits[s.step]),
                      str(per_step[s.step][0]), str(per_step[s.step][1]))
    out.print(table)
    stats = result.stats
    line = (f"calls {stats.calls} (cache hits {stats.cache_hits}, retries {stats.retries}, "
            f"failed {stats.failures}); tokens {stats.prompt_tokens + stats.completion_tokens}")
    if result.test_score is not None:
        line += f"; test score {_fmt(result.test_score)}"
    out.print(line)
    gates = [{**s.metrics, **s.timings} for s in result.events.of(StepFinished)
             if "node_gate_calls" in s.metrics]
    if gates:
        out.print(f"per-node gates: {len(gates)} steps scored edits alone, "
                  f"{sum(m['node_gate_calls'] for m in gates):.0f} calls "
                  f"({sum(m['node_gate_model_calls'] for m in gates):.0f} to the model), "
                  f"{sum(m['node_gate_seconds'] for m in gates):.1f} s")


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


# --- argument helpers ------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, not {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
    return value


def _options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--option expects KEY=VALUE, not {item!r}")
        key, value = item.split("=", 1)
        try:
            options[key] = int(value)
        except ValueError:
            options[key] = value
    return options


def _limits(items: list[str]) -> dict[str, int]:
    limits = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name or not value.isdigit() or int(value) < 1:
            raise UsageError(f"--backend-limit expects BACKEND=N with N a positive whole "
                             f"number, not {item!r}")
        limits[name] = int(value)
    return limits


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
    p.add_argument("--from-step", type=_non_negative, metavar="S",
                   help="the parent's step to fork from")
    p.add_argument("--set-prompt", action="append", default=[], metavar="NODE=@FILE",
                   help="with --fork: a hand-edited prompt for a node (repeatable)")
    p.add_argument("--db", default="runs.duckdb", help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--data-dir", help="where named datasets live")
    p.add_argument("--functions", metavar="FILE.py", help=FUNCTIONS_HELP)
    add_run_options(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("resume", help="continue a run from its last complete step")
    p.add_argument("run_id", help="the run to continue (python -m engine runs lists them)")
    p.add_argument("--db", default="runs.duckdb", help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--functions", metavar="FILE.py", help=FUNCTIONS_HELP)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("runs", help="list the runs in a run log")
    p.add_argument("--json", action="store_true",
                   help="print the rows as a JSON list, for scripts")
    p.add_argument("--db", default="runs.duckdb", help="the run log, a DuckDB file (default: runs.duckdb)")
    p.set_defaults(func=cmd_runs)

    from engine import experiment
    from engine.cli import probes as probe_cli
    from engine.runlog import export

    export.register_cli(sub)
    experiment.register_cli(sub)
    probe_cli.register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except _bad_input_errors() as exc:
        console.print(f"error: {exc}", markup=False, highlight=False)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        console.print("interrupted", markup=False)
        return 130
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if os.environ.get("SEMBACK_DEBUG"):
            traceback.print_exc()
        console.print(f"error: unexpected {exc.__class__.__name__}: {exc} "
                      "(set SEMBACK_DEBUG=1 for the traceback)", markup=False, highlight=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())
