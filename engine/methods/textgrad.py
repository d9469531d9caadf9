"""The TextGrad baseline as the paper describes it formally: one independent call per
(node, predecessor), each seeing only that one input, the node's task, its output and its
feedback: no sibling values, no example fields.

The instruction text is the one `semantic` uses (engine/prompts/templates.py): the two differ only
in the context they show. For the TextGrad library's own backward, which shows the full
formatted prompt, see `textgrad-lib` (textgrad_lib.py).
"""

from __future__ import annotations

import asyncio

from engine.core.backward import (
    Method,
    NodeGradient,
    ask_backward,
    asking_nodes,
    input_tasks,
    recorded_read,
)
from engine.core.forward import ExampleTrace, Prompts, RunContext
from engine.prompts import templates as P


class TextGrad(Method):
    name = "textgrad"
    role = "backward_single"
    include_fields = False
    sibling_aware = False

    @classmethod
    def backward_calls(cls, graph) -> int:
        """One call per (node, input) pair."""
        return sum(len(graph.predecessors(n.id)) for n in asking_nodes(graph))

    def shown_inputs(self, ctx: RunContext, values: dict[str, str], pred: str
                     ) -> dict[str, str]:
        """The inputs one call shows, in declared order: `pred`, plus the example's fields
        when `include_fields`; never a sibling."""
        return {k: v for k, v in values.items()
                if k == pred or (self.include_fields and k in ctx.graph.input_fields)}

    async def node_gradients(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                             node_id: str, feedback: str) -> dict[str, NodeGradient]:
        predecessors = ctx.graph.predecessors(node_id)
        values = trace.inputs[node_id]

        async def one(pred: str) -> NodeGradient:
            shown = self.shown_inputs(ctx, values, pred)
            view = P.BackwardView(prompts.text[node_id], shown,
                                  frozenset(ctx.graph.input_fields), trace.output(node_id),
                                  feedback, [pred], input_tasks=input_tasks(
                                      ctx.graph, prompts.text, [pred]),
                                  read=recorded_read(ctx, trace, node_id, shown))
            grads, call_id, problem, claims = await ask_backward(
                ctx, node_id, trace.example.id, view, self.role)
            return NodeGradient(grads[pred], call_id, problem, claims.get(pred))

        results = await asyncio.gather(*(one(p) for p in predecessors))
        return dict(zip(predecessors, results))
