"""A graph whose planted fault has two successors, and a scripted model under which only
one of the two gradients the fault receives fixes the answer (tests/test_blame_edges.py).

'fault' copies the first word of the text (a name); 'add' and 'check' both repeat it (in
prompts worded apart, so that their backward calls are not one cached call);
'total' adds the distinct numbers it is given. Backward: 'total' tells both its inputs to
give the numbers; 'add' tells 'fault' to give the numbers (following that fixes the
answer), 'check' tells it to write in capital letters (following that fixes nothing).
The aggregated gradient at 'fault' holds both, so it fixes the answer too: only an edge
followed on its own tells the two successors apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from engine.llm.base import LLMRequest
from tests.support.graphs import write_graph

GRAPH = """
name: two_successors
dataset: data.jsonl
input_fields: [text]
target_field: answer
metric: numeric
splits: {train: 4, val: 2, test: 0}
nodes:
  - {id: fault, prompt: Copy the first word of the text., inputs: [text]}
  - {id: add, prompt: Repeat the text you are given., inputs: [fault]}
  - {id: check, prompt: Repeat the text you are given word for word., inputs: [fault]}
  - {id: total, prompt: Add up the distinct numbers you are given., inputs: [add, check],
     output: true}
"""
NAMES = ["Ann", "Bob", "Cleo", "Dev", "Eve", "Finn"]
FIXING = "This input should give the numbers in the text, not a name."
CAPITALS = "This input should be written in capital letters."  # asks, but fixes nothing


def write_two_successors(tmp_path: Path) -> Path:
    rows = [{"id": f"t{i}", "text": f"{NAMES[i]} has {i + 2} apples and gets {i + 10} more.",
             "answer": str(2 * i + 12)} for i in range(6)]
    return write_graph(tmp_path, GRAPH, rows)


def _values(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(
        r'<input name="([^"]+)">\s*(.*?)\s*</input>', text, flags=re.S)}


def two_successors_responder() -> Callable[[LLMRequest], str | None]:
    def respond(request: LLMRequest) -> str | None:
        node, role = request.meta.get("node"), request.meta.get("role", "")
        if request.purpose == "forward":
            task, _, rest = request.user_text.partition("## Inputs")
            joined = " ".join(_values(rest or request.user_text).values())
            if node == "fault":
                words = re.findall(r"[A-Za-z]+", joined)
                out = " and ".join(re.findall(r"\d+", joined)) if "number" in task.lower() \
                    else (words[0] if words else "nobody")
            elif node == "total":
                out = str(sum(int(n) for n in dict.fromkeys(re.findall(r"\d+", joined))))
            else:
                out = joined
            return f"<output>{out}</output>"
        if request.purpose == "backward":
            values = _values(request.user_text)
            blocks = []
            for name in request.meta.get("inputs", []):
                text = ("No change is needed: this input carries the numbers."
                        if re.search(r"\d", values.get(name, "")) else
                        CAPITALS if node == "check" else FIXING)
                blocks.append(f'<gradient input="{name}">{text}</gradient>')
            return "\n".join(blocks)
        if request.purpose == "probe" and role == "probe_rewrite":
            feedback = request.meta.get("feedback", "")
            if "number" in feedback.lower() and "no change" not in feedback.lower():
                inputs = request.user_text.split("It produced this output:")[0]
                return f"<output>{' and '.join(re.findall(r'[0-9]+', inputs))}</output>"
            return f"<output>{request.meta.get('output', '').upper()}</output>"
        if request.purpose == "update":
            prompt = request.meta.get("prompt", "")
            new = "Write the numbers of the text." if "first word" in prompt.lower() else prompt
            return f"<prompt>{new}</prompt>"
        return None

    return respond
