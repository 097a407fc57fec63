"""Retries (GEP-1731) within the route's timeouts and the backends' retry budgets
(GEP-3388), in the one exchange.

Only a request whose rule has a ``retry`` policy comes here (:meth:`Retries.start`);
any other takes the Handler's forward as it always did, at no extra cost. Every try is
sent by :meth:`Handler.forward <proxy.exchange.handler.Handler.forward>`, the one
exchange (:class:`~proxy.exchange.forward.Forward`), so over HTTP/1.1 and HTTP/2
backends alike. A try that failed *before anything of its answer
went to the client* — a listed status whose head is still held, or no answer at all —
asks :meth:`Retries.after_status` / :meth:`Retries.after_error` whether to go again;
once a response head (or a 1xx) was relayed, nothing is retried.

- **What**: listed codes; connection errors (refused, closed or reset before a response
  byte) whatever the codes; no head within the backend timeout as a 504, another
  failure as a 502, each retried if that status is listed.
- **When**: after :func:`routing.retry.backoff` (at least the policy's minimum,
  exponential with jitter, capped); never past ``timeouts.request``, counted from the
  first try; each try's wait for its head is bounded by ``timeouts.backend`` and by
  what is left of ``timeouts.request``.
- **Where**: the rule's weighted pick again, skipping the backends tries failed on and
  ejected endpoints where others exist (:mod:`routing.ejection`); a rule whose backends
  carry request filters of their own retries the same backend (its filters already
  edited the request).
- **Body**: a request body is read whole first, up to :data:`MAX_REPLAY` bytes, and
  replayed to each try; a larger one streams as usual and the request is not retried
  (the access log's ``retry`` field says so).
- **Budget**: each retry must fit the budget of the backend it goes to
  (:class:`RetryBudgets`); if it does not, the client gets 503 (GEP-3388: "additional
  retries ... MUST return a 503").
- When every try failed on a connection error the answer is 503 (GEP-1731
  ``HTTPRouteRetryConnectionError`` accepts 500 or 503), not the 502 a route without a
  policy answers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Final

from proxy.exchange.mirror import buffer_body
from proxy.exchange.steps import Exchange
from proxy.observability.resilience import ResilienceMetrics
from proxy.request import BytesBody
from proxy.upstream.base import UpstreamError
from routing import retry as arithmetic
from routing.ejection import pick_avoiding
from routing.model import Backend, Retry, RetryConstraint
from routing.compiled import CompiledBackend, CompiledRule

if TYPE_CHECKING:
    from proxy.exchange.handler import Handler

MAX_REPLAY: Final = 64 * 1024  # request body bytes kept for replay, at most
MIN_TIMEOUT: Final = 0.001  # a try's head timeout when the request's is nearly over
RESOLUTION: Final = 10_000  # steps per budget window (its time is exact to 1/10,000)
MAX_BUDGETS: Final = 4096  # backends with a budget window before the set starts over


class Attempts:
    """The retry state of one exchange: the policy, the tries so far, the deadline of
    the whole request, the body kept for replay and why a retry was not made."""

    __slots__ = ("policy", "route", "deadline", "backend_timeout", "tries", "body",
                 "declare_length", "replayable", "connection_only", "interim", "note",
                 "timer", "owner", "failed")

    def __init__(self, owner: "Retries", route: CompiledRule, policy: Retry,
                 now: float) -> None:
        timeouts = route.rule.timeouts
        self.owner = owner
        self.policy = policy
        self.route = route
        request = timeouts.request if timeouts is not None else None
        self.deadline = None if request is None else now + request
        self.backend_timeout = timeouts.backend if timeouts is not None else None
        self.tries = 0
        self.body: bytes | None = None
        self.declare_length = True
        self.replayable = True
        self.connection_only = True  # every try so far failed on a connection error
        self.interim = False  # a 1xx went to the client: the answer has started
        self.note = ""
        self.timer: asyncio.TimerHandle | None = None
        self.failed: list[str] = []  # backend URLs tries failed on, in order

    def head_timeout(self, now: float) -> float | None:
        """What bounds this try's wait for its head: the backend timeout, and what is
        left of the request timeout."""
        timeout = self.backend_timeout
        if self.deadline is not None:
            left = max(self.deadline - now, MIN_TIMEOUT)
            timeout = left if timeout is None else min(timeout, left)
        return timeout

    def cancel(self, ex: Exchange) -> None:
        """The client left while waiting for the next try: stop waiting."""
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()
            ex.status = 0
            self.owner.handler.close(ex)


class _Window:
    """Events over the last ``span`` seconds, kept as (time step, count) pairs: exact
    to ``span / RESOLUTION``, and never more than ``RESOLUTION`` pairs."""

    __slots__ = ("span", "step", "events", "total")

    def __init__(self, span: float) -> None:
        self.span = span
        self.step = span / RESOLUTION
        self.events: deque[list[float]] = deque()
        self.total = 0

    def count(self, now: float) -> int:
        events = self.events
        horizon = now - self.span
        while events and events[0][0] <= horizon:
            self.total -= int(events.popleft()[1])
        return self.total

    def add(self, now: float) -> None:
        tick = now - now % self.step
        events = self.events
        if events and events[-1][0] == tick:
            events[-1][1] += 1
        else:
            self.count(now)  # (what left the window goes, counted or not)
            events.append([tick, 1])
        self.total += 1


class _Budget:
    """One backend's requests and retries over its budget's windows."""

    __slots__ = ("constraint", "requests", "retries", "recent")

    def __init__(self, constraint: RetryConstraint) -> None:
        self.constraint = constraint
        self.requests = _Window(constraint.interval)
        self.retries = _Window(constraint.interval)
        self.recent = _Window(constraint.min_retry_interval)


class RetryBudgets:
    """The retry budget of every backend that retried requests go to, by URL.

    Only tries of requests with a retry policy are counted (the others are not
    watched, so that they cost nothing): a backend's budget is a share of those.
    """

    def __init__(self) -> None:
        self._budgets: dict[str, _Budget] = {}

    def _of(self, backend: Backend) -> _Budget:
        constraint = backend.retry_constraint or arithmetic.DEFAULT_CONSTRAINT
        budget = self._budgets.get(backend.url)
        if budget is None or budget.constraint != constraint:
            if len(self._budgets) >= MAX_BUDGETS:
                self._budgets.clear()
            budget = self._budgets[backend.url] = _Budget(constraint)
        return budget

    def sent(self, backend: Backend, now: float) -> None:
        """A try (first or retry) went to ``backend``."""
        self._of(backend).requests.add(now)

    def allow(self, backend: Backend, now: float) -> bool:
        """Whether one more retry to ``backend`` fits its budget (counted if so)."""
        budget = self._of(backend)
        if not arithmetic.budget_allows(budget.constraint, budget.requests.count(now),
                                        budget.retries.count(now), budget.recent.count(now)):
            return False
        budget.retries.add(now)
        budget.recent.add(now)
        return True


class Retries:
    """Runs the tries of the exchanges whose rule has a retry policy; one per Handler."""

    def __init__(self, handler: "Handler", metrics: ResilienceMetrics) -> None:
        self.handler = handler
        self.metrics = metrics
        self.budgets = RetryBudgets()

    def start(self, ex: Exchange, route: CompiledRule, policy: Retry,
              chosen: CompiledBackend) -> None:
        """The first try of ``ex``, once its body is kept for replay (if it can be)."""
        loop = asyncio.get_running_loop()
        attempts = ex.retry = Attempts(self, route, policy, loop.time())
        length = ex.body.length
        if length is not None and length > MAX_REPLAY:
            self._not_replayable(ex, attempts)
        elif length != 0:
            ex.task = loop.create_task(self._keep_body(ex, attempts, chosen))
            return
        self._try(ex, chosen)

    async def _keep_body(self, ex: Exchange, attempts: Attempts,
                         chosen: CompiledBackend) -> None:
        declared = ex.body.length is not None
        try:
            body = await buffer_body(ex, MAX_REPLAY)
        except asyncio.CancelledError:
            ex.status = 0
            self.handler.close(ex)
            raise
        ex.task = None
        if body is None:
            self._not_replayable(ex, attempts)
        else:
            attempts.body = body
            attempts.declare_length = declared
        self._try(ex, chosen)

    def _not_replayable(self, ex: Exchange, attempts: Attempts) -> None:
        attempts.replayable = False
        attempts.note = f"not retried: request body over {MAX_REPLAY} bytes"

    def _try(self, ex: Exchange, chosen: CompiledBackend) -> None:
        attempts = ex.retry
        assert attempts is not None
        now = asyncio.get_running_loop().time()
        attempts.tries += 1
        self.budgets.sent(chosen.backend, now)
        self.metrics.attempt(ex.host_pattern, _rule(attempts))
        if attempts.body:
            ex.body = BytesBody(attempts.body, declare_length=attempts.declare_length)
        self.handler.forward(ex, chosen, attempts.head_timeout(now))

    # -- a try failed before any of its answer went out

    def after_status(self, ex: Exchange, chosen: CompiledBackend, status: int) -> bool:
        """The head of a try arrived with ``status`` (not relayed yet). True when the
        exchange goes on without this answer (a retry follows, or a 503 was answered);
        the caller then drops the try."""
        attempts = ex.retry
        assert attempts is not None
        attempts.connection_only = False
        if not arithmetic.retries_status(attempts.policy, status):
            return False
        return self._again(ex, attempts, chosen, "status")

    def after_error(self, ex: Exchange, chosen: CompiledBackend, error: UpstreamError) -> bool:
        """A try got no answer. True when a retry follows (or a 503 was answered);
        False leaves the failure to be answered (503 when every try failed on a
        connection error)."""
        attempts = ex.retry
        assert attempts is not None
        if error.reason == "canceled" or ex.responder.aborted:
            return False
        if error.reason == "dial" or error.unanswered:
            reason = "connection"
        else:
            attempts.connection_only = False
            timeout = error.reason == "timeout"
            status = error.status or (504 if timeout else 502)
            if not arithmetic.retries_status(attempts.policy, status):
                return False
            reason = "timeout" if timeout else "error"
        if self._again(ex, attempts, chosen, reason):
            return True
        if attempts.connection_only:
            error.status = 503  # (GEP-1731 HTTPRouteRetryConnectionError: 500 or 503)
        return False

    def _again(self, ex: Exchange, attempts: Attempts, chosen: CompiledBackend,
               reason: str) -> bool:
        """Schedule the next try after the backoff (True), answer 503 when the budget
        of its backend is spent (True), or say no retry may follow (False: counted
        unless the policy's attempts are simply used up)."""
        why = self._why_not(attempts)
        rule = _rule(attempts)
        loop = asyncio.get_running_loop()
        now = loop.time()
        delay = arithmetic.backoff(attempts.policy, attempts.tries, self.handler.rand())
        if not why and attempts.deadline is not None and now + delay >= attempts.deadline:
            why = "deadline"
            attempts.note = "not retried: no time left within timeouts.request"
        if why:
            if why != "attempts":
                self.metrics.not_retried(ex.host_pattern, rule, why)
            return False
        following = self._next(ex, attempts.route, chosen)
        if not self.budgets.allow(following.backend, now):
            self.metrics.not_retried(ex.host_pattern, rule, "budget")
            attempts.note = "not retried: retry budget exhausted"
            ex.answer_text(503, b"retry budget exhausted\n")
            self.handler.close(ex)
            return True
        self.metrics.retried(ex.host_pattern, rule, reason)
        ex.backend = following.backend
        ex.backend_filters = following.response_filters
        attempts.timer = loop.call_later(delay, self._retry, ex, following)
        return True

    def _why_not(self, attempts: Attempts) -> str:
        """Why no retry may follow, whatever the time and budget ("" if it may)."""
        if attempts.interim:
            attempts.note = "not retried: an interim response went to the client"
            return "started"
        if not attempts.replayable:
            return "body"
        if attempts.tries > attempts.policy.attempts:
            return "attempts"
        return ""

    def _next(self, ex: Exchange, route: CompiledRule,
              chosen: CompiledBackend) -> CompiledBackend:
        """The backend of the next try: picked again, away from those that failed."""
        if route.only is not None or chosen.request_filters:
            return chosen
        outliers = self.handler.outliers
        attempts = ex.retry
        assert attempts is not None
        attempts.failed.append(chosen.backend.url)
        following = pick_avoiding(route, self.handler.rand(), outliers.ejected,
                                  outliers.max_share, failed=attempts.failed)
        if (following is None or following.request_filters
                or following.backend.unavailable_status):
            return chosen
        return following

    def _retry(self, ex: Exchange, following: CompiledBackend) -> None:
        attempts = ex.retry
        assert attempts is not None
        attempts.timer = None
        if ex.closed:
            return
        if ex.responder.aborted:
            ex.status = 0
            self.handler.close(ex)
            return
        self.handler.outliers.picked(following.backend.url)
        self._try(ex, following)


def _rule(attempts: Attempts) -> str:
    return f"rules[{attempts.route.index}]"
