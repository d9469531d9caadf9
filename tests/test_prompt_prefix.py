"""Prompt caching: two calls of one node that differ only in the example share a prefix
holding every fixed part of the template (task, instructions, output format), so a
provider's prefix cache or llama.cpp's KV reuse serves it; the example comes last."""

from __future__ import annotations

import os

import pytest

from engine.prompts import templates as P


def _shared_user(one, two):
    assert [m for m in one[:-1]] == [m for m in two[:-1]]  # system messages identical
    first, second = one[-1][1], two[-1][1]
    return first, os.path.commonprefix([first, second])


def test_forward_shares_everything_but_the_inputs():
    """Task, output instruction and answer format lead; the inputs come last, so the shared
    prefix holds every fixed part and ends inside the inputs (see FORWARD_USER)."""
    one = P.forward_messages("Solve it.", {"question": "one"}, "Give a number only.")
    two = P.forward_messages("Solve it.", {"question": "two"}, "Give a number only.")
    first, shared = _shared_user(one, two)
    for fixed in ("## Task\nSolve it.", "</output>", "Give a number only.", "## Inputs"):
        assert fixed in shared
    assert first.rstrip().endswith('<input name="question">\none\n</input>')


@pytest.mark.parametrize("mode", ["directional", "evaluative"])
def test_backward_puts_the_task_question_and_answer_form_before_the_example(mode):
    def view(tag):
        return P.BackwardView(task="Give a hint.", inputs={"question": f"{tag}-q",
                                                           "hint": f"{tag}-h"},
                              fields=frozenset({"question"}), output=f"{tag}-o",
                              feedback=f"{tag}-f", asked=["hint"], mode=mode)

    first, shared = _shared_user(P.backward_messages(view("a")), P.backward_messages(view("b")))
    question = P.BACKWARD_QUESTION[mode].format(names="hint")
    for fixed in ("Give a hint.", question, P.gradient_blocks(["hint"])):
        assert fixed in shared
    # every example-specific text lies after the shared part
    for specific in ("a-q", "a-h", "a-o", "a-f"):
        assert first.index(specific) >= len(shared)


def test_judge_puts_the_rubric_and_scoring_form_before_the_answer():
    def user(tag):
        return P.JUDGE_USER.format(rubric="Is it right?", inputs=f"{tag}-q",
                                   prediction=f"{tag}-p", target=f"{tag}-t")

    first, second = user("a"), user("b")
    shared = os.path.commonprefix([first, second])
    assert "Is it right?" in shared and "<score>N</score>" in shared
    for specific in ("a-q", "a-p", "a-t"):
        assert first.index(specific) >= len(shared)
