"""What the Handler reports of an exchange: request ids, spans, the route decision at
debug level, and at the end the metrics and the access-log line.

What is on is decided once, when the Handler is made (``observing``: a request pays
for request ids, route-decision logging or tracing only when one of them is on, at one
check per request); the metrics and the access log see every exchange.
"""

from __future__ import annotations

import logging
import os
from typing import Final

from proxy.exchange.steps import Exchange
from proxy.flow.clock import MONOTONIC
from proxy.observability.accesslog import AccessLog
from proxy.observability.metrics import Metrics
from proxy.observability.tracing import Tracing
from proxy.request import Headers
from routing.compiled import CompiledBackend, Hit
from routing.tabletext import format_key

# Route decisions at debug level (``--log-level debug``): one line per request.
route_log = logging.getLogger("tunnelgate.route")

_REQUEST_ID: Final = b"x-request-id"
MAX_REQUEST_ID: Final = 128  # longer client-sent ids are cut (log lines stay bounded)


class Reporting:
    """The Handler's reports; one per Handler."""

    def __init__(self, metrics: Metrics, access_log: AccessLog,
                 tracing: Tracing | None) -> None:
        self.metrics = metrics
        self.access_log = access_log
        self.tracing = tracing
        self.debug_routes = route_log.isEnabledFor(logging.DEBUG)
        self.request_ids = access_log.enabled or self.debug_routes
        self.observing = tracing is not None or self.request_ids

    def observe(self, ex: Exchange) -> None:
        """Request id (kept from ``X-Request-Id`` or made up, and forwarded) and the
        server span, for requests that something reports on (``observing``)."""
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

    def log_route(self, ex: Exchange, hit: Hit | None,
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
        """Start the client span of this backend call (tracing is on); the headers
        that carry it."""
        tracing = self.tracing
        assert tracing is not None and ex.backend is not None
        ex.client_span = tracing.start_client(ex.span, ex.request.method, ex.backend.url,
                                              target, host, port)
        return tracing.inject(ex.client_span, headers)

    def account(self, ex: Exchange) -> None:
        """The exchange is over: its spans end, its metrics and log line are written
        (an upgrade's were at takeover)."""
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
