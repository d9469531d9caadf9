"""Tokens per model call, for the estimate: the prompts a run will send, rendered from its
own prompt set on its own examples, with replies sized from what earlier runs of the same
graph recorded in the run log, each capped at the limit the call will ask for (the node's
`max_tokens`, else the run's, as engine.runs.execute.default_max_tokens gives it; a local
optimizer call with a JSON schema, at its schema's bound where that is larger).

- Forward: each LLM node's template rendered on every example of a split, with the
  example's fields and, for an upstream node's output, text of that node's usual output
  length (earlier runs' mean; without one, half its usual reply).
- Backward: the prompt set's backward template for each node that makes a backward call,
  on the training examples, with its output and the feedback it usually receives.
- Update: the update template with k such examples.
- Replies, in this order: what this graph's earlier runs on the model recorded (per node
  and kind); else what the model's earlier runs of any graph recorded (how long a model's
  replies run is a property of the model: a 0.5B model that writes 20 tokens on one graph
  writes about as much on the next); else what earlier runs of this graph on another model
  recorded; else, for a named embedded model, what it wrote on the sample graphs when we
  measured it (REFERENCE_REPLY); else a prior by backend (FIRST_REPLY, SCRIPTED_REPLY).
  The estimate's line names either of the last two, since no rule can know how much an
  unseen model writes.
- Characters become tokens at the rate the same model's earlier calls of that kind showed
  (prompt tokens / prompt characters; this graph's, else any graph's), else
  CHARS_PER_TOKEN.
- The optimizer's calls (backward, update) are sized from the model that writes them: the
  embedded pair's 1.5B for a run on the 0.5B, whose replies run about a third of the
  prior's.
- On a local model, seconds per generated token from earlier runs' steps on the same
  local models, of any graph (their wall time over their completion tokens, the optimizer
  model's included): the models' measured speed on this machine, as a run sees it (calls
  waiting for a context included). Before any run of the embedded pair on this machine, the
  pair's speed on the two-core machine it was measured on (REFERENCE_SPEED), which the
  line names as such.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.graph import GraphSpec
from engine.runlog.lake import is_lake

CHARS_PER_TOKEN = 4.0
# Reply tokens of a model no run in the run log has used, capped by the call's max_tokens:
# a forward reply "thinks briefly" (the template asks it to) then answers; a backward or
# update reply writes a paragraph per input. A model's replies may be several times
# shorter or longer: the estimate's line says when it rests on this prior.
FIRST_REPLY = {"forward": 160, "backward": 300, "update": 250}
# Reply tokens of the named embedded models before this run log has seen them: on the
# demo, the seven attribution graphs and the traced example (one run each, 2026-12-05, two
# cores, the reasoning field at 600 characters), each graph's mean reply, then the mean over
# graphs. The 1.5B's backward and update replies are its JSON (a few sentences of
# reasoning, then one field per input or the prompt): 93 to 129 tokens per graph. The
# 0.5B's forward replies are these graphs' short answers (a number, a word, a sentence):
# 5.5 to 17 tokens per graph; a task that asks for working writes more, up to the node's
# max_tokens. Their prior (FIRST_REPLY) is capped by the calls' limits and was 3 to 4 times
# what they write.
REFERENCE_REPLY = {"qwen2.5-coder-0.5b": {"forward": 9},
                   "qwen2.5-coder-1.5b": {"backward": 109, "update": 106}}
# The scripted backend's (engine/llm/scripted.py) replies are ours and short: a one-line
# note or an answer; one sentence per gradient; the prompt with one sentence added.
SCRIPTED_REPLY = {"forward": 10, "backward": 50, "update": 35}
FEEDBACK_CHARS = 400  # a gradient's length without history
OUTPUT_SHARE = 0.5  # of a reply's characters, the output passed on, without history
# The share of steps whose candidate passes the gate, before any run of the graph: on real
# models most joint candidates are rejected
ACCEPTED_PRIOR = 0.25
# The weight of ACCEPTED_PRIOR, in steps, when it is pooled with a graph's earlier steps, so
# that one lucky run does not decide the share
PRIOR_STEPS = 2
# Below this many earlier steps the prior still makes a tenth of the share or more, and one
# run's luck much of the rest (GSM8K on the fake server: a first run accepted 0 of 4 steps,
# five later seeds 1 of 4 each): the line says what the share rests on
FEW_STEPS = 9 * PRIOR_STEPS
# Seconds per prompt token and per completion token of a run on the default embedded pair
# (Qwen2.5-Coder-0.5B forward, 1.5B optimizer, each in its llama-server), a run's calls
# together, on a two-core machine: the least-squares fit of the wall time of 27 runs of 8
# graphs (the demo, the seven attribution graphs, the traced example; 2026-12-03..05) on
# their prompt and completion tokens. It times a first run on the pair, before the run log
# has measured this machine. On those runs its figure was 0.45x to 1.7x of the wall (the
# demo: 0.75x to 0.95x): how long a graph's calls take depends on how many wait for one
# another, which tokens alone do not say.
REFERENCE_SPEED = {("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"): (0.0039, 0.0100)}


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
    speed_measured: bool = True  # False: REFERENCE_SPEED, not this machine's
    # the share of steps whose candidate passes the gate: earlier runs' (with a prior of
    # PRIOR_STEPS steps at ACCEPTED_PRIOR, so one lucky run does not decide it), else the prior
    accepted_share: float = ACCEPTED_PRIOR
    # of a pass's forward calls, the share that are distinct requests (earlier runs'; 1
    # without): the others repeat a request of the same pass and are answered once
    distinct_share: float = 1.0
    # of the validation passes after step 0 (candidates, per-node gates), the share of
    # forward calls that were new requests to the run in earlier runs (None without
    # history): a candidate that leaves a node as it was, or repeats another's edit, asks
    # what the run already asked
    later_val_share: float | None = None
    # what the estimate assumed for want of history, for its line ("replies ~160 tokens")
    assumptions: list[str] = field(default_factory=list)

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
    # purpose -> mean completion tokens of the model's calls on any graph
    model_completion: dict[str, float] = field(default_factory=dict)
    output_chars: dict[str, float] = field(default_factory=dict)  # node -> output passed on
    chars_per_token: dict[str, float] = field(default_factory=dict)  # purpose -> rate
    feedback_chars: dict[str, float] = field(default_factory=dict)  # node -> gradient length
    speed: tuple[float, float] | None = None  # local model: s per prompt, completion token
    steps: tuple[int, int] = (0, 0)  # optimization steps accepted, of all
    distinct: tuple[int, int] = (0, 0)  # distinct forward requests, of forward calls
    later_val: tuple[int, int] = (0, 0)  # new requests, of validation calls after step 0


def _names(models: list[str]) -> list[str]:
    """The names a run log may record each of `models` under: as given and, for a GGUF
    file, its file name."""
    return list(dict.fromkeys(n for m in models for n in (m, Path(m).name)))


def read_history(db: str | None, graph_name: str, model: str, backend: str,
                 run_models: list[str] | None = None) -> History:
    """The history of `graph_name`, and of `model` on any graph, in the run log at `db` (an
    empty History when there is no run log or no earlier run). On a local model, its speed
    is measured over the steps whose calls ran on any of `run_models` (default: `model`):
    a run whose optimizer is another embedded model spends its steps' time on both."""
    if not db or not (is_lake(db) or Path(db).is_file()):
        return History()
    from engine.runlog.history import (
        accepted_share,
        call_size_history,
        forward_distinct_share,
        gradient_size_history,
        later_validation_share,
        local_step_throughput,
        model_call_history,
    )
    from engine.runlog.schema import RunLogError

    models = _names([model])
    try:
        calls = call_size_history(db, graph_name)
        own = model_call_history(db, models)
        feedback = gradient_size_history(db, graph_name)
        steps = accepted_share(db, graph_name)
        distinct = forward_distinct_share(db, graph_name)
        later_val = later_validation_share(db, graph_name)
    except RunLogError:
        return History()
    same = calls[calls["model"].isin(models)]
    # another model's runs of this graph size its calls only when this model has none
    calls = same if not same.empty or not own.empty else calls
    history = History(feedback_chars=feedback, steps=steps, distinct=distinct,
                      later_val=later_val)
    purpose = calls["purpose"].replace({"repair": "backward"})
    for (kind, node), group in calls.groupby([purpose, calls["node_id"].fillna("")]):
        history.completion[(kind, node)] = float(group["completion_tokens"].mean())
        if kind == "forward" and group["output_chars"].notna().any():
            history.output_chars[node] = float(group["output_chars"].mean())
    own_purpose = own["purpose"].replace({"repair": "backward"})
    for frame, kinds in ((own, own_purpose), (calls, purpose)):  # the graph's rate wins
        for kind, group in frame.groupby(kinds):
            if frame is own:
                history.model_completion[kind] = float(group["completion_tokens"].mean())
            chars = float(group["prompt_chars"].fillna(0).sum())
            if chars > 0:
                history.chars_per_token[kind] = chars / max(1.0, float(
                    group["prompt_tokens"].sum()))
    if backend == "local":
        seconds, _, completion = local_step_throughput(db, _names([model, *(run_models or [])]))
        if seconds > 0 and completion > 0:
            history.speed = (0.0, seconds / completion)
    return history


def measure_sizes(graph: GraphSpec, config: Any, splits: Any, model: str,
                  optimizer: str | None = None) -> CallSizes:
    """Call sizes for a run with `config` (a RunConfig) over `splits` (see the module
    docstring): forward calls sized from `model`'s history, backward and update calls from
    `optimizer`'s (default: the same model; the embedded pair's 1.5B writes the
    optimizer's calls of a 0.5B run)."""
    from engine.prompts.sets import prompt_set
    from engine.runs.execute import default_max_tokens

    optimizer = optimizer or model
    opt_backend = config.optimizer_backend or config.backend
    history = read_history(config.db, graph.name, model, config.backend,
                           run_models=[model, optimizer] if opt_backend == config.backend
                           else None)
    # the optimizer's calls, sized from the model that writes them
    opt_history = history if optimizer == model else read_history(
        config.db, graph.name, optimizer, opt_backend)
    histories = {"forward": history, "backward": opt_history, "update": opt_history}
    prompts = prompt_set(config.prompts)
    # the limits the run's calls will ask for (a local model's are smaller by default)
    forward_limit, optimizer_limit = default_max_tokens(config)
    limits = {"forward": forward_limit, "backward": optimizer_limit,
              "update": optimizer_limit}
    if opt_backend == "local" and config.structured != "off":
        limits.update(schema_limits(graph, optimizer_limit))
    llm = [n for n in graph.nodes if n.kind == "llm"]

    backends = {"forward": config.backend,
                "backward": config.optimizer_backend or config.backend}
    backends["update"] = backends["backward"]
    guessed: dict[str, list[float]] = {}  # kind -> the prior's replies, where one was used
    referenced: dict[str, list[float]] = {}  # kind -> REFERENCE_REPLY's, where one was used
    writers = {"forward": model, "backward": optimizer, "update": optimizer}

    def reply(kind: str, node: Any) -> float:
        cap = (node.max_tokens if node is not None and node.max_tokens else limits[kind])
        seen = histories[kind]
        recorded = seen.completion.get((kind, node.id if node is not None else ""))
        if recorded is None and kind != "forward":  # the kind's mean over its nodes
            same = [v for (k, _), v in seen.completion.items() if k == kind]
            recorded = sum(same) / len(same) if same else None
        if recorded is None:  # the model's replies of this kind on other graphs
            recorded = seen.model_completion.get(kind)
        if recorded is None and backends[kind] == "local":  # a named embedded model's
            measured = reference_reply(writers[kind], kind)
            if measured is not None:
                referenced.setdefault(kind, []).append(min(cap, measured))
                return referenced[kind][-1]
        if recorded is None:
            guessed.setdefault(kind, []).append(min(cap, first_reply(backends[kind])[kind]))
            return guessed[kind][-1]
        return min(cap, recorded)

    rate = {kind: histories[kind].chars_per_token.get(kind, CHARS_PER_TOKEN)
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
    elif backends["forward"] == backends["backward"] == "local":
        reference = reference_speed(model, optimizer)
        if reference is not None:
            sizes.speed, sizes.speed_measured = (*reference, 1), False
    accepted, steps = history.steps
    sizes.accepted_share = share_accepted(accepted, steps)
    if history.distinct[1]:
        sizes.distinct_share = history.distinct[0] / history.distinct[1]
    if history.later_val[1]:
        sizes.later_val_share = history.later_val[0] / history.later_val[1]
    sizes.assumptions = assumptions(guessed, steps, referenced, accepted)
    return sizes


def schema_limits(graph: GraphSpec, limit: int) -> dict[str, int]:
    """The token limits of the optimizer's calls on the local backend with structured
    replies: a schema's bound raises a call's own limit where it is larger
    (engine/llm/local.py `reply_tokens`; an OpenAI-compatible server is sent the run's
    limit and no length bounds), the largest over the nodes whose backward step asks."""
    from engine.core.backward import asking_nodes
    from engine.llm.schema import token_budget
    from engine.prompts.structured import schema_for

    backward = [token_budget(schema_for("backward_joint", graph.predecessors(n.id)) or {})
                for n in asking_nodes(graph)]
    return {"backward": max([limit, *backward]),
            "update": max(limit, token_budget(schema_for("update", []) or {}))}


def reference_speed(model: str, optimizer: str) -> tuple[float, float] | None:
    """REFERENCE_SPEED of the pair of named models `model` and `optimizer`, if measured."""
    from engine.llm.models import canonical_name

    return REFERENCE_SPEED.get((canonical_name(model), canonical_name(optimizer)))


def reference_reply(model: str, kind: str) -> float | None:
    """REFERENCE_REPLY's tokens for a `kind` reply of the named model `model`, if measured."""
    from engine.llm.models import canonical_name

    return REFERENCE_REPLY.get(canonical_name(model) or "", {}).get(kind)


def first_reply(backend: str | None) -> dict[str, int]:
    """Reply tokens by kind for a model with no run in the run log (see FIRST_REPLY)."""
    return SCRIPTED_REPLY if backend == "scripted" else FIRST_REPLY


def share_accepted(accepted: int, steps: int) -> float:
    """The share of steps expected to pass the gate: `accepted` of `steps` earlier steps,
    with ACCEPTED_PRIOR counted as PRIOR_STEPS steps, so one lucky run does not decide it."""
    return (accepted + PRIOR_STEPS * ACCEPTED_PRIOR) / (steps + PRIOR_STEPS)


def assumptions(guessed: dict[str, list[float]], steps: int,
                referenced: dict[str, list[float]] | None = None, accepted: int = 0
                ) -> list[str]:
    """What an estimate without history, or with little, assumes, in the words its line
    prints: `steps` earlier steps of the graph, `accepted` of them accepted."""
    def replies(sizes: dict[str, list[float]], why: str) -> str:
        return "replies of " + ", ".join(
            f"~{sum(v) / len(v):.0f} tokens ({k})" for k, v in sizes.items()) + f" ({why})"

    said = []
    if referenced:
        said.append(replies(referenced, "what these embedded models wrote on the sample "
                                        "graphs; no earlier run of them here"))
    if guessed:
        said.append(replies(guessed, "no earlier run of this model"))
    if not steps:
        said.append(f"{ACCEPTED_PRIOR:.0%} of steps accepted (no earlier step of this graph)")
    elif steps < FEW_STEPS:  # the share rests on a few steps and the prior: say which
        plural = "s" if steps != 1 else ""
        said.append(f"{share_accepted(accepted, steps):.0%} of steps accepted ({accepted} of "
                    f"{steps} earlier step{plural} of this graph, with the prior's "
                    f"{ACCEPTED_PRIOR:.0%} counted as {PRIOR_STEPS} steps)")
    return said


def _optimizer_sizes(graph, prompts, train, values, outputs, history, config, rate, reply
                     ) -> tuple[CallSize, CallSize]:
    from engine.core.backward import asking_nodes, input_tasks
    from engine.prompts.templates import OUTPUT_GRADIENT, BackwardView, render_inputs

    def feedback(node: Any, example: Any) -> str:
        if node.output:
            return OUTPUT_GRADIENT.format(target=example.target)
        return "x" * int(history.feedback_chars.get(node.id, FEEDBACK_CHARS))

    asking = asking_nodes(graph) or [n for n in graph.nodes if n.kind == "llm"]
    backward = [_chars(prompts.backward(BackwardView(
        n.prompt or n.description or "", values(n, ex), frozenset(graph.input_fields),
        "x" * int(outputs.get(n.id, 200)), feedback(n, ex),
        list(graph.predecessors(n.id)), input_tasks=input_tasks(
            graph, {m.id: m.prompt or "" for m in graph.nodes},
            list(graph.predecessors(n.id)))))) for n in asking for ex in train]
    trainable = [graph.node(n) for n in graph.trainable_nodes] or asking
    k = min(config.failures_per_step, len(train))
    update = [_chars(prompts.update(n.id, n.prompt or "", [
        {"input": render_inputs(values(n, ex)), "output": "x" * int(outputs.get(n.id, 200)),
         "feedback": feedback(n, ex)} for ex in train[:k]], [])) for n in trainable]
    return (CallSize(sum(backward) / len(backward) / rate["backward"], reply("backward", None)),
            CallSize(sum(update) / len(update) / rate["update"], reply("update", None)))


def _chars(messages: list[tuple[str, str]]) -> int:
    return sum(len(content) for _, content in messages)
