"""Validation scores as the pages state a conclusion from them: each score with the number
of examples behind it and its 95% interval (dashboard.data.Score), and whether a change
between two of them is more than those examples can tell apart.

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/validation.py."""

from __future__ import annotations

from dashboard import data
from dashboard.data import Score
from dashboard.views.text import plural


def change_sentence(before: Score, after: Score) -> tuple[str, str]:
    """(verdict, sentence) for a score going from `before` to `after`: verdict 'rose',
    'fell', 'did not change' or '' (one side not measured); the sentence gives both values,
    the examples and whether the two 95% intervals overlap."""
    if before.value is None or after.value is None:
        return "", "Validation was not measured on both sides."
    verdict = ("rose" if after.value > before.value else
               "fell" if after.value < before.value else "did not change")
    same_n = before.n == after.n
    on = (f"on {plural(before.n, 'example')}" if same_n else
          f"on {before.n} and {plural(after.n, 'example')}")
    sentence = f"Validation {verdict} ({before.value:.3f} → {after.value:.3f}) {on}"
    a, b = before.interval(), after.interval()
    if verdict == "did not change" or a is None or b is None:
        return verdict, sentence + "."
    apart = a[1] < b[0] or b[1] < a[0]
    return verdict, (sentence + f"; 95% intervals {a[0]:.2f}–{a[1]:.2f} and "
                     f"{b[0]:.2f}–{b[1]:.2f}"
                     + (", which do not overlap." if apart else
                        ", which overlap: these examples cannot tell the two apart."))



def best_validation(db: str, run_id: str) -> str:
    """'1.000 on 24 examples (95% interval 0.86–1.00) at step 1', or '–'."""
    table = data.steps(db, run_id)
    scored = table.dropna(subset=["val_score"]) if not table.empty else table
    if scored.empty:
        return "–"
    best = scored.sort_values(["val_score", "step"], ascending=[False, True]).iloc[0]
    step = int(best["step"])
    return f"{data.validation_at(db, run_id, step).text()} at step {step}"
