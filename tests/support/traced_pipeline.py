"""The example pipeline (sample_graphs/traced_pipeline.py) and a literal-minded model for it,
served by tests/support/fake_openai.py."""

from __future__ import annotations

import json
import re

from benchmarks.traces_blame import load_pipeline  # noqa: F401  (the tests' one loader too)
from tests.support.fake_openai import default_responder, requested_schema

DIGITS = r"\d+"
REWRITE = "Rewrite the output as the feedback says"
UPDATE = "Write an improved prompt for this step"
FIXED_NUMBERS = "Numbers: give the two numbers in the sentence."  # the fault, repaired


def responder(body: dict) -> str:
    """The pipeline as a literal-minded model runs it (numbers says how the person feels,
    as its prompt asks; told to give the numbers, it gives them); a probe's rewrite of
    `numbers` passes the two numbers on, of `who` changes nothing that matters; asked to
    improve `numbers`'s prompt, it repairs the fault, and keeps the other prompts."""
    messages = body["messages"]
    system, user = messages[0]["content"], messages[-1]["content"]
    if system.startswith("Who:"):
        return f"It is about {user.split()[1]}."
    if system == FIXED_NUMBERS:
        return f"The numbers are {' and '.join(re.findall(DIGITS, user))}."
    if system.startswith("Numbers:"):
        return f"{user.split()[1]} feels fine."
    if system.startswith("Total:"):
        return str(sum(int(n) for n in re.findall(DIGITS, user)))
    if REWRITE in user:
        numbers = re.findall(DIGITS, user.split('<input name="input">')[-1].split("</input>")[0])
        output = user.split("<output>")[1].split("</output>")[0]  # the node's own output
        if "feels" in output:  # numbers'
            return f"<output>The numbers are {' and '.join(numbers)}.</output>"
        if "It is about" in output:  # who's
            return "<output>It is about a person.</output>"
        return f"<output>{sum(int(n) for n in numbers)}</output>"
    if UPDATE in user:
        current = user.split("<prompt>")[1].split("</prompt>")[0].strip()
        new = FIXED_NUMBERS if current.startswith("Numbers:") else current
        if requested_schema(body) is not None:
            return json.dumps({"reasoning": "The feedback asks for the numbers.",
                               "output_wanted": "the two numbers", "prompt": new})
        return f"The feedback asks for the numbers.\n<prompt>{new}</prompt>"
    return default_responder(body)
