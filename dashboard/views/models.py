"""What the New-run form offers as local models: the installed named models (the default
first), and for the others the command that installs each."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def model_offer(listing: Iterable[Any], default: str) -> tuple[list[str], str]:
    """(installed model names, the default first; a line naming, for each other model, the
    one command that installs it, or "") from `engine.llm.models.list_models()` rows."""
    rows = list(listing)
    installed = sorted((r.name for r in rows if r.installed), key=lambda n: n != default)
    missing = "; ".join(f"{r.name}: `python -m engine models install {r.name}`"
                        for r in rows if not r.installed)
    return installed, f"Not installed (local models): {missing}" if missing else ""
