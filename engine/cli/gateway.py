"""Your pipeline re-run for real (engine/gateway):

    python -m engine gateway --db DB (--upstream URL | --backend local) [--port 8790]
    python -m engine trace --pipeline MODULE:FUNCTION | --command CMD --data FILE.jsonl
                           [--metric NAME] [--val N] (--base-url URL | --backend local)
    python -m engine optimize --pipeline ... --data FILE.jsonl --metric NAME --val N
                              --steps S (--base-url URL | --backend local) [--json]

`gateway` serves until Ctrl-C or SIGTERM, printing one line with its address and a count
of calls every few seconds while calls arrive; an address in use or a file that is not a
run log: one `error:` line, status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.cli.collect import port_number, serve_until_stopped
from engine.core.graph import METRICS
from engine.runs.settings import non_negative_int, positive_int

DEFAULT_PORT = 8790


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _add_pipeline(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--pipeline", metavar="MODULE:FUNCTION",
                       help="a Python callable, called with each example's input fields as "
                            "keyword arguments (MODULE:FUNCTION or FILE.py:FUNCTION)")
    which.add_argument("--command", metavar="CMD",
                       help="a shell command: one JSON example on stdin, its output on "
                            "stdout")
    p.add_argument("--data", required=True, metavar="FILE.jsonl",
                   help="one JSON object a line: the input fields, and 'target'")
    p.add_argument("--targets", metavar="FILE.jsonl",
                   help="targets kept apart from --data: lines of the same input fields with "
                        "'target', matched to --data's lines by their fields")
    p.add_argument("--db", default="runs.duckdb", help="the run log (default: runs.duckdb)")
    p.add_argument("--metric", default="exact_match", metavar="NAME|FILE.py:NAME",
                   help=f"how an output is scored: {', '.join(m for m in METRICS if m != 'judge')}"
                        " or a Python metric (default: exact_match)")
    p.add_argument("--val", type=non_negative_int, default=0, metavar="N",
                   help="hold the last N scored examples out as the validation split")
    p.add_argument("--base-url", metavar="URL",
                   help="the upstream model: an OpenAI-compatible server (its key from "
                        "OPENAI_API_KEY)")
    p.add_argument("--backend", choices=("local",),
                   help="local: the embedded model, served by llama.cpp, as the upstream")
    p.add_argument("--model", help="the model name the run records (default: the calls')")
    p.add_argument("--run-id", help="the new run's id (default: made up)")
    p.add_argument("--concurrency", type=positive_int, default=4, metavar="N",
                   help="examples run at once (default: 4)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="seconds one example may run (default: 120)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def register_cli(sub: Any) -> None:
    p = sub.add_parser("gateway", help="an OpenAI-compatible gateway that records every "
                                       "call of a pipeline into a run log and intervenes "
                                       "by URL")
    p.add_argument("--db", default="runs.duckdb", help="the run log (default: runs.duckdb)")
    p.add_argument("--upstream", metavar="URL",
                   help="the model's OpenAI-compatible base URL (its key from "
                        "OPENAI_API_KEY; a client's own Authorization is forwarded)")
    p.add_argument("--backend", choices=("local",),
                   help="local: the embedded model, served by llama.cpp, as the upstream")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                   help=f"the port (default: {DEFAULT_PORT}; 0: any free one, printed)")
    p.set_defaults(func=cmd_gateway)

    p = sub.add_parser("trace", help="run your pipeline on a data file through the gateway "
                                     "and record it as a run that re-runs it")
    _add_pipeline(p)
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("optimize", help="trace your pipeline, back-propagate, validate "
                                        "candidates by re-running it, keep and hand back "
                                        "the better prompts")
    _add_pipeline(p)
    p.add_argument("--steps", type=positive_int, default=1, metavar="S",
                   help="optimization steps (default: 1)")
    p.add_argument("--method", help="credit assignment (default: semantic)")
    p.set_defaults(func=cmd_optimize)


def _upstream(args: argparse.Namespace) -> tuple[str, Any, str | None]:
    from engine.gateway.pipeline import upstream_of

    return upstream_of(getattr(args, "upstream", None) or getattr(args, "base_url", None),
                       args.backend)


def cmd_gateway(args: argparse.Namespace) -> int:
    import os

    from engine.gateway.server import Gateway

    url, server, model = _upstream(args)
    try:
        gateway = Gateway(args.db, url, host=args.host, port=args.port,
                          api_key=os.environ.get("OPENAI_API_KEY"), log=_log,
                          upstream_model=model)
        gateway.start()
        print(f"gateway on {gateway.url}/v1 (forwarding to {url}) recording into {args.db}; "
              f"point a pipeline at it with OPENAI_BASE_URL={gateway.url}/v1; Ctrl-C stops",
              flush=True)
        serve_until_stopped(lambda: _count_line(gateway.counts) if gateway.counts.calls
                            or gateway.counts.errors else None, gateway.close)
        print(f"stopped: {_count_line(gateway.counts)}", flush=True)
    finally:
        if server is not None:
            server.stop()
    return 0


def _count_line(counts: Any) -> str:
    return (f"{counts.calls} calls ({counts.upstream} upstream, {counts.cache_hits} from the "
            f"cache, {counts.patched} patched), {counts.errors} refused")


def _spec(args: argparse.Namespace) -> Any:
    import os

    from engine.gateway.runner import PipelineSpec

    return PipelineSpec(args.pipeline, args.command, os.getcwd())


def cmd_trace(args: argparse.Namespace) -> int:
    from engine.gateway.pipeline import trace_pipeline

    url, server, model = _upstream(args)
    try:
        result = trace_pipeline(_spec(args), args.data, args.db, upstream=url,
                                targets=args.targets,
                                metric=args.metric, val=args.val, run_id=args.run_id,
                                concurrency=args.concurrency, timeout=args.timeout,
                                model=args.model, upstream_model=model,
                                local=args.backend == "local",
                                log=(lambda line: None) if args.json else _log)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(result.as_json(), ensure_ascii=False, indent=1))
        return 0
    imported = result.imported
    p = imported.pipeline
    print(f"traced {len(p.traces)} examples into run '{imported.run_id}' ({args.db}): "
          f"{len(p.nodes)} calls, {len(p.edges)} flows; {imported.scored} scored"
          f"{f' ({imported.val} held out for validation)' if imported.val else ''}, "
          f"{imported.failing} failing; its forward passes re-run the pipeline")
    for node in p.nodes.values():
        print(f"  {node.id} <- {', '.join(node.inputs)}"
              f"{'  (final output)' if node.id == p.output else ''}")
    for line, error in result.errors:
        print(f"  line {line}: {error}")
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    from engine.gateway.pipeline import optimize_pipeline

    url, server, model = _upstream(args)
    try:
        pair = None
        if args.backend == "local":  # the embedded pair: the 1.5B writes gradients and edits
            from engine.llm.models import paired_optimizer

            pair, note = paired_optimizer(model)
            if note:
                _log(note)
        summary = optimize_pipeline(_spec(args), args.data, args.db, upstream=url,
                                    targets=args.targets,
                                    metric=args.metric, val=args.val, steps=args.steps,
                                    method=args.method, run_id=args.run_id,
                                    concurrency=args.concurrency, timeout=args.timeout,
                                    model=args.model, upstream_model=model,
                                    local=args.backend == "local",
                                    optimizer_backend="local" if pair else None,
                                    optimizer_model=pair,
                                    log=(lambda line: None) if args.json else _log)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(summary, ensure_ascii=False, indent=1))
        return 0
    v = summary["validation"]
    print(f"run '{summary['run_id']}': validation {_score(v['before'])} -> "
          f"{_score(v['after'])} on {v['n']} examples; nodes {', '.join(summary['nodes'])}")
    for node, prompt in summary["prompts"].items():
        mark = "changed" if node in summary["changed"] else "kept as it was"
        print(f"  {node} ({mark}): {prompt}")
    for note in summary["notes"]:
        print(f"  note: {note}")
    print(f"the prompts with their evidence: python -m engine prompts {summary['run_id']} "
          f"--db {args.db}")
    return 0


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
