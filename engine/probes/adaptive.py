"""Adaptive blame: probe in rounds of a few examples and stop spending probes where they no
longer decide anything (docs/probes.md, "Adaptive blame").

Exhaustive blame follows every node's gradient on every failing example, then runs every
node's proposed edit on every failing and passing example. Most of those probes decide
nothing: a node far behind the leader after a few examples stays behind, and once the
gradient probes name a node the edit probes are not weighed at all (`weigh`). So:

1. The gradient probes go in rounds of ROUND examples (a fixed order, the same every time
   for a run; the first round with an early look after EARLY examples, see there).
   After each round, a node is out (not probed again) when
   - its interval lies wholly below the leader's;
   - no node has a flip yet, and
     - its gradient fixes have all carried the answer (at least LEAKS of them): a node
       whose right output is the answer itself, which its successor copies; a leak is
       never a flip, so more of its probes add leaks, not evidence; or
     - its rate, at the look's interval, lies below the share it would need to be named
       beside the others' evidence (`cannot_be_named`).
     Once a node flips, the leader rule alone decides: a node dropped early keeps a wide
     interval, which the leader would then have to clear.
   When the leader's interval lies above every other node's, the gradient probes have
   named it and probing stops. An example's gradients, where the step did not
   back-propagate it, are computed when a round first probes it (engine/probes/plan.py,
   `ready`): on the embedded pair that backward pass is most of blame's cost.
2. Only when they name no node do the edit probes run, in rounds the same way, on the
   failing examples.
3. The passing examples (where an edit's regressions show) are probed for the nodes the
   verdict names or ties on only: regressions describe an edit, they never move a verdict.

The stopping decisions look at the evidence after every round, so each look uses a wider
interval than the verdict's 90% one: the 90% level split over the planned looks
(Bonferroni), so that all looks together are wrong no more often than one 90% look. The
verdict itself is the one exhaustive blame computes (`weigh`), from the probes made: a
node dropped as clearly behind is still compared, on the examples it was probed on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from hashlib import sha256
from statistics import NormalDist
from typing import Any

from engine.data.stats import Z90, wilson
from engine.probes.plan import BlamePlan

ROUND = 4  # examples a round: a few, so that a clear leader stops early
LEAKS = 2  # gradient fixes, all carrying the answer, after which a node's are not followed
# The gradient probes' first round gets an early look after EARLY examples: a gradient
# probe costs optimizer calls (its rewrite, and the backward pass of an example the step
# did not back-propagate), an edit probe only forward calls, so the rules for giving up get
# a look before most of that is spent (look's `give_up_only`).
EARLY = LEAKS
VERDICT_ALPHA = 2 * (1 - NormalDist().cdf(Z90))  # the verdict's intervals: 90%


def look_z(looks: int) -> float:
    """The interval width of one of `looks` looks: 90% over all of them together."""
    alpha = VERDICT_ALPHA / max(1, looks)
    return NormalDist().inv_cdf(1 - alpha / 2)


def example_order(run_id: str, examples: Iterable[str]) -> list[str]:
    """The examples in the order their rounds take them: fixed for a run (a repeat of the
    blame probes the same examples first), unrelated to their ids' order."""
    return sorted(examples, key=lambda e: sha256(f"{run_id}\0{e}".encode()).hexdigest())


def rounds_of(examples: list[str], size: int = ROUND) -> list[list[str]]:
    return [examples[i:i + size] for i in range(0, len(examples), size)]


@dataclass(frozen=True)
class Look:
    """What one look at the evidence decided: the node the probes name (None: not yet),
    and the nodes clearly behind the leader (no more probes for them)."""

    named: str | None
    behind: frozenset[str]
    why: dict[str, str] = field(default_factory=dict, compare=False)  # node -> its reason

    def reasons(self) -> dict[str, str]:
        """Each node out and why: `why`'s, else clearly behind the leader."""
        return {n: self.why.get(n, BEHIND) for n in self.behind}


BEHIND = "fell clearly behind"
LEAKED = "had every gradient fix carry the answer"
FUTILE = "could no longer be named"


def needed_share(others: list[tuple[int, int]], examples: int) -> float | None:
    """The least flip share over `examples` whose 90% interval (the verdict's) would lie
    above every interval of `others` ((flips, counted) each, as they stand): what a node
    must reach to be named. None when no share would (or no other node has evidence)."""
    tops = [wilson(f, c)[1] for f, c in others if c]
    if not tops or examples < 1:
        return None
    top = max(tops)
    return next((k / examples for k in range(examples + 1)
                 if wilson(k, examples)[0] > top), None)


def cannot_be_named(counts: dict[str, tuple[int, int]], node: str, examples: int,
                    z: float, out: frozenset[str] = frozenset()) -> bool:
    """Futility, for a node with no flip yet: its flip rate, at the look's interval, lies
    wholly below the share it would need over `examples` to be named beside the other
    nodes' evidence: a node `out` of the rounds (never probed again) as its evidence
    stands; one still in them as if probed on every example at its rate so far (its
    interval narrows, the need falls). Exact curtailment, "could it still be named if every
    remaining probe flipped?", almost never stops; this stops where the evidence says it
    will not. A node with a flip is left to the leader rule."""
    f, c = counts[node]
    if f or not c:
        return False
    others = [t if n in out else (round(t[0] / t[1] * examples), examples)
              for n, t in counts.items() if n != node and t[1]]
    if not others:
        return False
    need = needed_share(others, examples)
    return need is None or wilson(f, c, z)[1] < need


def look(counts: dict[str, tuple[int, ...]], looks: int, examples: int | None = None,
         out: frozenset[str] = frozenset(), give_up_only: bool = False) -> Look:
    """`counts`: node -> (flips, counted probes[, leaks]) so far. A node is behind when its
    interval's top lies below the leader's bottom; while no node has flipped, also when
    (leaks given) its fixes all carried the answer, at least LEAKS of them, or
    (`examples`: how many each node can be probed on in all; `out`: the nodes already
    behind) when it `cannot_be_named`. The leader is named when every other node is
    behind it by its interval. Intervals at `look_z(looks)`. `give_up_only`: the early look
    of the gradient probes' first round (see EARLY), which applies only the rules for
    giving up: they can only keep a node from being named, never name one, so they spend
    none of the looks' 10%."""
    z = look_z(looks)
    flips = {n: (t[0], t[1]) for n, t in counts.items()}
    if not any(f for f, _ in flips.values()):  # no leader yet: only the rules for giving up
        why = {n: LEAKED for n, t in counts.items() if len(t) > 2 and t[2] >= LEAKS}
        if examples:
            gone = out | frozenset(why)
            why.update((n, FUTILE) for n in flips
                       if n not in gone and cannot_be_named(flips, n, examples, z, gone))
        return Look(None, frozenset(why), why)
    if give_up_only or len(flips) < 2:
        return Look(None, frozenset())
    bounds = {n: wilson(f, c, z) for n, (f, c) in flips.items()}
    leader = max(flips, key=lambda n: (flips[n][0] / flips[n][1] if flips[n][1] else 0.0,
                                       flips[n][1]))
    floor = bounds[leader][0]
    clear = frozenset(n for n in flips if n != leader and bounds[n][1] < floor)
    return Look(leader if len(clear) == len(flips) - 1 else None, clear)

Jobs = list[dict[str, Any]]


@dataclass
class Spent:
    """What adaptive blame did with its planned probes (the report says it)."""

    planned: int = 0
    made: int = 0
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"planned": self.planned, "made": self.made, "notes": self.notes}


async def probe_adaptively(plan: BlamePlan, run_id: str,
                           probe_all: Callable[[Jobs], Awaitable[list]],
                           counts_of: Callable[[list, str], dict[str, tuple[int, ...]]],
                           named_of: Callable[[list], list[str]],
                           skip: Callable[[int], None]) -> tuple[list, Spent]:
    """Probe `plan`'s jobs as the module docstring says. `probe_all(jobs)` makes probes and
    returns their results; `counts_of(results, kind)` is each node's (flips, counted,
    leaks) of that kind so far; `named_of(results)` the nodes the verdict names or ties on;
    `skip(n)`: n planned probes will not be made (for the progress line's total)."""
    jobs = plan.jobs
    failing = set(plan.failing)
    own = [j for j in jobs if j["kind"] == "gradient" and not j.get("method")]
    edits = [j for j in jobs if j["kind"] == "edit" and j["example_id"] in failing]
    guards = [j for j in jobs if j["kind"] == "edit" and j["example_id"] not in failing]
    compared = [j for j in jobs if j["kind"] == "gradient" and j.get("method")]
    spent = Spent(planned=len(jobs))
    results = list(await probe_all(compared)) if compared else []
    spent.made += len(compared)
    for kind, pool in (("gradient", own), ("edit", edits)):
        if not pool:
            continue
        named, made, out, examples, total = await _in_rounds(kind, pool, run_id, results,
                                                             probe_all, counts_of)
        spent.made += made
        skip(len(pool) - made)
        said = f"{kind} probes: {made} of {len(pool)}, on {examples} of {total} examples"
        if out:
            by_reason: dict[str, list[str]] = {}
            for node, reason in sorted(out.items()):
                by_reason.setdefault(reason, []).append(node)
            said += "; " + ", ".join(f"{' and '.join(nodes)} {reason}"
                                     for reason, nodes in by_reason.items())
            said += ": not probed again"
        if named:
            said += f"; they named {named}"
        spent.notes.append(said)
        if named and kind == "gradient":
            skip(len(edits))
            if edits:
                spent.notes.append("edit probes on failing examples: none made (the gradient "
                                   "probes decide the verdict)")
            break
    wanted = set(named_of(results))
    kept = [j for j in guards if j["node_id"] in wanted]
    skip(len(guards) - len(kept))
    if guards:
        spent.notes.append(f"passing examples (regressions): probed for "
                           f"{', '.join(sorted(wanted)) or 'no node'} only, "
                           f"{len(kept)} of {len(guards)} probes")
    results += await probe_all(kept) if kept else []
    spent.made += len(kept)
    return results, spent


async def _in_rounds(kind: str, pool: Jobs, run_id: str, results: list,
                     probe_all: Callable[[Jobs], Awaitable[list]],
                     counts_of: Callable[[list, str], dict[str, tuple[int, ...]]]
                     ) -> tuple[str | None, int, dict[str, str], int, int]:
    """(the node named, probes made, the nodes out of the rounds and why, examples probed,
    examples in all); appends the results to `results`."""
    batches = rounds_of(example_order(run_id, {j["example_id"] for j in pool}))
    total = sum(map(len, batches))
    out: dict[str, str] = {}
    made = examples = 0
    for index, batch in enumerate(batches):
        # the gradient probes' first round in two parts, the first of EARLY examples
        parts = ([batch[:EARLY], batch[EARLY:]] if kind == "gradient" and index == 0
                 and len(batch) > EARLY else [batch])
        for part_index, part in enumerate(parts):
            todo = [j for j in pool if j["example_id"] in part and j["node_id"] not in out]
            if not todo:  # every node is out
                return None, made, out, examples, total
            new = await probe_all(todo)  # without the jobs of nodes that got no gradient
            results += new
            made += len({(r.example_id, r.node_id) for r in new})
            examples += len(part)
            tallies = counts_of(results, kind)
            # leaks and futility: the gradient probes' rules (their probes are the dear
            # ones; an edit probe is forward calls only, and its leader rule names early)
            if kind == "gradient":
                seen = look(tallies, len(batches), total, frozenset(out),
                            give_up_only=part_index < len(parts) - 1)
            else:
                seen = look({n: t[:2] for n, t in tallies.items()}, len(batches))
            out.update((n, w) for n, w in seen.reasons().items() if n not in out)
            if seen.named:
                return seen.named, made, out, examples, total
    return None, made, out, examples, total

