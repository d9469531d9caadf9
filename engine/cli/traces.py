"""Command line of imported traces (engine/traces):

    python -m engine import-traces FILE --db DB [--node-key ATTR] [--edge FROM:TO ...]
                                   [--targets FILE.jsonl]
                                   [--metric NAME|FILE.py:NAME] [--base-url URL]
                                   [--val N] [--model NAME] [--run-id ID] [--json]
                                   [--concurrency N] [--timeout S] [--optimizer-max-tokens N]
    python -m engine import-traces --collected --db DB [--service NAME] [--since WHEN] ...
    python -m engine backprop RUN_ID --db DB [--method M] [--base-url URL] [--model NAME]
                              [--optimizer-backend KIND] [--optimizer-model NAME]
                              [--concurrency N] [--timeout S] [--optimizer-max-tokens N]
                              [--proposals N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from engine.core.graph import METRICS
from engine.runs.settings import non_negative_int, positive_int


def add_call_settings(p: argparse.ArgumentParser) -> None:
    """The settings of the calls to the user's model, kept in the run for its probes."""
    p.add_argument("--concurrency", type=positive_int, metavar="N",
                   help="the most calls in flight at once (default: adaptive from 64; a "
                        "local server with N slots wants N)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="seconds per call (default: 120)")
    p.add_argument("--optimizer-max-tokens", type=positive_int, metavar="N",
                   help="generation limit of backward, rewrite and update calls (default: "
                        "1024)")


def register_cli(sub: Any) -> None:
    p = sub.add_parser("import-traces", help="make a run of a pipeline's OpenTelemetry "
                                             "traces (OTLP JSON lines)")
    p.add_argument("file", nargs="?",
                   help="spans in the OTLP JSON encoding, one ExportTraceServiceRequest "
                        "a line (the Collector's file exporter; export --format otel); not "
                        "with --collected")
    p.add_argument("--collected", action="store_true",
                   help="the spans `python -m engine collect --db DB` received into the run "
                        "log, in place of a file")
    p.add_argument("--service", metavar="NAME",
                   help="with --collected: only traces with a span of this service "
                        "(service.name)")
    p.add_argument("--since", metavar="WHEN",
                   help="with --collected: only traces whose first span arrived since WHEN, "
                        "a duration back from now (90s, 30m, 2h, 1d) or a date and time "
                        "(2026-12-06T14:30)")
    p.add_argument("--db", default="runs.duckdb",
                   help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--node-key", metavar="ATTR",
                   help="group LLM spans into call sites by this span attribute (default: "
                        "span name and system message)")
    p.add_argument("--edge", action="append", default=[], metavar="FROM:TO",
                   help="a flow the content cannot show: call FROM's reply feeds call TO "
                        "(node ids, as the import names them; repeatable). Refused when a "
                        "trace contradicts it")
    p.add_argument("--targets", metavar="FILE.jsonl",
                   help='expected outputs, one JSON object a line: {"trace_id": "<32 hex>", '
                        '"target": "..."} or {"input": "<root input>", "target": "..."}; '
                        "traces without one are kept unscored")
    p.add_argument("--metric", default="exact_match", metavar="NAME|FILE.py:NAME",
                   help=f"grader of the final output: {', '.join(m for m in METRICS if m != 'judge')}"
                        " or a Python metric (example, prediction) -> score "
                        "(default: exact_match)")
    p.add_argument("--val", type=non_negative_int, default=0, metavar="N",
                   help="hold out the last N scored traces as the validation split: never "
                        "back-propagated; backprop gates its proposals on them and "
                        "`blame --examples val` tests each proposed edit on them (default: 0)")
    p.add_argument("--base-url", metavar="URL",
                   help="the OpenAI-compatible server that re-runs call (default: "
                        "OPENAI_BASE_URL)")
    p.add_argument("--model", help="the model re-runs ask for (default: the recorded one)")
    p.add_argument("--run-id", help="name the run (default: generated)")
    add_call_settings(p)
    p.add_argument("--json", action="store_true",
                   help="print run_id, nodes, edges, traces, scored, failing, val and "
                        "ambiguous as one JSON object")
    p.set_defaults(func=cmd_import_traces)

    p = sub.add_parser("backprop", help="back-propagate a run's failing examples at its "
                                        "last step and propose prompts (e.g. an imported run)")
    p.add_argument("run_id", help="the run (python -m engine runs lists the ids)")
    p.add_argument("--db", default="runs.duckdb",
                   help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--method", help="credit assignment (default: the run's; docs/methods.md)")
    p.add_argument("--base-url", metavar="URL",
                   help="the OpenAI-compatible server for the model calls (recorded for "
                        "the run's probes and blame too)")
    p.add_argument("--model", help="the model to call (default: the run's)")
    p.add_argument("--optimizer-backend", choices=("openai", "local", "scripted"),
                   help="another backend for the gradient, rewrite and update calls (e.g. "
                        "local: an embedded model), kept for the run's probes and blame")
    p.add_argument("--optimizer-model", metavar="NAME",
                   help="the model of those calls (with --optimizer-backend local: "
                        "qwen2.5-coder-1.5b, say; python -m engine models lists them)")
    p.add_argument("--proposals", type=positive_int, metavar="N",
                   help="candidate prompt sets: the update calls made N times from the same "
                        "gradients, the best on the held-out traces kept (needs import-traces "
                        "--val; default: the run's, 1)")
    add_call_settings(p)
    p.add_argument("--json", action="store_true",
                   help="print run_id, step, status, gradients, failing_examples, proposals "
                        "(the count of changed ones), unchanged and each node's proposal "
                        "as one JSON object")
    p.set_defaults(func=cmd_backprop)


def declared_edge(text: str) -> tuple[str, str]:
    """`--edge FROM:TO` as a pair of node ids."""
    from engine.traces import TraceError

    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise TraceError(f"--edge {text}: expected FROM:TO, two call sites' node ids")
    return parts[0].strip(), parts[1].strip()


def cmd_import_traces(args: argparse.Namespace) -> int:
    from engine.traces import TraceError
    from engine.traces.importer import import_traces

    spans = None
    if args.collected == bool(args.file):
        raise TraceError("import-traces takes a FILE of spans or --collected (the spans "
                         "`collect` received into --db), one of the two")
    if not args.collected and (args.service or args.since):
        raise TraceError("--service and --since go with --collected")
    if args.collected:
        from engine.traces.collect import collected, since_time

        spans = collected(args.db, args.service,
                          since_time(args.since) if args.since else None)
        if not spans:
            chosen = " ".join(f"{flag} {value}" for flag, value in (
                ("--service", args.service), ("--since", args.since)) if value)
            raise TraceError(f"{args.db}: no collected spans{f' ({chosen})' if chosen else ''}"
                             f" (python -m engine collect --db {args.db} receives them)")
    result = import_traces(args.file or "collected", args.db, node_key=args.node_key,
                           targets=args.targets, metric=args.metric, base_url=args.base_url,
                           model=args.model, run_id=args.run_id,
                           concurrency=args.concurrency, timeout=args.timeout,
                           optimizer_max_tokens=args.optimizer_max_tokens, val=args.val,
                           spans=spans, edges=[declared_edge(e) for e in args.edge])
    if args.json:
        print(json.dumps(result.as_json(), ensure_ascii=False, indent=1))
        return 0
    p = result.pipeline
    print(f"imported {len(p.traces)} traces into run '{result.run_id}' ({args.db}): "
          f"{len(p.nodes)} call sites, {len(p.edges)} flows; {result.scored} scored"
          f"{f' ({result.val} held out for validation)' if result.val else ''}, "
          f"{result.failing} failing")
    for node in p.nodes.values():
        reads = ", ".join(node.inputs)
        print(f"  {node.id} <- {reads}{'  (final output)' if node.id == p.output else ''}")
    for flow in p.ambiguous:
        print(f"  ambiguous: {', '.join(flow['from'])} -> {flow['to']} in trace "
              f"{flow['trace_id']}: {flow['reason']}")
    return 0


def cmd_backprop(args: argparse.Namespace) -> int:
    from engine.events import Gradient, Proposal
    from engine.gateway.pipeline import backprop_rerun

    # a run recorded through the gateway re-runs its pipeline for the gate's passes
    result = asyncio.run(backprop_rerun(args.db, args.run_id, method=args.method,
                                        base_url=args.base_url, model=args.model,
                                        concurrency=args.concurrency, timeout=args.timeout,
                                        optimizer_max_tokens=args.optimizer_max_tokens,
                                        optimizer_backend_kind=args.optimizer_backend,
                                        optimizer_model=args.optimizer_model,
                                        proposals=args.proposals))
    if result.status != "finished":  # a step is recorded whole or not at all
        line = (f"run '{args.run_id}': backprop {result.status}"
                f"{': ' + result.reason if result.reason else ''}; step "
                f"{result.state.step + 1 if result.state else 1} was not recorded")
        print(json.dumps({"error": line, "status": result.status}, ensure_ascii=False)
              if args.json else line)
        return 1
    gradients = result.events.of(Gradient)
    proposals = result.events.of(Proposal)
    step = result.state.step
    # a proposal that leaves the prompt as it was is no proposal: marked, never counted
    changed = [p for p in proposals if not p.unchanged]
    several = len({p.candidate for p in proposals}) > 1
    if args.json:
        print(json.dumps({
            "run_id": args.run_id, "step": step, "status": result.status,
            "gradients": len(gradients),
            "failing_examples": len({g.example_id for g in gradients}),
            "proposals": len(changed), "unchanged": len(proposals) - len(changed),
            "nodes": [{"node_id": p.node_id, "candidate": p.candidate, "kept": p.accepted,
                       "unchanged": p.unchanged, "prompt": p.new_prompt,
                       "reason": p.reject_reason or p.parse_error} for p in proposals],
            "next": f"python -m engine blame {args.run_id} --db {args.db} --step {step}"},
            ensure_ascii=False, indent=1))
        return 0
    unchanged = len(proposals) - len(changed)
    print(f"run '{args.run_id}' step {step}: {len(gradients)} gradients on "
          f"{len({g.example_id for g in gradients})} failing examples, "
          f"{len(changed)} proposals{f' ({unchanged} unchanged)' if unchanged else ''} "
          f"(status {result.status})")
    for proposal in proposals:
        head = (f"  {proposal.node_id}"
                f"{f' (candidate {proposal.candidate + 1})' if several else ''}")
        if proposal.unchanged:
            print(f"{head}: unchanged (the prompt as it was)")
            continue
        print(f"{head}{' kept' if proposal.accepted else ''}: "
              f"{' '.join(proposal.new_prompt.split())[:100]}")
    print(f"next: python -m engine blame {args.run_id} --db {args.db} --step {step}")
    return 0
