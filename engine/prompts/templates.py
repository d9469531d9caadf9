"""Every prompt template the engine sends, named by role, and the parsers of their replies.

Templates are plain `str.format` strings so they are easy to read and to diff. Parsers
never drop content silently: when a reply ignores the requested format they fall back
to a documented rule and say so in the returned `parse_error`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

# --- forward ---------------------------------------------------------------------------

FORWARD_SYSTEM = (
    "You are one step in a pipeline of language-model calls. Do exactly the task you are "
    "given, using the inputs provided."
)

# Fixed parts first, the example last (as in the backward, judge and probe templates): all
# calls of a node at a step start with the same text, task and output instruction, so
# providers' prefix caches (OpenAI's cached_tokens, llama-server's KV reuse) serve it and
# only the inputs are new. With the instruction after the inputs, the demo's 144 forward
# calls took 184 s on the default model, against 123 s with it before them, for the same
# scores (starting prompts 0.08 and 0.02, hand-fixed 1.00 and 1.00 on 48 examples,
# benchmarks/demo_prompts.py, two cores).
FORWARD_USER = """## Task
{prompt}

Think briefly, then write the result of this step between <output> and </output>.{answer_format}

## Inputs
{inputs}"""

INPUT_BLOCK = '<input name="{name}">\n{value}\n</input>'


def render_inputs(values: dict[str, str]) -> str:
    return "\n".join(INPUT_BLOCK.format(name=k, value=v) for k, v in values.items())


def forward_messages(prompt: str, inputs: dict[str, str], answer_format: str = "",
                     fields: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """The default set's forward call; `fields` (which inputs are example fields) is used
    by the paper set only."""
    fmt = f"\n{answer_format}" if answer_format else ""
    return [("system", FORWARD_SYSTEM),
            ("user", FORWARD_USER.format(prompt=prompt, inputs=render_inputs(inputs),
                                         answer_format=fmt))]


_OUTPUT_TAG = re.compile(r"</?output\s*>?", re.I)  # a reply cut short may end in "</output"


def _untagged(text: str) -> str:
    """A fallback's text without stray <output> / </output> tags (a small model often
    writes only one of the pair), so a prediction never keeps one."""
    return _OUTPUT_TAG.sub("", text).strip()


# Forward replies end at the closing tag: nothing after it is read, and a model that keeps
# writing past it (Qwen2.5-Coder-1.5B does) would otherwise run to its token limit.
FORWARD_STOP = ("</output>",)


def parse_output(reply: str, stopped: bool = False) -> tuple[str, str | None]:
    """Text inside the last <output> block. `stopped`: the reply ended at the stop sequence
    `</output>`, which servers leave out of the reply, so an <output> still open at its end
    was closed there. Fallbacks, in order: the text after an unclosed <output> tag; the text
    before a dangling </output>; the whole reply; stray tags removed from each. Returns
    (output, parse_error or None)."""
    opened = re.split(r"<output>", reply, flags=re.I)
    if stopped and len(opened) > 1 and not re.search(r"</output>", opened[-1], flags=re.I) \
            and _untagged(opened[-1]):
        return _untagged(opened[-1]), None
    blocks = re.findall(r"<output>(.*?)</output>", reply, flags=re.S | re.I)
    if blocks and blocks[-1].strip():
        return blocks[-1].strip(), None
    if len(opened) > 1 and _untagged(opened[-1]):
        return _untagged(opened[-1]), "unclosed <output> tag: used the text after it"
    closed = re.split(r"</output\s*>", reply, flags=re.I)
    if len(closed) > 1 and _untagged(closed[0]):
        return _untagged(closed[0]), "no opening <output> tag: used the text before </output>"
    return _untagged(reply), "no <output> tags: used the whole reply"


# --- loss ------------------------------------------------------------------------------

OUTPUT_GRADIENT = 'The expected output is: "{target}".'

JUDGE_SYSTEM = "You grade answers strictly and fairly against a rubric."

JUDGE_USER = """Grade the answer against the rubric.

<rubric>
{rubric}
</rubric>

Write a short critique saying what the answer should change, then a score from 0 to 10 as <score>N</score>.

{inputs}

<answer>
{prediction}
</answer>

<reference>
{target}
</reference>"""


def parse_judge(reply: str) -> tuple[float, str, str | None]:
    """(score in [0, 1], critique, parse_error). Missing score: 0 and a parse error."""
    found = re.findall(r"<score>\s*(\d+(?:\.\d+)?)\s*</score>", reply, flags=re.I)
    critique = re.sub(r"<score>.*?</score>", "", reply, flags=re.S | re.I).strip()
    if not found:
        found = re.findall(r"\b(\d+(?:\.\d+)?)\s*/\s*10\b", reply)
        if not found:
            return 0.0, critique, "no <score> in the judge's reply: scored 0"
        return min(1.0, float(found[-1]) / 10), critique, "no <score> tags: used 'N/10'"
    return min(1.0, float(found[-1]) / 10), critique, None


# --- backward --------------------------------------------------------------------------

BACKWARD_SYSTEM = (
    "You are the optimizer of a pipeline of language-model calls. Given feedback on one "
    "step's output, you explain how that step's inputs should have been different."
)

# One backward call = the context a method chooses to show (a `BackwardView`) + the
# question its mode asks. The context template and each mode's question are shared by
# every method, so `semantic`, `semantic-nosibling` and `textgrad` differ ONLY in which
# inputs they show, and `semantic-evaluative` only in its question.

BACKWARD_TASK = """A step of the pipeline has this task:
<task>
{prompt}
</task>

"""

# What each asked input's producing step was told to do: without it a gradient can only say
# "the number is missing", not which step was asked for something else. On the demo the
# embedded 1.5B optimizer, shown only the values, answered "note is fine as it is" for an
# input a step asked for "one word" (its reasoning named the missing number).
BACKWARD_INPUT_TASKS = """The inputs written by earlier steps ({names}) were written with these tasks:
{tasks}

"""
BACKWARD_INPUT_TASK = '<task of="{name}">\n{task}\n</task>'

# an output and the feedback on it, as the backward and the probe-rewrite calls show them
OUTPUT_AND_FEEDBACK = """It produced this output:
<output>
{output}
</output>

Feedback on this output:
<feedback>
{feedback}
</feedback>"""

BACKWARD_EXAMPLE = """

For one example {reads}:
{inputs}

""" + OUTPUT_AND_FEEDBACK

BACKWARD_READS = "it read these inputs"
# a call imported from traces: the messages it read, not only its inputs (BackwardView.read)
BACKWARD_READS_MESSAGES = "it read these messages, each input tagged where it sits"

BACKWARD_QUESTION = {
    "directional": "For each input produced by an earlier step ({names}), explain how that "
                   "input should change so that this step's output would satisfy the feedback.",
    "evaluative": "For each input produced by an earlier step ({names}), comment on the "
                  "quality of that input: how it helped or hurt this output, given the "
                  "feedback. Judge each input on its own, without referring to the other "
                  "inputs.",
}

BACKWARD_ANSWER = """
Answer with one block per input, in this form:
{blocks}"""


@dataclass(frozen=True)
class BackwardView:
    """What one backward call shows. The method picks the context (which inputs: example
    fields, the node's predecessors, siblings or not); the prompt set picks the words."""

    task: str
    inputs: dict[str, str]  # shown inputs, in declared order (fields and node outputs)
    fields: frozenset[str]  # which shown inputs are example fields
    output: str
    feedback: str
    asked: list[str]  # the inputs a gradient is asked for, in order
    mode: str = "directional"  # or "evaluative"
    # the task (prompt or description) of the step that wrote each asked input, where known
    input_tasks: dict[str, str] = field(default_factory=dict)
    # a call imported from traces: the messages it read with the shown inputs tagged
    # (engine/prompts/recorded.py, marked_read), shown instead of the bare inputs
    read: str = ""


def backward_messages(view: BackwardView) -> list[tuple[str, str]]:
    user = (BACKWARD_TASK.format(prompt=view.task) + render_input_tasks(view)
            + BACKWARD_QUESTION[view.mode].format(names=", ".join(view.asked))
            + BACKWARD_ANSWER.format(blocks=gradient_blocks(view.asked))
            + BACKWARD_EXAMPLE.format(
                reads=BACKWARD_READS_MESSAGES if view.read else BACKWARD_READS,
                inputs=view.read or render_inputs(view.inputs), output=view.output,
                feedback=view.feedback))
    return [("system", BACKWARD_SYSTEM), ("user", user)]


def render_input_tasks(view: BackwardView) -> str:
    """The producing steps' tasks of the asked inputs ("" when none is known)."""
    tasks = [(n, view.input_tasks[n]) for n in view.asked if view.input_tasks.get(n)]
    if not tasks:
        return ""
    return BACKWARD_INPUT_TASKS.format(
        names=", ".join(n for n, _ in tasks),
        tasks="\n".join(BACKWARD_INPUT_TASK.format(name=n, task=t) for n, t in tasks))


def repair_message(missing: list[str], asked: list[str]) -> str:
    return BACKWARD_REPAIR.format(names=", ".join(missing), blocks=gradient_blocks(missing))


GRADIENT_BLOCK = '<gradient input="{name}">your feedback on {name}</gradient>'


def gradient_blocks(names: list[str]) -> str:
    return "\n".join(GRADIENT_BLOCK.format(name=n) for n in names)


def parse_gradients(reply: str, names: list[str], *, whole_reply_for_one: bool = True
                    ) -> tuple[dict[str, str], str | None]:
    """Split a backward reply into one gradient per input name.

    Rules, in order: `<gradient input="name">` blocks; else lines starting with the
    input's name or "Hint i" (i = its 1-based position), up to the next such line. With a
    single input (unless `whole_reply_for_one` is off, as for a repair reply), a reply that
    cannot be split is that input's gradient. With several, an
    input the reply has no block for gets an empty gradient and is named in the parse
    error: it never receives another input's text (`missing_gradients` lists them, for
    one repair request).
    """
    found: dict[str, str] = {}
    for name, body in re.findall(r'<gradient\s+input="([^"]+)"\s*>(.*?)</gradient>', reply,
                                 flags=re.S | re.I):
        if name in names and body.strip():
            found[name] = (found.get(name, "") + "\n" + body.strip()).strip()
    problem = None
    if not found:
        found = _split_by_labels(reply, names)
        if found:
            problem = "no <gradient> blocks: split the reply by input labels"
    if not found and whole_reply_for_one and len(names) == 1 and reply.strip():
        return {names[0]: reply.strip()}, "no <gradient> block: used the whole reply"
    missing = [n for n in names if n not in found]
    if missing:
        note = f"no block for {', '.join(missing)}: empty gradient"
        problem = f"{problem}; {note}" if problem else note
    return {n: found.get(n, "") for n in names}, problem


def missing_gradients(grads: dict[str, str]) -> list[str]:
    """Inputs, in order, that a parsed reply left without a gradient."""
    return [n for n, text in grads.items() if not text.strip()]


BACKWARD_REPAIR = """Your reply has no <gradient> block for {names}. Write the missing block(s) now, one per input, about that input only, in this form:
{blocks}"""


def _split_by_labels(reply: str, names: list[str]) -> dict[str, str]:
    labels = []
    for i, name in enumerate(names, start=1):
        labels.append((name, rf"(?:{re.escape(name)}|hint\s*{i})"))
    pattern = re.compile(r"^\W*(" + "|".join(p for _, p in labels) + r")\b\W*", re.I | re.M)
    parts: dict[str, str] = {}
    matches = list(pattern.finditer(reply))
    for m, nxt in zip(matches, matches[1:] + [None]):
        label = m.group(1).lower()
        for name, pat in labels:
            if re.fullmatch(pat, label, flags=re.I):
                end = nxt.start() if nxt else len(reply)
                body = reply[m.end():end].strip()
                if body:
                    parts[name] = (parts.get(name, "") + "\n" + body).strip()
    return parts


def aggregate_feedback(messages: list[tuple[str, str]]) -> str:
    """Combine successors' messages in the given (fixed) order, as a numbered list; one
    message is passed on unchanged. No summarizing call, as in the paper's code."""
    if len(messages) == 1:
        return messages[0][1]
    return "\n".join(f"{i}. (from {src}) {text}" for i, (src, text) in
                     enumerate(messages, start=1))


# --- update ----------------------------------------------------------------------------

UPDATE_SYSTEM = "You improve the instructions (prompts) of the steps of a language-model pipeline."

UPDATE_USER = """You are improving the prompt of the step "{node}" of a pipeline.

Current prompt:
<prompt>
{prompt}
</prompt>

How the step behaved on examples where the pipeline failed{with_feedback}:
{examples}
{rejected}
Write an improved prompt for this step: one that makes the step produce what the feedback asks of its output, on these examples and on others like them. If the feedback asks for a different kind of output than the current prompt does, ask for that kind of output instead. Keep the prompt general: do not copy the examples' specific values or answers into it. Explain your reasoning in a few sentences, then give the complete new prompt between <prompt> and </prompt>."""

UPDATE_EXAMPLE = """<example index="{index}">
<input>
{input}
</input>
<output>
{output}
</output>{feedback}
</example>"""

UPDATE_REJECTED = """
These earlier proposals for this prompt were tried and did not improve the validation score; propose something different:
{items}
"""


def update_messages(node: str, prompt: str, examples: list[dict[str, str]],
                    rejected: list[str]) -> list[tuple[str, str]]:
    rendered = []
    for i, ex in enumerate(examples, start=1):
        fb = f"\n<feedback>\n{ex['feedback']}\n</feedback>" if ex.get("feedback") else ""
        rendered.append(UPDATE_EXAMPLE.format(index=i, input=ex["input"], output=ex["output"],
                                              feedback=fb))
    with_feedback = " and feedback on what should change" if any(
        ex.get("feedback") for ex in examples) else ""
    rej = UPDATE_REJECTED.format(items="\n".join(f"- {r}" for r in rejected)) if rejected else ""
    return [("system", UPDATE_SYSTEM),
            ("user", UPDATE_USER.format(node=node, prompt=prompt, examples="\n".join(rendered),
                                        rejected=rej, with_feedback=with_feedback))]


_PROMPT_TAG = re.compile(r"</?prompt\s*>", re.I)


def parse_prompt(reply: str) -> tuple[str, str, str | None]:
    """(new prompt, reasoning, parse_error). Rules: the last non-empty <prompt> block;
    else the text after an unclosed <prompt> tag; else the text after a line starting
    "New prompt:"/"Prompt:"; else the reply's last paragraph."""
    # a stray tag inside a block (a small model writing "<prompt>" into the JSON field the
    # block is built from) is not part of the prompt
    blocks = [(m.start(), _PROMPT_TAG.sub("", m.group(1)).strip())
              for m in re.finditer(r"<prompt>(.*?)</prompt>", reply, flags=re.S | re.I)]
    blocks = [(start, b) for start, b in blocks if b]
    if blocks:
        start, block = blocks[-1]
        return block, reply[:start].strip(), None
    opened = re.split(r"<prompt>", reply, flags=re.I)
    if len(opened) > 1 and opened[-1].strip():
        return opened[-1].strip(), opened[0].strip(), "unclosed <prompt> tag: used the text after it"
    labelled = re.split(r"^\W*(?:new |improved )?prompt\s*:", reply, flags=re.I | re.M)
    if len(labelled) > 1 and labelled[-1].strip():
        return labelled[-1].strip(), labelled[0].strip(), "no <prompt> tags: used the text after 'Prompt:'"
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", reply) if p.strip()]
    if not paragraphs:
        return "", "", "empty reply: no new prompt"
    return paragraphs[-1], "\n\n".join(paragraphs[:-1]), "no <prompt> tags: used the last paragraph"


# --- prompt sets -----------------------------------------------------------------------
# `--prompts default` is this file's templates; `--prompts paper` (engine/prompts/paper.py)
# follows the structure of the paper's reference code in this project's own words. Both
# are parsed by the same parsers above. docs/methods.md lists every difference;
# engine/prompts/sets.py looks them up by name.


@dataclass(frozen=True)
class PromptSet:
    name: str
    forward: Callable[..., list[tuple[str, str]]]  # (prompt, inputs, answer_format, fields)
    backward: Callable[[BackwardView], list[tuple[str, str]]]
    repair: Callable[[list[str], list[str]], str]  # (missing, asked) -> follow-up message
    update: Callable[..., list[tuple[str, str]]]  # (node, prompt, examples, rejected)
    forward_stop: tuple[str, ...] = FORWARD_STOP  # stop sequences of forward calls


DEFAULT = PromptSet("default", forward_messages, backward_messages, repair_message,
                    update_messages)
# --- probes (engine/probes/probe.py) -----------------------------------------------------------

# The gradient probe's call: the optimizer model follows the gradient by rewriting the
# node's output (parsed like a forward reply, parse_output). The node's task is left out on
# purpose: a gradient may ask for another kind of output than the task does (the numbers
# where the prompt asks for a name), and the counterfactual it claims is that output, not the
# task's. Shown the task, the embedded 1.5B rewrote "Bob" (feedback: "should be a list of
# distinct numbers") as "Bob" on most examples; without it, as the sentence's numbers or the
# sentence itself. The instruction comes after the example, where a small model heeds it.
PROBE_REWRITE_SYSTEM = (
    "You rewrite one step's output in a pipeline of language-model calls the way feedback "
    "on it says the output should have been."
)
PROBE_REWRITE = """A step of the pipeline read these inputs:
{inputs}

""" + OUTPUT_AND_FEEDBACK + """

Rewrite the output as the feedback says it should have been, taking what it needs from the \
inputs. Write only the rewritten output, between <output> and </output>."""
