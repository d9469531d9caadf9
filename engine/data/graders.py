"""Answer extraction and comparison, chosen by the metric or, for `auto`, by the form of
the target (never by a task name).

A prediction may be a long model reply. The answer is looked for, in order: inside the
last <answer>...</answer> or <output>...</output> tags; after the last answer marker
("the answer is", "answer:", "####"), where the first number or label on that line wins;
then anywhere in the text, where the last matching number or label wins. Free text
(exact_match) is the rest of the marker's line, else the reply's last non-empty line.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

KNOWN_METRICS = ("exact_match", "numeric", "choice", "yes_no", "auto")

_TAGGED = re.compile(r"<(answer|output)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)
_MARKER = re.compile(r"(?:\banswer\b\s*(?:is\b|:|=)|####)\s*:?", re.IGNORECASE)
_NUMBER = re.compile(r"(?:(?<![\w.])[-\u2212])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_NUMBER_TARGET = re.compile(r"^[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$")
_CHOICE_TARGET = re.compile(r"^\(([A-Z])\)$")
_CHOICE_PAREN = re.compile(r"\(([A-Z])\)")
_CHOICE_WORD = re.compile(r"(?i:\b(?:option|choice)\b)\s*:?\s*\(?([A-Z])\b\)?")
_CHOICE_BARE = re.compile(r"^\(?([A-Za-z])\)?$")
_CHOICE_LONE = re.compile(r"(?<![\w'])([A-Z])(?![\w'])")
_WORD_LETTER = re.compile(r"[AI] [a-z]")
_EQUATION = re.compile(r"\s*[$]?[-\u2212]?[\d.,]+(?:\s*[-+*/x\u00d7\u00f7]\s*[$]?[\d.,]+)+"
                       r"\s*=\s*([$]?[-\u2212]?[\d.,]*\d)")
_TRAILING = ".,;:!?"
_QUOTES = "\"'`\u201c\u201d\u2018\u2019"

# Label families with two spellings; the first spelling of each pair is the canonical one.
_BINARY = {
    "yes_no": ("Yes", "No"),
    "true_false": ("True", "False"),
    "valid_invalid": ("valid", "invalid"),
}


def extract_answer(metric: str, text: str, target: str = "") -> str:
    """The answer in `text` in canonical form ('(B)', 'Yes', '1200', normalized free text),
    or '' when none is found. `target` picks the family when metric is 'auto'."""
    family = _family(metric, target)
    region = _answer_region(text)
    segment = _after_marker(region)
    if family == "numeric":
        return (_equation_result(segment) or _extract_number(segment, first=True)
                or _extract_number(region))
    if family == "choice":
        return _extract_choice(segment, region)
    if family in _BINARY:
        return _extract_binary(family, segment, region.replace("**", ""))
    return normalize_text(segment if segment is not None else _last_line(region))


def grade(metric: str, prediction: str, target: str) -> float:
    """1.0 when the answer extracted from `prediction` matches `target`, else 0.0."""
    family = _family(metric, target)
    predicted = extract_answer(family, prediction)
    expected = _canonical_target(family, target)
    if not predicted or not expected:
        return 0.0
    if family == "numeric":
        return 1.0 if Decimal(predicted) == Decimal(expected) else 0.0
    return 1.0 if predicted.casefold() == expected.casefold() else 0.0


def target_family(target: str) -> str:
    """The grading family that `auto` uses for this target's form."""
    t = normalize_text(target, lower=False)
    if _CHOICE_TARGET.match(t):
        return "choice"
    low = t.lower()
    for family, labels in _BINARY.items():
        if low in (labels[0].lower(), labels[1].lower()):
            return family
    if _NUMBER_TARGET.match(t):
        return "numeric"
    return "exact_match"


def normalize_text(text: str, *, lower: bool = True) -> str:
    """Collapsed whitespace, markdown bold and wrapping quotes removed, trailing sentence
    punctuation dropped; lowercased unless lower=False."""
    out = " ".join(text.replace("**", "").split())
    previous = None
    while out != previous:
        previous = out
        out = out.rstrip(_TRAILING).strip()
        if len(out) >= 2 and out[0] in _QUOTES and out[-1] in _QUOTES:
            out = out[1:-1].strip()
    return out.lower() if lower else out


# --- helpers ------------------------------------------------------------------------------


def _family(metric: str, target: str) -> str:
    if metric == "auto":
        return target_family(target)
    if metric in KNOWN_METRICS or metric in _BINARY:
        return metric
    if metric == "judge":
        raise ValueError("metric 'judge' is graded by an LLM judge, not by engine.data.graders")
    raise ValueError(f"unknown metric '{metric}' (known: {', '.join(KNOWN_METRICS)})")


def _canonical_target(family: str, target: str) -> str:
    if family == "exact_match":
        return normalize_text(target)
    return extract_answer(family, target)


def _answer_region(text: str) -> str:
    tagged = _TAGGED.findall(text or "")
    return tagged[-1][1] if tagged else (text or "")


def _after_marker(text: str) -> str | None:
    """What follows the last answer marker, up to the end of its line; None without one."""
    found = list(_MARKER.finditer(text))
    if not found:
        return None
    rest = text[found[-1].end():].lstrip()
    return rest.splitlines()[0] if rest else ""


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _extract_number(text: str | None, first: bool = False) -> str:
    """The last number in `text` (the first when `first`), canonical: no commas, no
    trailing zeros after the point."""
    found = _NUMBER.findall((text or "").replace("**", ""))
    if not found:
        return ""
    raw = found[0 if first else -1].replace(",", "").replace("\u2212", "-")
    try:
        value = Decimal(raw)
    except InvalidOperation:
        return ""
    out = format(value.normalize(), "f")
    return "0" if out in ("-0", "0") else out


def _equation_result(segment: str | None) -> str:
    """The result of an equation that opens the answer ("5 + 13 = 18" gives 18)."""
    found = _EQUATION.match((segment or "").replace("**", ""))
    return _extract_number(found.group(1)) if found else ""


def _extract_choice(segment: str | None, region: str) -> str:
    """A label like (B): the first one after an answer marker, else the last '(B)' or
    'option B' in the reply, else a reply that is a single letter."""
    if segment is not None:
        letter = _first_choice(segment.replace("**", ""))
        if letter:
            return f"({letter})"
    clean = region.replace("**", "")
    found = [(m.start(), m.group(1)) for m in _CHOICE_PAREN.finditer(clean)]
    found += [(m.start(), m.group(1)) for m in _CHOICE_WORD.finditer(clean)]
    if found:
        return f"({max(found)[1]})"
    bare = _CHOICE_BARE.match(normalize_text(clean, lower=False))
    return f"({bare.group(1).upper()})" if bare else ""


def _first_choice(segment: str) -> str:
    """The option named after an answer marker: a reply that is one letter; else the first
    explicitly marked option, "(D)" or "option D"; else a capital letter standing alone.
    "A" or "I" opening a sentence ("A hexagon", "I think") is a word, not an option."""
    bare = _CHOICE_BARE.match(normalize_text(segment, lower=False))
    if bare:
        return bare.group(1).upper()
    marked = [(m.start(), m.group(1)) for m in _CHOICE_PAREN.finditer(segment)]
    marked += [(m.start(), m.group(1)) for m in _CHOICE_WORD.finditer(segment)]
    if marked:
        return min(marked)[1]
    for match in _CHOICE_LONE.finditer(segment):
        if not _WORD_LETTER.match(segment, match.start()):
            return match.group(1)
    return ""


def _extract_binary(family: str, segment: str | None, region: str) -> str:
    """One of the family's two labels (whole words, canonically spelled): the first after an
    answer marker, else a label that opens the reply as its own sentence ("No. There is...")
    else the last one in the reply."""
    first, second = _BINARY[family]
    pattern = rf"\b({first}|{second})\b"
    words = re.findall(pattern, segment or "", re.IGNORECASE)[:1]
    if not words:
        opening = re.match(rf"\s*({first}|{second})\s*(?:[.,;:!\n]|$)", region, re.IGNORECASE)
        words = [opening.group(1)] if opening else re.findall(pattern, region, re.IGNORECASE)
    if not words:
        return ""
    return first if words[-1].lower() == first.lower() else second
