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


def agent_rome_closed(question: str) -> str:
    """sample_graphs/agent_pipeline.py's agent, whose weather service has no report for
    Rome on the Madrid-Rome trip: the recorded (faulty) run looks up Madrid and passes,
    and the fix, which looks up the arrival city, makes the pipeline itself raise there."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sample_graphs"))
    import agent_pipeline

    original = agent_pipeline.get_weather

    def get_weather(city: str) -> str:
        if city.strip().lower() == "rome" and "Madrid to Rome" in question:
            raise RuntimeError("the weather service has no report for Rome")
        return original(city)

    agent_pipeline.get_weather = get_weather
    try:
        return agent_pipeline.agent(question)
    finally:
        agent_pipeline.get_weather = original
