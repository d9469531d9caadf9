"""The TextGrad library's own backward, as a baseline: one call per (node, predecessor),
like `textgrad`, but each call shows everything the node's forward call showed (the task
and ALL its inputs, siblings and example fields included), then asks about that one input.

The paper's formal description of TextGrad (no siblings) is `textgrad`. The instruction
text is shared with every other method (engine/prompts/templates.py); the update step is this
project's, not TextGrad's optimizer.
"""

from __future__ import annotations

from engine.core.forward import RunContext
from engine.methods.textgrad import TextGrad


class TextGradLib(TextGrad):
    name = "textgrad-lib"
    role = "backward_textgrad_lib"
    sibling_aware = True  # each call shows every input, siblings included

    def shown_inputs(self, ctx: RunContext, values: dict[str, str], pred: str
                     ) -> dict[str, str]:
        return dict(values)
