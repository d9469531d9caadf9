"""`blame`: which node do the probes blame, and how sure is that?

`blame(...)` pools every backward step of a run (or one): at each LLM node it follows the
gradient the node received on every chosen failing example, and runs the node's proposed
edit alone on them and on the passing validation examples; with `methods`, it re-runs each
named method's backward pass on the same logged traces and follows those gradients too.
It reads as its stages, one module each:

1. plan (engine/probes/plan.py): per step, the examples, the gradients and the probe jobs;
2. estimate (estimate.py): what the plan will cost, said before the first probe;
3. probe (probe.py's Prober; adaptive.py decides, round by round, which to make);
4. tally (tally.py): each probe group counted as the verdict counts it;
5. verdict (verdict.py, pure): the evidence per node and the node it blames;
6. report (report.py): `BlameReport`, what the command prints and `--json` holds.

Which examples and edits a probe works on: selection.py; one probe command: single.py.

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
from typing import Any

from engine.llm.base import Backend
from engine.probes.adaptive import probe_adaptively
from engine.probes.estimate import blame_estimate, estimate_from_log
from engine.probes.plan import BlamePlan, Job, plan_step, ready
from engine.probes.probe import ProbeError, Prober, ProbeResult, load_run, open_prober
from engine.probes.report import BlameReport, summarize
from engine.probes.selection import EXAMPLE_CHOICES, NothingToProbe
from engine.probes.tally import own_counts
from engine.runlog.probing import optimization_steps


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
    steps = optimization_steps(db, run_id) if step is None else [step]
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
                plans.append(await plan_step(run, probers[-1], which, methods,
                                              lazy=adaptive and len(steps) == 1))
            except NothingToProbe as exc:  # pooled: a step with nothing to probe is skipped
                if step is not None:
                    raise
                empty.append(str(exc))
                await probers.pop().ctx.client.aclose()
        if not plans:
            raise ProbeError(empty[0] if len(empty) == 1 else
                             f"no step of run '{run_id}' has examples to probe ({empty[-1]})")
        temperature = float(plans[0].run.config.get("temperature", 0.0)) if plans else 0.0
        draws = repeats if temperature > 0 else 1
        total = sum(len(p.jobs) for p in plans) * draws
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

            async def probe_all(jobs: list[Job], plan: BlamePlan = plan) -> list[ProbeResult]:
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
                results.extend(await probe_all(plan.jobs))
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
        config = plans[0].run.config
        report.forward_model = str(names[0] or config.get("model") or config.get("backend"))
        report.rewriter = str(names[1] or config.get("optimizer_model") or report.forward_model)
    report.calls, report.model_calls, report.tokens = calls, model_calls, tokens
    report.seconds = time.perf_counter() - started
    return report

