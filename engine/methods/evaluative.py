"""The paper's non-directional variant: the same joint call showing the same context, but
it asks for a comment on the quality of each input, judged on its own, instead of how the
input should change."""

from __future__ import annotations

from engine.methods.semantic import SemanticBackprop


class SemanticEvaluative(SemanticBackprop):
    name = "semantic-evaluative"
    mode = "evaluative"
    role = "backward_evaluative"
