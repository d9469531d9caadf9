"""How many model calls may be in flight: an adaptive (AIMD) limit.

The limit starts generous, halves when the server signals congestion (a 429, a timeout, a
connection error) on half or more of the last 20 calls, and grows back by about one call
per round of successful calls, never above its ceiling (`--concurrency` when the user sets
it). Then a 429's Retry-After also holds every new call until that time, so a saturated
server is not hit again at once; an occasional pushback only delays its own retry. Only
calls that started after the last cut can cut again: one burst of 429s is one congestion
event, not thirty halvings.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

DEFAULT_START = 64
DEFAULT_CEILING = 256
RECENT = 20  # calls whose outcome decides whether a pushback means saturation


class AdaptiveLimit:
    """An asyncio limit whose size adapts: `acquire()` returns a start token to hand back
    to `release(token, congested, retry_after)` when the call ends."""

    def __init__(self, start: int = DEFAULT_START, ceiling: int = DEFAULT_CEILING,
                 floor: int = 1):
        if start < 1 or ceiling < 1:
            raise ValueError("concurrency must be at least 1")
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.limit = float(min(start, ceiling))
        self.in_flight = 0
        self.peak = 0  # the most calls in flight at once
        self.cuts = 0  # congestion events that halved the limit
        self._waiters: deque[asyncio.Future] = deque()
        self._recent: deque[bool] = deque(maxlen=RECENT)  # congested? for the last calls
        self._resume_at = 0.0  # monotonic time before which no call starts (Retry-After)
        self._last_cut = float("-inf")
        self._timer: asyncio.TimerHandle | None = None

    @property
    def slots(self) -> int:
        return max(self.floor, int(self.limit))

    async def acquire(self) -> float:
        if not self._waiters and self.in_flight < self.slots \
                and time.monotonic() >= self._resume_at:
            self._take()
            return time.monotonic()
        granted = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        self._wake()  # nothing may be in flight to wake us: grant now, or set the timer
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # granted, then cancelled
                self.in_flight -= 1
                self._wake()
            else:
                self._waiters.remove(granted)
            raise
        return time.monotonic()

    def release(self, token: float, congested: bool = False,
                retry_after: float | None = None) -> None:
        self.in_flight -= 1
        now = time.monotonic()
        self._recent.append(congested)
        if congested:
            # a pushback on a share of the recent calls is noise (each such call retries
            # after its own delay); on half of them or more, the server is saturated
            saturated = len(self._recent) >= 4 and sum(self._recent) * 2 >= len(self._recent)
            if saturated and token >= self._last_cut:
                self.limit = max(float(self.floor), self.limit / 2)
                self._last_cut = now
                self.cuts += 1
                if retry_after:
                    self._resume_at = max(self._resume_at, now + retry_after)
        elif self.limit < self.ceiling:
            self.limit = min(float(self.ceiling), self.limit + 1 / self.limit)
        self._wake()

    def _take(self) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def _wake(self) -> None:
        delay = self._resume_at - time.monotonic()
        if delay > 0:
            if self._timer is None and self._waiters:
                def resume() -> None:
                    self._timer = None
                    self._wake()
                self._timer = asyncio.get_running_loop().call_later(delay, resume)
            return
        while self._waiters and self.in_flight < self.slots:
            granted = self._waiters.popleft()
            if not granted.done():
                self._take()
                granted.set_result(None)
