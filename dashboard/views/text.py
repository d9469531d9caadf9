"""Safe text display shared by the pages.

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/text.py."""

from __future__ import annotations

import math
import re

import pandas as pd

COLLAPSE_AT = 400  # characters: longer texts start collapsed



def md(text: object) -> str:
    """Escape a value for use inside Markdown (no links, images or emphasis)."""
    return re.sub(r"([\\`*_{}\[\]()#+\-.!<>|~])", r"\\\1", str(text))



def code(text: object) -> str:
    """Inline code in Markdown (no escaping inside a code span; no backtick can end it)."""
    return "`" + str(text).replace("`", "'") + "`"



def plural(count: int, word: str, many: str | None = None) -> str:
    """'1 proposal', '2 proposals' (`many` for an irregular plural)."""
    return f"{count} {word if count == 1 else (many or word + 's')}"



def chars(value: object) -> str:
    """A gradient's length as every page shows it ('66 chars'): rounded half up, the way
    the tables' %.0f columns round in the browser, so a node's label, its tooltip, its
    edge and the table agree."""
    return f"{round_chars(value)} chars"



def round_chars(value: object) -> int:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0
    return 0 if pd.isna(number) else int(math.floor(number + 0.5))



def fmt(value: object, spec: str = ".3f", empty: str = "–") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NA:
        return empty
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)
