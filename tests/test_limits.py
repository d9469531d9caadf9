"""The adaptive (AIMD) concurrency limit: generous start, halving on congestion, additive
growth, a ceiling the user sets, Retry-After holding new calls."""

from __future__ import annotations

import asyncio
import time

from engine.llm.base import LLMReply, TransientLLMError
from engine.llm.client import LLMClient, RetryPolicy
from engine.llm.limits import AdaptiveLimit


def test_default_client_starts_with_64_and_a_user_limit_is_the_ceiling():
    class Backend:
        name = "b"

    assert LLMClient(Backend(), "m").limit.slots == 64
    user = LLMClient(Backend(), "m", concurrency=16).limit
    assert user.slots == 16 and user.ceiling == 16


def test_halves_once_per_congestion_event_and_grows_back_additively():
    async def scenario():
        limit = AdaptiveLimit(start=64, ceiling=64)
        tokens = [await limit.acquire() for _ in range(40)]
        for token in tokens[:10]:  # ten 429s from calls that were in flight together
            limit.release(token, congested=True)
        assert limit.slots == 32 and limit.cuts == 1
        late = await limit.acquire()
        limit.release(late, congested=True)  # a call started after the cut: a new event
        assert limit.slots == 16 and limit.cuts == 2
        for token in tokens[10:]:
            limit.release(token)
        successes = 0
        while limit.slots < 32:
            limit.release(await limit.acquire())
            successes += 1
        assert 16 * 10 < successes < 32 * 20  # about one slot per window of successes
        for _ in range(10_000):
            limit.release(await limit.acquire())
        assert limit.slots == 64  # never above the ceiling

    asyncio.run(scenario())


def test_never_more_in_flight_than_the_limit_and_no_waiter_is_lost():
    async def scenario():
        limit = AdaptiveLimit(start=4, ceiling=4)
        active, peak = 0, 0

        async def call(i):
            nonlocal active, peak
            token = await limit.acquire()
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.001)
            active -= 1
            limit.release(token, congested=(i % 7 == 0), retry_after=0.01 if i == 7 else None)

        await asyncio.wait_for(asyncio.gather(*(call(i) for i in range(60))), 10)
        return peak

    assert asyncio.run(scenario()) <= 4


class RateLimited:
    """429 with Retry-After for every call that starts within `window` s of another 429."""

    name = "rl"

    def __init__(self, capacity: int):
        self.capacity, self.active, self.requests, self.refused = capacity, 0, 0, 0

    async def complete(self, request):
        self.requests += 1
        if self.active >= self.capacity:
            self.refused += 1
            raise TransientLLMError("429", retry_after=0.02, congestion=True)
        self.active += 1
        try:
            await asyncio.sleep(0.01)
        finally:
            self.active -= 1
        return LLMReply("ok", 1, 1)


def test_a_rate_limiting_server_gets_fewer_retries_than_under_a_fixed_limit():
    def retries(limit):
        backend = RateLimited(capacity=8)
        client = LLMClient(backend, "m", shared_limit=limit,
                           retry=RetryPolicy(max_retries=8, base_delay=0.01))

        async def go():
            return await asyncio.gather(*(client.call(client.request(
                "forward", [("user", f"q{i}")]), step=0) for i in range(120)))

        records = asyncio.run(go())
        return sum(r.retries for r in records), sum(1 for r in records if r.error)

    fixed, _ = retries(AdaptiveLimit(start=64, ceiling=64, floor=64))  # cannot adapt
    adaptive, failed = retries(AdaptiveLimit())
    assert failed == 0 and adaptive < fixed / 2, (adaptive, fixed)


def test_retry_after_holds_new_calls():
    async def scenario():
        limit = AdaptiveLimit(start=8, ceiling=8)
        for token in [await limit.acquire() for _ in range(4)]:  # saturated: 4 of 4 refused
            limit.release(token, congested=True, retry_after=0.05)
        started = time.monotonic()
        limit.release(await limit.acquire())
        return time.monotonic() - started

    assert asyncio.run(scenario()) >= 0.04


def test_an_occasional_pushback_does_not_cut_the_limit():
    async def scenario():
        limit = AdaptiveLimit(start=64, ceiling=64)
        for i in range(200):  # one 429 in five: noise, not saturation
            limit.release(await limit.acquire(), congested=(i % 5 == 0), retry_after=0.5)
        return limit

    limit = asyncio.run(scenario())
    assert limit.slots == 64 and limit.cuts == 0
    assert limit._resume_at < time.monotonic()  # nothing held
