"""Registry of deterministic function nodes (`kind: function`).

A graph file names a function; it never imports or evaluates code. Each function takes
the node's input values, in declared order, and returns one string.
"""

from __future__ import annotations

import re
from collections.abc import Callable

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


FUNCTIONS: dict[str, Callable[..., str]] = {
    "extract_number": extract_number,
    "extract_choice": extract_choice,
    "extract_yes_no": extract_yes_no,
    "concatenate": concatenate,
    "first_line": first_line,
}
