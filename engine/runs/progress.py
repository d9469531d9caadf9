"""Progress by phase and call count: a listener that turns the run's call records into
`Progress` events (step, phase, calls done against calls expected).

The phase of a call follows from the order of a step's calls, so the core emits nothing
extra: forward calls before the step's first backward call are `forward` (the baseline
step scores train and validation together: step 0, or the step a fork starts from when it
re-measures its edited prompts), then `loss` (judge calls), `backward` and `update`;
forward calls after the step's update calls are the validation `gate` (under
`--node-gates auto`, the calls past the candidate's are `node_gates`: each edit scored
alone after a rejected candidate; `prune`: an accepted candidate that changed several
prompts scored without each of its edits, from the optimizer's PruningStarted on); forward
calls of the last step after its StepFinished are the `test` split.

Calls expected are an estimate from the graph and the split sizes: exact for forward,
gate and test (one call per LLM node per example; cached replies count as calls), an
upper bound for backward (k sampled examples times the method's `backward_calls`; repairs
can add a few), update and the gate under per-node gates (every proposal counted as a
change; under `auto` they are counted once the gate makes more calls than the candidate
alone needs, which is when they run); `prune` expects the node calls its passes make that
the gate's passes did not (the optimizer counts them by which edits reach each node: an
upper bound, as a dropped edit that changed no output leaves its successors' calls alike).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from engine.core.backward import Method, contrast_calls
from engine.core.optimizer import ChangeClaims, node_gates_apply, nodes_to_update
from engine.events import (
    CallRecord,
    CandidatesScored,
    Gradient,
    Progress,
    PruningStarted,
    StepFinished,
)

PHASES = ("forward", "loss", "backward", "update", "gate", "node_gates", "prune", "test")


class ProgressTracker:
    """Listener: feed it every event; it emits a `Progress` after each call record."""

    def __init__(self, graph: Any, sizes: dict[str, int], *, failures: int,
                 trainable: list[str], method: type[Method], run_id: str,
                 emit: Callable[[Any], None], update_mode: str = "all",
                 update_when: str = "asked", node_gates: str = "off",
                 baseline_step: int | None = 0, proposals: int = 1,
                 contrast: str | None = None):
        llm = [n.id for n in graph.nodes if n.kind != "function"]
        self.per_example = len(llm)
        self.sizes, self.run_id, self.emit = sizes, run_id, emit
        self.baseline_step = baseline_step  # its forward pass also scores validation
        self.trainable, self.update_mode = trainable, update_mode
        # the step's change claims, as the optimizer reads them, to know its update calls
        self.claims = ChangeClaims() if update_when == "asked" else None
        self.node_gates = node_gates
        self.proposals = max(1, proposals)  # candidates: their update calls and gate passes
        self.scored: dict[int, int] = {}  # step -> distinct candidates its gate scores
        self.pruning: dict[int, int] = {}  # step -> node calls its pruning passes expect
        self.backward = failures * (method.backward_calls(graph) + (
            contrast_calls(graph, contrast) if method.contrastable else 0))
        self.step, self.phase, self.done, self.total = -1, "", 0, 0
        self.finished: set[int] = set()
        self.seen_update = 0  # update calls seen in this step

    def __call__(self, event: Any) -> None:
        if isinstance(event, StepFinished):
            self.finished.add(event.step)
        elif isinstance(event, CandidatesScored):
            self.scored[event.step] = event.count
            # the gate has begun: say so now, not when its first call comes back (on the
            # embedded model the line stayed on "update 6 of 6" for the gate's first minute)
            if event.step not in self.finished:
                self.step, self.phase, self.done = event.step, "gate", 0
                self.emit(Progress(self.run_id, event.step, "gate", 0,
                                   self.expected("gate", event.step), self.total))
        elif isinstance(event, PruningStarted):
            # an accepted candidate's edits scored one left out at a time: a phase of its
            # own (a round after a dropped edit adds its calls to the phase's)
            if event.step not in self.finished:
                self.pruning[event.step] = self.pruning.get(event.step, 0) + event.calls
                if (self.step, self.phase) != (event.step, "prune"):
                    self.step, self.phase, self.done = event.step, "prune", 0
                self.emit(Progress(self.run_id, event.step, "prune", self.done,
                                   self.expected("prune", event.step), self.total))
        elif isinstance(event, Gradient) and self.claims is not None:
            self.claims(event)
        elif isinstance(event, CallRecord):
            self._count(event)

    def _count(self, call: CallRecord) -> None:
        if call.step != self.step:
            self.step, self.phase, self.seen_update = call.step, "", 0
        phase = self._phase(call)
        if phase != self.phase:
            self.phase, self.done = phase, 0
        self.done += 1
        self.total += 1
        self.emit(Progress(self.run_id, call.step, phase, self.done,
                           self.expected(phase, call.step, self.done), self.total))

    def _phase(self, call: CallRecord) -> str:
        if call.step in self.finished:
            return "test"
        if call.purpose == "update":
            self.seen_update += 1
            return "update"
        if call.purpose == "backward":
            return "backward"
        if self.phase == "prune":  # nothing but pruning passes follow it in a step
            return "prune"
        if self.seen_update:
            # under auto, the per-node gates run once the candidate is rejected: their
            # own phase, so the gate's count does not grow from 48 to 144 mid-phase
            candidate = self.sizes["val"] * self.per_example * self.scored.get(
                call.step, self.proposals)
            if self.phase == "node_gates" or (self.phase == "gate" and self.node_gates == "auto"
                                              and self.done >= candidate):
                return "node_gates"
            return "gate"
        return "loss" if call.purpose == "loss" else "forward"

    def expected(self, phase: str, step: int, done: int = 0) -> int:
        """Calls the phase should make (0: unknown), `done` calls into it."""
        n = self.per_example
        if phase == "forward":
            baseline = step == self.baseline_step
            return (self.sizes["train"] + (self.sizes["val"] if baseline else 0)) * n
        candidate = self.sizes["val"] * n
        edits = self.seen_update // self.proposals  # the update calls of one candidate
        alone = edits if node_gates_apply("on", edits) else 0
        if phase == "gate":  # the candidates; with --node-gates on, each edit alone too
            passes = self.scored.get(step, self.proposals)
            return candidate * (passes + (alone if self.node_gates == "on" else 0))
        if phase == "node_gates":  # under auto: each edit alone, after a rejected candidate
            return candidate * alone
        if phase == "prune":  # as the optimizer counted them
            return self.pruning.get(step, 0)
        return {"test": self.sizes["test"] * n,
                "backward": self.backward, "update": self.updates(step)}.get(phase, 0)

    def updates(self, step: int) -> int:
        claims = self.claims if self.claims is not None and self.claims.step == step else None
        return self.proposals * len(nodes_to_update(self.trainable, self.update_mode, step,
                                                    claims))


class ProgressFile:
    """Listener: appends every `Progress` and each step's end to `path` as one JSON line, for
    a process that follows the run from outside (the dashboard's job view) to read back as
    typed events with `read_progress`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._out: Any = None
        self._calls = 0

    def __call__(self, event: Any) -> None:
        if isinstance(event, Progress):
            self._calls = event.calls_total
            record = {"event": "progress", **asdict(event)}
        elif isinstance(event, StepFinished):
            record = {"event": "step_finished", "run_id": event.run_id, "step": event.step,
                      "calls_total": self._calls}
        else:
            return
        if self._out is None:
            self._out = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._out.write(json.dumps(record) + "\n")


def read_progress(path: str | Path) -> tuple[Progress | None, int | None, int | None]:
    """(the newest Progress written after the newest finished step or None, the newest
    finished step or None, calls so far or None) from a `ProgressFile`. A missing file and a
    half-written last line are read as what is there."""
    latest: Progress | None = None
    finished: int | None = None
    calls: int | None = None
    names = [f.name for f in fields(Progress)]
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None, None, None
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the line being written
        if record.get("event") == "progress":
            latest = Progress(**{k: record[k] for k in names})
            calls = latest.calls_total
        elif record.get("event") == "step_finished":
            finished, latest, calls = int(record["step"]), None, record.get("calls_total")
    return latest, finished, calls


def progress_line(event: Progress) -> str:
    """The plain line the CLI writes into a log file for a person to read:
    'step 1 backward: 12/40 calls (96 in all)'; an expected count of 0 means unknown."""
    return (f"step {event.step} {event.phase}: {event.calls_done}/{event.calls_expected} "
            f"calls ({event.calls_total} in all)")
