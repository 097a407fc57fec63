"""The Handler: one request from lookup to the last response byte.

Order of work, whatever entrance the request came through:

1–3. :func:`routing.decide.decide`: the entrance's scope, ``OPTIONS *``, the lookup
   (nothing ⇒ 404), a rule's ``unavailableStatus``, and the backend drawn *before*
   filters, so filters cannot influence the pick; the Handler applies the decision;
4. rule-level request filters, then the chosen backend's; a redirect or a CORS
   preflight answers here and skips response filters;
5. no backend ⇒ 500; backend ``unavailableStatus`` ⇒ that status;
6. forward, then rule-level and backend-level response filters, then stream the body.

Steps 1–5 are synchronous; step 6 is :class:`proxy.exchange.forward.Forward`, the one
exchange for every kind of backend, driven by the backend's listener calls. Only what
really waits takes a task: a mirror reading the body for its copy, the session after
a protocol switch (:mod:`proxy.exchange.awaited`), an HTTP/2 stream (its pool's). A rule with a retry policy sends each of its tries
through :mod:`proxy.exchange.retry`, which decides, before anything of a failed try's
answer went out, whether another try follows; ejected endpoints are skipped in the
draw (:mod:`proxy.upstream.outlier`), and an overloaded proxy sheds new requests
before step 1 (:mod:`proxy.exchange.shedding`). Failures the proxy answers itself —
including the 503 a Knative probe (:attr:`routing.decide.Decision.probe`) gets instead
of any of them — are :mod:`proxy.exchange.failures`'.

The decisions are routing's (``routing.decide``, ``routing.filters``); this module only
applies them and does the I/O, through the Responder and the upstream pools.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Callable

from proxy.exchange.failures import Failures
from proxy.exchange.forward import Forward
from proxy.exchange.mirror import Mirrors
from proxy.exchange.reporting import Reporting
from proxy.exchange.retry import Retries
from proxy.exchange.shedding import LoadShedder
from proxy.exchange.snapshot import SnapshotHolder
from proxy.exchange.steps import (
    NOBODY, Exchange, run_request_filters, run_waiting_filters, waits)
from proxy.exchange.websocket import DEFAULT_IDLE_TIMEOUT
from proxy.flow.turn import TurnEnd
from proxy.observability.accesslog import AccessLog
from proxy.observability.metrics import Metrics
from proxy.observability.tracing import Tracing
from proxy.request import Done, Headers, Request, Responder, Serve
from proxy.upstream.registry import Pools
from routing.decide import (
    FORBIDDEN, NO_ROUTE, ROUTE, UNAVAILABLE, Decision, EntranceScope, decide)
from routing.ejection import pick_avoiding
from routing.compiled import CompiledBackend, CompiledRule

log = logging.getLogger("tunnelgate.handler")

_JSON: Headers = [(b"Content-Type", b"application/json")]


class Handler(Serve):
    """Serves requests against the current snapshot; one instance per process."""

    def __init__(
        self,
        holder: SnapshotHolder,
        pools: Pools,
        metrics: Metrics,
        access_log: AccessLog,
        scope: EntranceScope,
        *,
        rand: Callable[[], float] = random.random,
        upgrade_timeout: float | None = 30.0,
        upgrade_dial_timeout: float | None = None,
        session_idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        tracing: Tracing | None = None,
        shedder: LoadShedder | None = None,
    ) -> None:
        self.holder = holder
        self.pools = pools
        self.mirrors = Mirrors(pools)  # RequestMirror copies go through the same pools
        self.metrics = metrics
        self.scope = scope  # what each entrance may serve (routing.decide)
        self.rand = rand
        self.upgrade_timeout = upgrade_timeout
        self.upgrade_dial_timeout = upgrade_dial_timeout
        self.session_idle_timeout = session_idle_timeout
        self.reporting = Reporting(metrics, access_log, tracing)
        self.failures = Failures(metrics)
        # Resilience (proxy.exchange.retry, proxy.upstream.outlier, .shedding): retries
        # run only for rules with a policy; ejection and shedding are a test each.
        self.outliers = pools.outliers
        self.outliers.listener = metrics.resilience.ejection
        self.retries = Retries(self, metrics.resilience)
        self.shedder = shedder if shedder is not None else LoadShedder(metrics.resilience)
        self.turn_end = TurnEnd()  # answers that ended this turn finish at its end
        self.count = 0
        """Requests inside the Handler now, upgraded sessions included (drain waits,
        and the shedder's limit is on it)."""
        self.shedder.watch(self)
        self._idle: asyncio.Event | None = None

    def start(self, request: Request, responder: Responder, done: Done) -> Exchange:
        """Serve ``request`` (:class:`proxy.request.Serve`): the common exchange runs
        on callbacks, with no task; what really waits (a mirror's body, a protocol
        switch, an HTTP/2 backend) continues in a task. ``done`` hears once, when the
        exchange is over, with the exception that broke it off if one did. The
        returned exchange's ``cancel()`` abandons it."""
        self.count += 1
        self.metrics.request_started()
        ex = Exchange(request, responder, done)
        reporting = self.reporting
        if reporting.observing:
            reporting.observe(ex)
        shedder = self.shedder
        if shedder.active and self.count > shedder.limit:
            shed = shedder.shed(request)
            if shed is not None:
                ex.answer(*shed)
                shedder.hold(ex.responder)
                self.close(ex)
                return ex
        try:
            self._serve(ex)
        except BaseException:
            ex.status = 0
            self.close(ex, notify=False)  # the entrance answers (500) and moves on
            raise
        return ex

    async def __call__(self, request: Request, responder: Responder) -> None:
        """:meth:`start` for a caller that awaits the end (the in-process bridge); an
        exchange over before ``start`` returned costs no future."""
        end = _End()
        ex = self.start(request, responder, end)
        if not end.over:
            end.future = asyncio.get_running_loop().create_future()
            try:
                await end.future
            except asyncio.CancelledError:
                ex.cancel()
                raise
        if end.error is not None:
            raise end.error

    def _serve(self, ex: Exchange) -> None:
        decision = self._route(ex)
        if decision is None:
            self.close(ex)
            return
        hit = decision.hit
        assert hit is not None
        route, chosen = hit.route, decision.backend
        filters = route.request_filters
        if filters or (chosen is not None and chosen.request_filters):
            if waits(filters) or (chosen is not None and waits(chosen.request_filters)):
                ex.task = asyncio.get_running_loop().create_task(
                    self._serve_waiting(ex, route, chosen))
                return
            shortcut = run_request_filters(ex, filters)
            if shortcut is None and chosen is not None:
                shortcut = run_request_filters(ex, chosen.request_filters)
            if shortcut is not None:
                ex.answer(shortcut.status, shortcut.headers, b"")
                self.close(ex)
                return
        self._dispatch(ex, route, chosen)

    async def _serve_waiting(self, ex: Exchange, route: CompiledRule,
                             chosen: CompiledBackend | None) -> None:
        """Step 4 with a filter that waits (a mirror reads the body first)."""
        try:
            shortcut = await run_waiting_filters(ex, route.request_filters, self.mirrors)
            if shortcut is None and chosen is not None:
                shortcut = await run_waiting_filters(ex, chosen.request_filters,
                                                     self.mirrors)
        except asyncio.CancelledError:
            ex.status = 0
            self.close(ex)
            raise
        except Exception as exc:
            ex.error = exc
            self.close(ex)
            return
        ex.task = None
        if shortcut is not None:
            ex.answer(shortcut.status, shortcut.headers, b"")
            self.close(ex)
            return
        self._dispatch(ex, route, chosen)

    def _dispatch(self, ex: Exchange, route: CompiledRule,
                  chosen: CompiledBackend | None) -> None:
        """Steps 5–6: the backend's own answers, or the forward."""
        if chosen is None:
            self.failures.no_backend(ex)
            self.close(ex)
            return
        backend = chosen.backend
        if backend.unavailable_status:
            self.failures.unavailable(ex, backend.unavailable_status)
            self.close(ex)
            return
        policy = route.rule.retry
        if policy is not None and ex.request.upgrade is None:
            self.retries.start(ex, route, policy, chosen)
            return
        self.forward(ex, chosen, route.deadline)

    def forward(self, ex: Exchange, chosen: CompiledBackend, deadline: float | None) -> None:
        """Send ``ex`` to ``chosen`` (one try, ``deadline`` for its response head),
        whatever the backend speaks: the one exchange, :class:`Forward`."""
        forward = ex.forward = Forward(self, ex, chosen)
        forward.start(self.pools.get(chosen.backend), deadline)

    def close(self, ex: Exchange, notify: bool = True) -> None:
        """The exchange is over: count it, log it, tell the entrance (once)."""
        if ex.closed:
            return
        ex.closed = True
        self.count -= 1
        self.reporting.account(ex)
        if not self.count and self._idle is not None:
            self._idle.set()
        done, ex.done = ex.done, NOBODY  # (the entrance's: no cycle left behind)
        if notify:
            done.exchange_over(ex.error)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :attr:`count` to reach 0 (drain);
        True if it did."""
        if not self.count:
            return True
        if self._idle is None:
            self._idle = asyncio.Event()
        self._idle.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def _route(self, ex: Exchange) -> Decision | None:
        """Steps 1–3: routing's decision, applied. None when the request was answered
        here; else a ``ROUTE`` decision, its backend drawn."""
        request = ex.request
        decision = decide(self.holder.current.table, self.scope, request.method,
                          request.host, request.path, request.query, request.headers,
                          request.entrance, self.rand)
        hit = decision.hit
        if hit is not None:
            ex.hit = hit
            ex.host_pattern = hit.host_pattern
            ex.knative_probe = decision.probe
        kind = decision.kind
        if kind == ROUTE:
            assert hit is not None
            ex.matched_prefix = hit.matched_prefix
            ex.rule_filters = hit.route.response_filters
            chosen = decision.backend
            outliers = self.outliers
            if outliers.ejected or outliers.probing:
                chosen = decision.backend = self._avoid_ejected(hit.route, chosen)
            if chosen is not None:
                ex.backend = chosen.backend
                ex.backend_filters = chosen.response_filters
            if self.reporting.debug_routes:
                self.reporting.log_route(ex, hit, chosen)
            return decision
        if kind == NO_ROUTE:
            if self.reporting.debug_routes:
                self.reporting.log_route(ex, None, None)
            self.failures.no_route(ex)
        elif kind == FORBIDDEN:
            ex.answer(403, _JSON, json.dumps({"error": "forbidden",
                                              "message": decision.detail,
                                              "entrance": request.entrance}).encode())
        elif kind == UNAVAILABLE:
            if decision.probe:
                self.failures.probe(ex, "unavailable")
            else:
                ex.answer_status(decision.status)
        else:  # SERVER: OPTIONS *, answered with no body as the Go data plane does
            ex.answer(decision.status, [], b"")
        return None

    def _avoid_ejected(self, route: CompiledRule,
                       drawn: CompiledBackend | None) -> CompiledBackend | None:
        """Step 3's draw again while outlier detection holds endpoints out: skipping
        ejected ones (:mod:`routing.ejection`, given what is ejected as data; the
        routing decision knows nothing of it). Picking an endpoint whose ejection just
        ended makes this request its probe."""
        outliers = self.outliers
        chosen = drawn
        if outliers.ejected and route.only is None:
            chosen = pick_avoiding(route, self.rand(), outliers.ejected, outliers.max_share)
        if chosen is not None and outliers.probing:
            outliers.picked(chosen.backend.url)
        return chosen


class _End(Done):
    """Where :meth:`Handler.__call__` learns that its exchange is over."""

    __slots__ = ("over", "error", "future")

    def __init__(self) -> None:
        self.over = False
        self.error: BaseException | None = None
        self.future: asyncio.Future[None] | None = None

    def exchange_over(self, error: BaseException | None) -> None:
        self.over = True
        self.error = error
        future = self.future
        if future is not None and not future.done():
            future.set_result(None)
