"""The paper's non-directional variant: the same joint call, but it asks for a comment on
the quality of each input, judged on its own, instead of how the input should change."""

from __future__ import annotations

from engine import prompts as P
from engine.methods.semantic import SemanticBackprop


class SemanticEvaluative(SemanticBackprop):
    name = "semantic-evaluative"
    template = P.BACKWARD_EVALUATIVE
    role = "backward_evaluative"
