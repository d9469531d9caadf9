"""The verdict, pure (no model call, no asyncio; the only module of engine/probes the
dashboard imports): the evidence per node (`Evidence`, pooled probe counts with a 90%
Wilson interval), which node it blames (`Verdict`: `weigh` chooses the gradient or the
edit probes, `verdict` names the node whose interval lies above every other's, or the
nodes tied), the facts per node the pages draw (`NodeFact`, `weighed`), and the verdict
read back from logged probe rows (`logged_verdict`, `logged_blame`). Definitions:
docs/probes.md and engine/probes/blame.py."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from engine.core.copies import COPY_REASON
from engine.data.stats import wilson
from engine.events import same_prompt
from engine.runlog.probing import chosen_updates


def proposal_kind(row: tuple[str, str, str] | None) -> str:
    """What a node's update at a step left to probe, from its (old prompt, new prompt,
    reject reason) row: "copied" (rejected as a copy of training examples: never probed),
    "unchanged" (no update, or the prompt left as it was) or "proposed"."""
    if row is not None and row[2] == COPY_REASON:
        return "copied"
    if row is None or same_prompt(row[0], row[1]):
        return "unchanged"
    return "proposed"


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

