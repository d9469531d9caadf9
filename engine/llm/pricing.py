"""A small, configurable price table: US dollars per million tokens (input, output).

Unknown models cost nothing; `cost_usd` returns None for them so that reports can say
the price is unknown rather than pretend it is zero.
"""

from __future__ import annotations

import json
import os

DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "scripted": (0.0, 0.0),
    "smollm2-135m-instruct": (0.0, 0.0),
}


def load_prices() -> dict[str, tuple[float, float]]:
    """Defaults, overridden by the JSON file named in SEMBACK_PRICES ({model: [in, out]})."""
    prices = dict(DEFAULT_PRICES)
    path = os.environ.get("SEMBACK_PRICES")
    if path:
        with open(path, encoding="utf-8") as fh:
            prices.update({k: (float(v[0]), float(v[1])) for k, v in json.load(fh).items()})
    return prices


def cost_usd(prices: dict[str, tuple[float, float]], model: str, prompt_tokens: int,
             completion_tokens: int) -> float | None:
    if model not in prices:
        return None
    per_in, per_out = prices[model]
    return (prompt_tokens * per_in + completion_tokens * per_out) / 1_000_000
