"""The interval every share the product concludes from is shown with: Wilson's score
interval of k successes in n examples (blame's flip rates at 90%, validation and test
scores at 95%)."""

from __future__ import annotations

import math

Z90 = 1.6448536269514722  # two-sided 90%
Z95 = 1.959963984540054  # two-sided 95%


def wilson(successes: float, n: int, z: float = Z90) -> tuple[float, float]:
    """Wilson score interval of a share; [0, 1] when there is nothing to go on."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def score_interval(score: float | None, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The interval of a pass rate `score` measured on `n` examples (a mean of per-example
    scores in [0, 1]: partial credit counts as its share of a success); None when there is
    no score or no example."""
    if score is None or score != score or n <= 0:
        return None
    return wilson(min(max(score, 0.0), 1.0) * n, n, z)


def bracketed(bounds: tuple[float, float]) -> str:
    """An interval as `engine blame` and the pages print it: "[0.60, 1.00]"."""
    low, high = bounds
    return f"[{low:.2f}, {high:.2f}]"
