"""The command line: `python -m engine` and `semback`. `commands` builds the parser and runs
the subcommands; `probes` holds the probe, blame and fork subcommands."""

from engine.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
