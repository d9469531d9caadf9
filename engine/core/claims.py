"""What a gradient claims: whether it asks its input to change, read from its text.

A structured backward reply states it in its `asks_change` field; a text reply is read
here, and the reading is recorded beside the claim (`claim_source` 'text:<rule>').
"""

from __future__ import annotations

import re

_KEEP = re.compile(
    r"\b(no (further |other )?changes? (is |are )?(needed|required|necessary)|no change"
    r"|needs? no changes?|need not (be )?change|(does not|doesn't|do not|don't) need to "
    r"(be )?change|(should|can) (stay|remain) (as it is|as is|unchanged)|nothing to change"
    r"|is (already )?(fine|correct|right|good)( as (it is|is))?|keep (it|this( input)?) "
    r"(as it is|as is|unchanged))\b", re.I)
_BUT = re.compile(r"\b(but|however|instead|although|though|except)\b", re.I)


def gradient_claim(text: str) -> tuple[bool, str]:
    """(asks its input to change, how that was read). Empty: no change. A no-change phrase
    with no contrast after it ("but", "however", ...): no change. Otherwise a change."""
    text = (text or "").strip()
    if not text:
        return False, "empty gradient"
    keep = _KEEP.search(text)
    if keep and not _BUT.search(text, keep.end()) and not _BUT.search(text[:keep.start()]):
        return False, f"no-change phrase {keep.group(0)!r}"
    if keep:
        return True, f"no-change phrase {keep.group(0)!r} with a contrast"
    return True, "asks for a change (no no-change phrase)"
