"""Typed events a run emits. The run log, the progress bar and tests are listeners.

Each record maps one-to-one onto a run-log table row (see docs/runlog.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CallRecord:
    call_id: str
    run_id: str
    step: int
    example_id: str | None
    node_id: str | None
    purpose: str
    backend: str
    model: str
    messages: str  # JSON list of {role, content}
    response: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    cache_hit: bool = False
    retries: int = 0
    error: str | None = None
    started_at: float = 0.0
    cost_usd: float | None = None
    cache_key: str = ""
    temperature: float = 0.0
    max_tokens: int = 0
    constrained: bool | None = None  # decoding enforced a JSON schema (None: cache from disk)
    # why the reply ended, as the provider said (stop, length, ...); "stop" for scripted and
    # cache-replayed replies; None for a call that got no reply
    finish_reason: str | None = None
    cached_tokens: int = 0  # of prompt_tokens, those the provider's prefix cache served
    response_model: str | None = None  # the model the reply named (None: it named none)
    # of latency_ms, the time the call waited for its turn before the model started on it:
    # the run's concurrency limit, a backend's own limit, the embedded model's slots or
    # contexts and its server's start (0 for cache hits)
    queued_ms: float = 0.0


@dataclass
class Activation:
    """One node run on one example."""

    run_id: str
    step: int
    split: str
    example_id: str
    node_id: str
    prompt_version: int
    input_text: str
    output_text: str
    error: str | None = None
    raw_text: str = ""
    parse_error: str | None = None
    call_id: str | None = None


@dataclass
class LossRecord:
    run_id: str
    step: int
    split: str
    example_id: str
    prediction: str
    target: str
    score: float
    feedback: str
    error: str | None = None
    call_id: str | None = None


@dataclass
class Gradient:
    """Feedback `node_id` received from its successor `from_node_id` ("loss" for the output).

    kind: 'gradient' (a message from one successor), 'aggregate' (what the node
    acted on: all successors' messages combined), 'target' and 'inferred_input' (gtbp).
    """

    run_id: str
    step: int
    example_id: str
    node_id: str
    from_node_id: str
    method: str
    content: str
    call_id: str | None = None
    kind: str = "gradient"
    parse_error: str | None = None
    asks_change: bool | None = None  # the gradient asks its input to change (kind 'gradient')
    claim_source: str | None = None  # 'schema' (the reply's field) or 'text:<reading>'


@dataclass
class Proposal:
    run_id: str
    step: int
    node_id: str
    old_prompt: str
    new_prompt: str
    accepted: bool = False
    val_before: float | None = None
    val_after: float | None = None
    call_id: str | None = None
    parse_error: str | None = None
    reasoning: str = ""
    val_alone: float | None = None  # validation score of this edit alone (per-node gate)
    reject_reason: str | None = None  # this node's own outcome when the step was rejected
    candidate: int = 0  # which of the step's candidate prompt sets (--proposals) it belongs to

    @property
    def unchanged(self) -> bool:
        """The proposal leaves the prompt as it was (or proposes nothing): no edit."""
        return same_prompt(self.old_prompt, self.new_prompt)


def same_prompt(old: str | None, new: str | None) -> bool:
    """Whether `new` leaves prompt `old` as it was: equal once runs of whitespace are one
    space (an empty proposal changes nothing either). The one rule of what an unchanged
    proposal is, for the optimizer, the commands and the pages."""
    words = " ".join(str(new or "").split())
    return not words or words == " ".join(str(old or "").split())


@dataclass
class PromptVersion:
    run_id: str
    node_id: str
    version: int
    prompt: str
    step: int
    accepted: bool = True


@dataclass
class StepFinished:
    run_id: str
    step: int
    train_score: float | None
    val_score: float | None
    accepted: bool
    started_at: float
    ended_at: float
    metrics: dict[str, float] = field(default_factory=dict)
    # Wall-clock and cache-dependent figures for the run summary; not written to the log,
    # so that a resumed run logs exactly what an uninterrupted one does.
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class StructuredFallback:
    """A server refused `response_format`: from this call on, the run uses text formats.
    The run log keeps it as the metric `structured_fallback` = 1 at that step."""

    run_id: str
    step: int
    backend: str
    message: str


@dataclass
class Progress:
    """Where a run is: the step, its phase (forward, loss, backward, update, gate,
    node_gates, prune, test) and model calls done against those expected for the phase (0
    when unknown)."""

    run_id: str
    step: int
    phase: str
    calls_done: int
    calls_expected: int
    calls_total: int  # every call of the run so far


@dataclass
class CandidatesScored:
    """A step is about to score `count` distinct candidate prompt sets on validation (one,
    or several under --proposals; identical candidates are scored once): progress says the
    gate has begun and counts its calls by it."""

    run_id: str
    step: int
    count: int


@dataclass
class PruningStarted:
    """An accepted step's kept candidate changed several prompts: it is about to score
    `passes` validation passes, each without one of its edits (the edits the gain does not
    need are dropped), expected to make `calls` node calls the gate has not made yet.
    Progress counts them as the `prune` phase. Not written to the run log."""

    run_id: str
    step: int
    passes: int
    calls: int


@dataclass
class RunFinished:
    run_id: str
    status: str  # finished | failed | stopped
    error: str | None = None


Event = (CallRecord | Activation | LossRecord | Gradient | Proposal | PromptVersion
         | StepFinished | RunFinished | StructuredFallback | Progress | CandidatesScored
         | PruningStarted)
Listener = Callable[[Any], None]


class EventBus:
    """Fan-out of events to listeners, in the order they were added."""

    def __init__(self, listeners: list[Listener] | None = None):
        self.listeners: list[Listener] = list(listeners or [])

    def add(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def emit(self, event: Any) -> None:
        for listener in self.listeners:
            listener(event)


class Collector:
    """A listener that keeps every event; tests and summaries read it."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def __call__(self, event: Any) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def as_row(record: Any) -> dict[str, Any]:
    return asdict(record)
