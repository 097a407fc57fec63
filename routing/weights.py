"""Weighted backend choice (Gateway API backendRef weights).

Draw uniformly in ``[0, Σweight)`` and walk the cumulative sums. A zero-weight backend
owns an empty interval, so it is never chosen; Σweight ≤ 0 (or no backends) means there
is nothing to choose. No single-backend shortcut and no stickiness: the caller draws a
fresh ``rand`` per request, which keeps this module free of any random state.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable, Sequence


def cumulative(weights: Iterable[int]) -> tuple[int, ...]:
    """Running totals of ``weights`` (negative weights count as 0)."""
    total = 0
    sums = []
    for weight in weights:
        total += max(weight, 0)
        sums.append(total)
    return tuple(sums)


def pick_index(sums: Sequence[int], rand: float) -> int | None:
    """Index chosen by ``rand`` (uniform in ``[0, 1)``) over cumulative ``sums``.

    ``None`` when the total weight is 0. The draw is ``int(rand * total)``; index ``i``
    wins for draws in ``[sums[i-1], sums[i])``, so its share is exactly its weight.
    """
    if not sums or sums[-1] <= 0:
        return None
    total = sums[-1]
    # min() guards the float edge where rand * total rounds up to total.
    return bisect_right(sums, min(int(rand * total), total - 1))
