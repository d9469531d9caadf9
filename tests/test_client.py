"""LLMClient: concurrency limits, overlap, failure recording, stats and cost."""

from __future__ import annotations

import asyncio

import pytest

from engine.llm.base import LLMError, LLMReply, LLMRequest, TransientLLMError
from engine.llm.client import LLMClient, RetryPolicy
from engine.llm.pricing import DEFAULT_PRICES


class SlowBackend:
    """Replies after `latency` seconds and tracks how many calls are in flight.
    `failures` is a list of exceptions raised, in order, by the first calls."""

    def __init__(self, name: str = "slow", latency: float = 0.05,
                 failures: list[Exception] | None = None):
        self.name = name
        self.latency = latency
        self.failures = list(failures or [])
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0

    async def complete(self, request: LLMRequest) -> LLMReply:
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.latency)
            if self.failures:
                raise self.failures.pop(0)
            return LLMReply(text=f"<output>{request.user_text}</output>", prompt_tokens=10,
                            completion_tokens=5, model=request.model)
        finally:
            self.in_flight -= 1

    async def aclose(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _default_prices(monkeypatch):
    monkeypatch.delenv("SEMBACK_PRICES", raising=False)


def run_calls(client: LLMClient, n: int, purpose: str = "forward"):
    async def go():
        return await asyncio.gather(*(
            client.call(client.request(purpose, [("user", f"q{i}")]), step=0)
            for i in range(n)))

    return asyncio.run(go())


def make_client(backend, **kwargs) -> LLMClient:
    kwargs.setdefault("retry", RetryPolicy(base_delay=0.001, timeout=5))
    return LLMClient(forward_backend=backend, forward_model="gpt-4o-mini", **kwargs)


def test_global_concurrency_limit_is_never_exceeded():
    backend = SlowBackend()
    records = run_calls(make_client(backend, concurrency=3), 12)
    assert backend.max_in_flight == 3
    assert all(r.error is None for r in records)


def test_per_backend_limit_applies_on_top_of_the_global_one():
    forward, optimizer = SlowBackend("fwd"), SlowBackend("opt")
    client = LLMClient(forward_backend=forward, forward_model="m", optimizer_backend=optimizer,
                       optimizer_model="m2", concurrency=8, backend_limits={"opt": 2},
                       retry=RetryPolicy(base_delay=0.001, timeout=5))

    async def go():
        calls = [client.call(client.request("forward", [("user", f"f{i}")]), step=0)
                 for i in range(8)]
        calls += [client.call(client.request("backward", [("user", f"b{i}")]), step=0)
                  for i in range(8)]
        return await asyncio.gather(*calls)

    records = asyncio.run(go())
    assert optimizer.max_in_flight == 2
    assert forward.max_in_flight <= 8
    assert {r.model for r in records} == {"m", "m2"}
    assert {r.backend for r in records if r.purpose == "backward"} == {"opt"}


def test_calls_overlap():
    # a count, not a time: all n calls are in flight at once (one by one, it would be 1)
    n, latency = 10, 0.1
    backend = SlowBackend(latency=latency)
    records = run_calls(make_client(backend, concurrency=n), n)
    assert backend.max_in_flight == n
    assert backend.calls == n and all(r.error is None for r in records)


def test_permanent_failure_is_recorded_not_raised():
    backend = SlowBackend(failures=[LLMError("bad request (400): nope")])
    client = make_client(backend)
    (record,) = run_calls(client, 1)
    assert record.error == "bad request (400): nope"
    assert record.response == "" and record.retries == 0 and backend.calls == 1
    assert client.stats.failures == 1 and client.stats.calls == 1


def test_transient_failures_are_retried_then_given_up():
    backend = SlowBackend(latency=0.0, failures=[TransientLLMError("flaky")] * 5)
    client = make_client(backend, retry=RetryPolicy(max_retries=2, base_delay=0.001))
    (record,) = run_calls(client, 1)
    assert backend.calls == 3 and record.retries == 2
    assert record.error == "gave up after 2 retries: flaky"
    assert client.stats.failures == 1 and client.stats.retries == 2


def test_success_after_retry_clears_the_error():
    backend = SlowBackend(latency=0.0, failures=[TransientLLMError("flaky")])
    client = make_client(backend)
    (record,) = run_calls(client, 1)
    assert record.error is None and record.retries == 1 and record.response == "<output>q0</output>"
    assert client.stats.failures == 0


def test_stats_and_events_are_counted():
    seen = []
    backend = SlowBackend(latency=0.0, failures=[TransientLLMError("flaky")])
    client = make_client(backend, on_call=seen.append)
    records = run_calls(client, 4)
    stats = client.stats
    assert stats.calls == 4 and stats.network_calls == 5 and stats.retries == 1
    assert stats.prompt_tokens == 40 and stats.completion_tokens == 20
    assert stats.cache_hits == 0 and stats.failures == 0
    assert sorted(r.call_id for r in seen) == sorted(r.call_id for r in records)


def test_cost_for_known_and_unknown_models():
    (known,) = run_calls(make_client(SlowBackend(latency=0.0)), 1)
    per_in, per_out = DEFAULT_PRICES["gpt-4o-mini"][:2]
    assert known.cost_usd == pytest.approx((10 * per_in + 5 * per_out) / 1_000_000)

    unknown_client = LLMClient(forward_backend=SlowBackend(latency=0.0), forward_model="mystery")
    (unknown,) = run_calls(unknown_client, 1)
    assert unknown.cost_usd is None and unknown.error is None


def test_concurrency_below_one_is_rejected():
    with pytest.raises(ValueError):
        make_client(SlowBackend(), concurrency=0)


@pytest.mark.parametrize("mode", ["off", "read", "readwrite"])
def test_identical_concurrent_requests_make_one_model_call_whatever_the_cache(mode):
    from engine.llm.cache import Cache

    backend = SlowBackend(latency=0.05)
    client = make_client(backend, cache=Cache(mode))

    async def go():
        same = [client.request("forward", [("user", "the same question")]) for _ in range(2)]
        other = client.request("forward", [("user", "another question")])
        return await asyncio.gather(*(client.call(r, step=1) for r in [*same, other]))

    first, second, other = asyncio.run(go())
    assert backend.calls == 2  # the two identical requests once, the other once
    assert first.response == second.response == "<output>the same question</output>"
    assert other.response == "<output>another question</output>"
    # the follower is recorded as answered without a model call, and not paid for
    assert [first.cache_hit, second.cache_hit, other.cache_hit] == [False, True, False]
    assert second.cost_usd == 0.0 and client.stats.cache_hits == 1
    # it was never at the model: its latency (waiting for the leader's 50 ms reply) is all
    # wait, so the pages' time at the model (latency less the wait) is 0 for it
    assert second.latency_ms >= 45 and second.queued_ms == second.latency_ms
    assert first.queued_ms < 45 and first.latency_ms - first.queued_ms >= 45


def test_the_pauses_between_retries_are_a_wait_not_the_models_time():
    """Two transient failures, each after 20 ms at the backend, then a reply after 20 ms;
    the pauses before the retries (0.1 to 0.2 s each, backoff with jitter) are logged in
    `queued_ms`, so latency less the wait is the three attempts' time at the backend."""
    backend = SlowBackend(latency=0.02, failures=[TransientLLMError("flaky")] * 2)
    client = make_client(backend, retry=RetryPolicy(base_delay=0.2, timeout=5))
    (record,) = run_calls(client, 1)
    assert record.error is None and record.retries == 2
    # pauses: 0.2 * 2**0 and 0.2 * 2**1, each times a jitter in [0.5, 1]
    assert 0.3 * 1000 - 10 <= record.queued_ms <= 0.6 * 1000 + 100
    assert 3 * 20 - 5 <= record.latency_ms - record.queued_ms < 3 * 20 + 100


def test_identical_requests_one_after_the_other_both_reach_the_model_with_the_cache_off():
    from engine.llm.cache import Cache

    backend = SlowBackend(latency=0.0)
    client = make_client(backend, cache=Cache("off"))
    run_calls(client, 1)
    run_calls(client, 1)  # the first has returned: nothing in flight to share, nothing stored
    assert backend.calls == 2
