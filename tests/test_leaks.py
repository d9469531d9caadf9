"""The leak check sees the answer in every written form the metric accepts, and not in
ordinary words that merely spell a label."""

from __future__ import annotations

import pytest

from engine.probes.leaks import leaks_answer, words_to_number


@pytest.mark.parametrize("text, target, metric", [
    ("The total is eighteen apples.", "18", "numeric"),
    ("so the cost comes to 1,200 dollars", "1200", "numeric"),
    ("one thousand two hundred", "1200", "numeric"),
    ("twenty-five", "25", "auto"),
    ("He has 18.0 now", "18", "numeric"),
    ("pick option B here", "(B)", "choice"),
    ("The answer: B", "(B)", "choice"),
    ("(B) is right", "(B)", "auto"),
    ("The review is positive.", "Yes", "yes_no"),
    ('The expected output is: "No".', "No", "yes_no"),
    ("No. The premise says otherwise", "No", "auto"),
    ("the answer is no because", "No", "yes_no"),
    ("Paris", "Paris", "exact_match"),
])
def test_finds_the_answer_in_any_form(text, target, metric):
    assert leaks_answer(text, target, metric)


@pytest.mark.parametrize("text, target, metric", [
    ("There is no other information in the text.", "No", "yes_no"),
    ("Yesterday it rained", "Yes", "yes_no"),
    ("He has 17 and then 180", "18", "numeric"),
    ("Be brief: Bob and Ann", "(B)", "choice"),
    ("eighty", "18", "numeric"),
    ("", "18", "numeric"),
])
def test_no_false_alarm(text, target, metric):
    assert not leaks_answer(text, target, metric)


def test_number_words():
    assert words_to_number("one thousand two hundred and five") == 1205
    assert words_to_number("eighteen") == 18
    assert words_to_number("ninety-nine") == 99
    assert words_to_number("a few") is None
