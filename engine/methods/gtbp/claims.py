"""GTBP's prompts as claims: the edit schedule, reading and writing claim lists, and the
budget that is enforced in code.

For an optimization step t >= 1:

    edit_budget(t)   = max(1, m0 - floor((t - 1) / m_minus))
    may_add_claim(t) = (t % m_plus == 0)    # then at most one new claim

With deletion off and no cap (the defaults, as in the paper), a prompt of c0 claims holds
at least c0 + floor(t / m_plus) claims after t accepted steps that add one, while at most
edit_budget(t) <= m0 of them change: the share of edited claims falls like O(1/t).
"""

from __future__ import annotations

import difflib
import itertools
import re


def edit_budget(step: int, m0: int, m_minus: int) -> int:
    """Claims the update may change at step t >= 1: max(1, m0 - floor((t-1)/m_minus))."""
    if step < 1:
        raise ValueError(f"gtbp updates start at step 1, not {step}")
    return max(1, m0 - (step - 1) // m_minus)


def may_add_claim(step: int, m_plus: int) -> bool:
    """Whether step t >= 1 may add one new claim: t % m_plus == 0."""
    if step < 1:
        raise ValueError(f"gtbp updates start at step 1, not {step}")
    return step % m_plus == 0


_ITEM = re.compile(r"^\s*(?:[-*•]\s+|\d+[.)]\s+)(.*)$")


def split_claims(prompt: str) -> list[str]:
    """A prompt's claims. Lines starting with "- ", "* " or "1." / "1)" start a claim; other
    non-empty lines continue the previous claim (or start one, before the first item). A
    prompt without such lines is split into sentences."""
    lines = [ln.strip() for ln in prompt.splitlines() if ln.strip()]
    if not any(_ITEM.match(ln) for ln in lines):
        text = " ".join(lines)
        return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    claims: list[str] = []
    for ln in lines:
        item = _ITEM.match(ln)
        if item and item.group(1).strip():
            claims.append(item.group(1).strip())
        elif claims and not item:
            claims[-1] = f"{claims[-1]} {ln}"
        elif not item:
            claims.append(ln)
    return claims


def render_claims(claims: list[str]) -> str:
    return "\n".join(f"- {c}" for c in claims)


def parse_claims_reply(reply: str) -> tuple[list[str] | None, str, str | None]:
    """(claims or None, reasoning, parse_error). Rules: the last <claims> block; else the
    text after an unclosed <claims> tag; else the reply's "- "/numbered lines; else None
    (the prompt stays as it is)."""
    blocks = re.findall(r"<claims>(.*?)</claims>", reply, flags=re.S | re.I)
    if blocks:
        reasoning = reply[: reply.lower().rfind("<claims>")].strip()
        if split_claims(blocks[-1]):
            return split_claims(blocks[-1]), reasoning, None
        return None, reasoning, "empty <claims> block: prompt left unchanged"
    opened = re.split(r"<claims>", reply, flags=re.I)
    if len(opened) > 1 and opened[-1].strip():
        return (split_claims(opened[-1]), opened[0].strip(),
                "unclosed <claims> tag: used the text after it")
    items = [ln for ln in reply.splitlines() if _ITEM.match(ln)]
    if items:
        return (split_claims("\n".join(items)), reply.strip(),
                "no <claims> tags: used the list lines")
    return None, reply.strip(), "no claims in the reply: prompt left unchanged"


def enforce_budget(current: list[str], proposed: list[str], budget: int, may_add: bool,
                   max_claims: int | None = None, allow_delete: bool = False
                   ) -> tuple[list[str], int, str | None]:
    """Apply at most `budget` of the proposal's changes to `current`, in claim order.

    Changes come from a diff of the two lists: a changed claim is an edit, a missing one a
    removal, a new one an addition. Additions only when `may_add`: at most one, and only
    below `max_claims` (None: no cap, as in the paper). Removals only when `allow_delete`
    (off by default: the paper's prompts only grow). Changes over the limits are reverted.
    Returns (claims, changes kept, problem or None)."""
    matcher = difflib.SequenceMatcher(a=[_norm(c) for c in current],
                                      b=[_norm(c) for c in proposed], autojunk=False)
    room = max_claims is None or len(current) < max_claims
    out: list[str] = []
    kept = added = dropped_adds = kept_removed = over_budget = 0
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.extend(current[i1:i2])
            continue
        for old, new in itertools.zip_longest(current[i1:i2], proposed[j1:j2]):
            if old is None and not (may_add and added == 0 and room):
                dropped_adds += 1  # an addition this step does not allow
            elif new is None and not allow_delete:
                kept_removed += 1
                out.append(old)  # deletion is off: the claim stays
            elif kept >= budget:
                over_budget += 1
                if old is not None:
                    out.append(old)  # revert the edit or removal
            else:
                kept, added = kept + 1, added + (old is None)
                if new is not None:
                    out.append(new)
    notes = []
    if dropped_adds:
        rule = "at most one may be added" if may_add else "no claim may be added"
        cap = "" if max_claims is None else f" (max {max_claims} claims)"
        notes.append(f"dropped {dropped_adds} new claim(s): {rule} this step{cap}")
    if kept_removed:
        notes.append(f"kept {kept_removed} claim(s) the proposal removed: deletion is off")
    if over_budget:
        notes.append(f"{kept + over_budget} changes over the edit budget of {budget}: "
                     f"kept the first {budget} in claim order")
    return out, kept, "; ".join(notes) or None


def _norm(claim: str) -> str:
    return " ".join(claim.split()).lower()
