"""`python -m engine runlog push FILE.duckdb --to LAKE` and `runlog pull FILE.duckdb --from
LAKE`: copy runs between a run-log file and a team's lake (or any two run logs), adding only
the rows the target lacks, so copying twice adds nothing (engine/runlog/moving.py)."""

from __future__ import annotations

import argparse
import json

from engine.console import console

HELP = "copy runs between a run-log file and a lake (ducklake:…); twice adds nothing"


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runlog", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, help="push or pull")
    for verb, what in (("push", "copy the runs of a local run log into another (a lake)"),
                       ("pull", "copy a lake's runs into a local run log")):
        q = verbs.add_parser(verb, help=what, description=what)
        q.add_argument("file", metavar="FILE.duckdb", help="the local run log")
        if verb == "push":
            q.add_argument("--to", metavar="LOG", required=True,
                           help="the run log to copy into (ducklake:postgres:dbname=… "
                                "host=…, or ducklake:F.ducklake)")
            q.set_defaults(from_=None)
        else:  # pull FILE --from LAKE, or as push reads: pull LAKE --to FILE
            where = q.add_mutually_exclusive_group(required=True)
            where.add_argument("--from", dest="from_", metavar="LOG",
                               help="the run log to copy from (a lake: ducklake:…)")
            where.add_argument("--to", metavar="LOG",
                               help="with the lake as the first argument: the local run "
                                    "log to copy into")
        q.add_argument("--run", action="append", metavar="RUN_ID", dest="runs",
                       help="only this run (repeatable; default: every run)")
        q.add_argument("--data-path", metavar="FOLDER|s3://…",
                       help="where a new lake keeps its Parquet files ($SEMBACK_DATA_PATH)")
        q.add_argument("--json", action="store_true", help="print what was copied as JSON")
        q.set_defaults(func=cmd_runlog, direction=verb)


def cmd_runlog(args: argparse.Namespace) -> int:
    from engine.runlog.moving import copy_runs

    if args.to:
        source, target = args.file, args.to
    else:
        source, target = args.from_, args.file
    copied = copy_runs(source, target, args.runs)
    if args.json:
        print(json.dumps({"source": source, "target": target, "rows": copied.rows,
                          "runs_added": copied.runs_added,
                          "runs_updated": copied.runs_updated}))
        return 0
    rows = sum(copied.rows.values())
    console.print(f"{source} -> {target}: {len(copied.runs_added)} run(s) added, "
                  f"{len(copied.runs_updated)} brought up to date, {rows:,} row(s) copied"
                  + ("" if copied.total else " (the target already had everything)"),
                  markup=False, highlight=False)
    return 0
