"""What to probe at a logged step, and `blame`: which node do the probes blame?

`probe(...)` is the entry point of one probe command (it checks the request against the
run log, runs the probes and writes them). `blame(...)` runs the gradient probe for every
(failing example, LLM node) pair of a step, and each node's proposed edit alone on the
same examples, then compares where the probes point with where the gradients pointed.

Definitions (docs/probes.md):
- a probe *flips* an example when the example scored below 1 and scores 1 after the
  intervention; flips whose intervention contains the target verbatim are counted apart
  (`leaks`), as they may be the answer copied through rather than credit;
- the probes *blame* the node with the highest share of non-leaking gradient flips;
- the gradients *single out* the node whose received (aggregated) gradient was longest on
  average over the probed examples; a gradient that asks for no change counts as empty.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.llm.base import Backend
from engine.probes.probe import (
    KINDS,
    LoggedRun,
    ProbeError,
    Prober,
    ProbeResult,
    load_run,
    open_prober,
)
from engine.runlog.schema import connect

NO_CHANGE = re.compile(
    r"\b(no changes? (is |are )?needed|needs? no change|need not change|does not need to "
    r"change|should not change|is (already )?(fine|correct|right) as (it is|is)|keep (it|this "
    r"input) (as it is|as is|unchanged))\b", re.I)


async def probe(db: str, run_id: str, step: int, node_id: str, kind: str, *,
                example: str | None = None, text: str | None = None,
                examples: str = "failing", forward_backend: Backend | None = None,
                optimizer_backend: Backend | None = None) -> list[ProbeResult]:
    """Run one probe command and log it. output: `text` is the new output of `node_id` on
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
        jobs = [dict(kind=kind, example_id=e, node_id=node_id, prompt=prompt) for e in ids]
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
    prober = open_prober(run, forward_backend, optimizer_backend)
    try:
        results = await asyncio.gather(*(prober.intervene(**job) for job in jobs))
        prober.save()
    finally:
        await prober.ctx.client.aclose()
    return list(results)


def received_gradients(run: LoggedRun) -> dict[tuple[str, str], str]:
    """(example, node) -> the aggregated gradient the node acted on at the step."""
    with connect(run.db, read_only=True) as con:
        rows = con.execute(
            "SELECT example_id, node_id, content FROM gradients WHERE run_id = ? AND step = ? "
            "AND kind = 'aggregate'", [run.run_id, run.step]).fetchall()
    return {(e, n): c or "" for e, n, c in rows}


def proposed_prompt(run: LoggedRun, node_id: str) -> str:
    with connect(run.db, read_only=True) as con:
        row = con.execute("SELECT old_prompt, new_prompt FROM updates WHERE run_id = ? AND "
                          "step = ? AND node_id = ?", [run.run_id, run.step, node_id]).fetchone()
    if row is None or not (row[1] or "").strip() or row[1].strip() == (row[0] or "").strip():
        raise ProbeError(f"step {run.step} has no proposed edit for node '{node_id}'"
                         + ("" if row is None else " (its update left the prompt unchanged)"))
    return row[1]


def backpropagated(run: LoggedRun) -> list[str]:
    """Examples whose loss was back-propagated at the step, in dataset order. A method
    that writes no gradients (`none`) leaves no trace of them: the optimizer's seeded
    sample is drawn again from the step's logged training losses."""
    from engine.core.optimizer import sample_failures
    from engine.events import LossRecord

    with connect(run.db, read_only=True) as con:
        rows = con.execute(
            "SELECT DISTINCT g.example_id, e.position FROM gradients g JOIN examples e ON "
            "e.run_id = g.run_id AND e.example_id = g.example_id WHERE g.run_id = ? AND "
            "g.step = ? ORDER BY e.position", [run.run_id, run.step]).fetchall()
        losses = [] if rows or run.step == 0 else con.execute(
            "SELECT l.example_id, l.score, l.error FROM losses l JOIN examples e ON "
            "e.run_id = l.run_id AND e.example_id = l.example_id AND e.split = 'train' "
            "WHERE l.run_id = ? AND l.step = ? AND l.split = 'train' ORDER BY e.position",
            [run.run_id, run.step]).fetchall()
    if rows or not losses:
        return [r[0] for r in rows]
    records = [LossRecord(run.run_id, run.step, "train", e, "", "", s, "", err)
               for e, s, err in losses]
    chosen = sample_failures(records, int(run.config.get("failures_per_step", 2)),
                             int(run.config.get("seed", 0)), run.step)
    return [losses[i][0] for i in chosen]


def select_examples(run: LoggedRun, which: str) -> list[str]:
    if which == "failing":
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


# --- blame ------------------------------------------------------------------------------


@dataclass
class NodeBlame:
    node_id: str
    probed: int = 0  # gradient probes run (examples where the node received a gradient)
    flips: int = 0  # ... that flipped the example, intervention not containing the target
    leaks: int = 0  # flips whose intervention contains the target verbatim
    edit_probed: int = 0
    edit_flips: int = 0
    has_edit: bool = False
    gradient_chars: float = 0.0  # mean length of the gradient it received (no change = 0)

    @property
    def share(self) -> float:
        return self.flips / self.probed if self.probed else 0.0


@dataclass
class BlameReport:
    run_id: str
    step: int
    examples: list[str]
    nodes: list[NodeBlame]
    blamed: list[str]  # nodes with the highest flip share (> 0); one when singled out
    by_gradients: str | None  # the node the gradients singled out
    calls: int = 0
    model_calls: int = 0
    seconds: float = 0.0
    results: list[ProbeResult] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return len(self.blamed) == 1 and self.blamed[0] == self.by_gradients


async def blame(db: str, run_id: str, step: int, examples: str = "failing", *,
                forward_backend: Backend | None = None,
                optimizer_backend: Backend | None = None,
                progress: Callable[[int, int], None] | None = None) -> BlameReport:
    """Gradient probes for every (failing example, LLM node) pair at `step`, and each
    node's proposed edit alone on the same examples; logged like any probe.
    `progress(done, total)` is called as probes finish."""
    if examples not in ("failing", "val"):
        raise ProbeError(f"--examples must be 'failing' or 'val', not {examples!r}")
    run = load_run(db, run_id, step)
    started = time.perf_counter()
    prober = open_prober(run, forward_backend, optimizer_backend)
    client = prober.ctx.client
    try:
        ids, gradients = await _failing_with_gradients(run, prober, examples)
        nodes = [n.id for n in run.graph.nodes if n.kind == "llm"]
        order = {n: i for i, n in enumerate(run.graph.topological_order())}
        nodes.sort(key=order.get)
        edits = {}
        for n in nodes:
            try:
                edits[n] = proposed_prompt(run, n)
            except ProbeError:
                pass
        jobs = [dict(kind="gradient", example_id=e, node_id=n, feedback=gradients[(e, n)])
                for e in ids for n in nodes if gradients.get((e, n), "").strip()]
        jobs += [dict(kind="edit", example_id=e, node_id=n, prompt=edits[n])
                 for n in edits for e in ids]
        done = 0

        async def one(job: dict) -> ProbeResult:
            nonlocal done
            result = await prober.intervene(**job)
            done += 1
            if progress:
                progress(done, len(jobs))
            return result

        if progress:
            progress(0, len(jobs))
        results = await asyncio.gather(*(one(job) for job in jobs))
        prober.save()
    finally:
        await client.aclose()
    report = summarize(run, ids, nodes, edits, gradients, list(results))
    report.calls, report.model_calls = client.stats.calls, client.stats.network_calls
    report.seconds = time.perf_counter() - started
    return report


async def _failing_with_gradients(run: LoggedRun, prober: Prober, which: str
                                  ) -> tuple[list[str], dict[tuple[str, str], str]]:
    """failing: the back-propagated examples and their logged gradients. val: the
    validation examples that fail with the step's prompts, back-propagated now with the
    run's method through the probe client (those gradients are not logged)."""
    if which == "failing":
        ids = backpropagated(run)
        if not ids:
            raise ProbeError(f"no example was back-propagated at step {run.step}; try "
                             "--examples val")
        return ids, received_gradients(run)
    from engine.core.loss import example_loss
    from engine.methods import make_method

    method = make_method(run.config.get("method", "semantic"),
                         **run.config.get("method_options", {}))
    ids = select_examples(run, "val")
    bases = await asyncio.gather(*(prober.baseline(e) for e in ids))
    failing = [(e, b) for e, b in zip(ids, bases) if (b.score or 0.0) < 1.0]
    losses = await asyncio.gather(*(example_loss(prober.ctx, b.trace, b.split)
                                    for _, b in failing))
    feedback = await asyncio.gather(*(method.backward(prober.ctx, run.prompts, b.trace, loss)
                                      for (_, b), loss in zip(failing, losses)))
    gradients = {(e, n): text for (e, _), fb in zip(failing, feedback) for n, text in fb.items()}
    return [e for e, _ in failing], gradients


def summarize(run: LoggedRun, ids: list[str], nodes: list[str], edits: dict[str, str],
              gradients: dict[tuple[str, str], str], results: list[ProbeResult]
              ) -> BlameReport:
    rows = {n: NodeBlame(n, has_edit=n in edits) for n in nodes}
    for r in results:
        row = rows[r.node_id]
        if r.kind == "gradient":
            row.probed += 1
            row.flips += int(r.flipped and not r.leaks_target)
            row.leaks += int(r.flipped and r.leaks_target)
        else:
            row.edit_probed += 1
            row.edit_flips += int(r.flipped)
    for n, row in rows.items():
        texts = [gradients.get((e, n), "") for e in ids]
        row.gradient_chars = sum(0 if NO_CHANGE.search(t) else len(t.strip())
                                 for t in texts) / len(texts) if texts else 0.0
    best = max((row.share for row in rows.values()), default=0.0)
    blamed = [n for n, row in rows.items() if best > 0 and row.share == best]
    longest = max((row.gradient_chars for row in rows.values()), default=0.0)
    by_gradients = next((n for n, row in rows.items()
                         if longest > 0 and row.gradient_chars == longest), None)
    return BlameReport(run.run_id, run.step, ids, list(rows.values()), blamed, by_gradients,
                       results=results)
