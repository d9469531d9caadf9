"""The forward pass of a run recorded through the gateway: the user's pipeline re-run.

Where an imported file's run replays its recorded calls (engine/traces/importer.py), a
run made by `trace --pipeline` re-runs the pipeline itself for every forward pass after
the first: the validation gate, probes and blame. `PipelineRerun.forward_example` is the
seam engine.core.forward calls (RunContext.rerun): it registers the pass's prompts (and a
probe's patched replies) as a candidate on the gateway, runs the pipeline on the example
under its own session, and reads each node's activation back from the calls the gateway
answered in that session: a node's output is its last call's reply, read as the pipeline
read it at import; the output node's is what the pipeline returned. A node the re-run
never called has an empty output; a call that matches no node (a branch the recorded
traces never showed) is listed in `notes`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from engine.core.forward import ExampleTrace, Prompts, RunContext, input_text, node_inputs
from engine.core.graph import GraphSpec
from engine.data.examples import Example
from engine.events import Activation, CallRecord
from engine.gateway.calls import reply_text
from engine.gateway.interventions import Candidate, NodeRule
from engine.gateway.runner import Runner
from engine.gateway.server import Gateway, Seen
from engine.prompts.recorded import RECORDED_FIELD, node_spec, recorded_output

# the example field holding the pipeline's own input fields (JSON), which a re-run calls it with
PIPELINE_FIELDS = "pipeline_fields"


def node_rules(graph: GraphSpec, examples: list[Example]) -> list[NodeRule]:
    """Each recorded node's prompt as the pipeline sends it, and how it sits in the call."""
    rules = []
    for node in graph.nodes:
        if not node.recorded:
            continue
        spec = next((s for e in examples if (s := node_spec(
            e.fields.get(RECORDED_FIELD, ""), node.id)) is not None), None) or {}
        rules.append(NodeRule(node.id, node.prompt, spec.get("system")))
    return rules


def wire_reply(spec: dict[str, Any] | None, value: str) -> str:
    """A node's output as the reply text that its pipeline reads as that output."""
    how = (spec or {}).get("reply") or {}
    if how.get("format") == "tool_arguments":
        tools = (spec or {}).get("tools") or {}
        choice = tools.get("tool_choice")
        name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) \
            else None
        name = name or next(((t.get("function") or {}).get("name") for t in
                             tools.get("tools") or []), "tool")
        return f'<tool_call name="{name}">{value}</tool_call>'
    if how.get("format") == "fields":
        if "fields" in how:
            try:
                values = json.loads(value)
            except json.JSONDecodeError:
                values = {how["fields"][0]: value}
        else:
            values = {how["field"]: value}
        return "\n\n".join(f"[[ ## {k} ## ]]\n{v}" for k, v in values.items()) + \
            "\n\n[[ ## completed ## ]]"
    return value


@dataclass
class PipelineRerun:
    """Re-runs a pipeline for a run's forward passes (RunContext.rerun)."""

    gateway: Gateway
    runner: Runner
    graph: GraphSpec
    rules: list[NodeRule]
    notes: list[str] = field(default_factory=list)

    def candidate(self, prompts: Prompts, replies: dict[str, str]) -> str:
        text = json.dumps([sorted(prompts.text.items()), sorted(replies.items())])
        name = hashlib.sha256(text.encode()).hexdigest()[:16]
        if name not in self.gateway.candidates:
            self.gateway.candidates[name] = Candidate(name, self.rules, dict(prompts.text),
                                                      dict(replies))
        return name

    async def forward_example(self, ctx: RunContext, prompts: Prompts, example: Example,
                              split: str, fixed: dict[str, Activation] | None = None
                              ) -> ExampleTrace:
        recorded = example.fields.get(RECORDED_FIELD, "")
        replies = {n: wire_reply(node_spec(recorded, n), a.output_text)
                   for n, a in (fixed or {}).items()}
        candidate = self.candidate(prompts, replies)
        session = f"{ctx.step}-{split}-{_safe(example.id)}-{candidate[:8]}-" \
                  f"{secrets.token_hex(4)}"
        fields = json.loads(example.fields.get(PIPELINE_FIELDS) or "{}")
        started = time.time()
        outcome = await self.runner.run(fields, session, candidate)
        seen = self.gateway.done(session)
        trace = ExampleTrace(example)
        by_node: dict[str, list[Seen]] = {}
        for call in seen:
            if call.node is None:
                note = ("a re-run made a call that matches no node of the run (a branch "
                        f"its traces never showed): {_first_words(call.request)}")
                if note not in self.notes:
                    self.notes.append(note)
                continue
            by_node.setdefault(call.node, []).append(call)
        for node_id in ctx.graph.topological_order():
            node = ctx.graph.node(node_id)
            values, failed = node_inputs(node, example, trace.activations)
            trace.inputs[node.id] = values
            calls = by_node.get(node.id, [])
            call_id = None
            for call in calls:
                call_id = self._emit_call(ctx, example, node.id, call, started)
            if fixed and node.id in fixed:
                activation = fixed[node.id]
            else:
                raw = reply_text(calls[-1].completion) if calls else ""
                output, problem = recorded_output(recorded, node.id, raw) if calls \
                    else ("", None)
                error = None
                if node.output:
                    if outcome.error:
                        error = f"the pipeline failed: {outcome.error}"
                    else:
                        output, problem = outcome.output or "", None
                activation = Activation(
                    ctx.run_id, ctx.step, split, example.id, node.id,
                    prompts.version.get(node.id, 0), input_text(example, node, values),
                    output, error, raw, problem, call_id)
            trace.activations[node.id] = activation
        for activation in trace.activations.values():
            ctx.emit(activation)
        return trace

    def _emit_call(self, ctx: RunContext, example: Example, node_id: str, call: Seen,
                   started: float) -> str:
        usage = call.completion.get("usage") or {}
        record = CallRecord(
            call_id=secrets.token_hex(8), run_id=ctx.run_id, step=ctx.step,
            example_id=example.id, node_id=node_id, purpose="forward", backend="gateway",
            model=str(call.request.get("model") or ""),
            messages=json.dumps(call.request.get("messages") or [], ensure_ascii=False),
            response=reply_text(call.completion),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_ms=call.latency_ms, cache_hit=call.cache_hit, started_at=started,
            finish_reason="stop")
        on_call = getattr(ctx.client, "on_call", None)  # a run's writer, or a prober
        (on_call or ctx.emit)(record)
        return record.call_id


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:48]


def _first_words(request: dict[str, Any]) -> str:
    messages = request.get("messages") or []
    text = str((messages[0] or {}).get("content") or "") if messages else ""
    return " ".join(text.split()[:12])
