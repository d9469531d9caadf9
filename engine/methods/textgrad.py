"""The TextGrad baseline: one independent call per (node, predecessor), each seeing only
that one input, the node's task, its output and its feedback: no sibling values."""

from __future__ import annotations

import asyncio

from engine import prompts as P
from engine.forward import ExampleTrace, Prompts, RunContext
from engine.methods.base import Method, NodeGradient, ask_backward


class TextGrad(Method):
    name = "textgrad"
    role = "backward_single"
    include_fields = False

    async def node_gradients(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                             node_id: str, feedback: str) -> dict[str, NodeGradient]:
        predecessors = ctx.graph.predecessors(node_id)
        values = trace.inputs[node_id]
        fields = {k: v for k, v in values.items() if k in ctx.graph.input_fields}

        async def one(pred: str) -> NodeGradient:
            shown = {**fields, pred: values[pred]} if self.include_fields else {pred: values[pred]}
            grads, call_id, problem = await ask_backward(
                ctx, node_id, trace.example.id, P.BACKWARD_SINGLE, [pred], self.role,
                prompt=prompts.text[node_id], inputs=P.render_inputs(shown),
                output=trace.output(node_id), feedback=feedback, name=pred)
            return NodeGradient(grads[pred], call_id, problem)

        results = await asyncio.gather(*(one(p) for p in predecessors))
        return dict(zip(predecessors, results))
