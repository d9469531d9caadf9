"""Credit-assignment methods, selectable per run with --method."""

from __future__ import annotations

from engine.core.backward import Method
from engine.methods.evaluative import SemanticEvaluative
from engine.methods.gtbp import GTBP
from engine.methods.none import NoGradients
from engine.methods.nosibling import SemanticNoSibling
from engine.methods.semantic import SemanticBackprop
from engine.methods.textgrad import TextGrad
from engine.methods.textgrad_lib import TextGradLib

METHODS: dict[str, type[Method]] = {
    m.name: m for m in (SemanticBackprop, SemanticEvaluative, TextGrad, TextGradLib,
                        NoGradients, SemanticNoSibling, GTBP)
}


def make_method(name: str, **options) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method '{name}' (choose from {', '.join(METHODS)})")
    return METHODS[name](**options)
