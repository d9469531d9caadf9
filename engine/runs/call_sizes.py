"""Tokens per model call, for the estimate: the prompts a run will send, rendered from its
own prompt set on its own examples, with replies sized from what earlier runs of the same
graph recorded in the run log (else from the node's `max_tokens`).

- Forward: each LLM node's template rendered on every example of a split, with the
  example's fields and, for an upstream node's output, text of that node's usual output
  length (earlier runs' mean; without one, half its usual reply).
- Backward: the prompt set's backward template for each node that makes a backward call,
  on the training examples, with its output and the feedback it usually receives.
- Update: the update template with k such examples.
- Characters become tokens at the rate the same model's earlier calls of that kind showed
  (prompt tokens / prompt characters), else CHARS_PER_TOKEN.
- On a local model, seconds per generated token from earlier runs' steps on the same
  local model, of any graph (their wall time over their completion tokens): the model's
  measured speed on this machine, as a run sees it (calls waiting for a context included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.core.graph import GraphSpec

CHARS_PER_TOKEN = 4.0
# Reply tokens without history, capped by the call's max_tokens: a forward reply "thinks
# briefly" then answers; a backward or update reply writes a paragraph per input.
FIRST_REPLY = {"forward": 160, "backward": 300, "update": 250}
FEEDBACK_CHARS = 400  # a gradient's length without history
OUTPUT_SHARE = 0.5  # of a reply's characters, the output passed on, without history
# The share of steps whose candidate passes the gate, before any run of the graph: on real
# models most joint candidates are rejected
ACCEPTED_PRIOR = 0.25


@dataclass
class CallSize:
    prompt: float
    completion: float

    @property
    def total(self) -> float:
        return self.prompt + self.completion


@dataclass
class CallSizes:
    """Mean tokens of one call by kind: `forward[split]` (over the graph's LLM nodes and the
    split's examples), `backward`, `update`; `seconds` per call where measured."""

    forward: dict[str, CallSize] = field(default_factory=dict)
    backward: CallSize = field(default_factory=lambda: CallSize(1500, 400))
    update: CallSize = field(default_factory=lambda: CallSize(1500, 400))
    # (seconds per prompt token, per completion token, calls at once) of a local model
    speed: tuple[float, float, int] | None = None
    # the share of steps whose candidate passes the gate: earlier runs' (with a prior of
    # two steps at ACCEPTED_PRIOR, so one lucky run does not decide it), else the prior
    accepted_share: float = ACCEPTED_PRIOR
    # of a pass's forward calls, the share that are distinct requests (earlier runs'; 1
    # without): the others repeat a request of the same pass and are answered once
    distinct_share: float = 1.0

    def for_phase(self, purpose: str, split: str | None) -> CallSize:
        if purpose == "forward":
            return self.forward.get(split or "", CallSize(600, 200))
        return self.update if purpose == "update" else self.backward

    def seconds(self, size: CallSize) -> float | None:
        if self.speed is None:
            return None
        per_prompt, per_completion, _ = self.speed
        return per_prompt * size.prompt + per_completion * size.completion


@dataclass
class History:
    """What earlier runs of a graph recorded, reduced to what sizing needs."""

    completion: dict[tuple[str, str], float] = field(default_factory=dict)  # (purpose, node)
    output_chars: dict[str, float] = field(default_factory=dict)  # node -> output passed on
    chars_per_token: dict[str, float] = field(default_factory=dict)  # purpose -> rate
    feedback_chars: dict[str, float] = field(default_factory=dict)  # node -> gradient length
    speed: tuple[float, float] | None = None  # local model: s per prompt, completion token
    steps: tuple[int, int] = (0, 0)  # optimization steps accepted, of all
    distinct: tuple[int, int] = (0, 0)  # distinct forward requests, of forward calls


def read_history(db: str | None, graph_name: str, model: str, backend: str) -> History:
    """The history of `graph_name` in the run log at `db` (an empty History when there is
    no run log or no earlier run)."""
    from pathlib import Path

    if not db or not Path(db).is_file():
        return History()
    from engine.runlog.history import (
        accepted_share,
        call_size_history,
        forward_distinct_share,
        gradient_size_history,
        local_step_throughput,
    )
    from engine.runlog.schema import RunLogError

    try:
        calls = call_size_history(db, graph_name)
        feedback = gradient_size_history(db, graph_name)
        steps = accepted_share(db, graph_name)
        distinct = forward_distinct_share(db, graph_name)
    except RunLogError:
        return History()
    calls = calls[calls["model"].isin([model])] if model in set(calls["model"]) else calls
    history = History(feedback_chars=feedback, steps=steps, distinct=distinct)
    purpose = calls["purpose"].replace({"repair": "backward"})
    for (kind, node), group in calls.groupby([purpose, calls["node_id"].fillna("")]):
        history.completion[(kind, node)] = float(group["completion_tokens"].mean())
        if kind == "forward" and group["output_chars"].notna().any():
            history.output_chars[node] = float(group["output_chars"].mean())
    for kind, group in calls.groupby(purpose):
        chars = float(group["prompt_chars"].fillna(0).sum())
        if chars > 0:
            history.chars_per_token[kind] = chars / max(1.0, float(group["prompt_tokens"].sum()))
    if backend == "local":
        # a GGUF file is logged by its file name
        seconds, _, completion = local_step_throughput(db, [model, Path(model).name])
        if seconds > 0 and completion > 0:
            history.speed = (0.0, seconds / completion)
    return history


def measure_sizes(graph: GraphSpec, config: Any, splits: Any, model: str) -> CallSizes:
    """Call sizes for a run with `config` (a RunConfig) over `splits` (see the module
    docstring)."""
    from engine.prompts.sets import prompt_set

    history = read_history(config.db, graph.name, model, config.backend)
    prompts = prompt_set(config.prompts)
    limits = {"forward": config.max_tokens or 512, "backward": config.optimizer_max_tokens
              or 768, "update": config.optimizer_max_tokens or 768}
    llm = [n for n in graph.nodes if n.kind == "llm"]

    def reply(kind: str, node: Any) -> float:
        cap = (node.max_tokens if node is not None and node.max_tokens else limits[kind])
        recorded = history.completion.get((kind, node.id if node is not None else ""))
        if recorded is None and kind != "forward":  # the kind's mean over its nodes
            same = [v for (k, _), v in history.completion.items() if k == kind]
            recorded = sum(same) / len(same) if same else None
        return min(cap, recorded if recorded is not None else FIRST_REPLY[kind])

    rate = {kind: history.chars_per_token.get(kind, CHARS_PER_TOKEN)
            for kind in ("forward", "backward", "update")}
    outputs = {n.id: history.output_chars.get(n.id, reply("forward", n) * rate["forward"]
                                              * OUTPUT_SHARE) for n in llm}
    outputs.update({n.id: 200.0 for n in graph.nodes if n.kind != "llm"})

    def values(node: Any, example: Any) -> dict[str, str]:
        return {name: "x" * int(outputs[name]) if name in outputs
                else str(example.fields.get(name, "")) for name in node.inputs}

    sizes = CallSizes()
    for split in ("train", "val", "test"):
        examples = list(getattr(splits, split))
        if not examples or not llm:
            continue
        chars = [_chars(prompts.forward(n.prompt, values(n, ex), graph.answer_format
                                        if n.output else "", frozenset(graph.input_fields)))
                 for n in llm for ex in examples]
        sizes.forward[split] = CallSize(sum(chars) / len(chars) / rate["forward"],
                                        sum(reply("forward", n) for n in llm) / len(llm))
    train = list(splits.train)[:8]
    if train:
        sizes.backward, sizes.update = _optimizer_sizes(
            graph, prompts, train, values, outputs, history, config, rate, reply)
    if history.speed is not None:  # a throughput: the calls at once are in it already
        sizes.speed = (*history.speed, 1)
    accepted, steps = history.steps
    sizes.accepted_share = (accepted + 2 * ACCEPTED_PRIOR) / (steps + 2)
    if history.distinct[1]:
        sizes.distinct_share = history.distinct[0] / history.distinct[1]
    return sizes


def _optimizer_sizes(graph, prompts, train, values, outputs, history, config, rate, reply
                     ) -> tuple[CallSize, CallSize]:
    from engine.core.backward import asking_nodes
    from engine.prompts.templates import OUTPUT_GRADIENT, BackwardView, render_inputs

    def feedback(node: Any, example: Any) -> str:
        if node.output:
            return OUTPUT_GRADIENT.format(target=example.target)
        return "x" * int(history.feedback_chars.get(node.id, FEEDBACK_CHARS))

    asking = asking_nodes(graph) or [n for n in graph.nodes if n.kind == "llm"]
    backward = [_chars(prompts.backward(BackwardView(
        n.prompt or n.description or "", values(n, ex), frozenset(graph.input_fields),
        "x" * int(outputs.get(n.id, 200)), feedback(n, ex),
        list(graph.predecessors(n.id))))) for n in asking for ex in train]
    trainable = [graph.node(n) for n in graph.trainable_nodes] or asking
    k = min(config.failures_per_step, len(train))
    update = [_chars(prompts.update(n.id, n.prompt or "", [
        {"input": render_inputs(values(n, ex)), "output": "x" * int(outputs.get(n.id, 200)),
         "feedback": feedback(n, ex)} for ex in train[:k]], [])) for n in trainable]
    return (CallSize(sum(backward) / len(backward) / rate["backward"], reply("backward", None)),
            CallSize(sum(update) / len(update) / rate["update"], reply("update", None)))


def _chars(messages: list[tuple[str, str]]) -> int:
    return sum(len(content) for _, content in messages)
