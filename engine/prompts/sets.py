"""The prompt sets a run can choose with `--prompts`, by name."""

from __future__ import annotations

from engine.prompts.paper import PAPER
from engine.prompts.templates import DEFAULT, PromptSet

PROMPT_SETS: dict[str, PromptSet] = {s.name: s for s in (DEFAULT, PAPER)}


def prompt_set(name: str) -> PromptSet:
    """The prompt set called `name`; ValueError for an unknown one."""
    if name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set '{name}' (choose from {', '.join(PROMPT_SETS)})")
    return PROMPT_SETS[name]
