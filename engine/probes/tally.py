"""Probe results counted as the verdict counts them: grouped by (kind, method, node,
step, example, edge), a group's outcome the majority of its draws, and each group added
to its node's `Evidence`."""

from __future__ import annotations

from collections.abc import Callable

from engine.probes.probe import (
    ProbeResult,
)
from engine.probes.verdict import Evidence


def group(results: list[ProbeResult]) -> dict[tuple, list[ProbeResult]]:
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


def tally(row: Evidence, draws: list[ProbeResult], claim: bool | None = None) -> None:
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
    for (k, method, node, *_), draws in group(results).items():
        if k == kind and not method:
            tally(rows.setdefault(node, Evidence(node, kind)), draws)
    return {n: (r.flips, r.counted, r.leaks) for n, r in rows.items()}

