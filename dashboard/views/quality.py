"""Gradients that carry no signal: an empty reply, a single word, or a reply that mostly
repeats the backward prompt it was given. A small model (the embedded ones) writes
many of these, and a page that shows a gradient says so beside it rather than presenting
it as advice.

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/quality.py."""

from __future__ import annotations

import json
import re

SHINGLE = 6  # words: a run of this many copied from the prompt is an echo, not a thought

ECHO_SHARE = 0.5  # of the reply's word runs found in the prompt

NOISE_NOTE = ("A small model writes gradients that are often noise: empty, one word, or "
              "pieces of the prompt it was given. Read them as the model's guess, not as a "
              "diagnosis; the probes (Check the blame, What if) are how you tell whether "
              "following one fixes the answer.")



def noise_note(model: str | None) -> str:
    """NOISE_NOTE naming the model that wrote the run's gradients (its optimizer model)."""
    if not model:
        return NOISE_NOTE
    return NOISE_NOTE.replace("A small model", f"A small embedded model such as this run's "
                              f"{model}", 1)



_WORD = re.compile(r"[\w']+")



def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())



def prompt_text(messages_json: object) -> str:
    """The text of a call's messages (the JSON list of {role, content}), joined."""
    try:
        messages = json.loads(messages_json) if isinstance(messages_json, str) else []
    except ValueError:
        return ""
    return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))



def degenerate(text: object, prompt: str = "") -> str | None:
    """Why a gradient carries no signal ('empty', 'one word', 'echoes the prompt'), or
    None when it looks like a real message."""
    value = "" if text is None or text != text else str(text)
    words = _words(value)
    if not words:
        return "empty"
    if len(words) == 1:
        return "one word"
    if prompt:
        known = _words(prompt)
        if len(words) < SHINGLE:
            return "echoes the prompt" if " ".join(words) in " ".join(known) else None
        runs = {tuple(known[i:i + SHINGLE]) for i in range(len(known) - SHINGLE + 1)}
        mine = [tuple(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)]
        if sum(run in runs for run in mine) >= ECHO_SHARE * len(mine):
            return "echoes the prompt"
    return None
