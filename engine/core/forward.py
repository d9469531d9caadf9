"""The forward pass: every (example, node) activation runs as soon as its inputs exist.

One asyncio task per activation awaits the tasks of its predecessors, so there is no
polling; the client's semaphore bounds how many calls are in flight. A failed call
marks that example failed (downstream nodes record an upstream failure), never the
whole evaluation.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.functions import FUNCTIONS
from engine.core.graph import GraphSpec, Node
from engine.data.examples import Example
from engine.events import Activation
from engine.llm.client import LLMClient
from engine.prompts import templates as P
from engine.prompts.recorded import (
    RECORDED_FIELD,
    marked_read,
    recorded_messages,
    recorded_output,
    recorded_tools,
)


@dataclass(frozen=True)
class Prompts:
    """The graph's parameters: each node's prompt text and its version number."""

    text: dict[str, str]
    version: dict[str, int]

    @classmethod
    def initial(cls, graph: GraphSpec) -> Prompts:
        # a function node's text is its description: its task in a joint backward call
        return cls({n.id: n.prompt or n.description for n in graph.nodes},
                   {n.id: 0 for n in graph.nodes})

    def updated(self, changes: dict[str, tuple[int, str]]) -> Prompts:
        text, version = dict(self.text), dict(self.version)
        for node_id, (v, t) in changes.items():
            text[node_id], version[node_id] = t, v
        return replace(self, text=text, version=version)


@dataclass
class ExampleTrace:
    """All activations of one example, keyed by node id."""

    example: Example
    activations: dict[str, Activation] = field(default_factory=dict)
    inputs: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def error(self) -> str | None:
        errors = [a.error for a in self.activations.values() if a.error]
        return errors[0] if errors else None

    def output(self, node_id: str) -> str:
        return self.activations[node_id].output_text


@dataclass
class SharedCalls:
    """Node calls shared by forward passes that run together over the same examples (a
    step's joint validation pass and its per-node gate passes): an identical call (same
    example, node, prompt version and inputs) is made once and its activation shared, so
    the passes add no round trips and no duplicate calls. `used` records, per pass label,
    which calls it needed; `cache_hit` whether each call was answered from the cache."""

    calls: dict[tuple, asyncio.Task] = field(default_factory=dict)
    used: dict[str, set[tuple]] = field(default_factory=dict)
    cache_hit: dict[tuple, bool] = field(default_factory=dict)

    def extra(self, besides: str) -> set[tuple]:
        """Calls that passes other than `besides` needed and `besides` did not."""
        others = set().union(*(keys for name, keys in self.used.items() if name != besides))
        return others - self.used.get(besides, set())


@dataclass
class RunContext:
    """What every phase of a step needs; passed down instead of globals."""

    graph: GraphSpec
    client: LLMClient
    emit: Callable[[Any], None]
    run_id: str
    step: int
    max_tokens: int = 512
    optimizer_max_tokens: int = 768
    prompt_set: P.PromptSet = P.DEFAULT  # --prompts default | paper
    shared: SharedCalls | None = None  # set while passes run together (the gate phase)
    pass_label: str = ""  # this pass's name in `shared.used`
    # a run recorded through the gateway: each example's forward pass re-runs the user's
    # pipeline (engine.gateway.rerun.PipelineRerun) instead of calling node by node
    rerun: Any = None


async def forward_pass(ctx: RunContext, prompts: Prompts, examples: list[Example],
                       split: str) -> list[ExampleTrace]:
    """Run the graph on every example concurrently; returns traces in example order."""
    return list(await asyncio.gather(*(forward_example(ctx, prompts, ex, split)
                                       for ex in examples)))


def node_inputs(node: Node, example: Example, upstream: Mapping[str, Activation]
                ) -> tuple[dict[str, str], str | None]:
    """A node's input values, in its declared order: an upstream node's output, else the
    example's field ("" when missing); and the first upstream node that failed, if any."""
    values: dict[str, str] = {}
    for name in node.inputs:
        if name in upstream:
            if upstream[name].error:
                return values, name
            values[name] = upstream[name].output_text
        else:
            values[name] = example.fields.get(name, "")
    return values, None


async def forward_example(ctx: RunContext, prompts: Prompts, example: Example, split: str,
                          fixed: dict[str, Activation] | None = None) -> ExampleTrace:
    """One example through the graph. Nodes in `fixed` are not run: their given activation
    stands (a patch, as in engine/probes/diff.py), and what depends on them runs on it."""
    if ctx.rerun is not None:
        return await ctx.rerun.forward_example(ctx, prompts, example, split, fixed)
    trace = ExampleTrace(example)
    tasks: dict[str, asyncio.Task] = {}

    async def run(node: Node) -> Activation:
        if fixed and node.id in fixed:
            return fixed[node.id]
        upstream = {name: await tasks[name] for name in node.inputs if name in tasks}
        values, failed = node_inputs(node, example, upstream)
        if failed:
            return _activation(ctx, split, example, node, prompts, values,
                               error=f"upstream node '{failed}' failed")
        trace.inputs[node.id] = values
        if node.kind == "function":
            output, error = await call_function(node, values)
            return _activation(ctx, split, example, node, prompts, values, output=output,
                               error=error)
        return await _shared_call(ctx, prompts, example, node, values, split)

    for node_id in ctx.graph.topological_order():
        tasks[node_id] = asyncio.ensure_future(run(ctx.graph.node(node_id)))
    try:
        for node_id, task in tasks.items():
            trace.activations[node_id] = await task
    except BaseException:  # e.g. the model is unavailable: stop this example's other nodes
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        raise
    for activation in trace.activations.values():
        ctx.emit(activation)
    return trace


async def call_function(node: Node, values: dict[str, str]) -> tuple[str, str | None]:
    """Apply a function node to its input values (in declared order): a bound Python
    callable, sync or async, or a registered function. Whatever it raises fails this
    example, with the exception recorded as the activation's error, as a failed call is."""
    fn = node.fn or FUNCTIONS[node.function]
    try:
        result = fn(*values.values())
        if inspect.isawaitable(result):
            result = await result
    except Exception as exc:  # noqa: BLE001 - a user's tool may raise anything
        return "", f"function '{node.function}' raised {exc.__class__.__name__}: {exc}"
    return ("" if result is None else str(result)), None


async def _shared_call(ctx: RunContext, prompts: Prompts, example: Example, node: Node,
                       values: dict[str, str], split: str) -> Activation:
    shared = ctx.shared
    if shared is None:
        return await call_node(ctx, prompts, example, node, values, split)
    key = (split, example.id, node.id, prompts.version.get(node.id, 0), prompts.text[node.id],
           tuple(values.items()))
    shared.used.setdefault(ctx.pass_label, set()).add(key)
    if key not in shared.calls:
        records: list = []

        async def call() -> Activation:
            activation = await call_node(ctx, prompts, example, node, values, split, records)
            shared.cache_hit[key] = bool(records and records[0].cache_hit)
            return activation

        shared.calls[key] = asyncio.ensure_future(call())
    return await asyncio.shield(shared.calls[key])


async def call_node(ctx: RunContext, prompts: Prompts, example: Example, node: Node,
                     values: dict[str, str], split: str, records: list | None = None
                     ) -> Activation:
    tools = None
    if node.recorded:  # a call imported from traces: the pipeline's own messages
        recorded = example.fields.get(RECORDED_FIELD, "")
        messages = recorded_messages(prompts.text[node.id], recorded, node.id, values)
        tools = recorded_tools(recorded, node.id)
    else:
        answer_format = ctx.graph.answer_format if node.output else ""
        messages = ctx.prompt_set.forward(prompts.text[node.id], values, answer_format,
                                          frozenset(ctx.graph.input_fields))
    request = ctx.client.request(
        "forward", messages, max_tokens=node.max_tokens or ctx.max_tokens,
        stop=() if node.recorded else ctx.prompt_set.forward_stop,
        meta={"role": "forward", "node": node.id, "output_node": node.output,
              "inputs": list(node.inputs)}, tools=tools)
    record = await ctx.client.call(request, step=ctx.step, node_id=node.id,
                                   example_id=example.id)
    if records is not None:
        records.append(record)
    if record.error:
        return _activation(ctx, split, example, node, prompts, values, error=record.error,
                           call_id=record.call_id)
    # a recorded call's reply is read as the pipeline read it (as it came, or the fields
    # its framework parsed out): no output tags to look for
    output, problem = recorded_output(example.fields.get(RECORDED_FIELD, ""), node.id,
                                      record.response) if node.recorded else P.parse_output(
        record.response, stopped=bool(request.stop) and record.finish_reason != "length")
    return _activation(ctx, split, example, node, prompts, values, output=output,
                       raw=record.response, parse_error=problem, call_id=record.call_id)


def input_text(example: Example, node: Node, values: dict[str, str]) -> str:
    """What the node read, as logged and shown to the optimizer: its inputs as blocks, or
    for a call imported from traces, its recorded messages with each input tagged where it
    sits (the passage or wording around them is part of what it read)."""
    read = marked_read(example.fields.get(RECORDED_FIELD, ""), node.id, values) \
        if node.recorded else ""
    return read or P.render_inputs(values)


def _activation(ctx: RunContext, split: str, example: Example, node: Node, prompts: Prompts,
                values: dict[str, str], *, output: str = "", error: str | None = None,
                raw: str = "", parse_error: str | None = None, call_id: str | None = None
                ) -> Activation:
    return Activation(
        run_id=ctx.run_id, step=ctx.step, split=split, example_id=example.id, node_id=node.id,
        prompt_version=prompts.version.get(node.id, 0),
        input_text=input_text(example, node, values),
        output_text=output, error=error, raw_text=raw, parse_error=parse_error,
        call_id=call_id)
