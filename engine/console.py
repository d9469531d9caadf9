"""The two terminals every command writes to: `out` (results, standard output) and `console`
(progress and `error:` lines, standard error). Shared by the command line and the
subcommands it registers, which therefore never import `engine.cli`.

Written to a file or a pipe (no terminal, no COLUMNS), tables get room for every column
(WIDE) instead of Rich's 80 columns, where headers and cells would be cut to "pr…"."""

from __future__ import annotations

import os
import sys

from rich.console import Console

WIDE = 200


def width_for(stream) -> int | None:
    """None (the terminal's own width) for a terminal or when COLUMNS is set, else WIDE."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return None if terminal or os.environ.get("COLUMNS") else WIDE


console = Console(stderr=True, soft_wrap=True, width=width_for(sys.stderr))
out = Console(soft_wrap=True, width=width_for(sys.stdout))
