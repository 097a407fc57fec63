"""The opt-in access log: one JSON line per request on stdout (the Go data plane's fields).

Field names, their order and the selection rules follow the anchor so existing log
pipelines parse our lines unchanged (``duration_ms`` is a number with up to three
decimals where the anchor writes whole milliseconds, the precision of ``upstream_ms``
beside it)::

    {"time":"2026-05-26T00:00:00.000Z","level":"INFO","msg":"access","method":"GET",
     "host":"app.example.com","path":"/api","query":"a=1","status":200,
     "bytes_written":1234,"duration_ms":42.107,"user_agent":"curl/8.6.0"}

After those fields, additively (pipelines that know only the anchor's fields ignore
them): ``client`` (the address the entrance vouches for, ``X-Forwarded-For``'s last
hop), ``entrance``, ``protocol`` (``HTTP/1.0``, ``HTTP/1.1`` or ``HTTP/2``: what the
client spoke), ``rule`` (the winning match, ``rules[3].matches[0]``, ``""`` when
none), ``backend`` (URL, ``""`` when none was called), ``upstream_ms`` (backend time to
the response head, ``null`` without a backend call), ``request_id`` (the client's
``X-Request-Id``, else one made up and forwarded to the backend), ``attempts`` (tries
sent to backends), ``retry`` (why a retry a policy wanted was not made, when one was
not) and, when a trace span is active, ``trace_id``/``span_id`` as the anchor does. A request an entrance refused
while parsing it (:meth:`AccessLog.rejected`) is a line with ``msg`` ``"rejected"``,
its status, client, entrance and the reason.

Selection: nothing written (status 0) ⇒ skipped; 101 ⇒ never logged (the session is
not a request/response); status ≥ 500 ⇒ always logged; anything else ⇒ logged when
``rand() < sampling_rate``. Method, host, path, query and User-Agent are those the
client sent — filters never rewrite the :class:`Request` in place, so reading them
after the fact still gives the pre-filter values.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any, Callable, Protocol, TextIO

from proxy.observability.settings import AccessLogSettings
from proxy.request import Request
from routing.model import Backend
from routing.compiled import Hit


class Tries(Protocol):
    """What the access log reads of a retried exchange's tries
    (:class:`proxy.exchange.retry.Attempts` is one)."""

    tries: int  # tries made, the first included
    note: str  # why a retry was not made, if one was not ("" otherwise)


class Outcome(Protocol):
    """What the access log reads of a served exchange beyond its request
    (:class:`proxy.exchange.steps.Exchange` is one)."""

    hit: Hit | None  # the winning match, None when no route won
    backend: Backend | None  # the backend called, None when none was
    upstream_s: float  # backend time to the response head; < 0: no call
    upstream_error: str  # why the backend call failed ("" if it did not)
    request_id: str
    span: Any  # the server span when tracing sampled the request, else None

    @property
    def retry(self) -> Tries | None:
        """The tries, when the rule retries (read only here)."""


# ASCII-only output: non-ASCII Host bytes become \u escapes, valid whatever stdout's encoding.
_encode = json.JSONEncoder(separators=(",", ":")).encode


def timestamp(now: float) -> str:
    """RFC 3339 UTC with milliseconds, the way Go's slog JSON handler prints ``time``."""
    seconds = int(now)
    millis = int((now - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def millis(seconds: float) -> float:
    """``seconds`` in milliseconds, to the microsecond (truncated): the precision of
    both ``duration_ms`` and ``upstream_ms``, so a total is never printed smaller than
    its part. The float division of an integer prints as at most three decimals, and
    costs less than ``round(x, 3)``."""
    return int(seconds * 1_000_000) / 1000


class AccessLog:
    """Writes the access-log line for each selected request to ``stream`` (stdout)."""

    def __init__(self, settings: AccessLogSettings, stream: TextIO | None = None, *,
                 rand: Callable[[], float] = random.random,
                 clock: Callable[[], float] = time.time) -> None:
        self.enabled = settings.enabled
        self.rate = min(1.0, max(0.0, settings.sampling_rate))  # clamped, as the anchor
        self.strip_query = settings.strip_query
        self.stream = stream
        self.rand = rand
        self.clock = clock

    def record(self, request: Request, status: int, bytes_written: int,
               duration_s: float, ex: Outcome | None = None) -> None:
        """Log one finished request if the selection rules pick it.

        ``status`` is what the client received, 0 when nothing was written; ``ex`` the
        exchange, for the fields beyond the anchor's.
        """
        if not self.enabled or status == 0 or status == 101:
            return
        if status < 500 and not self.rand() < self.rate:
            return
        user_agent = request.header(b"user-agent")
        fields: dict[str, Any] = {
            "time": timestamp(self.clock()),
            "level": "INFO",
            "msg": "access",
            "method": request.method,
            "host": request.host,
            "path": request.path,
            "query": "" if self.strip_query else request.query,
            "status": status,
            "bytes_written": bytes_written,
            "duration_ms": millis(duration_s),
            "user_agent": user_agent.decode("latin-1") if user_agent else "",
            "client": request.client_ip or "",
            "entrance": request.entrance,
            "protocol": "HTTP/" + request.http_version,
        }
        if ex is not None:
            _exchange_fields(fields, ex)
        self._write(_encode(fields))

    def rejected(self, entrance: str, status: int, reason: str,
                 client_ip: str | None) -> None:
        """Log a request the entrance answered itself because it could not be parsed
        (400, 413, 414, 431) or its head did not arrive in time (408). Sampled like a
        4xx access line."""
        if not self.enabled or not self.rand() < self.rate:
            return
        self._write(_encode({
            "time": timestamp(self.clock()), "level": "INFO", "msg": "rejected",
            "status": status, "client": client_ip or "", "entrance": entrance,
            "reason": reason}))

    def _write(self, line: str) -> None:
        # Resolved per call so a redirected sys.stdout (tests, embedding) is honoured.
        stream = self.stream if self.stream is not None else sys.stdout
        stream.write(line + "\n")
        stream.flush()


def _exchange_fields(fields: dict[str, Any], ex: Outcome) -> None:
    """The additive fields the Handler's exchange knows."""
    hit, backend = ex.hit, ex.backend
    fields["rule"] = hit.name() if hit is not None else ""
    fields["backend"] = backend.url if backend is not None else ""
    fields["upstream_ms"] = millis(ex.upstream_s) if ex.upstream_s >= 0 else None
    fields["request_id"] = ex.request_id
    attempts = ex.retry
    if attempts is None:
        fields["attempts"] = 1 if ex.upstream_s >= 0 or ex.upstream_error else 0
    else:
        fields["attempts"] = attempts.tries
        if attempts.note:
            fields["retry"] = attempts.note
    span = ex.span
    if span is not None:
        context = span.get_span_context()
        fields["trace_id"] = format(context.trace_id, "032x")
        fields["span_id"] = format(context.span_id, "016x")
