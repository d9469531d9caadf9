"""Ablation "no gradients": no backward calls; the update sees only the failing inputs
and outputs of each node."""

from __future__ import annotations

from engine.events import LossRecord
from engine.forward import ExampleTrace, Prompts, RunContext
from engine.methods.base import Method


class NoGradients(Method):
    name = "none"
    uses_gradients = False

    async def backward(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                       loss: LossRecord) -> dict[str, str]:
        return {}
