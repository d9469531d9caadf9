"""A user's own pipeline code, imported by module (tests/test_probe_python.py): a tool and
a metric that later commands must import again from where the run recorded them."""

from __future__ import annotations

import re


def digits_only(text: str) -> str:
    """Keeps the digits of the text: the tool between the two LLM nodes."""
    return " ".join(re.findall(r"\d+", text))


def close_enough(example: dict, prediction: str) -> float:
    """1.0 when the prediction's last number is the answer."""
    found = re.findall(r"\d+", prediction)
    return 1.0 if found and found[-1] == str(example["answer"]) else 0.0
