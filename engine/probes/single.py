"""One probe command (`python -m engine probe`): the request checked against the run log,
its probes run and logged."""

from __future__ import annotations

import asyncio
from typing import Any

from engine.llm.base import Backend
from engine.probes.probe import (
    KINDS,
    ProbeError,
    ProbeResult,
    load_run,
    open_prober,
)
from engine.probes.selection import (
    backpropagated,
    proposed_prompt,
    received_gradients,
    select_examples,
)


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

