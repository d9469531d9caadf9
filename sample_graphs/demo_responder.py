"""A scripted model for demo.yaml that obeys its prompts literally, so the demo's story plays
out in seconds and the same way every time: the starting prompts score 0, the hand-fixed
`note` prompt (data/demo_fixed_prompts.yaml) makes every answer right.

- forward: a task that names the kind of thing counted ("kind of thing") writes what its
  inputs ask about ("How many boxes?": boxes), or the word after their first number; a
  task that asks for a number ("how many", "number") writes the first number of its
  inputs ("none" when there is none); a task that asks for one word writes the first word
  of its inputs; any other task repeats its first input;
- every other call (loss, backward, update, probes) gets the scripted backend's default
  reply, so the optimizer's edits (the default appends a generic sentence) never fix
  `note`: a person's fork does.

    .venv/bin/python -m engine run sample_graphs/demo.yaml --backend scripted \\
        --scripted-responder sample_graphs/demo_responder.py:demo_responder
    .venv/bin/python benchmarks/demo_prompts.py --backend scripted
"""

from __future__ import annotations

import re
from collections.abc import Callable

from engine.llm.base import LLMRequest

_INPUT = re.compile(r'<input name="[^"]+">\s*(.*?)\s*</input>', re.S)


def _task_and_inputs(request: LLMRequest) -> tuple[str, list[str]]:
    task, _, rest = request.user_text.partition("## Inputs")
    return task.lower(), _INPUT.findall(rest)


def demo_responder() -> Callable[[LLMRequest], str | None]:
    """The responder (engine/llm/scripted.py): forward replies follow the node's task."""

    def respond(request: LLMRequest) -> str | None:
        if request.purpose != "forward":
            return None
        task, inputs = _task_and_inputs(request)
        joined = " ".join(inputs)
        if "kind of thing" in task:
            counted = (re.search(r"how many ([A-Za-z ]+)", joined, re.I)
                       or re.search(r"\d+\s+([A-Za-z]+)", joined))
            out = counted.group(1).strip() if counted else "things"
        elif "how many" in task or "number" in task:
            numbers = re.findall(r"\d+", joined)
            out = numbers[0] if numbers else "none"
        elif "one word" in task:
            words = re.findall(r"[A-Za-z]+", joined)
            out = words[0] if words else "nothing"
        else:
            out = inputs[0] if inputs else ""
        return f"<output>{out}</output>"

    return respond
