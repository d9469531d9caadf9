"""Copy detection: a proposed prompt that pastes training material into itself.

An update call sees the sampled failing examples; the update instructions forbid
mentioning them, yet small models paste them in ("The soup was bland. Really bad
headphones..."). Such a prompt is memorizing, not generalizing, so the optimizer records
it as rejected with the reason `COPY_REASON` instead of applying it (`--allow-copies`
turns the check off, for few-shot style prompts).

The rule, on lower-cased words (punctuation ignored):
- the proposal shares a run of at least `SPAN_WORDS` (8) consecutive words with one of the
  sampled examples' inputs (their field values) or targets; or
- the proposal contains a whole input or target of at least `WHOLE_WORDS` (4) words:
  one-sentence examples are shorter than any span threshold, and pasting one entire is
  still copying, while a one-word target ("Yes") never counts; or
- the proposal retells a short example (under `2 * SPAN_WORDS` words): it holds at least
  `WHOLE_WORDS` of the example's words, in any order, and at least `MOST_OF` (three
  quarters) of the example's distinct words. A retelling with the number left out or the
  words moved ("Write one word about the number of buttons that Oskar lost from his coat."
  for "Oskar lost 4 buttons from his coat.") names one example as surely as a paste does.
Text (a run, or a word) that the current prompt already contains is not counted: only new
text can copy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SPAN_WORDS = 8
WHOLE_WORDS = 4
MOST_OF = 0.75
COPY_REASON = "copies training examples"

_WORD = re.compile(r"\w+(?:['’]\w+)*")


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _runs(seq: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)}


def _contains(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


def copied_span(proposal: str, examples: Iterable[str], current: str = "",
                span_words: int = SPAN_WORDS, whole_words: int = WHOLE_WORDS) -> str | None:
    """The first copied passage of `proposal` (as words joined by spaces), or None.

    `examples` are the texts the update call saw (inputs and targets of the sampled
    examples); `current` is the prompt being replaced."""
    said, before = words(proposal), words(current)
    old = _runs(before, span_words)
    for text in examples:
        ex = words(text)
        if whole_words <= len(ex) < span_words and _contains(said, ex) \
                and not _contains(before, ex):
            return " ".join(ex)
        if len(ex) >= span_words:
            theirs = _runs(ex, span_words)
            for i in range(len(said) - span_words + 1):
                run = tuple(said[i:i + span_words])
                if run in theirs and run not in old:
                    return " ".join(run)
        if whole_words <= len(ex) < 2 * span_words:
            retold = _retold(said, ex, before, whole_words)
            if retold:
                return retold
    return None


def _retold(said: list[str], example: list[str], before: list[str], whole_words: int
            ) -> str | None:
    """The example's words the proposal holds (in the example's order), when they are at
    least `whole_words` and `MOST_OF` of its distinct words; words the current prompt has
    count for neither side."""
    known, held = set(before), set(said)
    theirs = [w for w in dict.fromkeys(example) if w not in known]
    shared = [w for w in theirs if w in held]
    if len(shared) >= whole_words and len(shared) >= MOST_OF * len(theirs):
        return " ".join(shared)
    return None


def example_texts(fields: dict[str, object], target: str) -> list[str]:
    """What of one example the copy check compares against: its field values and target."""
    return [str(v) for v in fields.values() if v is not None] + [str(target)]


def find_copies(proposed: dict[str, tuple[str, str]], examples: list[tuple[dict, str]]
                ) -> dict[str, str]:
    """{node: copied passage} for the proposals that copy: `proposed` maps a node to
    (new prompt, current prompt); `examples` are the sampled examples' (fields, target)."""
    texts = [t for fields, target in examples for t in example_texts(fields, target)]
    found = {n: copied_span(new, texts, old) for n, (new, old) in proposed.items()}
    return {n: span for n, span in found.items() if span}
