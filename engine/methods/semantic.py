"""Semantic backpropagation (the paper's method, the default).

One joint call per node and example shows the node's task, the example's fields, the
outputs of ALL its predecessors together (the siblings), its own output and its
aggregated feedback, and asks how each predecessor's output should change. The reply is
split into one gradient per predecessor: each is conditioned on its siblings' values.
"""

from __future__ import annotations

from engine.core.backward import (
    Method,
    NodeGradient,
    ask_backward,
    input_tasks,
    recorded_read,
)
from engine.core.forward import ExampleTrace, Prompts, RunContext
from engine.prompts import templates as P


class SemanticBackprop(Method):
    name = "semantic"
    mode = "directional"
    role = "backward_joint"
    contrastable = True

    async def node_gradients(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                             node_id: str, feedback: str) -> dict[str, NodeGradient]:
        predecessors = ctx.graph.predecessors(node_id)
        view = P.BackwardView(prompts.text[node_id], dict(trace.inputs[node_id]),
                              frozenset(ctx.graph.input_fields), trace.output(node_id),
                              feedback, predecessors, self.mode,
                              input_tasks(ctx.graph, prompts.text, predecessors),
                              recorded_read(ctx, trace, node_id))
        grads, call_id, problem, claims = await ask_backward(ctx, node_id, trace.example.id,
                                                             view, self.role)
        return {p: NodeGradient(grads[p], call_id, problem, claims.get(p)) for p in predecessors}
