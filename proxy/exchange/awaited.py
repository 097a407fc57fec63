"""The exchanges that really wait, as coroutines: a protocol switch (the handshake,
then the session) and an HTTP/2 backend (its connection is shared by many streams).

Everything else takes :mod:`proxy.exchange.forward`'s callback path. Here the pool's
awaiting form (``send``) is used, and the body is relayed with ``await``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING, Callable, Final

from proxy.exchange.forwarding import (
    downstream_response_headers, upstream_request_headers, upstream_target)
from proxy.exchange.steps import Exchange
from proxy.exchange.websocket import pipe_upgrade
from proxy.request import Headers
from proxy.upstream.base import BackendResponse, UpstreamError
from proxy.wire.framing import forwardable_trailers
from routing.compiled import CompiledBackend

if TYPE_CHECKING:
    from proxy.exchange.handler import Handler

_NO_BODY_STATUSES: Final = frozenset({204, 304})  # answers that never carry a body


async def forward_awaited(handler: "Handler", ex: Exchange, chosen: CompiledBackend,
                          deadline: float | None) -> None:
    """Forward ``ex`` and relay the answer; the exchange is closed at the end,
    whatever happened (an exception is the entrance's to answer) — unless a retry
    follows (:mod:`proxy.exchange.retry`), which goes on with the exchange."""
    try:
        response = await _send(handler, ex, chosen, deadline)
        if response is None:
            pass
        elif response.status == 101 and ex.request.upgrade is not None:
            await _switch(handler, ex, response)
        else:
            await _relay(handler, ex, response)
    except asyncio.CancelledError:
        ex.status = 0
        raise
    except Exception as exc:
        ex.error = exc  # the entrance answers it (500, or a cut connection)
    finally:
        ex.task = None
        if ex.retry is None or ex.retry.timer is None:
            handler.close(ex)


async def _send(handler: "Handler", ex: Exchange, chosen: CompiledBackend,
                deadline: float | None) -> BackendResponse | None:
    """The backend's answer with its head, or None when a failure was answered."""
    request = ex.request
    backend = chosen.backend
    client_host = request.host.encode("latin-1")
    headers = upstream_request_headers(
        ex.headers, ex.upstream_host(client_host), client_host,
        request.client_ip, request.scheme, request.upgrade)
    dial_timeout = None
    if request.upgrade is not None and handler.upgrade_timeout is not None:
        # The handshake is bounded by PROXY_WS_HANDSHAKE_TIMEOUT as well as by the
        # route's own deadline; the session after the 101 by the idle timeout only.
        deadline = min(deadline or handler.upgrade_timeout, handler.upgrade_timeout)
    if request.upgrade is not None:
        dial_timeout = handler.upgrade_dial_timeout
    target = upstream_target(chosen.base_path, chosen.base_query, ex.path, ex.query,
                                 request.empty_query)
    # Interim answers (103 Early Hints, ...) go to the client as they come, for an
    # entrance that can send them (RFC 9110 §15.2: a proxy forwards them).
    responder = ex.responder
    interim = (functools.partial(_relay_interim, responder.interim)
               if responder.relays_interim else None)
    pool = handler.pools.get(backend)
    if ex.span is not None:
        headers = handler.reporting.client_span(ex, pool.key.host, pool.key.port, target,
                                                headers)
    sent = time.monotonic()
    try:
        response = await pool.send(
            request.method, target, headers, ex.body, head_timeout=deadline,
            dial_timeout=dial_timeout, interim=interim)
    except UpstreamError as exc:
        _failed(handler, ex, chosen, exc)
        return None
    failed = response.failed
    if failed is not None:
        # The head parsed but the bytes after it (same read) did not: nothing was
        # relayed yet, so the client still gets a proper 502.
        response.close()
        _failed(handler, ex, chosen, failed)
        return None
    status = ex.upstream_status = response.status
    ex.upstream_s = time.monotonic() - sent
    handler.metrics.backend_answered(backend.url, status, ex.upstream_s)
    handler.outliers.answered(backend.url, status)
    if (ex.retry is not None and status != 101
            and handler.retries.after_status(ex, chosen, status)):
        response.close()  # a retry follows (or a 503 was answered)
        return None
    return response


def _failed(handler: "Handler", ex: Exchange, chosen: CompiledBackend,
            exc: UpstreamError) -> None:
    """A try got no answer: a retry follows, or the failure is answered."""
    url = chosen.backend.url
    ex.upstream_error = exc.reason
    handler.metrics.backend_failed(url)
    if exc.reason != "canceled":
        handler.outliers.failed(url)
    if ex.retry is not None and handler.retries.after_error(ex, chosen, exc):
        return
    handler.failures.upstream(ex, exc)


async def _relay(handler: "Handler", ex: Exchange, response: BackendResponse) -> None:
    """The answer, through the response filters, with ``await`` on the body."""
    status = response.status
    headers = ex.response_headers(downstream_response_headers(response.headers))
    responder = ex.responder
    ex.status = status
    if (response.length is not None and status not in _NO_BODY_STATUSES
            and ex.request.method != "HEAD"):
        body = response.whole_body()
        if body is not None:
            # All of it arrived with a declared length: one complete response.
            ex.bytes_written = len(body)
            responder.respond(status, headers, body)
            return
    responder.start(status, headers)
    responder.flush()  # the head now: the body may be long in coming
    try:
        while chunk := await response.read():
            if responder.aborted:
                # The status line went out: it is what the client was told.
                response.close()
                return
            ex.bytes_written += len(chunk)
            await responder.write(chunk)
    except UpstreamError as exc:
        handler.metrics.backend_error(ex.host_pattern, exc.reason)
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


async def _switch(handler: "Handler", ex: Exchange, response: BackendResponse) -> None:
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
    metrics = handler.metrics
    metrics.upgrade_completed(ex.host_pattern, time.monotonic() - ex.started, ex.bytes_read)
    try:
        await pipe_upgrade(client_stream, backend_stream, handler.session_idle_timeout)
    finally:
        metrics.websocket_closed()


def _relay_interim(relay: Callable[[int, Headers], None], status: int,
                   headers: Headers) -> None:
    """Pass a backend's 1xx on, minus its hop-by-hop fields."""
    relay(status, downstream_response_headers(headers))
