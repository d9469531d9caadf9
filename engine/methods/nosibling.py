"""Ablation "no sibling information": one call per predecessor, like TextGrad, but keeping
the node's task and the example's fields. Its instruction text is `semantic`'s: only the
sibling outputs are missing from what it shows. (The paper's script also dropped the task
and context, and reverted to sibling mode after the first accepted update; neither
happens here.)"""

from __future__ import annotations

from engine.methods.textgrad import TextGrad


class SemanticNoSibling(TextGrad):
    name = "semantic-nosibling"
    role = "backward_nosibling"
    include_fields = True
