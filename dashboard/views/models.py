"""What the New-run form offers as local models: the installed named models (the default
first), and for each of the others one line with the command that installs it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def model_offer(listing: Iterable[Any], default: str) -> tuple[list[str], list[str]]:
    """(installed model names, default first; install lines for the others) from
    `engine.llm.models.list_models()` rows."""
    rows = list(listing)
    installed = sorted((r.name for r in rows if r.installed), key=lambda n: n != default)
    missing = [f"{r.name}: python -m engine models install {r.name}"
               for r in rows if not r.installed]
    return installed, missing
