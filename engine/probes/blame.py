"""What to probe at a logged step, and `blame`: which node do the probes blame, and how
sure is that?

`probe(...)` is the entry point of one probe command (it checks the request against the
run log, runs the probes and writes them). `blame(...)` pools every backward step of a run
(or one): at each LLM node it follows the gradient the node received on every chosen
failing example, and runs the node's proposed edit alone on them and on the passing
validation examples; with `methods`, it re-runs each named method's backward pass on the
same logged traces and follows those gradients too.

Definitions (docs/probes.md):
- a probe *flips* an example when it scored below 1 before and 1 after; it *regresses*
  one that scored 1 before and less after; failed probes are errors, never "no flip";
- *leaks* (the intervention carries the answer, engine/probes/leaks.py), *in-sample* edit
  flips (the update call saw that example) and copy-rejected proposals are confounds:
  shown in their own columns, never counted as flips; an edit's probes on examples the
  update call saw are left out of its share altogether (`Evidence.seen`);
- each node's flip rate has a 90% Wilson interval; the probes *blame* a node only when its
  interval lies above every other node's; when two or more leading nodes each lie above
  every other node but not above one another, the probes *tie* on them (`leading_group`);
  else the evidence is insufficient and the report says about how many examples per node
  would separate the two leading nodes;
- the gradients *claim* a node when the gradient it received asks it to change
  (`gradient_claim`); claims are set beside the probes per node and per example;
- per edge (a node and one successor, with `methods`): the gradient the node received
  from that successor alone, before aggregation, is followed the same way; a node with
  one successor acted on that gradient only, so its edge row is its node row.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from engine.core.claims import gradient_claim
from engine.core.copies import COPY_REASON
from engine.data.stats import wilson
from engine.events import Gradient, same_prompt
from engine.llm.base import Backend
from engine.probes.adaptive import Spent, probe_adaptively
from engine.probes.probe import (
    KINDS,
    LoggedRun,
    ProbeError,
    Prober,
    ProbeResult,
    descendants,
    load_run,
    open_prober,
)
from engine.runlog.probing import (
    aggregate_gradients,
    backward_steps,
    proposal_origin,
    recorded_claims,
    run_paces,
    sampled_examples,
    step_failing,
    step_proposal,
)

EXAMPLE_CHOICES = ("sampled", "failing", "val", "all")


class CopiedProposal(ProbeError):
    """The step's proposal was rejected as a copy of training examples."""


class NothingToProbe(ProbeError):
    """A step with no failing example among those chosen."""


async def probe(db: str, run_id: str, step: int, node_id: str, kind: str, *,
                example: str | None = None, text: str | None = None,
                examples: str = "failing", forward_backend: Backend | None = None,
                optimizer_backend: Backend | None = None, rerun: Any = None
                ) -> list[ProbeResult]:
    """Run one probe command and log it (`rerun`: a gateway-recorded run's pipeline).
    output: `text` is the new output of `node_id` on
    `example`; gradient: follow the gradient it received there; edit: `text` is a prompt,
    or "proposed" for the step's proposal, run on `examples` ("failing": the examples
    back-propagated at the step, "val", or comma-separated ids). Raises ProbeError."""
    if kind not in KINDS:
        raise ProbeError(f"unknown probe kind '{kind}' (choose from {', '.join(KINDS)})")
    run = load_run(db, run_id, step)
    run.node(node_id, need_prompt=kind == "edit")
    if kind == "edit":
        prompt = proposed_prompt(run, node_id) if text == "proposed" else (text or "")
        if not prompt.strip():
            raise ProbeError("the prompt to apply is empty")
        ids = select_examples(run, example if example else examples)
        # the step's own proposal was written from the back-propagated examples
        seen = set(backpropagated(run)) if text == "proposed" else set()
        jobs = [dict(kind=kind, example_id=e, node_id=node_id, prompt=prompt,
                     in_sample=e in seen) for e in ids]
    else:
        if example is None:
            raise ProbeError(f"a {kind} probe needs --example")
        run.example(example)
        feedback = None
        if kind == "gradient":
            feedback = received_gradients(run).get((example, node_id), "")
            if not feedback.strip():
                raise ProbeError(f"node '{node_id}' received no gradient for example "
                                 f"'{example}' at step {step} (only back-propagated "
                                 "examples have one)")
        jobs = [dict(kind=kind, example_id=example, node_id=node_id, text=text,
                     feedback=feedback)]
    prober = open_prober(run, forward_backend, optimizer_backend, rerun)
    try:
        results = await asyncio.gather(*(prober.intervene(**job) for job in jobs))
        prober.save()
    finally:
        await prober.ctx.client.aclose()
    return list(results)


def received_gradients(run: LoggedRun) -> dict[tuple[str, str], str]:
    """(example, node) -> the aggregated gradient the node acted on at the step."""
    return aggregate_gradients(run.db, run.run_id, run.step)


def proposal_kind(row: tuple[str, str, str] | None) -> str:
    """What a node's update at a step left to probe, from its (old prompt, new prompt,
    reject reason) row: "copied" (rejected as a copy of training examples: never probed),
    "unchanged" (no update, or the prompt left as it was) or "proposed"."""
    if row is not None and row[2] == COPY_REASON:
        return "copied"
    if row is None or same_prompt(row[0], row[1]):
        return "unchanged"
    return "proposed"


def proposed_prompt(run: LoggedRun, node_id: str) -> str:
    """The node's proposal at the step. One the optimizer rejected as a copy of training
    examples is refused: a flip it causes is the examples pasted in, not credit."""
    row = step_proposal(run.db, run.run_id, run.step, node_id)
    kind = proposal_kind(row)
    if kind == "copied":
        unchanged = row[1].strip() in ("", row[0].strip())
        raise CopiedProposal(f"step {run.step}'s proposal for node '{node_id}' was rejected: "
                             f"it {COPY_REASON}" + ("" if unchanged else
                                                    " (to probe it anyway, pass it as "
                                                    "--edit @FILE)"))
    if kind == "unchanged":
        raise ProbeError(f"step {run.step} has no proposed edit for node '{node_id}'"
                         + ("" if row is None else " (its update left the prompt unchanged)"))
    return row[1]


def backpropagated(run: LoggedRun) -> list[str]:
    """Examples whose loss was back-propagated at the step, in dataset order
    (`sampled_examples`: for a method without gradients, the optimizer's seeded sample
    drawn again)."""
    return sampled_examples(run.db, run.run_id, run.step, run.config)


def select_examples(run: LoggedRun, which: str) -> list[str]:
    if which in ("failing", "sampled"):
        ids = backpropagated(run)
        if not ids:
            raise ProbeError(f"no example was back-propagated at step {run.step}; pass "
                             "--examples val or a list of ids")
        return ids
    if which == "val":
        ids = [e for e, split in run.split_of.items() if split == "val"]
        if not ids:
            raise ProbeError(f"run '{run.run_id}' has no validation examples")
        return ids
    ids = [e.strip() for e in which.split(",") if e.strip()]
    for e in ids:
        run.example(e)
    return ids


# --- what the gradients claim -----------------------------------------------------------

# --- the interval and the verdict -------------------------------------------------------


def examples_to_separate(p_high: float, p_low: float, limit: int = 100_000) -> int | None:
    """The fewest examples per node at which shares p_high and p_low would have disjoint
    90% intervals; None when they never would (equal shares)."""
    if p_high <= p_low:
        return None
    n = 1
    while n <= limit:
        if wilson(round(p_high * n), n)[0] > wilson(round(p_low * n), n)[1]:
            return n
        n = n + 1 if n < 64 else int(n * 1.1)
    return None


@dataclass
class Evidence:
    """One kind of intervention at one node, pooled over steps and examples. A probe
    group (step, example, node) counts once; with repeats its flip is the majority's."""

    node_id: str
    kind: str = "gradient"
    method: str = ""
    probed: int = 0  # groups on failing examples
    flips: int = 0  # ... fixed, intervention not leaking the answer, not in-sample
    errors: int = 0  # ... whose probes all failed: not evidence either way
    leaks: int = 0  # ... fixed, but the intervention carries the answer
    in_sample: int = 0  # ... fixed, but the update call saw the example (edits)
    seen: int = 0  # ... on examples the update call saw, fixed or not (edits): no evidence
    guarded: int = 0  # groups on passing (validation) examples
    regressions: int = 0  # ... broken by the intervention
    score_change: float = 0.0  # summed over scored failing groups
    scored: int = 0
    repeat_groups: int = 0  # groups probed more than once
    repeat_agree: int = 0  # ... whose repeats all agreed on the flip
    copy_rejected: int = 0  # steps whose proposal was a copy: not probed
    unchanged: int = 0  # steps whose update left the prompt as it was (edit rows)
    claimed: int = 0  # gradients that asked the node to change (gradient kind)
    claim_agree: int = 0  # ... claim == flipped, per example
    edge: str = ""  # the successor whose gradient alone was followed (edge rows)

    @property
    def counted(self) -> int:
        """Probes that are evidence: not errors, and (edits) not on an example the update
        call saw, whose fix or non-fix says nothing about the edit out of sample."""
        return self.probed - self.errors - self.seen

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.flips, self.counted)

    @property
    def share(self) -> float | None:
        return self.flips / self.counted if self.counted else None

    @property
    def mean_score_change(self) -> float | None:
        return self.score_change / self.scored if self.scored else None

    def as_json(self) -> dict[str, Any]:
        low, high = self.interval
        data = {"node": self.node_id, "kind": self.kind, "probed": self.probed,
                "flips": self.flips, "errors": self.errors, "leaks": self.leaks,
                "interval": [round(low, 4), round(high, 4)],
                "mean_score_change": self.mean_score_change,
                "regressions": self.regressions, "guarded": self.guarded}
        if self.kind == "edit":
            data.update(in_sample=self.in_sample, seen=self.seen,
                        copy_rejected=self.copy_rejected)
        else:  # what the followed gradients asked
            data.update(claimed=self.claimed, claim_agreement=self.claim_agree)
        if self.repeat_groups:
            data["repeat_agreement"] = [self.repeat_agree, self.repeat_groups]
        if self.method:
            data["method"] = self.method
        return data


@dataclass
class Verdict:
    node: str | None
    reason: str
    more_examples: int | None = None  # per node, to separate the two leading nodes
    # with no node named: the leading nodes whose intervals each lie above every node
    # outside them but overlap one another's (the fault is in one or more of them)
    tied: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node, "reason": self.reason, "more_examples": self.more_examples,
                "tied": self.tied}

    @property
    def named(self) -> str:
        """What the verdict names, in a word: the node, the tied nodes joined by " or ",
        or "no node"."""
        return self.node or " or ".join(self.tied) or "no node"


def weigh(gradients: list[Evidence], edits: list[Evidence]) -> tuple[Verdict, str, str]:
    """(verdict, evidence kind, why that kind): the gradient probes decide when they name a
    node. When they name none (a run without gradients, or gradients whose every fix
    carries the answer, as when a node's right output is the answer itself), the edit
    probes decide if they name one: an edit that fixes examples its update call never saw,
    at one node and not the others, is evidence of that node's fault the gradients could
    not give. A node whose update left its prompt as it was is compared as what its edit
    alone is: no change, so none of the failing examples the others were probed on is
    fixed. A node whose proposal was not probed (it copied training examples) is left out
    of the comparison, and at least two nodes must be compared. When neither names a node
    but the edit probes fixed examples, the verdict's reason gives theirs too (two nodes'
    edits that each fix some, say, and how many examples would separate them)."""
    if not gradients:
        return edit_verdict(edits), "edit", "the run has no gradients"
    by_gradient = verdict(gradients)
    if by_gradient.node:
        return by_gradient, "gradient", ""
    by_edit = edit_verdict(edits)
    if by_edit.node or (by_edit.tied and not by_gradient.tied):
        return by_edit, "edit", f"the gradient probes named no node ({by_gradient.reason})"
    if any(e.flips for e in edits if e.counted):  # the edits' evidence, short of a name
        return replace(by_gradient, reason=f"{by_gradient.reason}; the edit probes name no "
                                           f"node either: {by_edit.reason}",
                       more_examples=by_gradient.more_examples or by_edit.more_examples
                       ), "gradient", ""
    return by_gradient, "gradient", ""


def compared_edits(edits: list[Evidence]) -> tuple[list[Evidence], list[Evidence], int]:
    """(the edits probed, the nodes whose update left the prompt as it was, compared as
    0 of n, and n: the most examples any edit was counted on), as `edit_verdict` and
    `weighed` compare them (see weigh)."""
    tried = [e for e in edits if e.counted]
    n = max((e.counted for e in tried), default=0)
    kept = [replace(e, probed=n, errors=0, seen=0) for e in edits
            if not e.counted and e.unchanged and not e.copy_rejected and n]
    return tried, kept, n


def edit_verdict(edits: list[Evidence]) -> Verdict:
    """The edit probes' verdict, nodes with no proposal compared as unchanged (see weigh)."""
    tried, kept, n = compared_edits(edits)
    compared = tried + kept
    if len(compared) < 2:
        return verdict(compared) if not tried else Verdict(
            None, f"only {tried[0].node_id}'s edit was probed: no other node to compare")
    found = verdict(compared)
    # named in id order, so the note reads the same from a blame and from the run log
    notes = [f"{e.node_id}: its update left the prompt unchanged, so 0 of {n}"
             for e in sorted(kept, key=lambda e: e.node_id)]
    compared_ids = {e.node_id for e in compared}
    notes += [f"{e.node_id}: no edit to probe"
              for e in sorted(edits, key=lambda e: e.node_id) if e.node_id not in compared_ids]
    return replace(found, reason=f"{found.reason} ({'; '.join(notes)})") if notes else found


def verdict(rows: list[Evidence]) -> Verdict:
    """Name a node only when its interval lies wholly above every other node's."""
    if not rows:
        return Verdict(None, "no node was probed")
    if not any(r.flips for r in rows):
        return Verdict(None, f"no {rows[0].kind} probe flipped an example (leaks, in-sample "
                             "edits and errors are not counted)")
    ranked = sorted(rows, key=lambda r: (r.share or 0.0, r.counted), reverse=True)
    best, others = ranked[0], ranked[1:]
    low = best.interval[0]
    if all(low > r.interval[1] for r in others):
        return Verdict(best.node_id, f"{best.node_id}'s 90% interval lies above every other "
                                     "node's")
    tied = leading_group(ranked)
    rival = max(others, key=lambda r: r.interval[1])
    need = examples_to_separate(best.share or 0.0, rival.share or 0.0)
    have = min(best.counted, rival.counted)
    if need is None:
        more = None
        how = "at these flip rates no number of examples would tell them apart"
    else:
        more = max(need - have, 1)
        how = (f"about {need} examples per node would separate them at these rates "
               f"({more} more than the {have} now)")
    if tied:
        by_id = {r.node_id: r for r in ranked}
        counts = ", ".join(f"{n} {by_id[n].flips}/{by_id[n].counted}" for n in tied)
        return Verdict(None, f"a tie: the 90% intervals of {' and '.join(tied)} ({counts}) "
                             "each lie above every other node's but overlap one another's, "
                             "so the fault lies in one or more of them; "
                             f"{how}", more, tied)
    return Verdict(None, f"insufficient evidence: {best.node_id} "
                         f"({best.flips}/{best.counted}) and {rival.node_id} "
                         f"({rival.flips}/{rival.counted}) have overlapping 90% intervals; "
                         f"{how}", more)


def leading_group(ranked: list[Evidence]) -> list[str]:
    """The smallest group of two or more leading nodes (`ranked` by flip rate, highest
    first) each of whose 90% intervals lies above the interval of every node outside it,
    with at least one node outside it; [] if there is none. Two planted faults each of
    whose repairs alone passes the answer on tie this way: no probe of one node at a time
    can tell which of them is at fault, and both are above the rest."""
    for size in range(2, len(ranked)):
        group, rest = ranked[:size], ranked[size:]
        if all(r.flips for r in group) and \
                min(r.interval[0] for r in group) > max(r.interval[1] for r in rest):
            return sorted(r.node_id for r in group)
    return []


@dataclass(frozen=True)
class NodeFact:
    """One node as a verdict weighed it: the one count a picture of the verdict shows.

    kind: the probes the verdict weighs ("gradient" or "edit", `weigh`); flips of counted:
    that node's count of them (an unchanged node's edit: 0 of the most any edit was
    counted on); standing: "blamed" (the verdict names it), "tied" (one of the nodes it
    ties on), "weighed" (compared, not named), "unchanged" (its update left the prompt as
    it was: compared as 0 of n), "copied" (its proposal copied training examples: not
    probed, not compared) or "not probed"."""

    node: str
    kind: str
    standing: str
    flips: int = 0
    counted: int = 0

    @property
    def share(self) -> float | None:
        return self.flips / self.counted if self.counted else None

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.flips, self.counted)


def weighed(found: Verdict, evidence: str, gradients: list[Evidence], edits: list[Evidence],
            nodes: list[str]) -> list[NodeFact]:
    """Per node of `nodes`, in that order, what `weigh`'s verdict `found` (from the
    probes of kind `evidence`) rests on: the same counts, the same comparison."""
    if evidence == "gradient":
        compared = {e.node_id: e for e in gradients if e.counted}
        kept: dict[str, Evidence] = {}
        copied: set[str] = set()
    else:
        tried, unchanged, _ = compared_edits(edits)
        kept = {e.node_id: e for e in unchanged}
        compared = {e.node_id: e for e in tried + unchanged}
        copied = {e.node_id for e in edits if e.copy_rejected and not e.counted}
    facts = []
    for node in nodes:
        row = compared.get(node)
        standing = ("blamed" if node == found.node else "tied" if node in found.tied
                    else "unchanged" if node in kept else "weighed" if row is not None
                    else "copied" if node in copied else "not probed")
        facts.append(NodeFact(node, evidence, standing, row.flips if row else 0,
                              row.counted if row else 0))
    return facts


def chosen_updates(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of a step's update rows (several per node under --proposals), the one per node whose
    edit blame probes, by step_proposal's order (engine/runlog/probing.py): the kept
    candidate's, else the best-scored one that changed the prompt, else the first."""
    def known(value: Any) -> bool:  # not NULL (None, or a frame's NaN)
        return value is not None and value == value

    def order(u: dict[str, Any]) -> tuple:
        kept = known(u.get("accepted")) and bool(u.get("accepted"))
        changed = not same_prompt(u.get("old_prompt"), u.get("new_prompt"))
        score = u.get("val_after")
        candidate = u.get("candidate")
        return (not kept, not changed, not known(score),
                -float(score) if known(score) else 0.0,
                int(candidate) if known(candidate) else 0)

    chosen: dict[str, dict[str, Any]] = {}
    for u in sorted(updates, key=order):
        chosen.setdefault(u["node_id"], u)
    return list(chosen.values())


class LoggedBlame(NamedTuple):
    verdict: Verdict
    evidence: str  # "gradient" or "edit"
    facts: list[NodeFact]  # per LLM node, in the order given


def logged_verdict(rows: list[dict[str, Any]], updates: list[dict[str, Any]],
                   nodes: list[str]) -> tuple[Verdict, str]:
    """(verdict, evidence kind) of `logged_blame`."""
    found, evidence, _ = logged_blame(rows, updates, nodes)
    return found, evidence


def logged_blame(rows: list[dict[str, Any]], updates: list[dict[str, Any]],
                 nodes: list[str]) -> LoggedBlame:
    """(verdict, evidence kind, per-node facts) by `weigh`'s rule from per-node counts as
    reader.node_blame reads them from a step's logged probes (keys node_id, probed, flips,
    leaks, edit_probed, edit_flips), the step's updates (keys node_id, old_prompt,
    new_prompt, reject_reason) and the graph's LLM nodes (a node no probe touched counts
    zero): the verdict a page shows for every probe logged at the step, whichever blame
    jobs wrote them, and what it rests on per node (`weighed`), which a page's drawing
    shows: one function for the sentence and the picture."""
    by_node = {u["node_id"]: (str(u.get("old_prompt") or ""), str(u.get("new_prompt") or ""),
                              str(u.get("reject_reason") or "")) for u in chosen_updates(updates)}
    seen = {r["node_id"] for r in rows}
    rows = list(rows) + [{"node_id": n, "probed": 0, "flips": 0, "leaks": 0,
                          "edit_probed": 0, "edit_flips": 0} for n in nodes if n not in seen]
    gradients = [Evidence(r["node_id"], "gradient", probed=int(r["probed"]),
                          flips=int(r["flips"]), leaks=int(r["leaks"]))
                 for r in rows if int(r["probed"])]
    edits = []
    for r in rows:
        kind = proposal_kind(by_node.get(r["node_id"]))
        edits.append(Evidence(r["node_id"], "edit", probed=int(r["edit_probed"]),
                              flips=int(r["edit_flips"]),
                              unchanged=int(kind == "unchanged"),
                              copy_rejected=int(kind == "copied")))
    found, evidence, _ = weigh(gradients, edits)
    return LoggedBlame(found, evidence, weighed(found, evidence, gradients, edits, nodes))


# --- blame ------------------------------------------------------------------------------


@dataclass
class BlameReport:
    run_id: str
    steps: list[int]
    which: str  # the --examples choice
    examples: list[tuple[int, str]]  # (step, example) probed as failing
    nodes: list[Evidence]  # gradient evidence per LLM node (the run's own method)
    edits: list[Evidence]  # edit evidence per LLM node
    evidence: str  # "gradient" or "edit": what the verdict weighs (`weigh`)
    verdict: Verdict
    claimed: str | None  # the node the gradients most often asked to change
    claims: list[dict[str, Any]] = field(default_factory=list)  # per (step, example, node)
    methods: list[Evidence] = field(default_factory=list)  # per (method, node)
    method_verdicts: dict[str, Verdict] = field(default_factory=dict)
    repeats: int = 1
    repeats_note: str = ""
    rewriter: str = ""  # the model that follows gradients (the optimizer model)
    forward_model: str = ""
    calls: int = 0
    model_calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    results: list[ProbeResult] = field(default_factory=list)

    edges: list[Evidence] = field(default_factory=list)  # per (method, node, successor)
    evidence_note: str = ""  # why the edit probes decide, when they do
    # examples pointing at `claimed`, examples pointing at any single node, examples with
    # claims (the counts behind "gradients point at")
    pointed: tuple[int, int, int] = (0, 0, 0)
    # of one step's blame, each probed edit that came from a candidate prompt set the step
    # did not keep (`proposal_origin`): node -> where it came from
    edit_origins: dict[str, str] = field(default_factory=dict)
    # adaptive blame (engine/probes/adaptive.py): the probes planned and made, and why the
    # rest were not; None when every planned probe was made (--exhaustive, pooled steps)
    spent: Spent | None = None
    estimate: str = ""  # what it said it would cost before it began

    @property
    def step(self) -> int | None:
        return self.steps[0] if len(self.steps) == 1 else None

    @property
    def facts(self) -> list[NodeFact]:
        """Per LLM node, what the verdict rests on (`weighed`): the counts the pages draw."""
        gradients = self.nodes if any(r.probed for r in self.nodes) else []
        return weighed(self.verdict, self.evidence, gradients, self.edits,
                       [r.node_id for r in self.nodes])

    @property
    def blamed(self) -> list[str]:
        """The node the probes name, or the nodes they tie on."""
        return [self.verdict.node] if self.verdict.node else list(self.verdict.tied)

    def as_json(self) -> dict[str, Any]:
        nodes = []
        edits = {e.node_id: e for e in self.edits}
        for row in self.nodes:
            data = row.as_json()
            data["edit"] = edits[row.node_id].as_json()
            if row.node_id in self.edit_origins:
                data["edit"]["origin"] = self.edit_origins[row.node_id]
            nodes.append(data)
        return {
            "run_id": self.run_id, "steps": self.steps, "examples": self.which,
            "probed_examples": len(self.examples), "evidence": self.evidence,
            "evidence_note": self.evidence_note,
            "nodes": nodes, "verdict": self.verdict.as_json(),
            "gradients_claimed": self.claimed,
            "gradients_pointed": dict(zip(("claimed", "single_node", "examples"),
                                          self.pointed)),
            "claims": self.claims,
            **({"methods": [{**m.as_json(), "method": m.method,
                             "verdict": self.method_verdicts[m.method].node,
                             "tied": self.method_verdicts[m.method].tied}
                            for m in self.methods]} if self.methods else {}),
            **({"edges": [edge_json(e) for e in self.edges]} if self.methods else {}),
            "repeats": self.repeats, "repeats_note": self.repeats_note,
            "confounds": {"rewriter_model": self.rewriter, "forward_model": self.forward_model,
                          "rewriter_is_optimizer_model": True},
            "cost": {"calls": self.calls, "model_calls": self.model_calls,
                     "tokens": self.tokens, "seconds": round(self.seconds, 3)},
            "adaptive": self.spent.as_json() if self.spent else None,
            "estimate": self.estimate,
        }


def edge_json(row: Evidence) -> dict[str, Any]:
    """One edge row: the gradient `source` received from `target` alone, followed."""
    low, high = row.interval
    return {"method": row.method, "source": row.node_id, "target": row.edge,
            "probed": row.probed, "flips": row.flips, "errors": row.errors,
            "leaks": row.leaks, "interval": [round(low, 4), round(high, 4)],
            "claimed": row.claimed, "mean_score_change": row.mean_score_change}


def parse_methods(text: str | None) -> list[str]:
    from engine.methods import METHODS

    names = [m.strip() for m in (text or "").split(",") if m.strip()]
    for name in names:
        if name not in METHODS:
            raise ProbeError(f"unknown method '{name}' (choose from {', '.join(METHODS)})")
        if not METHODS[name].uses_gradients:
            raise ProbeError(f"method '{name}' computes no gradients: nothing to follow")
    return names


async def blame(db: str, run_id: str, step: int | None = None, examples: str = "failing", *,
                methods: list[str] | None = None, repeats: int = 1,
                forward_backend: Backend | None = None,
                optimizer_backend: Backend | None = None,
                progress: Callable[[int, int], None] | None = None,
                adaptive: bool = True,
                announce: Callable[[str], None] | None = None,
                rerun: Any = None) -> BlameReport:
    """Probe every LLM node on the chosen examples of `step` (None: every backward step,
    pooled): follow its gradient on each failing example and run its proposed edit alone
    on them and on the passing validation examples; with `methods`, also follow each
    method's gradients, re-computed on the same logged traces. `repeats` > 1 draws each
    probe again at temperature > 0. Logged like any probe; raises ProbeError on bad input.
    `progress(done, total)` is called as probes finish. `adaptive` (one step): probe in
    rounds and stop where probes no longer decide anything (engine/probes/adaptive.py);
    False: every planned probe. `announce(line)` gets the estimate before the first probe.
    `rerun`: on a run recorded through the gateway, the probes re-run its pipeline."""
    which = examples
    if which not in EXAMPLE_CHOICES and not [e for e in which.split(",") if e.strip()]:
        raise ProbeError(f"--examples must be one of {', '.join(EXAMPLE_CHOICES)} or a list "
                         f"of ids, not {which!r}")
    if repeats < 1:
        raise ProbeError(f"--repeats must be 1 or more, not {repeats}")
    methods = list(methods or [])
    steps = backward_steps(db, run_id) if step is None else [step]
    if step is None and not steps:
        load_run(db, run_id, 1)  # says why: no run, or no complete step
    started = time.perf_counter()
    plans, results, probers, empty = [], [], [], []
    spent, estimate = None, ""
    calls = model_calls = tokens = 0
    if announce and len(steps) == 1:  # before any model call: from the run log alone
        announce(estimate_from_log(db, run_id, steps[0], which, adaptive))
    try:
        for s in steps:
            run = load_run(db, run_id, s)
            probers.append(open_prober(run, forward_backend, optimizer_backend, rerun))
            try:
                plans.append(await _plan_step(run, probers[-1], which, methods,
                                              lazy=adaptive and len(steps) == 1))
            except NothingToProbe as exc:  # pooled: a step with nothing to probe is skipped
                if step is not None:
                    raise
                empty.append(str(exc))
                await probers.pop().ctx.client.aclose()
        if not plans:
            raise ProbeError(empty[0] if len(empty) == 1 else
                             f"no step of run '{run_id}' has examples to probe ({empty[-1]})")
        temperature = float(plans[0]["run"].config.get("temperature", 0.0)) if plans else 0.0
        draws = repeats if temperature > 0 else 1
        total = sum(len(p["jobs"]) for p in plans) * draws
        adaptive = adaptive and len(plans) == 1
        estimate = blame_estimate(plans, draws, adaptive)
        if announce:
            announce(estimate.replace("blame: up to", "blame: planned: up to", 1))
        done = 0
        if progress:
            progress(0, total)

        def skip(count: int) -> None:  # planned probes adaptive blame will not make
            nonlocal total
            total -= count * draws
            if progress and count:
                progress(done, total)

        for plan, prober in zip(plans, probers):

            async def one(job: dict, index: int, prober: Prober = prober) -> ProbeResult:
                nonlocal done
                result = await prober.intervene(**job, sample_index=index)
                done += 1
                if progress:
                    progress(done, total)
                return result

            async def probe_all(jobs: list[dict], plan: dict = plan) -> list[ProbeResult]:
                # a pending job whose node received no gradient is dropped: adaptive
                # blame counts what it made, and skips the rest of its plan
                return list(await asyncio.gather(*(one(job, i)
                                                   for job in await ready(plan, jobs)
                                                   for i in range(draws))))

            if adaptive:
                made, spent = await probe_adaptively(
                    plan, run_id, probe_all, own_counts,
                    lambda rs, plan=plan: summarize(run_id, steps, which, [plan], rs).blamed,
                    skip)
                results.extend(made)
            else:
                results.extend(await probe_all(plan["jobs"]))
            tokens += sum((c.prompt_tokens or 0) + (c.completion_tokens or 0)
                          for c in prober.calls if not c.cache_hit)
            prober.save()
    finally:
        # the models that really answered (an embedded model's pair is chosen by the client,
        # not named in the run's settings)
        names = (probers[0].ctx.client.forward_model, probers[0].ctx.client.optimizer_model) \
            if probers else (None, None)
        for prober in probers:
            calls += prober.ctx.client.stats.calls
            model_calls += prober.ctx.client.stats.network_calls
            await prober.ctx.client.aclose()
    report = summarize(run_id, steps, which, plans, results)
    report.spent = spent if adaptive else None
    report.estimate = estimate
    report.repeats = draws
    report.repeats_note = "" if repeats == 1 else (
        f"each probe drawn {repeats} times at temperature {temperature:g}" if draws > 1 else
        f"--repeats {repeats} ignored: the run is at temperature 0, so every draw is the same")
    if plans:
        config = plans[0]["run"].config
        report.forward_model = str(names[0] or config.get("model") or config.get("backend"))
        report.rewriter = str(names[1] or config.get("optimizer_model") or report.forward_model)
    report.calls, report.model_calls, report.tokens = calls, model_calls, tokens
    report.seconds = time.perf_counter() - started
    return report


async def _plan_step(run: LoggedRun, prober: Prober, which: str, methods: list[str],
                     lazy: bool = False) -> dict[str, Any]:
    """The step's failing and passing examples, the gradients to follow (logged, or
    re-computed with the run's method through the probe client) and the probe jobs.
    `lazy` (adaptive blame): the gradients the log lacks are not computed here; their
    jobs are *pending* (`feedback` None) until `ready` computes them for the examples a
    round probes, so examples adaptive blame never reaches cost no backward calls."""
    from engine.core.loss import example_loss
    from engine.methods import make_method

    sampled = set(backpropagated(run))
    train = [e for e, split in run.split_of.items() if split == "train"]
    val = [e for e, split in run.split_of.items() if split == "val"]
    if which == "sampled":
        if not sampled:
            raise NothingToProbe(f"no example was back-propagated at step {run.step}; try "
                                 "--examples failing or val")
        ids = [e for e in train if e in sampled]
    elif which == "failing":
        ids = train
    elif which == "val":
        ids = val
    elif which == "all":
        ids = train + val
    else:
        ids = select_examples(run, which)
    bases = dict(zip(ids, await asyncio.gather(*(prober.baseline(e) for e in ids))))
    failing = [e for e in ids if bases[e].score is not None and bases[e].score < 1.0]
    if not failing:
        raise NothingToProbe(f"no chosen example fails at step {run.step}")
    # passing validation examples: where an edit's regressions show
    val_bases = await asyncio.gather(*(prober.baseline(e) for e in val))
    passing_val = [e for e, b in zip(val, val_bases) if (b.score or 0.0) >= 1.0]

    logged = received_gradients(run)
    run_method = run.config.get("method", "semantic")

    graph = run.graph

    async def backprop(name: str, ids: list[str]) -> tuple[dict, dict, dict]:
        """(aggregated gradient per (example, node); per (example, node, successor) the
        gradient that successor sent, before aggregation, and its claim; per (example,
        node) whether any gradient it received asks it to change)."""
        options = run.config.get("method_options", {}) if name == run_method else {}
        method = make_method(name, **options)
        if not method.uses_gradients or not ids:
            return {}, {}, {}
        sent: list[Gradient] = []  # the backward pass's gradient events, one per edge
        ctx = replace(prober.ctx, emit=lambda event: sent.append(event)
                      if isinstance(event, Gradient) and event.kind == "gradient" else None)
        losses = await asyncio.gather(*(example_loss(prober.ctx, bases[e].trace,
                                                     bases[e].split) for e in ids))
        feedback = await asyncio.gather(*(method.backward(ctx, run.prompts, bases[e].trace,
                                                          loss)
                                          for e, loss in zip(ids, losses)))
        edges = {(g.example_id, g.node_id, g.from_node_id): (g.content or "",
                                                              bool(g.asks_change))
                 for g in sent if g.from_node_id in graph.successors(g.node_id)}
        claims: dict[tuple[str, str], bool] = {}
        for g in sent:
            key = (g.example_id, g.node_id)
            claims[key] = claims.get(key, False) or bool(g.asks_change)
        return ({(e, n): text for e, fb in zip(ids, feedback) for n, text in fb.items()},
                edges, claims)

    missing = [e for e in failing if e not in sampled or not any(k[0] == e for k in logged)]
    gradients = {k: v for k, v in logged.items() if k[0] in failing and k[0] in sampled}
    if not lazy:
        gradients.update((await backprop(run_method, missing))[0])
    by_method, by_edge, method_claims = {}, {}, {}
    for name in methods:
        by_method[name], by_edge[name], method_claims[name] = await backprop(name, failing)
    nodes = [n for n in run.graph.topological_order() if run.graph.node(n).kind == "llm"]
    edits, copied, unchanged = {}, set(), set()
    for n in nodes:
        try:
            edits[n] = proposed_prompt(run, n)
        except CopiedProposal:
            copied.add(n)
        except ProbeError:  # no proposal: the update left the prompt as it was
            unchanged.add(n)
    # method "" marks the run's own gradients; a name, the comparison's re-computed ones
    pending = set(missing) if lazy else set()
    jobs = [dict(kind="gradient", example_id=e, node_id=n,
                 feedback=None if e in pending else gradients[(e, n)])
            for e in failing for n in nodes if e in pending or (e, n) in gradients]
    jobs += [dict(kind="edit", example_id=e, node_id=n, prompt=edits[n], in_sample=e in sampled)
             for n in edits for e in [*failing, *passing_val]]
    jobs += [dict(kind="gradient", example_id=e, node_id=n, feedback=grads[(e, n)], method=name)
             for name, grads in by_method.items()
             for e in failing for n in nodes if (e, n) in grads]
    # a node with several successors: each one's gradient alone (with one, the edge's
    # gradient is the node's, already followed above)
    jobs += [dict(kind="gradient", example_id=e, node_id=n, feedback=edges[(e, n, t)][0],
                  method=name, edge=t)
             for name, edges in by_edge.items() for e in failing for n in nodes
             if len(graph.successors(n)) > 1 for t in graph.successors(n)
             if edges.get((e, n, t), ("",))[0].strip()]

    async def backprop_own(ids: list[str]) -> None:  # a pending job's gradients, into the plan
        pending.difference_update(ids)
        gradients.update((await backprop(run_method, ids))[0])

    return {"run": run, "failing": failing, "nodes": nodes, "edits": edits, "copied": copied,
            "unchanged": unchanged, "pending": pending, "backprop_own": backprop_own,
            "gradients": gradients, "by_method": by_method, "by_edge": by_edge,
            "method_claims": method_claims, "jobs": jobs,
            "recorded": {k: v for k, v in recorded_claims(run.db, run.run_id, run.step).items()
                         if k in logged and k in gradients and gradients[k] == logged[k]},
            "run_method": run_method}


async def ready(plan: dict[str, Any], jobs: list[dict]) -> list[dict]:
    """`jobs` with every pending gradient job (see `_plan_step`'s `lazy`) given its
    gradient, computed now for the examples that lack one; a node that received no gradient
    on an example has no job there."""
    wanted = sorted({j["example_id"] for j in jobs if j.get("feedback", "") is None
                     and j["example_id"] in plan["pending"]})
    if wanted:
        await plan["backprop_own"](wanted)
    gradients = plan["gradients"]
    out = []
    for job in jobs:
        if job["kind"] == "gradient" and job.get("feedback", "") is None:
            key = (job["example_id"], job["node_id"])
            if key not in gradients:
                continue
            job = {**job, "feedback": gradients[key]}
        out.append(job)
    return out


def _group(results: list[ProbeResult]) -> dict[tuple, list[ProbeResult]]:
    groups: dict[tuple, list[ProbeResult]] = {}
    for r in results:
        groups.setdefault((r.kind, r.method if r.kind == "gradient" else "", r.node_id,
                           r.step, r.example_id, r.edge), []).append(r)
    return groups


def majority(draws: list[ProbeResult], outcome: Callable[[ProbeResult], bool]) -> bool:
    """The repeated-draws rule (docs/probes.md): a probe group has an outcome when more
    than half of its draws that did not fail have it. Failed draws are left out (they are
    not evidence either way); a tie is not the outcome; a group whose every draw failed
    has none (it is an error)."""
    ok = [r for r in draws if r.error is None]
    return sum(outcome(r) for r in ok) * 2 > len(ok) > 0


def fixed_by(draws: list[ProbeResult]) -> bool:
    """The group flipped its example by the majority of its draws, without carrying the
    answer: what counts as a flip, and what a claim is compared with."""
    return majority(draws, lambda r: r.flipped) and not any(
        r.leaks_target for r in draws if r.flipped)


def _tally(row: Evidence, draws: list[ProbeResult], claim: bool | None = None) -> None:
    ok = [r for r in draws if r.error is None]
    before = draws[0].before_score
    if before is not None and before >= 1.0:
        row.guarded += 1
        row.regressions += int(majority(draws, lambda r: r.regressed))
        return
    row.probed += 1
    if not ok:
        row.errors += 1
        return
    fixed = majority(draws, lambda r: r.flipped)
    leaked = fixed and any(r.leaks_target for r in ok if r.flipped)
    inside = fixed and draws[0].in_sample
    row.flips += int(fixed and not leaked and not inside)
    row.leaks += int(leaked)
    row.in_sample += int(inside and not leaked)
    row.seen += int(draws[0].in_sample)
    changes = [r.score_change for r in ok if r.score_change is not None]
    if changes:
        row.score_change += sum(changes) / len(changes)
        row.scored += 1
    if len(draws) > 1:
        row.repeat_groups += 1
        row.repeat_agree += int(len({r.flipped for r in draws}) == 1 and len(ok) == len(draws))
    if claim is not None:
        row.claimed += int(claim)
        row.claim_agree += int(claim == (fixed and not leaked))


def own_counts(results: list[ProbeResult], kind: str) -> dict[str, tuple[int, int, int]]:
    """Per node, (flips, counted, leaks) of the run's own gradient probes or of the edit
    probes made so far, counted as the verdict counts them (`Evidence`)."""
    rows: dict[str, Evidence] = {}
    for (k, method, node, *_), draws in _group(results).items():
        if k == kind and not method:
            _tally(rows.setdefault(node, Evidence(node, kind)), draws)
    return {n: (r.flips, r.counted, r.leaks) for n, r in rows.items()}


def blame_estimate(plans: list[dict], draws: int, adaptive: bool) -> str:
    """One line before the first probe: the probes planned, their model calls (a gradient
    probe: its rewrite, an optimizer call, and the nodes below; an edit probe: the node and
    those below; an example whose gradients are still to compute: about an optimizer call
    per node; cached calls count too) and the time at the run's own paces (`run_paces`)."""
    forward = optimizer = probes = 0
    for plan in plans:
        below = _llm_below(plan["run"].graph, plan["nodes"])
        for job in plan["jobs"]:
            probes += draws
            forward += draws * below[job["node_id"]]
            if job["kind"] == "gradient":
                optimizer += draws
            else:
                forward += draws
        optimizer += len(plan.get("pending", ())) * len(plan["nodes"])
    run = plans[0]["run"]
    return _estimate_line(probes, forward, optimizer, run_paces(run.db, run.run_id), adaptive)


def estimate_from_log(db: str, run_id: str, step: int, examples: str = "failing",
                      adaptive: bool = True) -> str:
    """The line `blame_estimate` prints, before any model call, from the run log alone (the
    dashboard's button shows it): the step's logged failing examples of the chosen split,
    one gradient and one edit probe each per LLM node, and each edit on the passing
    validation examples; an upper bound, as blame's own plan is. Blame probes the prompts
    in force when the step began: its training losses are logged at the step, but its
    validation losses at the step before (the step's own are the kept candidate's)."""
    run = load_run(db, run_id, step)
    nodes = [n for n in run.graph.topological_order() if run.graph.node(n).kind == "llm"]
    counts = {**step_failing(db, run_id, step - 1), "train": step_failing(db, run_id, step)
              .get("train", (0, 0))}
    split = "val" if examples == "val" else "train"
    failing = counts.get(split, (0, 0))[0] + (counts.get("val", (0, 0))[0]
                                               if examples == "all" else 0)
    passing = counts.get("val", (0, 0))[1] - counts.get("val", (0, 0))[0]
    below = _llm_below(run.graph, nodes)
    probes = sum(2 * failing + passing for _ in nodes)
    # per node: a gradient probe (a rewrite, then the nodes below) on each failing example
    # and an edit probe (the node and those below) on each failing and passing one
    forward = sum(failing * below[n] + (failing + passing) * (below[n] + 1) for n in nodes)
    optimizer = failing * len(nodes)
    # examples the step did not back-propagate need a backward pass first: about a
    # gradient call per node each
    fresh = failing - (len(set(backpropagated(run))) if split == "train" else 0)
    optimizer += max(fresh, 0) * len(nodes)
    return _estimate_line(probes, forward, optimizer, run_paces(db, run_id), adaptive)


def _llm_below(graph: Any, nodes: list[str]) -> dict[str, int]:
    return {n: sum(1 for d in descendants(graph, n) if graph.node(d).kind == "llm")
            for n in nodes}


def _estimate_line(probes: int, forward: int, optimizer: int,
                   paces: tuple[float, float] | None, adaptive: bool) -> str:
    calls = forward + optimizer
    when = ""
    if paces:
        seconds = forward * paces[0] + optimizer * paces[1]
        when = (f" ({forward} forward, {optimizer} optimizer), {_duration(seconds)} at "
                f"this run's pace ({_pace(paces[0])} a forward call, {_pace(paces[1])} an "
                "optimizer call; cached calls are faster)")
    how = ("adaptive: probed in rounds of a few examples, it stops where the probes no "
           "longer decide anything, so it usually makes far fewer; --exhaustive makes all"
           if adaptive else "every planned probe is made")
    return f"blame: up to {probes} probes, about {calls} model calls{when}; {how}"


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    return f"about {seconds:.0f} s" if seconds < 120 else f"about {seconds / 60:.0f} min"


def _pace(seconds: float) -> str:
    """A call's pace as people read it: 0.3 s, 12 s, under 10 ms (never 5e-05 s)."""
    if seconds < 0.01:
        return "under 10 ms"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


def summarize(run_id: str, steps: list[int], which: str, plans: list[dict],
              results: list[ProbeResult]) -> BlameReport:
    nodes = plans[0]["nodes"] if plans else []
    grads = {n: Evidence(n, "gradient") for n in nodes}
    edits = {n: Evidence(n, "edit") for n in nodes}
    names = list(plans[0]["by_method"]) if plans else []
    per_method = {(m, n): Evidence(n, "gradient", m) for m in names for n in nodes}
    graph = plans[0]["run"].graph if plans else None
    per_edge = {(m, n, t): Evidence(n, "gradient", m, edge=t) for m in names for n in nodes
                for t in graph.successors(n)}
    method_claims = {(m, p["run"].step, e, n): c for p in plans
                     for m, cl in p.get("method_claims", {}).items() for (e, n), c in cl.items()}
    edge_claims = {(m, p["run"].step, e, n, t): c for p in plans
                   for m, edges in p.get("by_edge", {}).items()
                   for (e, n, t), (_, c) in edges.items()}
    texts = {(p["run"].step, e, n): t for p in plans for (e, n), t in p["gradients"].items()}
    recorded = {(p["run"].step, e, n): c for p in plans
                for (e, n), c in p.get("recorded", {}).items()}
    claims = []
    for key, draws in _group(results).items():
        kind, method, node, step, example, edge = key
        if kind == "edit":
            _tally(edits[node], draws)
        elif method and edge:
            _tally(per_edge[(method, node, edge)], draws,
                   edge_claims.get((method, step, example, node, edge), False))
        elif method:
            _tally(per_method[(method, node)], draws,
                   method_claims.get((method, step, example, node), False))
        else:
            # the claim recorded at backward time; a log without one: read from the text
            asks, reading = recorded.get((step, example, node)) or gradient_claim(
                texts.get((step, example, node), ""))
            _tally(grads[node], draws, asks)
            claims.append({"step": step, "example": example, "node": node, "asks_change": asks,
                           "reading": reading, "flipped": fixed_by(draws)})
    for p in plans:
        for n in p["copied"]:
            edits[n].copy_rejected += 1
        for n in p.get("unchanged", ()):
            edits[n].unchanged += 1
    has_gradients = any(r.probed for r in grads.values())
    chosen, evidence, note = weigh(list(grads.values()) if has_gradients else [],
                                   list(edits.values()))
    # Per example, the gradients point at the node furthest upstream that they ask to
    # change: every request downstream of it traces back to it (the output node's own
    # gradient is the loss, which always asks). Two such nodes, neither upstream of the
    # other: the example points at no single node. Across examples: the most pointed at.
    asked: dict[tuple[int, str], set[str]] = {}
    for c in claims:
        if c["asks_change"]:
            asked.setdefault((c["step"], c["example"]), set()).add(c["node"])
    pointed: dict[tuple[int, str], str] = {}
    for key, asking in asked.items():
        roots = [n for n in asking
                 if not any(n in descendants(graph, m) for m in asking - {n})]
        if len(roots) == 1:
            pointed[key] = roots[0]
    claims_by_example = {(c["step"], c["example"]) for c in claims}
    counts = {n: list(pointed.values()).count(n) for n in nodes}
    top = max(counts.values(), default=0)
    leaders = [n for n, c in counts.items() if c == top and top > 0]
    examples = [(p["run"].step, e) for p in plans for e in p["failing"]]
    report = BlameReport(run_id, steps, which, examples, list(grads.values()),
                         list(edits.values()), evidence, chosen,
                         leaders[0] if len(leaders) == 1 else None, claims,
                         list(per_method.values()), results=results, evidence_note=note)
    report.pointed = (top if len(leaders) == 1 else 0, len(pointed), len(claims_by_example))
    if len(plans) == 1:
        run = plans[0]["run"]
        origins = {n: proposal_origin(run.db, run.run_id, run.step, n) for n in plans[0]["edits"]}
        report.edit_origins = {n: origin for n, origin in origins.items() if origin}
    report.method_verdicts = {m: verdict([per_method[(m, n)] for n in nodes]) for m in names}
    for m, n, t in list(per_edge):  # one successor: the edge's gradient is the node's
        if len(graph.successors(n)) == 1:
            per_edge[(m, n, t)] = replace(per_method[(m, n)], edge=t)
    report.edges = list(per_edge.values())
    return report

