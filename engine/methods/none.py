"""Ablation "no gradients": no backward calls; the update sees only the failing inputs
and outputs of each node."""

from __future__ import annotations

from engine.core.backward import Method
from engine.core.forward import ExampleTrace, Prompts, RunContext
from engine.events import LossRecord


class NoGradients(Method):
    name = "none"
    uses_gradients = False
    sibling_aware = False

    async def backward(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                       loss: LossRecord) -> dict[str, str]:
        return {}
