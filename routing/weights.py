"""Weighted backend choice (Gateway API backendRef weights).

Draw uniformly in ``[0, Σweight)`` and walk the cumulative sums. A zero-weight backend
owns an empty interval, so it is never chosen; Σweight ≤ 0 (or no backends) means there
is nothing to choose. No stickiness and no skipped draw: the caller draws a fresh
``rand`` per request, one backend or many (a single positive weight just needs no
search), which keeps this module free of any random state.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable


def cumulative(weights: Iterable[int]) -> tuple[int, ...]:
    """Running totals of ``weights`` (negative weights count as 0)."""
    total = 0
    sums = []
    for weight in weights:
        total += max(weight, 0)
        sums.append(total)
    return tuple(sums)


def pick_index(sums: tuple[int, ...], rand: float) -> int | None:
    """Index chosen by ``rand`` (uniform in ``[0, 1)``) over cumulative ``sums``.

    ``None`` when the total weight is 0. The draw is ``int(rand * total)``; index ``i``
    wins for draws in ``[sums[i-1], sums[i])``, so its share is exactly its weight.
    A single positive weight wins every draw, so its index is returned without the
    search (the most common rule; :class:`routing.compiled.CompiledRule` keeps that
    backend as ``only``, so the Handler draws nothing for it).
    """
    count = len(sums)
    if count == 0:
        return None
    total = sums[count - 1]
    if total <= 0:
        return None
    if count == 1:
        return 0
    # min() guards the float edge where rand * total rounds up to total.
    return bisect_right(sums, min(int(rand * total), total - 1))
