"""Graph-based target back-propagation (GTBP; Zhu et al., arXiv 2606.14155).

Instead of critiques, GTBP passes back *targets*: the output node's target is the
example's reference answer. In reverse topological order, a node v with target Ô_v gets
one call (role "gtbp_input") asking which input Î_v would have made v, with its prompt
unchanged, produce Ô_v while staying close to its actual input; each predecessor reads
its own target output off its block of Î_v. Function nodes pass their target through
unchanged; nodes that read only example fields stop.

Several successors (left open by the paper): like semantic backpropagation treats
siblings, ONE call (role "gtbp_combine") sees all successors' targets together, in
successor (topological) order, and states one target for the node. A single target is
used as it is, without a call.

Update: a prompt is an ordered list of short claims ("- claim" lines). The update call
sees (I_v, O_v, Ô_v) for the sampled examples and the numbered claims, and may change at
most n claims; each edited, removed or added claim counts as one change. The schedule, for
an optimization step t >= 1:

    edit_budget(t)   = max(1, m0 - floor((t - 1) / m_minus))
    may_add_claim(t) = (t % m_plus == 0)    # then at most one new claim, up to max_claims

The budget is enforced in code: changes beyond it are reverted (the first n, in claim
order, are kept) and the proposal records a parse_error saying so.

Run log (`gradients` table): kind 'target' for each target a node received (from_node_id
= the successor, or 'loss' for the output node), kind 'aggregate' for the one target the
node acted on, kind 'inferred_input' for Î_v (from_node_id NULL, the rendered blocks).
"""

from __future__ import annotations

import asyncio
import difflib
import itertools
import re

from engine import prompts as P
from engine import structured as S
from engine.events import LossRecord
from engine.forward import ExampleTrace, Prompts, RunContext
from engine.methods.base import (
    Method,
    NodeGradient,
    UpdateProposal,
    UpdateSample,
    function_messages,
)

# --- templates -------------------------------------------------------------------------

GTBP_SYSTEM = (
    "You are the optimizer of a pipeline of language-model calls. You work out what each "
    "step should have produced so that the pipeline gives the target answer."
)

GTBP_COMBINE = """A step of the pipeline has this task:
<task>
{prompt}
</task>

For one example it received these inputs:
{inputs}

It produced this output:
<output>
{output}
</output>

The steps that read this output each need a different output from it. Their targets, in order:
{targets}

Write the ONE output this step should have produced so that every one of these steps gets what it needs. Reconcile the targets where they differ, and stay as close to the actual output as they allow.
Answer with the output between <target> and </target>."""

GTBP_INPUT = """A step of the pipeline has this task, which stays unchanged:
<task>
{prompt}
</task>

For one example it received these inputs:
{inputs}

It produced this output:
<output>
{output}
</output>

It should have produced this target output:
<target>
{target}
</target>

Which input would have made this step, with its task unchanged, produce the target output? Stay as close to the actual input as you can. The example's own fields ({fields}) are given: repeat them as they are. Rewrite the inputs produced by earlier steps ({names}) as those steps should have written them.
Answer with one block per input, in this form:
{blocks}"""

GTBP_UPDATE = """You are improving the prompt of the step "{node}" of a pipeline. The prompt is a numbered list of claims:
{claims}

On examples where the pipeline failed, the step received an input, produced an output, and should have produced the target output:
{examples}
{rejected}
Change the claims so that the step produces the target outputs. Rules for this step:
- You may change at most {budget} claim(s); editing, removing or adding a claim each count as one change.
- {add_rule}
- Keep every unchanged claim word for word and in its order. Claims must stay general: do not mention the specific examples, numbers or answers above.
Explain your reasoning in a few sentences, then give the complete new list between <claims> and </claims>, one claim per line starting with "- "."""

GTBP_EXAMPLE = """<example index="{index}">
<input>
{input}
</input>
<output>
{output}
</output>
<target>
{target}
</target>
</example>"""

ADD_ALLOWED = "You may add at most one new claim (the list may hold at most {max_claims})."
ADD_FORBIDDEN = "Do not add a new claim in this step: edit or remove existing claims only."

# --- the schedule ----------------------------------------------------------------------


def edit_budget(step: int, m0: int, m_minus: int) -> int:
    """Claims the update may change at step t >= 1: max(1, m0 - floor((t-1)/m_minus))."""
    if step < 1:
        raise ValueError(f"gtbp updates start at step 1, not {step}")
    return max(1, m0 - (step - 1) // m_minus)


def may_add_claim(step: int, m_plus: int) -> bool:
    """Whether step t >= 1 may add one new claim: t % m_plus == 0."""
    if step < 1:
        raise ValueError(f"gtbp updates start at step 1, not {step}")
    return step % m_plus == 0


# --- parsers ---------------------------------------------------------------------------

_ITEM = re.compile(r"^\s*(?:[-*•]\s+|\d+[.)]\s+)(.*)$")


def split_claims(prompt: str) -> list[str]:
    """A prompt's claims. Lines starting with "- ", "* " or "1." / "1)" start a claim; other
    non-empty lines continue the previous claim (or start one, before the first item). A
    prompt without such lines is split into sentences."""
    lines = [ln.strip() for ln in prompt.splitlines() if ln.strip()]
    if not any(_ITEM.match(ln) for ln in lines):
        text = " ".join(lines)
        return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    claims: list[str] = []
    for ln in lines:
        item = _ITEM.match(ln)
        if item and item.group(1).strip():
            claims.append(item.group(1).strip())
        elif claims and not item:
            claims[-1] = f"{claims[-1]} {ln}"
        elif not item:
            claims.append(ln)
    return claims


def render_claims(claims: list[str]) -> str:
    return "\n".join(f"- {c}" for c in claims)


def parse_target(reply: str) -> tuple[str, str | None]:
    """(target, parse_error). Rules: the last non-empty <target> block; else the text after
    an unclosed <target> tag; else the whole reply."""
    blocks = [b.strip() for b in re.findall(r"<target>(.*?)</target>", reply, re.S | re.I)]
    blocks = [b for b in blocks if b]
    if blocks:
        return blocks[-1], None
    opened = re.split(r"<target>", reply, flags=re.I)
    if len(opened) > 1 and opened[-1].strip():
        return opened[-1].strip(), "unclosed <target> tag: used the text after it"
    return reply.strip(), "no <target> tags: used the whole reply"


def parse_inferred_input(reply: str, names: list[str], fields: set[str],
                         actual: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """One value per input name. Rules, in order: the last `<input name="n">` block for n;
    else a line starting with "n:" up to the next such label; else an example field keeps
    its actual value and a predecessor gets the whole reply. The parse error names every
    input that needed a fallback."""
    found: dict[str, str] = {}
    for name, body in re.findall(r'<input\s+name="([^"]+)"\s*>(.*?)</input>', reply,
                                 flags=re.S | re.I):
        if name in names and body.strip():
            found[name] = body.strip()
    notes = []
    labelled = _split_labelled(reply, [n for n in names if n not in found])
    if labelled:
        found.update(labelled)
        notes.append(f"no <input> block for {', '.join(labelled)}: used its 'name:' label")
    missing = [n for n in names if n not in found]
    for n in missing:
        found[n] = actual.get(n, "") if n in fields else reply.strip()
    kept = [n for n in missing if n in fields]
    whole = [n for n in missing if n not in fields]
    if kept:
        notes.append(f"no block for field {', '.join(kept)}: kept its actual value")
    if whole:
        notes.append(f"no block for {', '.join(whole)}: gave it the whole reply")
    return {n: found[n] for n in names}, "; ".join(notes) or None


def _split_labelled(reply: str, names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    pattern = re.compile(r"^\W*(" + "|".join(re.escape(n) for n in names) + r")\s*:", re.M)
    matches = list(pattern.finditer(reply))
    parts: dict[str, str] = {}
    for m, nxt in zip(matches, matches[1:] + [None]):
        body = reply[m.end():nxt.start() if nxt else len(reply)].strip()
        if body:
            parts[m.group(1)] = body
    return parts


def parse_claims_reply(reply: str) -> tuple[list[str] | None, str, str | None]:
    """(claims or None, reasoning, parse_error). Rules: the last <claims> block; else the
    text after an unclosed <claims> tag; else the reply's "- "/numbered lines; else None
    (the prompt stays as it is)."""
    blocks = re.findall(r"<claims>(.*?)</claims>", reply, flags=re.S | re.I)
    if blocks:
        reasoning = reply[: reply.lower().rfind("<claims>")].strip()
        if split_claims(blocks[-1]):
            return split_claims(blocks[-1]), reasoning, None
        return None, reasoning, "empty <claims> block: prompt left unchanged"
    opened = re.split(r"<claims>", reply, flags=re.I)
    if len(opened) > 1 and opened[-1].strip():
        return (split_claims(opened[-1]), opened[0].strip(),
                "unclosed <claims> tag: used the text after it")
    items = [ln for ln in reply.splitlines() if _ITEM.match(ln)]
    if items:
        return (split_claims("\n".join(items)), reply.strip(),
                "no <claims> tags: used the list lines")
    return None, reply.strip(), "no claims in the reply: prompt left unchanged"


# --- budget enforcement ----------------------------------------------------------------


def enforce_budget(current: list[str], proposed: list[str], budget: int, may_add: bool,
                   max_claims: int) -> tuple[list[str], int, str | None]:
    """Apply at most `budget` of the proposal's changes to `current`, in claim order.

    Changes come from a diff of the two lists: a changed claim is an edit, a missing one a
    removal, a new one an addition (additions only when `may_add`: at most one, and only
    up to `max_claims`). Changes over the limits are reverted. Returns (claims, changes
    kept, problem or None)."""
    matcher = difflib.SequenceMatcher(a=[_norm(c) for c in current],
                                      b=[_norm(c) for c in proposed], autojunk=False)
    out: list[str] = []
    kept = added = dropped_adds = over_budget = 0
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.extend(current[i1:i2])
            continue
        for old, new in itertools.zip_longest(current[i1:i2], proposed[j1:j2]):
            if old is None and not (may_add and added == 0 and len(current) < max_claims):
                dropped_adds += 1  # an addition this step does not allow
            elif kept >= budget:
                over_budget += 1
                if old is not None:
                    out.append(old)  # revert the edit or removal
            else:
                kept, added = kept + 1, added + (old is None)
                if new is not None:
                    out.append(new)
    notes = []
    if dropped_adds:
        rule = "at most one may be added" if may_add else "no claim may be added"
        notes.append(f"dropped {dropped_adds} new claim(s): {rule} this step "
                     f"(max {max_claims} claims)")
    if over_budget:
        notes.append(f"{kept + over_budget} changes over the edit budget of {budget}: "
                     f"kept the first {budget} in claim order")
    return out, kept, "; ".join(notes) or None


def _norm(claim: str) -> str:
    return " ".join(claim.split()).lower()


# --- the method ------------------------------------------------------------------------


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"gtbp option {name} must be a whole number above 0, not {value!r}")
    return value


class GTBP(Method):
    name = "gtbp"

    def __init__(self, m0: int = 2, m_plus: int = 2, m_minus: int = 2, max_claims: int = 8):
        self.m0 = _positive("m0", m0)
        self.m_plus = _positive("m_plus", m_plus)
        self.m_minus = _positive("m_minus", m_minus)
        self.max_claims = _positive("max_claims", max_claims)

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
        may_add = may_add and len(current) < self.max_claims
        request = ctx.client.request(
            "update", [("system", P.UPDATE_SYSTEM),
                       ("user", self.update_text(node_id, current, samples, rejected, budget,
                                                 may_add))],
            max_tokens=ctx.optimizer_max_tokens,
            meta={"role": "gtbp_update", "node": node_id, "prompt": current_text,
                  "claims": current, "budget": budget, "may_add": may_add,
                  "max_claims": self.max_claims})
        record = await ctx.client.call(request, step=ctx.step, node_id=node_id)
        if record.error:
            return UpdateProposal(current_text, call_id=record.call_id, error=record.error)
        proposed, reasoning, problem = parse_claims_reply(
            S.reply_text(record.response, "gtbp_update"))
        if proposed is None:
            return UpdateProposal(current_text, reasoning, record.call_id, problem)
        claims, changed, over = enforce_budget(current, proposed, budget, may_add,
                                               self.max_claims)
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
        add_rule = (ADD_ALLOWED.format(max_claims=self.max_claims) if may_add
                    else ADD_FORBIDDEN)
        return GTBP_UPDATE.format(node=node_id, claims=numbered, examples=examples,
                                  rejected=rej, budget=budget, add_rule=add_rule)
