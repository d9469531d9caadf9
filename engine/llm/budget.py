"""A run's budget: at most `max_calls` model calls (cache misses) and at most `max_cost`
US dollars on priced models, counted over one `run` or `resume` invocation.

A call is admitted only if it fits: its worst case (the prompt's tokens at the input
price and `max_tokens` at the output price) is reserved before it is sent and replaced by
its real cost when it returns, so calls in flight together cannot overshoot. The first
call that does not fit raises `BudgetExhausted`, and so does every later one.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.llm.base import LLMRequest, estimate_tokens
from engine.llm.pricing import cost_usd


class BudgetExhausted(Exception):  # noqa: N818 - reads as the run's end, not as a fault
    """The next model call would exceed the run's budget; the message names it."""


@dataclass
class Budget:
    max_calls: int | None = None
    max_cost: float | None = None
    calls: int = 0  # model calls admitted
    spent: float = 0.0  # US dollars of the calls that returned
    reserved: float = 0.0  # worst-case cost of the calls in flight
    exhausted: str | None = None

    def __post_init__(self) -> None:
        if self.max_calls is not None and self.max_calls < 0:
            raise ValueError(f"--max-calls must not be negative, not {self.max_calls}")
        if self.max_cost is not None and self.max_cost < 0:
            raise ValueError(f"--max-cost must not be negative, not {self.max_cost}")

    @property
    def limited(self) -> bool:
        return self.max_calls is not None or self.max_cost is not None

    def admit(self, request: LLMRequest, prices: dict) -> float:
        """Reserve one call, returning its reserved cost; BudgetExhausted if it does not fit."""
        if self.exhausted:
            raise BudgetExhausted(self.exhausted)
        if self.max_calls is not None and self.calls + 1 > self.max_calls:
            self._stop(f"budget: --max-calls {self.max_calls} reached ({self.calls} model "
                       f"calls made); resume with a larger budget to continue")
        worst = 0.0
        if self.max_cost is not None:
            prompt = sum(estimate_tokens(content) for _, content in request.messages)
            worst = cost_usd(prices, request.model, prompt, request.max_tokens) or 0.0
            if self.spent + self.reserved + worst > self.max_cost:
                self._stop(f"budget: --max-cost {self.max_cost:g} USD reached "
                           f"({self.spent:.4f} USD spent, {self.calls} model calls); resume "
                           f"with a larger budget to continue")
        self.calls += 1
        self.reserved += worst
        return worst

    def settle(self, reserved: float, cost: float | None) -> None:
        """A call returned: its real cost replaces its reservation."""
        self.reserved -= reserved
        self.spent += cost or 0.0

    def _stop(self, message: str) -> None:
        self.exhausted = message
        raise BudgetExhausted(message)
