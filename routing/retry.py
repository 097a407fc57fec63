"""The arithmetic of retries (GEP-1731) and retry budgets (GEP-3388), with no clock.

Which answers are retried, how long to wait before a retry, whether a backend's budget
allows one more, and how a policy reads in ``check``/``explain``. The caller measures
time and counts requests (:mod:`proxy.exchange.retry`); everything here is a pure
function of what it is given, so it is tested with tables.

- **What is retried**: a status listed in the policy's ``codes``, and a connection
  error (refused, or closed/reset before any response byte; GEP-1731
  ``HTTPRouteRetryConnectionError``). With no codes listed, only connection errors.
- **Backoff**: never before the configured minimum (GEP-1731); the n-th retry waits a
  random time in ``[minimum, min(minimum·2ⁿ, minimum·BACKOFF_CAP))`` — exponential,
  with jitter so that the retries of many requests that failed together spread out,
  and capped at :data:`BACKOFF_CAP` times the minimum.
- **Budget**: a retry is allowed while the retries sent to a backend over the budget's
  interval, this one included, stay within ``percent`` of all requests sent to it
  over that interval (this one included), or while fewer than ``min_retries`` retries
  went to it over the minimum rate's own interval (GEP-3388 ``minRetryRate``).
"""

from __future__ import annotations

from typing import Final

from routing.model import Retry, RetryConstraint
from routing.values import format_duration

BACKOFF_CAP: Final = 10  # the longest wait, in multiples of the minimum (Envoy's too)
DEFAULT_CONSTRAINT: Final = RetryConstraint()  # GEP-3388's defaults: 20 % / 10 s, 10 / 1 s


def retries_status(policy: Retry, status: int) -> bool:
    """Whether an answer with ``status`` is retried under ``policy``."""
    return status in policy.codes


def backoff(policy: Retry, retry: int, rand: float) -> float:
    """Seconds to wait before retry number ``retry`` (1 for the first); ``rand``
    uniform in [0, 1)."""
    low = policy.backoff
    high = min(low * (2 ** min(retry, 30)), low * BACKOFF_CAP)
    return low + rand * (high - low)


def budget_allows(constraint: RetryConstraint, requests: int, retries: int,
                  recent_retries: int) -> bool:
    """Whether one more retry fits the budget: ``requests`` (tries of every kind) and
    ``retries`` sent to the backend over ``constraint.interval``, ``recent_retries``
    over ``constraint.min_retry_interval`` (all without the retry in question)."""
    if recent_retries < constraint.min_retries:
        return True
    return (retries + 1) * 100 <= constraint.percent * (requests + 1)


def describe(policy: Retry) -> str:
    """One line for ``check``/``explain``: what is retried, how often, how far apart."""
    codes = ", ".join(str(code) for code in policy.codes)
    what = f"status {codes} and connection errors" if codes else "connection errors"
    tries = "once" if policy.attempts == 1 else f"up to {policy.attempts} times"
    return (f"retry {what} {tries}, backoff {format_duration(policy.backoff)} "
            f"(exponential with jitter, at most {BACKOFF_CAP}x)")


def describe_constraint(constraint: RetryConstraint | None) -> str:
    """The retry budget of a backend, for ``check``/``explain``."""
    c = DEFAULT_CONSTRAINT if constraint is None else constraint
    text = (f"retry budget {c.percent}% per {format_duration(c.interval)}, at least "
            f"{c.min_retries} per {format_duration(c.min_retry_interval)}")
    return text + (" (default)" if constraint is None else "")
