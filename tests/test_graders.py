"""Graders: many concrete cases per answer family, and every target of every BBH task file
graded against itself, inside a long reply, and against a wrong label."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine.core.graph import METRICS
from engine.data.graders import (
    KNOWN_METRICS,
    extract_answer,
    grade,
    normalize_text,
    target_family,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
BBH_FILES = sorted((DATA / "bbh").glob("*.json")) if DATA.is_dir() else []
BBH_PARAMS = [pytest.param(p, id=p.stem) for p in BBH_FILES] or [pytest.param(
    None, marks=pytest.mark.skip(reason=f"no BBH task files found in {DATA / 'bbh'}"))]


def _cases(metric: str, target: str, right: list[str], wrong: list[str]) -> list[tuple]:
    return ([(metric, p, target, 1.0) for p in right]
            + [(metric, p, target, 0.0) for p in wrong])


CASES = (
    _cases("numeric", "1200", [
        "1200", "1,200", "$1,200", "The answer is $1,200.00.", "1200.0", "1200 dollars",
        "Total: 1,200 dollars.", "First 3 then 5, so 1200", "#### 1200", "Answer: **1200**",
        "<answer>1200</answer> and later 7", "The answer is 1200 because 3 x 400 = 1200",
        "The answer is $1,200 (3 x 400).",
        "The answer is 1200.\nCheck: 1200 / 3 = 400 ok",
    ], [
        "120", "12000", "1200.5", "I think 1200 is wrong, it is 1300", "", "no number here",
        "<answer>1300</answer> 1200",
    ])
    + _cases("numeric", "-5", ["-5", "The result is -5.", "x = -5.00", "\u22125"],
             ["5", "The answer is 5", "2-5"])
    + _cases("numeric", "0.5", ["0.50", "It is 0.5 kg.", "$0.5"], ["5", "0.05"])
    + _cases("numeric", "18", ["Janet makes 9 * 2 = 18 dollars.\n#### 18", "18%"],
             ["Janet makes 9 * 2 = 18 dollars.\n#### 17"])
    + _cases("choice", "(B)", [
        "(B)", "B", "b", "B.", "answer is B", "The answer is B.", "Option (B)", "option B",
        "The answer is: (B) red", "Let me think... (A) is out, so (B).",
        "Options: (A) one (B) two (C) three. The answer is B", "**(B)**",
        "<answer>(B)</answer> but (C) was close", "So the answer is (B) because (C) fails",
    ], [
        "(A)", "C", "The answer is (C).", "Between (B) and (C), I pick (C).", "", "Bob",
        "The answer is Blue", "None of them",
    ])
    + _cases("yes_no", "Yes", [
        "Yes", "yes", "YES.", "Yes. There is no evidence for it.", "The answer is yes",
        "No wait, yes", "Answer: Yes, because nothing supports it.", "**Yes**",
        "<output>Yes</output>",
    ], ["No", "no.", "Nope", "I cannot tell", "", "The answer is No, yes it seemed true"])
    + _cases("yes_no", "no", ["No", "Answer: no", "I say no."], ["Yes", "Nobody knows"])
    + _cases("exact_match", "hello world", [
        "hello world", "Hello World.", "  hello   world!! ", '"Hello world"',
        "Thinking first.\nThe answer is hello world.", "Some steps\nhello world",
    ], ["hello", "hello world again", "", "The answer is hello.\nhello world"])
    + _cases("auto", "(C)", ["The answer is (C).", "C"], ["(A)", "The answer is D"])
    + _cases("auto", "Yes", ["yes.", "Yes, it is."], ["No."])
    + _cases("auto", "valid", ["valid", "The argument is deductively valid.", "Answer: valid"],
             ["invalid", "It is invalid."])
    + _cases("auto", "invalid", ["invalid", "So the argument is invalid."],
             ["valid", "It is valid."])
    + _cases("auto", "False", ["False", "not True evaluates to False", "false."],
             ["True", "The answer is True."])
    + _cases("auto", "-11520", ["-11520", "So the result is -11,520."], ["11520"])
    + _cases("auto", ") ] }", [") ] }", "The answer is ) ] }.", "Closing it:\n) ] }"],
             [") ]", "] ) }", "the sequence closes: ) ] }"])
    + _cases("auto", "apple banana cherry", ["Apple banana cherry.",
                                              "Sorted:\napple banana cherry"],
             ["banana apple cherry"])
    + _cases("auto", "Monsters, Inc", ["Monsters, Inc.", "The answer is Monsters, Inc."],
             ["Monsters"])
)


@pytest.mark.parametrize("metric, prediction, target, expected", CASES)
def test_grade_cases(metric, prediction, target, expected):
    assert grade(metric, prediction, target) == expected


@pytest.mark.parametrize("metric, text, target, answer", [
    ("numeric", "The answer is $1,200.00.", "", "1200"),
    ("numeric", "It costs 3.50 dollars", "", "3.5"),
    ("numeric", "no digits", "", ""),
    ("choice", "Let me think... so the answer is (C).", "", "(C)"),
    ("choice", "b", "", "(B)"),
    ("yes_no", "Yes. There is no evidence.", "", "Yes"),
    ("yes_no", "maybe", "", ""),
    ("auto", "It is invalid.", "valid", "invalid"),
    ("auto", "that is true", "False", "True"),
    ("auto", "The answer is Hello There!", "x", "hello there"),
    ("exact_match", "<answer> Paris </answer>", "", "paris"),
])
def test_extract_answer(metric, text, target, answer):
    assert extract_answer(metric, text, target) == answer


@pytest.mark.parametrize("target, family", [
    ("(A)", "choice"), ("(K)", "choice"), ("Yes", "yes_no"), ("no", "yes_no"),
    ("valid", "valid_invalid"), ("invalid", "valid_invalid"), ("True", "true_false"),
    ("false", "true_false"), ("42", "numeric"), ("-7", "numeric"), ("1,234", "numeric"),
    ("2.5", "numeric"), (") ]", "exact_match"), ("apple pear", "exact_match"),
    ("Monsters, Inc", "exact_match"), ("A", "exact_match"), ("(AB)", "exact_match"),
])
def test_auto_dispatches_on_the_form_of_the_target(target, family):
    assert target_family(target) == family


def test_normalize_text():
    assert normalize_text("  **Hello**,  World!?. ") == "hello, world"
    assert normalize_text("'(B)'", lower=False) == "(B)"
    assert normalize_text(") ] }") == ") ] }"


def test_known_metrics_match_the_graph_format():
    assert set(KNOWN_METRICS) == set(METRICS) - {"judge"}


def test_unknown_and_judge_metrics_raise():
    with pytest.raises(ValueError, match="unknown metric 'fuzzy'"):
        grade("fuzzy", "a", "a")
    with pytest.raises(ValueError, match="LLM judge"):
        grade("judge", "a", "a")


# --- every BBH task file ------------------------------------------------------------------


def _wrong_label(target: str) -> str:
    """An answer of the same form as `target` that differs from it."""
    family = target_family(target)
    if family == "choice":
        return "(A)" if target != "(A)" else "(B)"
    swaps = {"yes": "No", "no": "Yes", "true": "False", "false": "True", "valid": "invalid",
             "invalid": "valid"}
    if target.lower() in swaps:
        return swaps[target.lower()]
    if family == "numeric":
        return str(int(target.replace(",", "")) + 1)
    return target + " " + string.ascii_lowercase[len(target) % 26]


@pytest.mark.parametrize("path", BBH_PARAMS)
def test_every_bbh_target_grades_itself_and_rejects_a_wrong_label(path: Path):
    targets = [row["target"] for row in json.loads(path.read_text("utf-8"))["examples"]]
    assert targets
    for target in targets:
        assert grade("auto", target, target) == 1.0, target
        assert grade("auto", f"Reasoning...\nThe answer is {target}.", target) == 1.0, target
        assert grade("auto", f"<answer>{target}</answer>", target) == 1.0, target
        wrong = _wrong_label(target)
        assert grade("auto", wrong, target) == 0.0, (target, wrong)
        assert grade("auto", f"Reasoning...\nThe answer is {wrong}.", target) == 0.0, target


def test_gsm8k_solutions_grade_against_their_own_answers():
    if not (DATA / "gsm8k").is_dir():
        pytest.skip(f"GSM8K not found at {DATA / 'gsm8k'}")
    for name in ("train", "test"):
        for line in (DATA / "gsm8k" / f"{name}.jsonl").read_text("utf-8").splitlines():
            solution = json.loads(line)["answer"]
            target = solution.rsplit("####", 1)[1].strip().replace(",", "")
            assert grade("numeric", solution, target) == 1.0, solution
            assert grade("numeric", target, str(int(target) + 1)) == 0.0


# --- marked options win, equations, and properties over answer wrappers ----------

@pytest.mark.parametrize("reply,target,expected", [
    ("Answer: A hexagon, option (D)", "(D)", 1.0),
    ("Answer: A hexagon, option (D)", "(A)", 0.0),
    ("Answer: I think it is (C).", "(C)", 1.0),
    ("Answer: I think it is (C).", "(I)", 0.0),
    ("Answer: I think it is option C.", "(C)", 1.0),
    ("The answer is B.", "(B)", 1.0),
])
def test_an_explicitly_marked_option_wins_over_a_capital_word(reply, target, expected):
    assert grade("choice", reply, target) == expected


@pytest.mark.parametrize("reply,target,expected", [
    ("The answer is 5 + 13 = 18", "18", 1.0),
    ("The answer is 5 + 13 = 18", "5", 0.0),
    ("The answer is $4 x 3 = $12.", "12", 1.0),
    ("The answer is 1200 because 3 x 400 = 1200", "1200", 1.0),
])
def test_an_equation_after_the_marker_grades_as_its_result(reply, target, expected):
    assert grade("numeric", reply, target) == expected


WRAPPERS = ("{}", "The answer is {}.", "Answer: {}", "<answer>{}</answer>", "#### {}",
            "**{}**", "Some reasoning first.\nSo the answer is {}", "<output>{}</output>")
LETTERS = st.sampled_from("ABCDEFGHIJKLMNOPQR")


@settings(max_examples=150, deadline=None)
@given(letter=LETTERS, wrapper=st.sampled_from(WRAPPERS))
def test_property_gold_option_in_any_wrapper_grades_one(letter, wrapper):
    assert grade("choice", wrapper.format(f"({letter})"), f"({letter})") == 1.0
    assert grade("auto", wrapper.format(f"({letter})"), f"({letter})") == 1.0


@settings(max_examples=150, deadline=None)
@given(gold=LETTERS, other=LETTERS, wrapper=st.sampled_from(WRAPPERS))
def test_property_a_different_valid_option_grades_zero(gold, other, wrapper):
    assume(gold != other)
    assert grade("choice", wrapper.format(f"({other})"), f"({gold})") == 0.0


@settings(max_examples=150, deadline=None)
@given(value=st.integers(-10**7, 10**7), wrapper=st.sampled_from(WRAPPERS))
def test_property_gold_number_in_any_wrapper_grades_one(value, wrapper):
    assert grade("numeric", wrapper.format(value), str(value)) == 1.0
    assert grade("numeric", wrapper.format(f"{value:,}"), str(value)) == 1.0


@settings(max_examples=150, deadline=None)
@given(value=st.integers(-10**7, 10**7), delta=st.integers(1, 1000),
       wrapper=st.sampled_from(WRAPPERS))
def test_property_a_different_number_grades_zero(value, delta, wrapper):
    assert grade("numeric", wrapper.format(value + delta), str(value)) == 0.0


@settings(max_examples=60, deadline=None)
@given(gold=st.sampled_from(["Yes", "No"]), wrapper=st.sampled_from(WRAPPERS))
def test_property_yes_no_gold_grades_one_and_the_other_label_zero(gold, wrapper):
    other = "No" if gold == "Yes" else "Yes"
    assert grade("yes_no", wrapper.format(gold), gold) == 1.0
    assert grade("yes_no", wrapper.format(other), gold) == 0.0
