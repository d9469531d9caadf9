"""Word-level diffs of prompts and outputs as escaped HTML (green added, red removed)."""

from __future__ import annotations

import difflib
import html
import re
from dataclasses import dataclass

ADDED_STYLE = "background:#d4f8d4;color:#0a5c0a;text-decoration:none"
REMOVED_STYLE = "background:#fbd5d5;color:#8a1010;text-decoration:line-through"
_TOKEN = re.compile(r"\s+|[^\s]+")


@dataclass(frozen=True)
class WordDiff:
    """A diff as (op, text) pieces; op is 'equal', 'added' or 'removed'."""

    pieces: tuple[tuple[str, str], ...]

    @property
    def added(self) -> list[str]:
        return _words(self.pieces, "added")

    @property
    def removed(self) -> list[str]:
        return _words(self.pieces, "removed")

    @property
    def changed(self) -> bool:
        return any(op != "equal" for op, _ in self.pieces)


def _words(pieces: tuple[tuple[str, str], ...], op: str) -> list[str]:
    return [w for o, text in pieces if o == op for w in text.split()]


def word_diff(old: str, new: str) -> WordDiff:
    """Diff two texts word by word; whitespace runs are kept as their own tokens so the
    rendered diff keeps line breaks."""
    a, b = _TOKEN.findall(old or ""), _TOKEN.findall(new or "")
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    pieces: list[tuple[str, str]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pieces.append(("equal", "".join(a[i1:i2])))
            continue
        if tag in ("replace", "delete"):
            pieces.append(("removed", "".join(a[i1:i2])))
        if tag in ("replace", "insert"):
            pieces.append(("added", "".join(b[j1:j2])))
    return WordDiff(tuple(p for p in pieces if p[1]))


def diff_html(old: str, new: str, only_changes: bool = False, context_words: int = 8) -> str:
    """The diff as HTML: <ins> in green for added words, <del> in red for removed ones.
    Every piece of text is escaped. `only_changes` elides long unchanged stretches."""
    diff = word_diff(old, new)
    parts: list[str] = []
    previous = ("equal", " ")
    for op, text in diff.pieces:
        if _glued(previous, (op, text)):
            parts.append(" ")  # "Write" struck out then "The": two words, not "WriteThe"
        previous = (op, text)
        if op == "equal":
            if only_changes:
                text = _elide(text, context_words)
            parts.append(_escape(text))
        elif op == "added":
            parts.append(f'<ins style="{ADDED_STYLE}">{_escape(text)}</ins>')
        else:
            parts.append(f'<del style="{REMOVED_STYLE}">{_escape(text)}</del>')
    body = "".join(parts) if parts else '<span style="color:#888">(empty)</span>'
    return ('<div class="semback-diff" style="white-space:pre-wrap;font-family:monospace;'
            f'font-size:0.85rem;line-height:1.5">{body}</div>')


def side_by_side_html(old: str, new: str, only_changes: bool = False,
                      context_words: int = 8) -> tuple[str, str]:
    """The diff as two HTML panes: `old` with its removed words in red, `new` with its
    added words in green (every piece escaped), for a before | after view."""
    diff = word_diff(old, new)
    left: list[str] = []
    right: list[str] = []
    for op, text in diff.pieces:
        shown = _elide(text, context_words) if op == "equal" and only_changes else text
        if op in ("equal", "removed"):
            left.append(_escape(shown) if op == "equal" else
                        f'<del style="{REMOVED_STYLE}">{_escape(text)}</del>')
        if op in ("equal", "added"):
            right.append(_escape(shown) if op == "equal" else
                         f'<ins style="{ADDED_STYLE}">{_escape(text)}</ins>')
    return tuple(  # type: ignore[return-value]
        '<div class="semback-diff" style="white-space:pre-wrap;font-family:monospace;'
        'font-size:0.85rem;line-height:1.5">'
        + ("".join(p) if p else '<span style="color:#888">(empty)</span>') + "</div>"
        for p in (left, right))


def _glued(before: tuple[str, str], after: tuple[str, str]) -> bool:
    """A removed run met by an added one (or the reverse) with no whitespace between:
    shown inline they would read as one word."""
    ops = {before[0], after[0]}
    return (ops == {"removed", "added"} and bool(before[1]) and bool(after[1])
            and not before[1][-1].isspace() and not after[1][0].isspace())


def _elide(text: str, keep: int) -> str:
    words = _TOKEN.findall(text)
    if len(words) <= 4 * keep:
        return text
    return "".join(words[: 2 * keep]) + " … " + "".join(words[-2 * keep:])


def _escape(text: str) -> str:
    return html.escape(text, quote=True)


def change_caption(kind: str, why: str, explains: bool) -> str:
    """What the Compare drawing writes under a node, in the words of the line under it: a
    node whose output is the same on both sides says so, and why ("same output (prompt
    differs)"), never a bare "unchanged" beside a text that says its prompt differs."""
    if explains:
        return "explains"
    return why if kind == "unchanged" else kind
