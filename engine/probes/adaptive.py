"""Adaptive blame: probe in rounds of a few examples and stop spending probes where they no
longer decide anything (docs/probes.md, "Adaptive blame").

Exhaustive blame follows every node's gradient on every failing example, then runs every
node's proposed edit on every failing and passing example. Most of those probes decide
nothing: a node far behind the leader after a few examples stays behind, and once the
gradient probes name a node the edit probes are not weighed at all (`weigh`). So:

1. The gradient probes go in rounds of ROUND examples (a fixed order, the same every time
   for a run). After each round, a node whose interval lies wholly below the leader's is
   out: it is not probed again. When the leader's interval lies above every other node's,
   the gradient probes have named it and probing stops.
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

ROUND = 4  # examples a round: a few, so that a clear leader stops early
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


def look(counts: dict[str, tuple[int, int]], looks: int) -> Look:
    """`counts`: node -> (flips, counted probes) so far. A node is behind when its
    interval's top lies below the leader's bottom; the leader is named when every other
    node is behind. Intervals at `look_z(looks)`."""
    z = look_z(looks)
    bounds = {n: wilson(f, c, z) for n, (f, c) in counts.items()}
    if len(counts) < 2 or not any(f for f, _ in counts.values()):
        return Look(None, frozenset())
    leader = max(counts, key=lambda n: (counts[n][0] / counts[n][1] if counts[n][1] else 0.0,
                                        counts[n][1]))
    floor = bounds[leader][0]
    behind = frozenset(n for n in counts if n != leader and bounds[n][1] < floor)
    named = leader if len(behind) == len(counts) - 1 else None
    return Look(named, behind)


Jobs = list[dict[str, Any]]


@dataclass
class Spent:
    """What adaptive blame did with its planned probes (the report says it)."""

    planned: int = 0
    made: int = 0
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"planned": self.planned, "made": self.made, "notes": self.notes}


async def probe_adaptively(plan: dict[str, Any], run_id: str,
                           probe_all: Callable[[Jobs], Awaitable[list]],
                           counts_of: Callable[[list, str], dict[str, tuple[int, int]]],
                           named_of: Callable[[list], list[str]],
                           skip: Callable[[int], None]) -> tuple[list, Spent]:
    """Probe `plan`'s jobs as the module docstring says. `probe_all(jobs)` makes probes and
    returns their results; `counts_of(results, kind)` is each node's (flips, counted) of
    that kind so far; `named_of(results)` the nodes the verdict names or ties on;
    `skip(n)`: n planned probes will not be made (for the progress line's total)."""
    jobs = plan["jobs"]
    failing = set(plan["failing"])
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
        named, made, behind, examples, total = await _in_rounds(kind, pool, run_id, results,
                                                                probe_all, counts_of)
        spent.made += made
        skip(len(pool) - made)
        said = f"{kind} probes: {made} of {len(pool)}, on {examples} of {total} examples"
        if behind:
            said += f"; {', '.join(sorted(behind))} fell clearly behind and were not probed again"
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
                     counts_of: Callable[[list, str], dict[str, tuple[int, int]]]
                     ) -> tuple[str | None, int, frozenset[str], int, int]:
    """(the node named, probes made, nodes left behind, examples probed, examples in all);
    appends the results to `results`."""
    batches = rounds_of(example_order(run_id, {j["example_id"] for j in pool}))
    behind: frozenset[str] = frozenset()
    made = examples = 0
    for batch in batches:
        todo = [j for j in pool if j["example_id"] in batch and j["node_id"] not in behind]
        results += await probe_all(todo)
        made, examples = made + len(todo), examples + len(batch)
        seen = look(counts_of(results, kind), len(batches))
        behind = behind | seen.behind
        if seen.named:
            return seen.named, made, behind, examples, sum(map(len, batches))
    return None, made, behind, examples, sum(map(len, batches))
