"""The answers the proxy makes up itself when it cannot forward.

A failing backend gets **502** (refused, reset, TLS failure, garbage), **504** (no head
in time) or the status its pool chose (503 at a connection cap). A Knative probe gets
**503** with a short reason instead of every status the proxy generates itself:
Knative's prober retries on 503 but takes 500/502/504 as "abandoned", which counts as
ready — a revision whose pod refuses connections would be declared Ready and then fail
real traffic. A status the backend itself sent is never replaced.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from proxy.exchange.steps import Exchange
from proxy.request import Headers
from proxy.observability.logs import RateLimit
from proxy.observability.metrics import Metrics
from proxy.upstream.base import UpstreamError

log = logging.getLogger("tunnelgate.handler")

# A gRPC client cannot read an HTML/text 404; it needs trailers-only status 12
# (UNIMPLEMENTED) in a 200, as gRPC clients expect.
_GRPC_NO_ROUTE: Headers = [(b"Content-Type", b"application/grpc"), (b"Grpc-Status", b"12"),
                  (b"Grpc-Message", b"no matching route")]
_ERROR_STATUS: Final = {"timeout": 504}
# What a Knative probe's 503 says, by the reason the proxy counts (metrics).
_PROBE_FAILURE_TEXT: Final = {
    "no_backend": b"no backend available for this route",
    "unavailable": b"backend unavailable",
    "dial": b"cannot connect to the backend",
    "tls": b"TLS with the backend failed",
    "timeout": b"the backend did not answer in time",
}
_ERROR_TEXT: Final = {504: b"gateway timeout\n", 503: b"service unavailable\n"}


class Failures:
    """Answers (and counts, and logs) what went wrong; one per Handler."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        # Dial-failure warnings: one line per backend per interval (backend URLs come
        # from the config, so this stays bounded).
        self.dial_warnings: dict[str, RateLimit] = {}

    def no_route(self, ex: Exchange) -> None:
        """404 (a probe of a host not pushed yet is retried), or gRPC's UNIMPLEMENTED."""
        content_type = ex.request.header(b"content-type") or b""
        if content_type.startswith(b"application/grpc"):
            ex.answer(200, _GRPC_NO_ROUTE, b"")
        else:
            ex.answer_text(404, b"no matching route\n")

    def no_backend(self, ex: Exchange) -> None:
        if ex.knative_probe:
            self.probe(ex, "no_backend")
        else:
            ex.answer_text(500, b"no backend available for this route\n")

    def unavailable(self, ex: Exchange, status: int) -> None:
        """A backend's ``unavailableStatus``."""
        if ex.knative_probe:
            self.probe(ex, "unavailable")
        else:
            ex.answer_text(status, b"backend unavailable\n")

    def upstream(self, ex: Exchange, exc: UpstreamError) -> None:
        """Count a backend failure and answer it (502, or 504 on a timeout), unless
        the client is gone."""
        self.metrics.backend_error(ex.host_pattern, exc.reason)
        if exc.reason == "canceled" or ex.responder.aborted:
            ex.status = 0
            return
        self._log(ex, exc)
        if ex.knative_probe:
            self.probe(ex, exc.reason)
            return
        status = exc.status or _ERROR_STATUS.get(exc.reason, 502)
        ex.answer_text(status, _ERROR_TEXT.get(status, b"bad gateway\n"))

    def probe(self, ex: Exchange, reason: str) -> None:
        """Answer a Knative probe 503 for a failure of ours; the metric keeps ``reason``."""
        self.metrics.probe_failure(ex.host_pattern, reason)
        text = _PROBE_FAILURE_TEXT.get(reason, b"invalid or no answer from the backend")
        ex.answer_text(503, b"knative probe not ready: " + text + b"\n")

    def _log(self, ex: Exchange, exc: UpstreamError) -> None:
        fields = {"reason": exc.reason, "detail": str(exc), "host": ex.request.host,
                  "backend": ex.backend.url if ex.backend is not None else ""}
        if exc.reason != "dial":
            log.info("backend error", extra=fields)
            return
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
