"""The GTBP method: target back-propagation over the graph, and the claim-list update.

See the package docstring (engine/methods/gtbp/__init__.py) for the method, and
docs/methods.md for where this project extends the paper.
"""

from __future__ import annotations

import asyncio

from engine.core.backward import (
    Method,
    NodeGradient,
    UpdateProposal,
    UpdateSample,
    function_messages,
)
from engine.core.forward import ExampleTrace, Prompts, RunContext
from engine.events import LossRecord
from engine.methods.gtbp import replies
from engine.methods.gtbp.claims import (
    edit_budget,
    enforce_budget,
    may_add_claim,
    parse_claims_reply,
    render_claims,
    split_claims,
)
from engine.methods.gtbp.targets import parse_inferred_input, parse_target
from engine.methods.gtbp.templates import (
    ADD_ALLOWED,
    ADD_CAP,
    ADD_FORBIDDEN,
    ADD_FORBIDDEN_DELETE,
    CHANGE_NO_DELETE,
    CHANGE_WITH_DELETE,
    GTBP_COMBINE,
    GTBP_EXAMPLE,
    GTBP_INPUT,
    GTBP_SYSTEM,
    GTBP_UPDATE,
)
from engine.prompts import structured as S
from engine.prompts import templates as P


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"gtbp option {name} must be a whole number above 0, not {value!r}")
    return value


def _flag(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
        return value.lower() in ("true", "yes", "on")
    if value in (0, 1):
        return bool(value)
    raise ValueError(f"gtbp option {name} must be true or false, not {value!r}")


class GTBP(Method):
    name = "gtbp"
    form_options = (("m0", "gtbp: initial edit budget m0", 2),
                    ("m_plus", "gtbp: a new claim every m+ steps", 2),
                    ("m_minus", "gtbp: budget shrinks every m- steps", 2))

    @classmethod
    def reply_roles(cls) -> tuple[str, ...]:
        return replies.ROLES

    @classmethod
    def backward_calls(cls, graph) -> int:
        """One input call per node with inputs, and one combine call per node with several
        successors."""
        return super().backward_calls(graph) + sum(
            1 for n in graph.nodes if len(graph.successors(n.id)) > 1)

    def __init__(self, m0: int = 2, m_plus: int = 2, m_minus: int = 2,
                 max_claims: int | None = None, allow_delete: bool | str = False):
        """Defaults follow the paper: no cap on claims, no deletion (prompts only grow).
        `max_claims` and `allow_delete` are this project's options."""
        self.m0 = _positive("m0", m0)
        self.m_plus = _positive("m_plus", m_plus)
        self.m_minus = _positive("m_minus", m_minus)
        self.max_claims = None if max_claims is None else _positive("max_claims", max_claims)
        self.allow_delete = _flag("allow_delete", allow_delete)

    def edit_budget(self, step: int) -> int:
        return edit_budget(step, self.m0, self.m_minus)

    def may_add_claim(self, step: int) -> bool:
        return may_add_claim(step, self.m_plus)

    async def backward(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                       loss: LossRecord) -> dict[str, str]:
        """Back-propagate targets for one example; returns the target each node acted on."""
        graph = ctx.graph
        received: dict[str, list[tuple[str, str]]] = {n: [] for n in graph.node_ids}
        acted_on: dict[str, str] = {}
        done = {n: asyncio.Event() for n in graph.node_ids}
        output = graph.output_node.id
        if trace.example.target.strip():
            received[output].append(("loss", trace.example.target))
            ctx.emit(self._gradient(ctx, trace, output, "loss",
                                    NodeGradient(trace.example.target), loss.call_id,
                                    kind="target"))

        async def visit(node_id: str) -> None:
            for successor in graph.successors(node_id):
                await done[successor].wait()
            rank = {s: i for i, s in enumerate(["loss", *graph.successors(node_id)])}
            targets = sorted(received[node_id], key=lambda m: rank[m[0]])  # fixed order
            if targets:
                combined = (NodeGradient(targets[0][1]) if len(targets) == 1 else
                            await self.combine_targets(ctx, prompts, trace, node_id, targets))
                acted_on[node_id] = combined.content
                ctx.emit(self._gradient(ctx, trace, node_id, None, combined, kind="aggregate"))
                if combined.content and graph.predecessors(node_id):
                    await self._send_targets(ctx, prompts, trace, node_id, combined.content,
                                             received)
            done[node_id].set()

        await asyncio.gather(*(visit(n) for n in reversed(graph.topological_order())))
        return acted_on

    async def _send_targets(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                            node_id: str, target: str,
                            received: dict[str, list[tuple[str, str]]]) -> None:
        predecessors = ctx.graph.predecessors(node_id)
        node = ctx.graph.node(node_id)
        if node.kind == "function" and node.fn is None:  # a registered rule
            grads = function_messages(node.function or "", target, trace.inputs[node_id],
                                      predecessors)
        elif node.kind == "function" and not node.description:  # a bare Python tool
            grads = {p: NodeGradient(target) for p in predecessors}
        else:  # an LLM node, or a Python tool whose description is its task
            inferred, call_id, problem = await self.infer_input(ctx, prompts, trace, node_id,
                                                                target)
            ctx.emit(self._gradient(ctx, trace, node_id, None,
                                    NodeGradient(P.render_inputs(inferred), call_id, problem),
                                    kind="inferred_input"))
            grads = {p: NodeGradient(inferred[p], call_id, problem) for p in predecessors}
        for pred in (p for p in predecessors if p in grads):  # declared order
            if grads[pred].content:
                received[pred].append((node_id, grads[pred].content))
            ctx.emit(self._gradient(ctx, trace, pred, node_id, grads[pred], kind="target"))

    async def combine_targets(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                              node_id: str, targets: list[tuple[str, str]]) -> NodeGradient:
        """One call that sees every successor's target (in the given order) and states one."""
        listed = "\n".join(f'<target from="{src}">\n{text}\n</target>' for src, text in targets)
        user = GTBP_COMBINE.format(prompt=prompts.text[node_id],
                                   inputs=P.render_inputs(trace.inputs[node_id]),
                                   output=trace.output(node_id), targets=listed)
        request = ctx.client.request(
            "backward", [("system", GTBP_SYSTEM), ("user", user)],
            max_tokens=ctx.optimizer_max_tokens,
            meta={"role": "gtbp_combine", "node": node_id,
                  "targets": [t for _, t in targets], "from": [s for s, _ in targets]})
        record = await ctx.client.call(request, step=ctx.step, node_id=node_id,
                                       example_id=trace.example.id)
        fallback = P.aggregate_feedback(targets)
        if record.error:
            return NodeGradient(fallback, record.call_id,
                                f"combine call failed ({record.error}): used the targets as a list")
        target, problem = parse_target(S.reply_text(record.response, "gtbp_combine"))
        if not target:
            return NodeGradient(fallback, record.call_id, "empty combine reply: used the "
                                "targets as a list")
        return NodeGradient(target, record.call_id, problem)

    async def infer_input(self, ctx: RunContext, prompts: Prompts, trace: ExampleTrace,
                          node_id: str, target: str
                          ) -> tuple[dict[str, str], str | None, str | None]:
        """One call for Î_v: one value per input name (example fields included)."""
        actual = trace.inputs[node_id]
        names = list(ctx.graph.node(node_id).inputs)
        fields = [n for n in names if n in ctx.graph.input_fields]
        preds = ctx.graph.predecessors(node_id)
        blocks = "\n".join(P.INPUT_BLOCK.format(name=n, value=f"the input {n} as it should be")
                           for n in names)
        user = GTBP_INPUT.format(prompt=prompts.text[node_id], inputs=P.render_inputs(actual),
                                 output=trace.output(node_id), target=target,
                                 fields=", ".join(fields) or "none", names=", ".join(preds),
                                 blocks=blocks)
        request = ctx.client.request(
            "backward", [("system", GTBP_SYSTEM), ("user", user)],
            max_tokens=ctx.optimizer_max_tokens,
            meta={"role": "gtbp_input", "node": node_id, "inputs": names, "fields": fields,
                  "values": dict(actual), "target": target})
        record = await ctx.client.call(request, step=ctx.step, node_id=node_id,
                                       example_id=trace.example.id)
        if record.error:
            empty = {n: (actual.get(n, "") if n in fields else "") for n in names}
            return empty, record.call_id, f"input call failed: {record.error}"
        inferred, problem = parse_inferred_input(S.reply_text(record.response, "gtbp_input", names),
                                                 names, set(fields), actual)
        return inferred, record.call_id, problem

    async def propose_update(self, ctx: RunContext, prompts: Prompts, node_id: str,
                             samples: list[UpdateSample], rejected: list[str]) -> UpdateProposal:
        """One update call over the claims, under this step's budget, enforced in code."""
        current_text = prompts.text[node_id]
        current = split_claims(current_text)
        budget, may_add = self.edit_budget(ctx.step), self.may_add_claim(ctx.step)
        may_add = may_add and (self.max_claims is None or len(current) < self.max_claims)
        request = ctx.client.request(
            "update", [("system", P.UPDATE_SYSTEM),
                       ("user", self.update_text(node_id, current, samples, rejected, budget,
                                                 may_add))],
            max_tokens=ctx.optimizer_max_tokens,
            meta={"role": "gtbp_update", "node": node_id, "prompt": current_text,
                  "claims": current, "budget": budget, "may_add": may_add,
                  "max_claims": self.max_claims, "allow_delete": self.allow_delete})
        record = await ctx.client.call(request, step=ctx.step, node_id=node_id)
        if record.error:
            return UpdateProposal(current_text, call_id=record.call_id, error=record.error)
        proposed, reasoning, problem = parse_claims_reply(
            S.reply_text(record.response, "gtbp_update"))
        if proposed is None:
            return UpdateProposal(current_text, reasoning, record.call_id, problem)
        claims, changed, over = enforce_budget(current, proposed, budget, may_add,
                                               self.max_claims, self.allow_delete)
        if changed and not claims:
            changed, over = 0, "; ".join(p for p in (over, "the proposal removed every claim: "
                                                     "prompt left unchanged") if p)
        problem = "; ".join(p for p in (problem, over) if p) or None
        if not changed:
            return UpdateProposal(current_text, reasoning, record.call_id, problem)
        return UpdateProposal(render_claims(claims), reasoning, record.call_id, problem)

    def update_text(self, node_id: str, claims: list[str], samples: list[UpdateSample],
                    rejected: list[str], budget: int, may_add: bool) -> str:
        examples = "\n".join(
            GTBP_EXAMPLE.format(index=i, input=s.input_text, output=s.output_text,
                                target=s.feedback or "(no target reached this step)")
            for i, s in enumerate(samples, start=1))
        rej = P.UPDATE_REJECTED.format(items="\n".join(
            f'<rejected index="{i}">\n{r}\n</rejected>' for i, r in enumerate(rejected, 1))
        ) if rejected else ""
        numbered = "\n".join(f"{i}. {c}" for i, c in enumerate(claims, start=1))
        cap = "" if self.max_claims is None else ADD_CAP.format(max_claims=self.max_claims)
        add_rule = (ADD_ALLOWED.format(cap=cap) if may_add else
                    ADD_FORBIDDEN_DELETE if self.allow_delete else ADD_FORBIDDEN)
        change_rule = CHANGE_WITH_DELETE if self.allow_delete else CHANGE_NO_DELETE
        return GTBP_UPDATE.format(node=node_id, claims=numbered, examples=examples,
                                  rejected=rej, budget=budget, add_rule=add_rule,
                                  change_rule=change_rule)
