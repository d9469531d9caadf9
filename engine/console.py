"""The two terminals every command writes to: `out` (results, standard output) and `console`
(progress and `error:` lines, standard error). Shared by the command line and the
subcommands it registers, which therefore never import `engine.cli`."""

from __future__ import annotations

from rich.console import Console

console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)
