"""A scripted model for tests/support/tie_demo.yaml (the demo before its rebuild, where
`note` and `thing` both read the sentence) whose updates repair both `note` and `thing` in
part, so that a blame on the validation examples ties on the two:
the gradient probes fix nothing (the scripted backend's default rewrite), each node's
proposed edit alone fixes some failing examples, and `answer`'s edit fixes none.

- forward: as sample_graphs/demo_responder.py, plus the two edited prompts: `note`'s
  writes the text's number when it is below LIMIT (else "many"); `thing`'s repeats the
  text when its number is even (else "odd");
- update: `note` and `thing` get those prompts; `answer` the backend's default.

    .venv/bin/python -m engine run tests/support/tie_demo.yaml --backend scripted \\
        --scripted-responder tests/support/tie_script.py:tie_responder
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path

from engine.llm.base import LLMRequest

DEMO = Path(__file__).resolve().parents[2] / "sample_graphs" / "demo_responder.py"

LIMIT = 20
NOTE_EDIT = f"Write the number in the text if it is below {LIMIT}."
THING_EDIT = "Repeat the text if its number is even."


def _number(request: LLMRequest) -> int | None:
    found = re.search(r"\d+", request.user_text.partition("## Inputs")[2])
    return int(found.group()) if found else None


def _demo_responder() -> Callable[[LLMRequest], str | None]:
    # by path: the engine loads this file by path too, from any working directory
    spec = importlib.util.spec_from_file_location("semback_demo_responder", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.demo_responder()


def tie_responder() -> Callable[[LLMRequest], str | None]:
    demo = _demo_responder()

    def respond(request: LLMRequest) -> str | None:
        node = request.meta.get("node")
        if request.purpose == "update":
            edit = {"note": NOTE_EDIT, "thing": THING_EDIT}.get(node)
            return f"<prompt>{edit}</prompt>" if edit else None
        if request.purpose == "forward":
            task = request.user_text.partition("## Inputs")[0]
            number = _number(request)
            if NOTE_EDIT in task:
                small = number is not None and number < LIMIT
                return f"<output>{number if small else 'many'}</output>"
            if THING_EDIT in task:
                even = number is not None and number % 2 == 0
                return f"<output>{'there are ' + str(number) if even else 'odd'}</output>"
        return demo(request)

    return respond
