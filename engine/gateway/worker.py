"""A runner's worker process: `python -m engine.gateway.worker MODULE:FUNCTION`.

It imports the user's pipeline once (a module that builds its model client at import time
builds it here, with OPENAI_BASE_URL already pointing at this worker's gateway route), then
reads one JSON example a line on stdin, `{"id": ..., "fields": {...}}`, calls the function
with the fields as keyword arguments (awaiting it when it is async), and writes one JSON
line back, `{"id": ..., "output": TEXT}` or `{"id": ..., "error": "Exception: message"}`.
The pipeline's own prints go to stderr: stdout carries only these lines.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any


def load(spec: str) -> Any:
    """The callable `MODULE:FUNCTION` names (a module path, or a FILE.py)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ValueError(f"--pipeline {spec!r}: expected MODULE:FUNCTION or FILE.py:FUNCTION")
    if where.endswith(".py"):
        path = Path(where).resolve()
        sys.path.insert(0, str(path.parent))
        module = importlib.import_module(path.stem)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"--pipeline {spec!r}: {where} has no function '{name}'")
    return fn


def as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    for attribute in ("answer", "output", "content"):  # a DSPy Prediction, a message
        inner = getattr(value, attribute, None)
        if isinstance(inner, str):
            return inner
    return str(value)


def call(fn: Any, fields: dict[str, Any]) -> str:
    result = fn(**fields)
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    return as_text(result)


async def _awaited(result: Any) -> Any:
    return await result


def exception_line(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{exc.__class__.__name__}: {exc}{where}"


def main() -> int:
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)  # the pipeline's prints go to stderr
    sys.stdout = sys.stderr
    try:
        fn = load(sys.argv[1])
    except Exception as exc:  # noqa: BLE001 - any import failure is the pipeline's
        protocol.write(json.dumps({"id": None, "error": exception_line(exc)}) + "\n")
        return 2
    protocol.write(json.dumps({"id": None, "ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        try:
            out = {"id": task["id"], "output": call(fn, task["fields"])}
        except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
            out = {"id": task["id"], "error": exception_line(exc)}
        protocol.write(json.dumps(out, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
