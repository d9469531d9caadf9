"""`python -m engine mcp [--db DB] [--port PORT]`: the run log's commands as Model Context
Protocol tools for a coding agent (engine/mcp/server.py, docs/mcp.md). Standard input and
output by default; with --port, streamable HTTP on 127.0.0.1 only. Needs the `mcp` extra."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

EXIT_BAD_INPUT = 2
MISSING = "error: python -m engine mcp needs the mcp extra: pip install .[mcp]"


def register_cli(sub: Any) -> None:
    p = sub.add_parser("mcp", help="serve the run log's commands as Model Context Protocol "
                                   "tools for a coding agent (stdio; --port: HTTP on "
                                   "127.0.0.1)")
    p.add_argument("--db", default="runs.duckdb",
                   help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--port", type=int,
                   help="serve streamable HTTP at http://127.0.0.1:PORT/mcp instead of "
                        "standard input and output (bound to 127.0.0.1 only)")
    p.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("mcp") is None:
        print(MISSING, file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.port is not None and not 0 < args.port < 65536:
        raise ValueError(f"--port must be 1 to 65535, not {args.port}")
    from engine.mcp.server import serve

    if args.port is not None:
        print(f"semback MCP server on http://127.0.0.1:{args.port}/mcp (run log {args.db})",
              file=sys.stderr)
    serve(args.db, args.port)
    return 0
