"""The Handler: one request from lookup to the last response byte.

Order of work, whatever entrance the request came through:

1. entrance admission (cluster scope), then ``Snapshot.table.lookup``; nothing ⇒ 404;
2. rule ``unavailableStatus`` ⇒ that status, nothing else runs;
3. the backend is drawn *before* filters, so filters cannot influence the pick;
4. rule-level request filters, then the chosen backend's; a redirect or a CORS
   preflight answers here and skips response filters;
5. no backend ⇒ 500; backend ``unavailableStatus`` ⇒ that status;
6. forward, then rule-level and backend-level response filters, then stream the body.

Steps 1–5 are synchronous; step 6 is :class:`proxy.exchange.forward.Forward`, driven by
the backend connection's callbacks. Only what really waits takes a task: a mirror
reading the body for its copy, a protocol switch, an HTTP/2 backend
(:mod:`proxy.exchange.awaited`). Failures the proxy answers itself — including the 503
a Knative probe (``proxy.entrances.policy.is_knative_probe``) gets instead of any of
them — are :mod:`proxy.exchange.failures`'.

The decisions are routing's (``routing.table``, ``routing.filters``); this module only
applies them and does the I/O, through the Responder and the upstream pools.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Callable, Final

from proxy.control.snapshot import SnapshotHolder
from proxy.entrances.policy import TUNNEL, EntrancePolicy, is_knative_probe
from proxy.exchange.awaited import forward_awaited
from proxy.exchange.failures import Failures
from proxy.exchange.forward import Forward
from proxy.exchange.mirror import Mirrors
from proxy.exchange.steps import (
    NOBODY, Exchange, run_request_filters, run_waiting_filters, waits)
from proxy.exchange.websocket import DEFAULT_IDLE_TIMEOUT
from proxy.flow.clock import MONOTONIC
from proxy.flow.turn import TurnEnd
from proxy.observability.accesslog import AccessLog
from proxy.observability.metrics import Metrics
from proxy.observability.tracing import Tracing
from proxy.request import Done, Headers, Request, Responder, Serve
from proxy.upstream.registry import Pools
from routing.table import CompiledBackend, CompiledRule, Hit, format_key

log = logging.getLogger("tunnelgate.handler")
# Route decisions at debug level (``--log-level debug``): one line per request.
route_log = logging.getLogger("tunnelgate.route")

_JSON: Headers = [(b"Content-Type", b"application/json")]
_REQUEST_ID: Final = b"x-request-id"
MAX_REQUEST_ID: Final = 128  # longer client-sent ids are cut (log lines stay bounded)


class Handler(Serve):
    """Serves requests against the current snapshot; one instance per process."""

    def __init__(
        self,
        holder: SnapshotHolder,
        pools: Pools,
        metrics: Metrics,
        access_log: AccessLog,
        policy: EntrancePolicy,
        *,
        rand: Callable[[], float] = random.random,
        upgrade_timeout: float | None = 30.0,
        upgrade_dial_timeout: float | None = None,
        session_idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        tracing: Tracing | None = None,
    ) -> None:
        self.holder = holder
        self.pools = pools
        self.mirrors = Mirrors(pools)  # RequestMirror copies go through the same pools
        self.metrics = metrics
        self.access_log = access_log
        self.policy = policy
        self.rand = rand
        self.upgrade_timeout = upgrade_timeout
        self.upgrade_dial_timeout = upgrade_dial_timeout
        self.session_idle_timeout = session_idle_timeout
        self.tracing = tracing
        # Decided once, here: a request pays for route-decision logging, request ids or
        # tracing only when one of them is on (``observing``, one check per request).
        self.debug_routes = route_log.isEnabledFor(logging.DEBUG)
        self.request_ids = access_log.enabled or self.debug_routes
        self.observing = tracing is not None or self.request_ids
        self.failures = Failures(metrics)
        self.turn_end = TurnEnd()  # answers that ended this turn finish at its end
        self.count = 0
        """Requests inside the Handler now, upgraded sessions included (drain waits)."""
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
        if self.observing:
            self._observe(ex)
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
        route, chosen = decision
        filters = route.request_filters
        if filters or (chosen is not None and chosen.request_filters):
            if waits(filters) or (chosen is not None and waits(chosen.request_filters)):
                ex.task = asyncio.get_running_loop().create_task(
                    self._serve_waiting(ex, route, chosen))
                return
            shortcut = run_request_filters(ex, filters, self.mirrors)
            if shortcut is None and chosen is not None:
                shortcut = run_request_filters(ex, chosen.request_filters, self.mirrors)
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
        if ex.request.upgrade is None and backend.protocol != "h2c":
            forward = ex.forward = Forward(self, ex, chosen)
            forward.start(self.pools.get(backend), route.deadline)
            return
        ex.task = asyncio.get_running_loop().create_task(
            forward_awaited(self, ex, chosen, route.deadline))

    def close(self, ex: Exchange, notify: bool = True) -> None:
        """The exchange is over: count it, log it, tell the entrance (once)."""
        if ex.closed:
            return
        ex.closed = True
        self.count -= 1
        self._account(ex)
        if not self.count and self._idle is not None:
            self._idle.set()
        done, ex.done = ex.done, NOBODY  # (the entrance's: no cycle left behind)
        if notify:
            done.exchange_over(ex.error)

    def _observe(self, ex: Exchange) -> None:
        """Request id (kept from ``X-Request-Id`` or made up, and forwarded) and the
        server span, for requests that something reports on."""
        if self.request_ids:
            given = ex.request.header(_REQUEST_ID)
            if given:
                ex.request_id = given[:MAX_REQUEST_ID].decode("latin-1")
            else:
                ex.request_id = os.urandom(16).hex()
                # A new list: the Request keeps what the client sent (access log).
                ex.headers = [*ex.headers, (b"X-Request-Id", ex.request_id.encode())]
        if self.tracing is not None:
            ex.span = self.tracing.start_server(ex.request)

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

    def _route(self, ex: Exchange) -> tuple[CompiledRule, CompiledBackend | None] | None:
        """Steps 1–3: admission, lookup, rule ``unavailableStatus``, the backend draw.
        None when the request was answered here."""
        request = ex.request
        refusal = self.policy.refusal(request)
        if refusal is not None:
            ex.answer(403, _JSON, refusal)
            return None
        if request.path == "*":
            # OPTIONS * asks about the server, not a resource (RFC 9110 §9.3.7; the
            # entrance admits "*" with OPTIONS only). No route is involved: answered
            # here, with no body, as the Go data plane's server does.
            ex.answer(200, [], b"")
            return None
        table = self.holder.current.table
        hit = table.lookup(request.host, request.path, request.query, request.headers,
                           request.method, request.entrance)
        if self.policy.probe_sees_all(request, hit):
            other = table.lookup(request.host, request.path, request.query,
                                 request.headers, request.method, TUNNEL)
            if other is not None and other.knative_probe:
                hit = other
        if hit is None:
            if self.debug_routes:
                self._log_route(ex, None, None)
            self.failures.no_route(ex)
            return None
        ex.hit = hit
        ex.host_pattern = hit.host_pattern
        ex.knative_probe = is_knative_probe(request, hit)
        refusal = self.policy.probe_refusal(request, ex.knative_probe)
        if refusal is not None:
            ex.answer(403, _JSON, refusal)
            return None
        route = hit.route
        if route.rule.unavailable_status:
            if ex.knative_probe:
                self.failures.probe(ex, "unavailable")
            else:
                ex.answer_status(route.rule.unavailable_status)
            return None
        ex.matched_prefix = hit.matched_prefix
        ex.rule_filters = route.response_filters
        # Drawn before filters run (step 3); a rule with one backend needs no draw.
        chosen = route.only
        if chosen is None:
            chosen = route.pick(self.rand())
        if chosen is not None:
            ex.backend = chosen.backend
            ex.backend_filters = chosen.response_filters
        if self.debug_routes:
            self._log_route(ex, hit, chosen)
        return route, chosen

    def _log_route(self, ex: Exchange, hit: Hit | None,
                   chosen: CompiledBackend | None) -> None:
        """The decision at debug level: which match won, in which bucket, and why."""
        request = ex.request
        fields: dict[str, object] = {
            "request_id": ex.request_id, "entrance": request.entrance,
            "method": request.method, "host": request.host, "path": request.path}
        if hit is None:
            route_log.debug("no matching route", extra=fields)
            return
        fields.update(
            rule=hit.name(), bucket=hit.host_pattern or "(default)",
            backend=chosen.backend.url if chosen is not None else "",
            why=f"first satisfied match in precedence order ({format_key(hit.key)})",
            matched_prefix=hit.matched_prefix)
        route_log.debug("route decision", extra=fields)

    def client_span(self, ex: Exchange, host: str, port: int, target: str,
                     headers: Headers) -> Headers:
        """Start the client span of this backend call; the headers that carry it."""
        tracing = self.tracing
        assert tracing is not None and ex.backend is not None
        ex.client_span = tracing.start_client(ex.span, ex.request.method, ex.backend.url,
                                              target, host, port)
        return tracing.inject(ex.client_span, headers)

    def _account(self, ex: Exchange) -> None:
        duration = MONOTONIC() - ex.started
        if ex.span is not None:
            self._end_spans(ex)
        if ex.status == 101:
            return  # counted at takeover (upgrade_completed)
        self.metrics.request_finished(ex.host_pattern, ex.status, duration,
                                      ex.bytes_read, ex.bytes_written)
        self.access_log.record(ex.request, ex.status, ex.bytes_written, duration, ex)

    def _end_spans(self, ex: Exchange) -> None:
        tracing = self.tracing
        assert tracing is not None
        if ex.client_span is not None:
            tracing.end_client(ex.client_span, ex.upstream_status,
                               ex.upstream_error or None)
        hit = ex.hit
        if hit is not None:
            tracing.routed(ex.span, hit.path_pattern(), hit.name(), hit.host_pattern)
        tracing.end_server(ex.span, ex.status,
                           ex.backend.url if ex.backend is not None else None)


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
