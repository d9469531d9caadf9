"""A scripted model for sample_graphs/blame_fault.yaml that obeys its prompts literally, so
that the planted fault (the 'numbers' node copies a name) decides every answer.

- forward: 'who' writes the first word; 'numbers' writes the numbers of the text when its
  prompt asks for numbers, else the first word; 'total' adds the numbers in its inputs
  ("0" when there are none).
- backward (the 'total' node's joint call): honest, 'numbers' is told to pass on the
  numbers and 'who' that no change is needed; misleading, 'who' receives a long,
  plausible gradient that does not mention numbers and 'numbers' a terse correct one.
- probe rewrite: follows the feedback: a quoted expected output is copied, "number(s)"
  yields the numbers of the node's inputs, anything else rewords the output.
- update: 'numbers' is asked to copy the numbers; the other prompts gain a sentence.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from engine.llm.base import LLMRequest

HONEST = {"who": "No change is needed: the name does not affect the sum.",
          "numbers": "This input should give the two numbers in the sentence, not a name."}
MISLEADING = {"who": "The description of the person should be much richer: say what they "
                     "are doing, where the things are kept and what kind of things they "
                     "are, so that the final step has the full context of the sentence.",
              "numbers": "Give the numbers."}


def _inputs(request: LLMRequest) -> str:
    return request.user_text.split("## Inputs", 1)[-1] if "## Inputs" in request.user_text \
        else request.user_text


def _text_numbers(text: str) -> str:
    return " and ".join(re.findall(r"\d+", text))


def _first_word(text: str) -> str:
    match = re.search(r'<input name="text">\s*(\w+)', text)
    return match.group(1) if match else "nobody"


def blame_fault_responder(misleading: bool = False) -> Callable[[LLMRequest], str | None]:
    gradients = MISLEADING if misleading else HONEST

    def respond(request: LLMRequest) -> str | None:
        node, role = request.meta.get("node"), request.meta.get("role", "")
        if request.purpose == "forward":
            inputs = _inputs(request)
            task = request.user_text.split("## Inputs", 1)[0]
            if node == "who":
                return f"<output>{_first_word(inputs)}</output>"
            if node == "numbers":
                wanted = "number" in task.lower()
                return f"<output>{_text_numbers(inputs) if wanted else _first_word(inputs)}" \
                       "</output>"
            if node == "total":
                total = sum(int(n) for n in re.findall(r"\d+", inputs))
                return f"<output>{total}</output>"
        if request.purpose == "backward" and node == "total":
            return "\n".join(f'<gradient input="{n}">{gradients[n]}</gradient>'
                             for n in request.meta.get("inputs", []))
        if request.purpose == "probe" and role == "probe_rewrite":
            feedback = request.meta.get("feedback", "")
            quoted = re.search(r'expected output is: "([^"]*)"', feedback)
            if quoted:
                return f"<output>{quoted.group(1)}</output>"
            if "number" in feedback.lower():
                shown = request.user_text.split("It produced this output:")[0]  # its inputs
                return f"<output>{_text_numbers(shown)}</output>"
            return f"<output>{request.meta.get('output', '')}, described in full</output>"
        if request.purpose == "update":
            prompt = request.meta.get("prompt", "")
            new = "Copy the two numbers in the text." if node == "numbers" else \
                f"{prompt} Be brief."
            return f"<prompt>{new}</prompt>"
        return None

    return respond
