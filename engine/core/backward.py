"""The credit-assignment interface and the reverse-mode walk every gradient method shares.

`backward` walks the graph in reverse topological order, like micrograd's `backward()`:
a node waits for the messages of all its successors, aggregates them in a fixed order
(successors in topological order), and asks its method for one message per predecessor
(`node_gradients`). Independent branches run concurrently. A method is one small module
that implements `node_gradients` (and may override `backward` and `propose_update`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from engine.core.claims import gradient_claim
from engine.core.forward import ExampleTrace, Prompts, RunContext
from engine.core.functions import function_backward
from engine.events import Gradient, LossRecord
from engine.prompts import structured as S
from engine.prompts import templates as P
from engine.prompts.recorded import RECORDED_FIELD, marked_read


@dataclass
class NodeGradient:
    content: str
    call_id: str | None = None
    parse_error: str | None = None
    asks_change: bool | None = None  # as the structured reply states it; None: read the text


def claim_of(grad: NodeGradient, kind: str) -> dict[str, Any]:
    """What a gradient (kind 'gradient') claims and where that was read: the structured
    reply's `asks_change` field ('schema'), else its text ('text:<reading>')."""
    if kind != "gradient":
        return {}
    if grad.asks_change is not None:
        return {"asks_change": grad.asks_change, "claim_source": "schema"}
    asks, reading = gradient_claim(grad.content)
    return {"asks_change": asks, "claim_source": f"text:{reading}"}


@dataclass
class UpdateSample:
    """What the update call sees of one sampled example at one node."""

    example_id: str
    input_text: str
    output_text: str
    feedback: str


@dataclass
class UpdateProposal:
    new_prompt: str
    reasoning: str = ""
    call_id: str | None = None
    parse_error: str | None = None
    error: str | None = None


class Method:
    """A credit-assignment method. Besides computing gradients, a method states the facts
    other parts ask about: how many backward calls one example costs (progress, estimates),
    whether its gradients see sibling inputs (the Learn page's comparisons), and the options
    a form should offer."""

    name = "base"
    uses_gradients = True
    # the gradient an input receives is conditioned on the other inputs of the same node
    sibling_aware = True
    # `--contrast`: a sibling-blind method's gradients can be written beside this method's
    # on the same examples (only a joint call conditioned on the siblings has a contrast)
    contrastable = False
    # (option, label, default) for forms that start a run with this method
    form_options: tuple[tuple[str, str, int], ...] = ()

    @classmethod
    def reply_roles(cls) -> tuple[str, ...]:
        """The reply roles of this method's calls, each with a JSON shape in
        engine/prompts/structured.py: its backward role, and the shared update."""
        role = getattr(cls, "role", None)
        return (role, "update") if cls.uses_gradients and role else ("update",)

    @classmethod
    def backward_calls(cls, graph) -> int:
        """Backward calls one back-propagated example makes, repairs aside: by default one
        joint call per node (LLM, or Python tool with a description) that has inputs."""
        if not cls.uses_gradients:
            return 0
        return sum(1 for n in asking_nodes(graph))

    async def node_gradients(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                             node_id: str, feedback: str) -> dict[str, NodeGradient]:
        """Messages for the node's LLM-produced inputs, given its aggregated feedback."""
        raise NotImplementedError

    async def backward(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                       loss: LossRecord) -> dict[str, str]:
        """Back-propagate one example's loss; returns the aggregated feedback per node."""
        graph = ctx.graph
        received: dict[str, list[tuple[str, str]]] = {n: [] for n in graph.node_ids}
        aggregated: dict[str, str] = {}
        done: dict[str, asyncio.Event] = {n: asyncio.Event() for n in graph.node_ids}
        output = graph.output_node.id
        received[output].append(("loss", loss.feedback))
        ctx.emit(self._gradient(ctx, trace, output, "loss", NodeGradient(loss.feedback),
                                loss.call_id))

        async def visit(node_id: str) -> None:
            for successor in graph.successors(node_id):
                await done[successor].wait()
            rank = {s: i for i, s in enumerate(["loss", *graph.successors(node_id)])}
            messages = sorted(received[node_id], key=lambda m: rank[m[0]])  # fixed order
            feedback = P.aggregate_feedback(messages) if messages else ""
            aggregated[node_id] = feedback
            ctx.emit(self._gradient(ctx, trace, node_id, None, NodeGradient(feedback), None,
                                    kind="aggregate"))
            predecessors = graph.predecessors(node_id)
            if feedback and predecessors:
                node = graph.node(node_id)
                if node.kind == "function" and node.fn is None:  # a registered rule
                    grads = function_messages(node.function or "", feedback,
                                              trace.inputs[node_id], predecessors)
                elif node.kind == "function" and not node.description:  # a bare Python tool
                    grads = {p: NodeGradient(feedback) for p in predecessors}
                else:  # an LLM node, or a Python tool whose description is its task
                    grads = await self.node_gradients(ctx, prompts, trace, node_id, feedback)
                for pred in predecessors:  # declared order: deterministic
                    if pred in grads:
                        if grads[pred].content:
                            received[pred].append((node_id, grads[pred].content))
                        ctx.emit(self._gradient(ctx, trace, pred, node_id, grads[pred]))
            done[node_id].set()

        await asyncio.gather(*(visit(n) for n in reversed(graph.topological_order())))
        return aggregated

    def _gradient(self, ctx: RunContext, trace: ExampleTrace, node_id: str,
                  from_node: str | None, grad: NodeGradient, call_id: str | None = None,
                  kind: str = "gradient") -> Gradient:
        return Gradient(run_id=ctx.run_id, step=ctx.step, example_id=trace.example.id,
                        node_id=node_id, from_node_id=from_node, method=self.name,
                        content=grad.content, call_id=grad.call_id or call_id, kind=kind,
                        parse_error=grad.parse_error, **claim_of(grad, kind))

    async def propose_update(self, ctx: RunContext, prompts: Prompts, node_id: str,
                             samples: list[UpdateSample], rejected: list[str]) -> UpdateProposal:
        """One update call: current prompt + (input, output, feedback) per sampled example."""
        current = prompts.text[node_id]
        shown = [{"input": s.input_text, "output": s.output_text,
                  "feedback": s.feedback if self.uses_gradients else ""} for s in samples]
        messages = ctx.prompt_set.update(node_id, current, shown, rejected)
        request = ctx.client.request("update", messages, max_tokens=ctx.optimizer_max_tokens,
                                     meta={"role": "update", "node": node_id, "prompt": current})
        record = await ctx.client.call(request, step=ctx.step, node_id=node_id)
        if record.error:
            return UpdateProposal(current, call_id=record.call_id, error=record.error)
        # a JSON reply (engine/prompts/structured.py) is read as its text form: same parser
        new_prompt, reasoning, problem = P.parse_prompt(S.reply_text(record.response, "update"))
        if not new_prompt:
            new_prompt = current
        return UpdateProposal(new_prompt, reasoning, record.call_id, problem)


def input_tasks(graph, prompts_text: dict[str, str], names: list[str]) -> dict[str, str]:
    """What the step that wrote each of `names` was told to do: an LLM node's current
    prompt, a Python tool's description (an example field has none)."""
    tasks = {}
    for name in names:
        if name in graph.node_ids:
            node = graph.node(name)
            task = prompts_text.get(name) if node.kind == "llm" else node.description
            if task:
                tasks[name] = task
    return tasks


def recorded_read(ctx: RunContext, trace: ExampleTrace, node_id: str,
                  shown: Collection[str] | None = None) -> str:
    """For a call imported from traces, the messages it read with its inputs tagged (those
    not in `shown` hidden): what a backward call shows of it instead of the bare inputs,
    so a passage or wording around them, or only the part of the pipeline's input the
    call was given, is what the optimizer reads. "" for any other node."""
    if not ctx.graph.node(node_id).recorded:
        return ""
    return marked_read(trace.example.fields.get(RECORDED_FIELD, ""), node_id,
                       trace.inputs[node_id], shown)


def asking_nodes(graph) -> list:
    """The nodes whose backward step is a model call: LLM nodes with inputs, and Python
    tools with inputs and a description (a registered rule or a bare tool makes none)."""
    return [n for n in graph.nodes if graph.predecessors(n.id) and (
        n.kind == "llm" or (n.fn is not None and bool(n.description)))]


def function_messages(function: str, message: str, values: dict[str, str],
                      predecessors: list[str]) -> dict[str, NodeGradient]:
    """A function node's registered backward rule (engine/core/functions.py), no call: one
    message per predecessor; a predecessor the rule gives nothing is left out."""
    split, note = function_backward(function, message, values)
    return {p: NodeGradient(split[p], None, note) for p in predecessors if split.get(p)}


async def ask_backward(ctx: RunContext, node_id: str, example_id: str, view: P.BackwardView,
                       role: str
                       ) -> tuple[dict[str, str], str | None, str | None, dict[str, bool]]:
    """One backward call showing `view` in the run's prompt set; returns (gradient per
    asked input, call_id, parse or call error, asks_change per input as the structured
    reply states it)."""
    names = view.asked
    request = ctx.client.request("backward", ctx.prompt_set.backward(view),
                                 max_tokens=ctx.optimizer_max_tokens,
                                 meta={"role": role, "node": node_id, "inputs": names})
    record = await ctx.client.call(request, step=ctx.step, node_id=node_id,
                                   example_id=example_id)
    if record.error:
        return ({n: "" for n in names}, record.call_id, f"backward call failed: {record.error}",
                {})
    grads, problem = P.parse_gradients(S.reply_text(record.response, role, names), names)
    claims = {n: c for n, c in S.reply_claims(record.response, names).items() if grads.get(n)}
    if len(names) > 1 and P.missing_gradients(grads):
        grads, problem = await repair_gradients(ctx, request, record.response, grads, problem,
                                                node_id, example_id, role)
    return grads, record.call_id, problem, claims


async def repair_gradients(ctx: RunContext, request, reply: str, grads: dict[str, str],
                           problem: str | None, node_id: str, example_id: str, role: str
                           ) -> tuple[dict[str, str], str | None]:
    """ONE follow-up call naming the inputs the reply had no block for. What it still
    leaves out stays empty, with the parse error saying so: an input never receives
    another input's text."""
    names, missing = list(grads), P.missing_gradients(grads)
    ask = ctx.prompt_set.repair(missing, names)
    repair = ctx.client.request("backward", [*request.messages, ("assistant", reply),
                                             ("user", ask)],
                                max_tokens=ctx.optimizer_max_tokens,
                                meta={"role": f"{role}_repair", "node": node_id,
                                      "inputs": missing})
    record = await ctx.client.call(repair, step=ctx.step, node_id=node_id,
                                   example_id=example_id)
    # parsed against every asked name, so "Hint i" keeps its original position
    fixed = {} if record.error else P.parse_gradients(
        S.reply_text(record.response, role, missing), names, whole_reply_for_one=False)[0]
    grads = {n: grads[n] or (fixed.get(n, "") if n in missing else "") for n in grads}
    still = P.missing_gradients(grads)
    note = f"no block for {', '.join(missing)}: " + (
        f"still none for {', '.join(still)} after one repair request: empty gradient" if still
        else "one repair request supplied it")
    earlier = (problem or "")[:(problem or "").rfind("no block for")].rstrip("; ")
    return grads, "; ".join(p for p in (earlier, note) if p)


def contrast_nodes(graph) -> list[str]:
    """The nodes whose backward call a sibling-blind method makes differently from a
    sibling-aware one: LLM nodes (or described tools) with two inputs or more. With one
    input there is no sibling to leave out."""
    return [n.id for n in asking_nodes(graph) if len(graph.predecessors(n.id)) > 1]


def contrast_calls(graph, contrast: str | None) -> int:
    """Calls `--contrast` adds per back-propagated example: one per (node, input) pair at
    the contrast nodes (both sibling-blind methods ask about one input a call)."""
    return 0 if not contrast else sum(len(graph.predecessors(n)) for n in contrast_nodes(graph))


async def contrast_gradients(ctx: RunContext, contrast: Method, prompts: Prompts,
                             trace: ExampleTrace, feedback: dict[str, str]) -> None:
    """The sibling-blind method's gradients on the same forward pass: at each contrast node
    that acted on feedback in the run's own backward pass, the `contrast` method's backward
    calls with that same aggregated feedback, recorded as kind 'contrast' (and the
    contrast method's name) beside the run's own. Nothing flows further from them and no
    update reads them: they show what the gradient would have said without the siblings."""
    async def one(node_id: str) -> None:
        grads = await contrast.node_gradients(ctx, prompts, trace, node_id, feedback[node_id])
        for pred in ctx.graph.predecessors(node_id):
            if pred in grads:
                ctx.emit(contrast._gradient(ctx, trace, pred, node_id, grads[pred],
                                            kind="contrast"))

    await asyncio.gather(*(one(n) for n in contrast_nodes(ctx.graph) if feedback.get(n)))
