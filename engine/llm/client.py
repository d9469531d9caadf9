"""Every model call goes through `LLMClient.call`: cache, concurrency limit, retries with
backoff, per-call timeout, accounting, and one `CallRecord` event per call.

A call that still fails after its retries returns a record with `error` set; callers
treat that example as failed and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.events import CallRecord, StructuredFallback
from engine.llm.base import (
    Backend,
    LLMError,
    LLMReply,
    LLMRequest,
    SchemaRefused,
    TransientLLMError,
)
from engine.llm.budget import Budget
from engine.llm.cache import Cache
from engine.llm.limits import AdaptiveLimit
from engine.llm.pricing import cost_usd, load_prices

STRUCTURED_MODES = ("auto", "on", "off")


class ModelUnavailable(LLMError):
    """Every call so far has failed: the server is unreachable or refuses us. Raised so that
    a run stops with one clear message instead of logging a wall of failed examples."""


@dataclass
class RetryPolicy:
    max_retries: int = 4
    base_delay: float = 0.5
    max_delay: float = 20.0
    timeout: float = 120.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        if retry_after is not None:
            return min(self.max_delay, max(0.0, retry_after))
        return min(self.max_delay, self.base_delay * 2**attempt) * rng.uniform(0.5, 1.0)


@dataclass
class CallStats:
    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    network_calls: int = 0


@dataclass
class LLMClient:
    """Routes forward calls to the forward backend/model and loss, backward and update
    calls to the optimizer backend/model."""

    forward_backend: Backend
    forward_model: str
    optimizer_backend: Backend | None = None
    optimizer_model: str | None = None
    cache: Cache = field(default_factory=lambda: Cache("off"))
    # calls in flight: None adapts (AIMD, engine.llm.limits) from 64 up to 256; a number
    # set by the user is the ceiling the adaptive limit never exceeds
    concurrency: int | None = None
    backend_limits: dict[str, int] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    on_call: Callable[[CallRecord], None] | None = None
    on_event: Callable[[Any], None] | None = None  # other typed events (StructuredFallback)
    run_id: str = ""
    temperature: float = 0.0
    seed: int | None = None
    stats: CallStats = field(default_factory=CallStats)
    give_up_after: int = 3  # failed calls, with no success yet, before the run stops
    # (messages, meta) -> (messages, JSON schema or None): the prompt layer's structured-reply
    # rules (engine.prompts.structured.prepare), given by whoever builds the client so that
    # this layer knows no prompt; None: every request stays text
    structure: Callable[[list, dict], tuple[list, dict | None]] | None = None
    # JSON-schema replies for the roles in engine/prompts/structured.py: auto (where the backend
    # supports it; text formats after a server refuses it), on (a refusal is an error), off
    structured: str = "auto"
    # one limit shared by several clients (concurrent experiment runs); None: its own
    shared_limit: AdaptiveLimit | None = None
    # --max-calls / --max-cost: a model call that would exceed it raises BudgetExhausted
    budget: Budget | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.optimizer_backend = self.optimizer_backend or self.forward_backend
        self.optimizer_model = self.optimizer_model or self.forward_model
        self.limit = self.shared_limit or (
            AdaptiveLimit() if self.concurrency is None else
            AdaptiveLimit(start=self.concurrency, ceiling=self.concurrency))
        self._per_backend = {name: asyncio.Semaphore(n) for name, n in self.backend_limits.items()}
        self._prices = load_prices()
        self._jitter = random.Random()
        self._inflight: dict[str, asyncio.Future] = {}
        self._active = 0  # model calls in flight
        if self.structured not in STRUCTURED_MODES:
            raise ValueError(f"structured must be one of {', '.join(STRUCTURED_MODES)}")
        self.structured_refused: dict[str, str] = {}  # backend name -> the server's refusal

    def backend_for(self, purpose: str) -> tuple[Backend, str]:
        if purpose == "forward":
            return self.forward_backend, self.forward_model
        return self.optimizer_backend, self.optimizer_model  # type: ignore[return-value]

    def request(self, purpose: str, messages: list[tuple[str, str]], *, max_tokens: int = 512,
                temperature: float | None = None, sample_index: int = 0,
                meta: dict[str, Any] | None = None, stop: tuple[str, ...] = (),
                tools: dict[str, Any] | None = None) -> LLMRequest:
        backend, model = self.backend_for(purpose)
        schema = None
        if meta and self.structure is not None and self.structured_for(backend):
            # the role's JSON schema, and its text-format instruction restated as JSON
            messages, schema = self.structure(list(messages), meta)
        return LLMRequest(
            messages=tuple(messages), model=model, purpose=purpose,
            temperature=self.temperature if temperature is None else temperature,
            max_tokens=max_tokens, seed=self.seed, sample_index=sample_index, stop=tuple(stop),
            backend=backend.name, meta=dict(meta or {}), schema=schema,
            model_sha256=getattr(backend, "model_sha256", None), tools=tools or None,
        )

    def structured_for(self, backend: Backend) -> bool:
        """Whether requests to `backend` carry their role's JSON schema."""
        if self.structured == "off" or backend.name in self.structured_refused:
            return False
        return bool(getattr(backend, "supports_schema", False))

    async def call(self, request: LLMRequest, *, step: int, node_id: str | None = None,
                   example_id: str | None = None) -> CallRecord:
        backend, _ = self.backend_for(request.purpose)
        record = CallRecord(
            call_id=uuid.uuid4().hex, run_id=self.run_id, step=step, example_id=example_id,
            node_id=node_id, purpose=request.purpose, backend=backend.name,
            model=request.model, messages=request.messages_json(), response="",
            started_at=time.time(), cache_key=request.cache_key(),
            temperature=request.temperature, max_tokens=request.max_tokens,
        )
        started = time.perf_counter()
        reply = self.cache.get(record.cache_key)
        if reply is not None:
            record.cache_hit = True
        elif record.cache_key in self._inflight:
            # an identical request is on its way: share its reply instead of paying twice,
            # whatever the cache mode (`off` stores and reads nothing; it never asks twice
            # at once). The shared reply is recorded as a cache hit: no model call paid.
            reply = await asyncio.shield(self._inflight[record.cache_key])
            if reply is None:  # its failure may be transient: try on our own
                record.queued_ms += (time.perf_counter() - started) * 1000
                reply = await self._model_call(backend, request, record)
            else:
                record.cache_hit = True
        else:
            pending = asyncio.get_running_loop().create_future()
            self._inflight[record.cache_key] = pending
            reply = None
            try:
                reply = await self._model_call(backend, request, record)
            finally:
                del self._inflight[record.cache_key]
                pending.set_result(reply)
        record.latency_ms = (time.perf_counter() - started) * 1000
        if record.cache_hit:  # never at the model: a shared call waited all its latency
            record.queued_ms = record.latency_ms
        if reply is not None:
            record.response = reply.text
            record.prompt_tokens = reply.prompt_tokens
            record.completion_tokens = reply.completion_tokens
            record.constrained = reply.constrained
            # a replayed reply ended where its stored text ends: nothing was cut this time
            record.finish_reason = "stop" if record.cache_hit else reply.finish_reason
            if not record.cache_hit:
                record.cached_tokens = reply.cached_tokens
                record.response_model = reply.response_model
                self.cache.put(record.cache_key, request, reply)
                record.cost_usd = cost_usd(self._prices, request.model, reply.prompt_tokens,
                                           reply.completion_tokens, reply.cached_tokens)
            else:
                record.cost_usd = 0.0
        self._account(record)
        if self.on_call:
            self.on_call(record)
        succeeded = self.stats.calls - self.stats.failures
        if record.error and not succeeded and self.stats.failures >= self.give_up_after:
            raise ModelUnavailable(
                f"{backend.name} model '{request.model}' unavailable: {self.stats.failures} "
                f"calls failed and none succeeded (last: {record.error})")
        return record

    async def _model_call(self, backend: Backend, request: LLMRequest,
                          record: CallRecord) -> LLMReply | None:
        """One call to the model (a cache miss), admitted by the budget first."""
        reserved = self.budget.admit(request, self._prices) if self.budget else 0.0
        self._active += 1
        reply = None
        try:
            reply = await self._call_with_retries(backend, request, record)
        finally:
            self._active -= 1
            if self.budget:
                self.budget.settle(reserved, reply and cost_usd(
                    self._prices, request.model, reply.prompt_tokens, reply.completion_tokens,
                    reply.cached_tokens))
        return reply

    async def settle(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) for the model calls in flight to return, so
        that their replies reach the cache before a stopped run closes."""
        deadline = time.monotonic() + timeout
        while self._active and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def _call_with_retries(self, backend: Backend, request: LLMRequest,
                                 record: CallRecord) -> LLMReply | None:
        limit = self._per_backend.get(backend.name)
        for attempt in range(self.retry.max_retries + 1):
            retry_after = None
            try:
                asked = time.perf_counter()  # waiting for a turn is not the model's time
                token, congested, wait = await self.limit.acquire(), False, None
                try:
                    async with limit if limit is not None else contextlib.nullcontext():
                        record.queued_ms += (time.perf_counter() - asked) * 1000
                        reply = await self._one_call(backend, request, record)
                        record.queued_ms += reply.queued_ms  # the backend's own queue
                except TransientLLMError as exc:
                    congested, wait = exc.congestion, exc.retry_after
                    raise
                finally:
                    self.limit.release(token, congested, wait)
                if not reply.text.strip():
                    raise TransientLLMError("empty reply")
                return reply
            except TransientLLMError as exc:
                record.error = str(exc)
                retry_after = exc.retry_after
            except LLMError as exc:
                record.error = str(exc)
                return None
            if attempt < self.retry.max_retries:
                record.retries += 1
                # the pause before trying again is a wait, not the model's time
                paused = time.perf_counter()
                await asyncio.sleep(self.retry.delay(attempt, retry_after, self._jitter))
                record.queued_ms += (time.perf_counter() - paused) * 1000
        record.error = f"gave up after {record.retries} retries: {record.error}"
        return None

    async def _one_call(self, backend: Backend, request: LLMRequest,
                        record: CallRecord) -> LLMReply:
        self.stats.network_calls += 1
        if request.schema is not None and backend.name in self.structured_refused:
            request = dataclasses.replace(request, schema=None)  # built before the refusal
        # a backend that times its own calls (the embedded model) is not timed from its queue
        timeout = None if getattr(backend, "times_own_calls", False) else self.retry.timeout
        try:
            try:
                return await asyncio.wait_for(backend.complete(request), timeout)
            except SchemaRefused as exc:
                if self.structured == "on":
                    raise LLMError(f"{exc} (--structured on; use --structured auto to fall "
                                   "back to text formats)") from None
                self._refused(backend.name, str(exc), record.step)
                # the same request as text: this reply, and every later request, unconstrained
                self.stats.network_calls += 1
                return await asyncio.wait_for(
                    backend.complete(dataclasses.replace(request, schema=None)), timeout)
        except TimeoutError:
            raise TransientLLMError(f"timed out after {self.retry.timeout:g} s",
                                    congestion=True) from None

    def _refused(self, backend: str, message: str, step: int) -> None:
        """Record, once per backend and run, that its server refused JSON schemas."""
        if backend in self.structured_refused:
            return
        self.structured_refused[backend] = message
        if self.on_event:
            self.on_event(StructuredFallback(self.run_id, step, backend, message))

    def _account(self, record: CallRecord) -> None:
        if record.error and not record.response:
            self.stats.failures += 1
        else:
            record.error = None
        self.stats.calls += 1
        self.stats.cache_hits += int(record.cache_hit)
        self.stats.retries += record.retries
        self.stats.prompt_tokens += record.prompt_tokens
        self.stats.completion_tokens += record.completion_tokens

    async def aclose(self) -> None:
        for backend in {id(b): b for b in (self.forward_backend, self.optimizer_backend)}.values():
            close = getattr(backend, "aclose", None)
            if close:
                await close()
