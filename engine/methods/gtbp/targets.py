"""Parsers of GTBP's backward replies: the combined target, and the inferred input."""

from __future__ import annotations

import re


def parse_target(reply: str) -> tuple[str, str | None]:
    """(target, parse_error). Rules: the last non-empty <target> block; else the text after
    an unclosed <target> tag; else the whole reply."""
    blocks = [b.strip() for b in re.findall(r"<target>(.*?)</target>", reply, re.S | re.I)]
    blocks = [b for b in blocks if b]
    if blocks:
        return blocks[-1], None
    opened = re.split(r"<target>", reply, flags=re.I)
    if len(opened) > 1 and opened[-1].strip():
        return opened[-1].strip(), "unclosed <target> tag: used the text after it"
    return reply.strip(), "no <target> tags: used the whole reply"


def parse_inferred_input(reply: str, names: list[str], fields: set[str],
                         actual: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """One value per input name. Rules, in order: the last `<input name="n">` block for n;
    else a line starting with "n:" up to the next such label; else an example field keeps
    its actual value, and a predecessor gets the whole reply when it is the only one, else
    no target (never another input's block). The parse error names every input that
    needed a fallback."""
    found: dict[str, str] = {}
    for name, body in re.findall(r'<input\s+name="([^"]+)"\s*>(.*?)</input>', reply,
                                 flags=re.S | re.I):
        if name in names and body.strip():
            found[name] = body.strip()
    notes = []
    labelled = _split_labelled(reply, [n for n in names if n not in found])
    if labelled:
        found.update(labelled)
        notes.append(f"no <input> block for {', '.join(labelled)}: used its 'name:' label")
    missing = [n for n in names if n not in found]
    predecessors = [n for n in names if n not in fields]
    for n in missing:  # never another input's text: see parse_gradients
        whole = len(predecessors) == 1 and reply.strip()
        found[n] = actual.get(n, "") if n in fields else (reply.strip() if whole else "")
    kept = [n for n in missing if n in fields]
    lost = [n for n in missing if n not in fields]
    if kept:
        notes.append(f"no block for field {', '.join(kept)}: kept its actual value")
    if lost and len(predecessors) == 1:
        notes.append(f"no block for {lost[0]}: gave it the whole reply")
    elif lost:
        notes.append(f"no block for {', '.join(lost)}: no target")
    return {n: found[n] for n in names}, "; ".join(notes) or None


def _split_labelled(reply: str, names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    pattern = re.compile(r"^\W*(" + "|".join(re.escape(n) for n in names) + r")\s*:", re.M)
    matches = list(pattern.finditer(reply))
    parts: dict[str, str] = {}
    for m, nxt in zip(matches, matches[1:] + [None]):
        body = reply[m.end():nxt.start() if nxt else len(reply)].strip()
        if body:
            parts[m.group(1)] = body
    return parts
