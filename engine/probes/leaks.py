"""Does an intervention carry the answer in? A flip it causes may then be the target copied
through rather than credit (docs/probes.md).

The check follows the graph's metric, so that it sees the answer in every form the grader
would accept and more: a number written with separators, as a decimal or in words
("1,200", "18.0", "eighteen"); an answer option by its letter in any usual wording
("(B)", "option B", "answer: B"); a label or one of its synonyms when it is *asserted*
(the whole text, quoted, after an answer marker, or closing a clause) so that an ordinary
"no" in "no other information" is not taken for the target No.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from engine.data.graders import extract_answer, normalize_text, target_family

# Words that state a binary label (the first is the grader's canonical spelling).
LABEL_SYNONYMS: dict[str, tuple[str, ...]] = {
    "yes": ("yes", "positive", "affirmative", "true", "correct"),
    "no": ("no", "negative", "false", "incorrect"),
    "true": ("true", "yes", "correct"),
    "false": ("false", "no", "incorrect"),
    "valid": ("valid", "sound"),
    "invalid": ("invalid", "unsound", "not valid"),
}

_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate(
    "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if w != "_"}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000, "billion": 1_000_000_000}
_NUMBER_WORD = "|".join([*_UNITS, *_TENS, *_SCALES, "and"])
_WORD_RUN = re.compile(rf"\b(?:{_NUMBER_WORD})(?:[\s-]+(?:{_NUMBER_WORD}))*\b", re.I)
_DIGITS = re.compile(r"(?<![\w.])[-\u2212]?\d[\d,]*(?:\.\d+)?")
_MARKER = r"(?:answer|output|result|label|verdict)\s*(?:is|should be|would be|:|=)\s*:?\s*"


def words_to_number(words: str) -> int | None:
    """'one thousand two hundred and five' -> 1205; None when it is not a number."""
    total, current, seen = 0, 0, False
    for word in re.split(r"[\s-]+", words.lower().strip()):
        if word == "and" or not word:
            continue
        if word in _UNITS:
            current += _UNITS[word]
        elif word in _TENS:
            current += _TENS[word]
        elif word == "hundred":
            current = max(current, 1) * 100
        elif word in _SCALES:
            total += max(current, 1) * _SCALES[word]
            current = 0
        else:
            return None
        seen = True
    return total + current if seen else None


def numbers_in(text: str) -> list[Decimal]:
    """Every number written in `text`, in digits (separators allowed) or in words."""
    found = []
    for match in _DIGITS.finditer(text):
        try:
            found.append(Decimal(match.group(0).replace(",", "").replace("\u2212", "-")))
        except InvalidOperation:
            pass
    for match in _WORD_RUN.finditer(text):
        value = words_to_number(match.group(0))
        if value is not None and match.group(0).strip().lower() != "and":
            found.append(Decimal(value))
    return found


def _asserted(word: str, text: str) -> bool:
    """`word` stated as an answer: the whole text, quoted, after a marker, or closing a
    clause (followed by punctuation or the end)."""
    w = re.escape(word)
    if normalize_text(text) == word.lower():
        return True
    patterns = (rf"[\"'\u201c\u2018`]\s*{w}\s*[.!]?\s*[\"'\u201d\u2019`]",
                rf"{_MARKER}{w}\b", rf"(?<![\w-]){w}\s*(?:[.,;:!?)\n]|$)",
                rf"^\s*{w}\b")
    return any(re.search(p, text, re.I | re.M) for p in patterns)


def leaks_answer(text: str, target: str, metric: str = "auto") -> bool:
    """True when `text` carries `target` in a form the graph's metric would read as the
    answer (see the module's docstring)."""
    target = (target or "").strip()
    if not target or not (text or "").strip():
        return False
    family = target_family(target) if metric in ("auto", "judge", "") else metric
    if family == "numeric" or (family == "exact_match" and _DIGITS.fullmatch(target)):
        try:
            expected = Decimal(extract_answer("numeric", target) or "x")
        except InvalidOperation:
            expected = None
        if expected is not None:
            return any(n == expected for n in numbers_in(text))
    if family == "choice":
        letter = extract_answer("choice", target)[1:2] if extract_answer("choice", target) \
            else ""
        if letter:
            patterns = (rf"\(\s*{letter}\s*\)", rf"\b(?:option|choice|answer)\s*:?\s*"
                        rf"(?:is\s*)?\(?{letter}\b", rf"^\s*\(?{letter}[.)]?\s*$",
                        rf"(?<![\w'(]){letter}\)")
            return any(re.search(p, text, re.M) for p in patterns)
    label = normalize_text(target)
    if label in LABEL_SYNONYMS:
        return any(_asserted(word, text) for word in LABEL_SYNONYMS[label])
    return re.search(rf"(?<!\w){re.escape(target)}(?!\w)", text, flags=re.I) is not None
