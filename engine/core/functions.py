"""Registry of deterministic function nodes (`kind: function`).

A graph file names a function; it never imports or evaluates code. Each function takes
the node's input values, in declared order, and returns one string.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_number(*values: str) -> str:
    """The last number in the first input (commas removed), or '' when there is none."""
    found = _NUMBER.findall(values[0] if values else "")
    return found[-1].replace(",", "") if found else ""


def extract_choice(*values: str) -> str:
    """The last multiple-choice label like (A) in the first input, or ''."""
    found = re.findall(r"\(([A-Z])\)", values[0] if values else "")
    return f"({found[-1]})" if found else ""


def extract_yes_no(*values: str) -> str:
    """'Yes' or 'No', whichever appears last in the first input, or ''."""
    found = re.findall(r"\b(yes|no)\b", (values[0] if values else "").lower())
    return found[-1].capitalize() if found else ""


def concatenate(*values: str) -> str:
    """All inputs joined by blank lines."""
    return "\n\n".join(values)


def first_line(*values: str) -> str:
    """The first non-empty line of the first input."""
    for line in (values[0] if values else "").splitlines():
        if line.strip():
            return line.strip()
    return ""


# --- backward rules ---------------------------------------------------------------------
# A function node makes no call. Its rule turns the one message it received (feedback, or a
# GTBP target) into one message per input, in declared order. A rule never copies a
# message to every input: that is the "sum" behaviour the paper criticises.
# Returns (message per input name, note or None); '' means the input receives nothing.

BackwardRule = Callable[[str, dict[str, str]], tuple[dict[str, str], str | None]]


def to_first_input(message: str, values: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """Extractors read only their first input: the whole message goes to it, none to others."""
    names = list(values)
    return {n: (message if i == 0 else "") for i, n in enumerate(names)}, None


def split_by_part(message: str, values: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """`concatenate` joins its inputs with blank lines, so input i owns part i. Rules, in
    order: `<part name="x">` blocks or lines starting "x:" name each input's part; else a
    message of exactly as many blank-line-separated parts as inputs is split at those
    lines (a GTBP target that rewrote the joined text); else each input gets the message
    framed with its own part quoted, so it knows which part it wrote (noted)."""
    names = list(values)
    found = {n: b.strip() for n, b in re.findall(
        r'<part\s+name="([^"]+)"\s*>(.*?)</part>', message, flags=re.S | re.I) if n in values}
    if not found:
        found = _labelled_parts(message, names)
    if found:
        return {n: found.get(n, "") for n in names}, None
    parts = [p.strip() for p in re.split(r"\n\s*\n", message.strip()) if p.strip()]
    if len(names) > 1 and len(parts) == len(names):
        return dict(zip(names, parts)), None
    if len(names) == 1:
        return {names[0]: message}, None
    framed = {n: (f"Your output was part {i} of {len(names)} of a joined text, this part:\n"
                  f"{values[n]}\nMessage on the whole joined text:\n{message}")
              for i, n in enumerate(names, start=1)}
    return framed, "message not split by part: each part got it with its own part quoted"


def _labelled_parts(message: str, names: list[str]) -> dict[str, str]:
    pattern = re.compile(r"^\W*(" + "|".join(re.escape(n) for n in names) + r")\s*:", re.M)
    matches = list(pattern.finditer(message))
    parts: dict[str, str] = {}
    for m, nxt in zip(matches, matches[1:] + [None]):
        body = message[m.end():nxt.start() if nxt else len(message)].strip()
        if body:
            parts[m.group(1)] = body
    return parts


BACKWARD_RULES: dict[str, BackwardRule] = {
    "extract_number": to_first_input,
    "extract_choice": to_first_input,
    "extract_yes_no": to_first_input,
    "concatenate": split_by_part,
    "first_line": to_first_input,
}


def function_backward(function: str, message: str, values: dict[str, str]
                      ) -> tuple[dict[str, str], str | None]:
    """The registered backward rule of `function` applied to one message."""
    return BACKWARD_RULES[function](message, values)


FUNCTIONS: dict[str, Callable[..., str]] = {
    "extract_number": extract_number,
    "extract_choice": extract_choice,
    "extract_yes_no": extract_yes_no,
    "concatenate": concatenate,
    "first_line": first_line,
}


# --- a functions file the user chose (--functions FILE.py) ------------------------------


class FunctionsFileError(ValueError):
    """A --functions file that does not import (the command line: one line, exit 2)."""


def load_functions(path: str | Path) -> dict[str, Callable[..., Any]]:
    """Import a Python file the user chose and return its public callables by name."""
    path = Path(path)
    if not path.is_file():
        raise FunctionsFileError(f"{path}: functions file not found")
    name = "semback_functions_" + "".join(c if c.isalnum() else "_" for c in path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FunctionsFileError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.resolve().parent))  # its sibling modules, as `python FILE`
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - whatever the file does on import, one line
        sys.modules.pop(name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        raise FunctionsFileError(f"{path}: cannot import: {exc.__class__.__name__}: {first}"
                                 ) from None
    finally:
        if str(path.resolve().parent) in sys.path:
            sys.path.remove(str(path.resolve().parent))
    return {k: v for k, v in vars(module).items() if callable(v) and not k.startswith("_")}
