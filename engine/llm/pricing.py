"""A small, configurable price table: US dollars per million tokens (input, output, and
where the provider discounts them, cached input: prompt tokens its prefix cache served).

Unknown models cost nothing; `cost_usd` returns None for them so that reports can say
the price is unknown rather than pretend it is zero. Without a cached price, cached
tokens cost the input price.
"""

from __future__ import annotations

import json
import os

# (input, output) or (input, output, cached input), per million tokens
DEFAULT_PRICES: dict[str, tuple[float, ...]] = {
    "gpt-4o-mini": (0.15, 0.60, 0.075),
    "gpt-4o": (2.50, 10.00, 1.25),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-4.1-mini": (0.40, 1.60, 0.10),
    "gpt-4.1": (2.00, 8.00, 0.50),
    "scripted": (0.0, 0.0),
    "smollm2-135m-instruct": (0.0, 0.0),  # the name runs logged before the named models
    "smollm2-135m": (0.0, 0.0),
    "qwen2.5-coder-0.5b": (0.0, 0.0),
    "qwen2.5-coder-1.5b": (0.0, 0.0),
}


def load_prices() -> dict[str, tuple[float, ...]]:
    """Defaults, overridden by the JSON file named in SEMBACK_PRICES
    ({model: [in, out]} or {model: [in, out, cached_in]})."""
    prices = dict(DEFAULT_PRICES)
    path = os.environ.get("SEMBACK_PRICES")
    if path:
        with open(path, encoding="utf-8") as fh:
            prices.update({k: tuple(float(x) for x in v[:3]) for k, v in json.load(fh).items()})
    return prices


def cost_usd(prices: dict[str, tuple[float, ...]], model: str, prompt_tokens: int,
             completion_tokens: int, cached_tokens: int = 0) -> float | None:
    """The call's cost; `cached_tokens` (part of `prompt_tokens`) at the cached price."""
    if model not in prices:
        return None
    per_in, per_out = prices[model][:2]
    per_cached = prices[model][2] if len(prices[model]) > 2 else per_in
    cached = min(max(cached_tokens, 0), prompt_tokens)
    return ((prompt_tokens - cached) * per_in + cached * per_cached
            + completion_tokens * per_out) / 1_000_000
