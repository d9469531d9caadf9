"""Copy detection: a proposed prompt that pastes the sampled training examples is
recorded rejected with the reason "copies training examples", unless --allow-copies."""

from __future__ import annotations

import duckdb
import pytest

from engine.core.copies import (
    COPY_REASON,
    MOST_OF,
    SPAN_WORDS,
    WHOLE_WORDS,
    copied_span,
    find_copies,
)
from engine.llm.scripted import ScriptedBackend
from tests.support.graphs import write_graph

QUESTION = ("A farmer packs twelve crates of apples every morning before the market opens "
            "and sells them by noon.")


def test_a_shared_run_of_eight_words_is_a_copy():
    proposal = ("Solve it. For instance, twelve crates of apples every morning before the "
                "market means a total.")
    assert copied_span(proposal, [QUESTION]) == \
        "twelve crates of apples every morning before the"


def test_exactly_the_threshold_is_a_copy_and_one_word_fewer_is_not():
    words = QUESTION.split()
    eight = " ".join(words[3:3 + SPAN_WORDS])
    seven = " ".join(words[3:3 + SPAN_WORDS - 1])
    assert SPAN_WORDS == 8
    assert copied_span(f"Be careful: {eight}, then answer.", [QUESTION]) is not None
    assert copied_span(f"Be careful: {seven}, then answer.", [QUESTION]) is None
    # at the very start or end of the proposal, and an example of exactly eight words
    assert copied_span(f"{eight}.", [QUESTION]) is not None
    assert copied_span(f"Be careful: {eight}", [QUESTION]) is not None
    assert copied_span(f"Note: {eight}!", [eight]) is not None
    # seven of a short example's eight words are no run of eight, but they retell it
    assert copied_span(f"Note: {seven}!", [eight]) == seven.lower()


def test_a_general_prompt_is_not_a_copy():
    proposal = "Read the question, find every quantity, and compute the total step by step."
    assert copied_span(proposal, [QUESTION, "144"]) is None


def test_case_and_punctuation_do_not_hide_a_copy():
    shouted = "TWELVE crates, of apples; every morning -- before the MARKET opens!"
    assert copied_span(shouted, [QUESTION]) is not None


def test_a_whole_short_example_pasted_in_is_a_copy():
    reviews = ["The soup was bland.", "Really good headphones.", "No"]
    assert WHOLE_WORDS == 4
    assert copied_span("Decide. The soup was bland. Answer Yes or No.", reviews) == \
        "the soup was bland"
    # three words is below the whole-example limit, and a one-word target never counts
    assert copied_span("Really good headphones are rare. No.", reviews) is None


def test_text_the_current_prompt_already_has_is_not_new_copying():
    current = "Say whether the soup was bland in one word."
    assert copied_span(current + " Be brief.", ["The soup was bland."], current) is None


def test_find_copies_names_only_the_copying_nodes():
    examples = [({"question": QUESTION}, "144")]
    proposed = {"a": ("Count the twelve crates of apples every morning before the market.",
                      "Count."), "b": ("Count every crate.", "Count.")}
    assert set(find_copies(proposed, examples)) == {"a"}


REVIEWS = """
name: reviews
dataset: data.jsonl
input_fields: [review]
target_field: positive
metric: yes_no
nodes:
  - id: answer
    prompt: Answer Yes or No.
    inputs: [review]
    output: true
"""
ROWS = [{"id": f"r{i}", "review": text, "positive": label} for i, (text, label) in enumerate(
    [("The soup was bland and cold.", "No"), ("The concert was a total disaster.", "No"),
     ("I love this phone so much.", "Yes"), ("The staff were rude to us.", "No")] * 4)]


def copying_backend():
    """Forward always answers Yes (so the negative reviews fail); every update pastes the
    first review the update call was shown into the prompt."""

    def responder(request):
        if request.purpose == "forward":
            return "<output>Yes</output>"
        if request.purpose == "update":
            shown = request.user_text.split('<input name="review">\n', 1)[1].split("\n", 1)[0]
            return f"<prompt>Answer Yes or No. Example: {shown}</prompt>"
        return None

    return ScriptedBackend(responder=responder)


@pytest.mark.parametrize("allow", [False, True])
def test_a_copying_proposal_is_recorded_rejected_and_never_applied(tmp_path, allow):
    from tests.support.graphs import run_engine

    graph = write_graph(tmp_path, REVIEWS, ROWS)
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, copying_backend(), steps=1, train=4, val=4,
                        allow_copies=allow)
    assert result.status == "finished"
    with duckdb.connect(str(db), read_only=True) as con:
        [(new, accepted, reason)] = con.execute(
            "SELECT new_prompt, accepted, reject_reason FROM updates").fetchall()
        versions = con.execute("SELECT count(*) FROM prompt_versions WHERE step = 1"
                               ).fetchone()[0]
        val_forward = con.execute("SELECT count(*) FROM node_outputs WHERE step = 1 AND "
                                  "split = 'val'").fetchone()[0]
    assert new.startswith("Answer Yes or No. Example: The")
    if allow:
        assert reason != COPY_REASON and versions == 1 and val_forward == 4
    else:
        assert (accepted, reason) == (False, COPY_REASON)
        assert versions == 0 and val_forward == 0  # never tried on validation


def test_a_short_example_retold_in_other_order_or_without_its_number_is_a_copy():
    """The demo's seed 2 (2026-12-06) kept `note`'s "Write one word about the number of
    buttons that Oskar lost from his coat.": no run of 8 words and not the whole sentence,
    yet it names one training example."""
    current = "Write one word about the text."
    example = ["Oskar lost 4 buttons from his coat.", "4"]
    assert MOST_OF == 0.75
    retold = "Write one word about the number of buttons that Oskar lost from his coat."
    assert copied_span(retold, example, current) == "oskar lost buttons from his coat"
    # a general prompt that names two of its words is not a retelling ...
    assert copied_span("Write one word about the text, including the number of buttons "
                       "lost.", example, current) is None
    # ... nor is one with four of its six new words (under three quarters)
    assert copied_span("Write the number of cookies baked for the party.",
                       ["Tomas baked 24 cookies for the party."], current) is None
    # words the current prompt already has count for neither side
    assert copied_span("Count buttons Oskar lost from his coat.", example,
                       "Count what Oskar lost from his coat.") is None


def test_a_long_example_is_judged_by_its_runs_only():
    """A question of 16 words or more is judged by the 8-word runs alone: a prompt about its
    topic shares most of its words without copying it."""
    question = ("Each morning the farmer loads twelve crates of apples onto the truck and "
                "drives them to the market")
    assert len(question.split()) >= 2 * SPAN_WORDS
    prompt = ("The farmer loads crates of apples onto the truck each morning and drives to "
              "market: work out what the question asks")
    assert copied_span(prompt, [question]) is None
