"""The `--prompts paper` set: the structure of the paper's reference code, in this
project's own words.

What each call shows, in what order, and what it forbids follows the reference
(github.com/HishamAlyahya/semantic_backprop); the wording is ours. In short:

- forward: no system message; the example as "Context", the predecessors' outputs as a
  numbered list of hints, then the task, a request to reason step by step, and the result
  wrapped in <output> tags; the output node also gets the answer format;
- backward (directional): no system message; task, question, numbered hints, the output
  and the feedback; one line per hint starting "Hint i";
- backward (evaluative): a system message that frames the request with one comment list
  to avoid and one to follow (our own examples), then the same layout asking for a
  comment per hint that does not mention the others;
- update: the current prompt in quotes, the failing examples as "Example i" with input,
  "my output" and the feedback received; it forbids the word "feedback" and anything
  specific to the examples, and wants the new prompt in <prompt> tags.

Replies are read by the parsers in engine/prompts/templates.py ("Hint i" lines are one of their
rules). Proposals rejected by the gate are still shown to the update call: without them
the reference re-proposes the same candidate and stalls (its defect 8).
"""

from __future__ import annotations

from engine.prompts import templates as P


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" if line.strip() else "" for line in text.splitlines())


def _numbered(items: list[str]) -> str:
    return "\n".join(f"{i}. {text}" for i, text in enumerate(items, start=1))


def _context(inputs: dict[str, str], fields: frozenset[str]) -> str:
    shown = {k: v for k, v in inputs.items() if k in fields}
    if len(shown) == 1:
        return next(iter(shown.values()))
    return "\n".join(f"{k}: {v}" for k, v in shown.items())


def _hints(inputs: dict[str, str], fields: frozenset[str]) -> list[str]:
    return [v for k, v in inputs.items() if k not in fields]


# --- forward ---------------------------------------------------------------------------

FORWARD_HINTS = "\nUse these hints:\n{hints}\n"

FORWARD = """Context:
{context}
{hints}
Task:
{task}

Reason step by step before you answer.

Close with the result of this step between <output> and </output>.{answer_format}"""


def forward_messages(prompt: str, inputs: dict[str, str], answer_format: str = "",
                     fields: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    hints = _hints(inputs, fields)
    text = FORWARD.format(
        context=_indent(_context(inputs, fields)),
        hints=FORWARD_HINTS.format(hints=_indent(_numbered(hints))) if hints else "",
        task=_indent(prompt), answer_format=f"\n{answer_format}" if answer_format else "")
    return [("user", text)]


# --- backward --------------------------------------------------------------------------

BACKWARD = """A step was carried out on a question with the help of some hints.

Task:
{task}
{question}
Hints:
{hints}

Output the step gave:
{output}

Feedback on that output:
{feedback}

{ask}"""

BACKWARD_QUESTION_BLOCK = "\nQuestion:\n{question}\n"

BACKWARD_ASK = {
    "directional": 'Given the feedback, how should each hint change? Write one line per '
                   'hint, beginning with "Hint i" for the i-th hint.',
    "evaluative": 'Given the feedback, comment on how good each hint was, without mentioning '
                  'the other hints. Write one line per hint, beginning with "Hint i: This '
                  'hint" for the i-th hint.',
}

EVALUATIVE_SYSTEM = """You comment on hints according to how much each one helped to reach an output. A comment about one hint never mentions any other hint.

Comments like these are NOT allowed, because the second and third talk about the first hint:
Hint 1: This hint names the right unit, which settles the question.
Hint 2: This hint says the same thing as the first one and adds nothing.
Hint 3: This hint only restates hint 1 in other words.

Comments like these are allowed:
Hint 1: This hint names the right unit, which settles the question.
Hint 2: This hint sets up the equation, so the remaining steps are mechanical.
Hint 3: This hint uses the wrong quantity and pushes the answer off course."""


def backward_messages(view: P.BackwardView) -> list[tuple[str, str]]:
    """Hints are the asked-about inputs, numbered in order; example fields are the question."""
    context = _context(view.inputs, view.fields)
    text = BACKWARD.format(
        task=_indent(view.task),
        question=BACKWARD_QUESTION_BLOCK.format(question=_indent(context)) if context else "",
        hints=_indent(_numbered([view.inputs[n] for n in view.asked])),
        output=_indent(view.output), feedback=_indent(view.feedback),
        ask=BACKWARD_ASK[view.mode])
    if view.mode == "evaluative":
        return [("system", EVALUATIVE_SYSTEM), ("user", text)]
    return [("user", text)]


REPAIR = 'Your reply has no line for {labels}. Write only the missing line(s), each beginning ' \
         'with "Hint i" as before.'


def repair_message(missing: list[str], asked: list[str]) -> str:
    labels = ", ".join(f"Hint {asked.index(n) + 1}" for n in missing)
    return REPAIR.format(labels=labels)


# --- update ----------------------------------------------------------------------------

UPDATE = """I am writing the instructions for one step of a question-answering pipeline.

Its current instructions are:
"{prompt}"

{header}
{examples}
{rejected}
From these examples, write improved instructions. Show your reasoning step by step. The new instructions must not use the word "feedback" and must not contain anything specific to these examples.
End with the new instructions between <prompt> and </prompt>."""

EXAMPLE = """## Example {index}
Input:
{input}

My output:
{output}
"""

EXAMPLE_FEEDBACK = """
Feedback received on my output:
{feedback}
"""

REJECTED = """These earlier instructions were tried and did not do better; write something different:
{items}
"""


def update_messages(node: str, prompt: str, examples: list[dict[str, str]],
                    rejected: list[str]) -> list[tuple[str, str]]:
    rendered = []
    for i, ex in enumerate(examples, start=1):
        text = EXAMPLE.format(index=i, input=_indent(ex["input"]), output=_indent(ex["output"]))
        if ex.get("feedback"):
            text += EXAMPLE_FEEDBACK.format(feedback=_indent(ex["feedback"]))
        rendered.append(text)
    rej = REJECTED.format(items="\n".join(f"- {r}" for r in rejected)) if rejected else ""
    return [("user", UPDATE.format(prompt=prompt, header="Examples it did not handle well:",
                                   examples=_indent("\n".join(rendered)), rejected=rej))]


PAPER = P.PromptSet("paper", forward_messages, backward_messages, repair_message,
                    update_messages)
