"""The Handler: one request from lookup to the last response byte.

Order of work, whatever entrance the request came through:

1. entrance admission (cluster scope), then ``Snapshot.table.lookup``; nothing ⇒ 404;
2. rule ``unavailableStatus`` ⇒ that status, nothing else runs;
3. the backend is drawn *before* filters, so filters cannot influence the pick;
4. rule-level request filters, then the chosen backend's; a redirect or a CORS
   preflight answers here and skips response filters;
5. no backend ⇒ 500; backend ``unavailableStatus`` ⇒ that status;
6. forward, then rule-level and backend-level response filters, then stream the body.

A Knative probe (``proxy.entrances.policy.is_knative_probe``) gets **503** with a short reason
instead of every failure status the proxy generates itself (steps 2 and 5, and a
failed forward). Knative's prober retries on 503 but takes 500/502/504 as "abandoned",
which counts as ready: a revision whose pod refuses connections would be declared
Ready and then fail real traffic. A status the backend itself sent passes unchanged.

The decisions are routing's (``routing.table``, ``routing.filters``); this module only
applies them and does the I/O, through the Responder and the upstream pools.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import time
from typing import Callable

from proxy.control.snapshot import SnapshotHolder
from proxy.entrances.policy import TUNNEL, EntrancePolicy, is_knative_probe
from proxy.exchange.forwarding import (
    downstream_response_headers, upstream_request_headers, upstream_target)
from proxy.exchange.forward import Forward
from proxy.exchange.mirror import Mirrors
from proxy.exchange.steps import (
    Exchange, no_callback, run_request_filters, run_waiting_filters, waits)
from proxy.exchange.websocket import DEFAULT_IDLE_TIMEOUT, pipe_upgrade
from proxy.observability.accesslog import AccessLog
from proxy.observability.logs import RateLimit
from proxy.observability.metrics import Metrics
from proxy.observability.tracing import Tracing
from proxy.request import Headers, Request, Responder
from proxy.upstream.base import BackendResponse, UpstreamError
from proxy.upstream.registry import Pools
from proxy.wire.framing import forwardable_trailers
from routing.model import Backend
from routing.table import CompiledBackend, CompiledRule, Hit, format_key

log = logging.getLogger("tunnelgate.handler")
# Route decisions at debug level (``--log-level debug``): one line per request.
route_log = logging.getLogger("tunnelgate.route")

_JSON = [(b"Content-Type", b"application/json")]
# A gRPC client cannot read an HTML/text 404; it needs trailers-only status 12
# (UNIMPLEMENTED) in a 200, as gRPC clients expect.
_GRPC_NO_ROUTE = [(b"Content-Type", b"application/grpc"), (b"Grpc-Status", b"12"),
                  (b"Grpc-Message", b"no matching route")]
_ERROR_STATUS = {"timeout": 504}
# What a Knative probe's 503 says, by the reason the proxy counts (metrics).
_PROBE_FAILURE_TEXT = {
    "no_backend": b"no backend available for this route",
    "unavailable": b"backend unavailable",
    "dial": b"cannot connect to the backend",
    "tls": b"TLS with the backend failed",
    "timeout": b"the backend did not answer in time",
}
_ERROR_TEXT = {504: b"gateway timeout\n", 503: b"service unavailable\n"}
_NO_BODY_STATUSES = frozenset({204, 304})  # answers that never carry a body
_REQUEST_ID = b"x-request-id"
MAX_REQUEST_ID = 128  # longer client-sent ids are cut (log lines stay bounded)


class Handler:
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
        # Dial-failure warnings: one line per backend per interval (backend URLs come
        # from the config, so this stays bounded).
        self.dial_warnings: dict[str, RateLimit] = {}
        self.count = 0
        """Requests inside the Handler now, upgraded sessions included (drain waits)."""
        self._idle: asyncio.Event | None = None

    def start(self, request: Request, responder: Responder,
              done: Callable[[BaseException | None], None]) -> Exchange:
        """Serve ``request`` (:class:`proxy.request.Serve`): the common exchange runs
        on callbacks, with no task; what really waits (a mirror's body, a protocol
        switch, an HTTP/2 backend) continues in a task. ``done`` runs once, when the
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
        """:meth:`start` for a caller that awaits the end (the in-process bridge)."""
        finished = asyncio.get_running_loop().create_future()
        ex = self.start(request, responder, functools.partial(_resolve, finished))
        try:
            await finished
        except asyncio.CancelledError:
            ex.cancel()
            raise

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
            if ex.knative_probe:
                self._probe_failed(ex, "no_backend")
            else:
                ex.answer_text(500, b"no backend available for this route\n")
            self.close(ex)
            return
        backend = chosen.backend
        if backend.unavailable_status:
            if ex.knative_probe:
                self._probe_failed(ex, "unavailable")
            else:
                ex.answer_text(backend.unavailable_status, b"backend unavailable\n")
            self.close(ex)
            return
        if ex.request.upgrade is None and backend.protocol != "h2c":
            forward = ex.forward = Forward(self, ex, backend)
            forward.start(self.pools.get(backend), route.deadline)
            return
        ex.task = asyncio.get_running_loop().create_task(
            self._forward_waiting(ex, backend, route.deadline))

    def close(self, ex: Exchange, notify: bool = True) -> None:
        """The exchange is over: count it, log it, tell the entrance (once)."""
        if ex.closed:
            return
        ex.closed = True
        self.count -= 1
        self._account(ex)
        if not self.count and self._idle is not None:
            self._idle.set()
        done, ex.done = ex.done, no_callback  # (the entrance's: no cycle left behind)
        if notify:
            done(ex.error)

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
            self._no_route(ex)  # 404: a probe of a host not pushed yet is retried
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
                self._probe_failed(ex, "unavailable")
            else:
                ex.answer_status(route.rule.unavailable_status)
            return None
        ex.matched_prefix = hit.matched_prefix
        ex.response_chains.append(route.response_filters)
        chosen = route.pick(self.rand())  # drawn before filters run (step 3)
        if chosen is not None:
            ex.backend = chosen.backend
            ex.response_chains.append(chosen.response_filters)
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

    def _no_route(self, ex: Exchange) -> None:
        content_type = ex.request.header(b"content-type") or b""
        if content_type.startswith(b"application/grpc"):
            ex.answer(200, _GRPC_NO_ROUTE, b"")
        else:
            ex.answer_text(404, b"no matching route\n")

    async def _forward_waiting(self, ex: Exchange, backend: Backend,
                               deadline: float | None) -> None:
        """Steps 5–6 where the exchange waits: a protocol switch, an HTTP/2 backend."""
        try:
            await self._forward(ex, backend, deadline)
        except asyncio.CancelledError:
            ex.status = 0
            raise
        except Exception as exc:
            ex.error = exc  # the entrance answers it (500, or a cut connection)
        finally:
            ex.task = None
            self.close(ex)

    async def _forward(self, ex: Exchange, backend: Backend, deadline: float | None) -> None:
        """Send upstream and await the answer, then relay it with response filters."""
        request = ex.request
        headers = upstream_request_headers(
            ex.headers, ex.upstream_host(), request.host.encode("latin-1"),
            request.client_ip, request.scheme, request.upgrade,
            keep_te=backend.protocol == "h2c")
        if request.upgrade is not None and self.upgrade_timeout is not None:
            # The handshake is bounded by PROXY_WS_HANDSHAKE_TIMEOUT as well as by the
            # route's own deadline; the session after the 101 by the idle timeout only.
            deadline = min(deadline or self.upgrade_timeout, self.upgrade_timeout)
        target = upstream_target(backend.url, ex.path, ex.query)
        dial_timeout = self.upgrade_dial_timeout if request.upgrade is not None else None
        # Interim answers (103 Early Hints, ...) go to the client as they come, for an
        # entrance that can send them (RFC 9110 §15.2: a proxy forwards them).
        relay = getattr(ex.responder, "interim", None)
        interim = None if relay is None else functools.partial(_relay_interim, relay)
        pool = self.pools.get(backend)
        if ex.span is not None:
            headers = self.client_span(ex, pool.key.host, pool.key.port, target, headers)
        sent = time.monotonic()
        try:
            response = await pool.send(
                request.method, target, headers, ex.body, head_timeout=deadline,
                dial_timeout=dial_timeout, interim=interim)
        except UpstreamError as exc:
            ex.upstream_error = exc.reason
            self.metrics.backend_failed(backend.url)
            self.upstream_failed(ex, exc)
            return
        failed = response.failed
        if failed is not None:
            # The head parsed but the bytes after it (same read) did not: nothing was
            # relayed yet, so the client still gets a proper 502.
            response.close()
            ex.upstream_error = failed.reason
            self.metrics.backend_failed(backend.url)
            self.upstream_failed(ex, failed)
            return
        status = ex.upstream_status = response.status
        ex.upstream_s = time.monotonic() - sent
        self.metrics.backend_answered(backend.url, status, ex.upstream_s)
        if status == 101 and request.upgrade is not None:
            await self._switch(ex, response)
            return
        headers = ex.response_headers(downstream_response_headers(response.headers))
        responder = ex.responder
        ex.status = status
        if (response.length is not None and status not in _NO_BODY_STATUSES
                and request.method != "HEAD"):
            body = response.whole_body()
            if body is not None:
                # All of it arrived with a declared length (the common small answer):
                # one complete response instead of start/write/finish.
                ex.bytes_written = len(body)
                responder.respond(status, headers, body)
                return
        responder.start(status, headers)
        responder.flush()  # the head now: the body may be long in coming
        try:
            while chunk := await response.read():
                if responder.aborted:
                    # The status line went out: it is what the client was told
                    # (the "aborted" status class counts only when nothing was written).
                    response.close()
                    return
                ex.bytes_written += len(chunk)
                await responder.write(chunk)
        except UpstreamError as exc:
            self.metrics.backend_error(ex.host_pattern, exc.reason)
            responder.abort()
            return
        except BaseException:
            # Cancelled mid-body (client gone) or anything unexpected: the backend
            # exchange must not stay half-read (an h2 stream would keep its window, an
            # HTTP/1.1 connection would be stuck).
            response.close()
            raise
        trailers = response.trailers
        responder.finish(forwardable_trailers(trailers) if trailers else None)

    def client_span(self, ex: Exchange, host: str, port: int, target: str,
                     headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """Start the client span of this backend call; the headers that carry it."""
        tracing = self.tracing
        assert tracing is not None and ex.backend is not None
        ex.client_span = tracing.start_client(ex.span, ex.request.method, ex.backend.url,
                                              target, host, port)
        return tracing.inject(ex.client_span, headers)

    def upstream_failed(self, ex: Exchange, exc: UpstreamError) -> None:
        """Count a backend failure and answer it (502, or 504 on a timeout), unless
        the client is gone."""
        self.metrics.backend_error(ex.host_pattern, exc.reason)
        if exc.reason == "canceled" or ex.responder.aborted:
            ex.status = 0
            return
        fields = {"reason": exc.reason, "detail": str(exc), "host": ex.request.host,
                  "backend": ex.backend.url if ex.backend is not None else ""}
        if exc.reason == "dial":
            # A backend that is down fails every request: one line per backend per
            # interval, the others counted in the next line.
            limit = self.dial_warnings.get(fields["backend"])
            if limit is None:
                limit = self.dial_warnings[fields["backend"]] = RateLimit()
            suppressed = limit.allow(time.monotonic())
            if suppressed is not None:
                log.warning("backend dial failed",
                            extra={**fields, "suppressed": suppressed} if suppressed
                            else fields)
        else:
            log.info("backend error", extra=fields)
        if ex.knative_probe:
            self._probe_failed(ex, exc.reason)
            return
        status = exc.status or _ERROR_STATUS.get(exc.reason, 502)
        ex.answer_text(status, _ERROR_TEXT.get(status, b"bad gateway\n"))

    def _probe_failed(self, ex: Exchange, reason: str) -> None:
        """Answer a Knative probe 503 for a failure of ours; the metric keeps ``reason``."""
        self.metrics.probe_failure(ex.host_pattern, reason)
        text = _PROBE_FAILURE_TEXT.get(reason, b"invalid or no answer from the backend")
        ex.answer_text(503, b"knative probe not ready: " + text + b"\n")

    async def _switch(self, ex: Exchange, response: BackendResponse) -> None:
        """A backend accepted a protocol switch: 101 first, then pipe raw bytes."""
        headers = ex.response_headers(
            downstream_response_headers(response.headers, keep_upgrade=True))
        backend_stream = response.detach()
        try:
            client_stream = await ex.responder.upgrade(headers)
        except BaseException:
            # The client side could not switch (gone, or a writer that refuses the
            # hijack): the backend already did, so its connection must not linger.
            backend_stream.close()
            raise
        ex.status = 101
        self.metrics.upgrade_completed(ex.host_pattern, time.monotonic() - ex.started,
                                       ex.bytes_read)
        try:
            await pipe_upgrade(client_stream, backend_stream, self.session_idle_timeout)
        finally:
            self.metrics.websocket_closed()

    def _account(self, ex: Exchange) -> None:
        duration = time.monotonic() - ex.started
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


def _relay_interim(relay: Callable[[int, Headers], None], status: int,
                   headers: Headers) -> None:
    """Pass a backend's 1xx on, minus its hop-by-hop fields."""
    relay(status, downstream_response_headers(headers))


def _resolve(finished: asyncio.Future[None], error: BaseException | None) -> None:
    if finished.done():
        return
    if error is None:
        finished.set_result(None)
    else:
        finished.set_exception(error)
