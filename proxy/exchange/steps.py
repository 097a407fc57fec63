"""One request's working state, and the request-phase filter steps that edit it.

Filters run as a chain of small named steps (the Envoy model): each step reads the
:class:`Exchange`, edits it (headers, path, upstream Host), remembers a response-phase
edit, or answers outright with a :class:`Shortcut` (redirect, CORS preflight). The
arithmetic of every step is routing's; these steps only apply it.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final, cast

from proxy.exchange.mirror import Mirrors
from proxy.flow.clock import MONOTONIC
from proxy.flow.push import PushBody
from proxy.request import Body, Done, Headers, Request, Responder
from routing.filterkinds import Chain, CompiledFilter
from routing.filters import cors
from routing.filters.cors import CorsPolicy
from routing.filters.headers import (
    REQUEST as REQUEST_HEADERS, RESPONSE as RESPONSE_HEADERS, HeaderEdit,
    apply_header_modifier,
)
from routing.filters.mirror import KIND as MIRROR
from routing.filters.redirect import KIND as REDIRECT, redirect_location
from routing.filters.rewrite import KIND as REWRITE, rewrite_path
from routing.model import Backend, Mirror, Redirect, Rewrite
from routing.compiled import Hit

if TYPE_CHECKING:
    from proxy.exchange.forward import Forward
    from proxy.exchange.retry import Attempts

_TEXT: Headers = [(b"Content-Type", b"text/plain; charset=utf-8"),
                  (b"X-Content-Type-Options", b"nosniff")]


class Shortcut:
    """A response produced by a filter instead of the backend. (A plain class: a
    compiled frozen dataclass is built through the interpreter, once per redirect.)"""

    __slots__ = ("status", "headers")

    def __init__(self, status: int, headers: Headers) -> None:
        self.status = status
        self.headers = headers


class _Nobody(Done):
    """The ``done`` of an exchange nobody waits for (and of one already closed)."""

    __slots__ = ()

    def exchange_over(self, error: BaseException | None) -> None:
        pass


NOBODY: Final = _Nobody()


class CountingBody:
    """Wraps a request body to count the bytes actually read (request_bytes metric)."""

    __slots__ = ("inner", "length", "count")

    def __init__(self, inner: Body) -> None:
        self.inner = inner
        self.length = inner.length
        self.count = 0

    async def read(self) -> bytes:
        chunk = await self.inner.read()
        self.count += len(chunk)
        return chunk

    @property
    def trailers(self) -> Headers | None:
        """The wrapped body's trailer fields, if it has any (a chunked request's)."""
        return getattr(self.inner, "trailers", None)


class Exchange:
    """Mutable state of one request between lookup and the last response byte."""

    __slots__ = (
        "request", "responder", "path", "query", "headers", "rewrite_host", "body",
        "counter", "matched_prefix", "host_pattern", "status", "bytes_written", "started",
        "rule_filters", "backend_filters", "knative_probe", "hit", "backend", "upstream_s",
        "upstream_status", "upstream_error", "request_id", "span", "client_span",
        "done", "closed", "task", "forward", "error", "retry",
    )

    def __init__(self, request: Request, responder: Responder,
                 done: Done = NOBODY) -> None:
        self.request = request
        self.responder = responder
        self.path = request.path
        self.query = request.query
        self.headers = request.headers
        self.rewrite_host: str | None = None
        # The counter is kept apart from ``body``: a mirror replaces ``body`` with its
        # buffered copy, and those bytes were still read from the client.
        body = request.body
        self.counter: PushBody | CountingBody | None = None
        self.body: Body = body
        if isinstance(body, PushBody):
            # A body the entrance pushes counts itself (and must stay unwrapped to be
            # pushed); any other is counted as it is read.
            if body.length != 0:
                self.counter = body
        elif body.length != 0:
            self.counter = self.body = CountingBody(body)
        self.matched_prefix = ""
        self.host_pattern = ""
        self.status = 0
        self.bytes_written = 0
        self.started = MONOTONIC()
        # The response-phase chains: the rule's, then the chosen backend's (empty
        # tuples, shared, until the lookup set them).
        self.rule_filters: Chain = ()
        self.backend_filters: Chain = ()
        # A Knative probe (routing.decide.Decision.probe): failures the proxy itself
        # generates are then answered 503, so the prober retries.
        self.knative_probe = False
        # What the access log, tracing and debug logging report (set as it happens).
        self.hit: Hit | None = None
        self.backend: Backend | None = None
        self.upstream_s = -1.0  # backend time to the response head; < 0: no call
        self.upstream_status = 0
        self.upstream_error = ""  # UpstreamError.reason of a failed call
        self.request_id = ""  # only when something reports it (Reporting.observing)
        self.span: Any = None  # the server span, when tracing sampled this request
        self.client_span: Any = None
        # Running it (proxy.exchange.handler): ``done`` tells the entrance it is over,
        # ``closed`` once it was counted; a task for the parts that wait, or the
        # callback-driven forward of the common path.
        self.done = done
        self.closed = False
        self.task: asyncio.Task[None] | None = None
        self.forward: Forward | None = None
        self.error: BaseException | None = None  # what broke a waiting part off
        self.retry: Attempts | None = None  # tries so far, when the rule retries

    def cancel(self) -> None:
        """The client is gone: stop (see :class:`proxy.request.Running`)."""
        if self.task is not None:
            self.task.cancel()
        elif self.forward is not None:
            self.forward.cancel()
        elif self.retry is not None:  # waiting for the next try
            self.retry.cancel(self)

    @property
    def bytes_read(self) -> int:
        """Request body bytes read from the client so far."""
        counter = self.counter
        return 0 if counter is None else counter.count

    def upstream_host(self, client_host: bytes) -> bytes:
        """Host sent upstream: the client's (``client_host``, its Host encoded), unless
        a URLRewrite set a hostname."""
        rewrite = self.rewrite_host
        return client_host if rewrite is None else rewrite.encode("latin-1")

    def response_headers(self, headers: Headers) -> Headers:
        """Run the response-phase chains (rule level, then the chosen backend's), each
        in list order: header modifiers and CORS response headers."""
        return self._run_chain(self.backend_filters,
                               self._run_chain(self.rule_filters, headers))

    def _run_chain(self, chain: Chain, headers: Headers) -> Headers:
        for c in chain:
            headers = STEPS[c.type].response(self, c, headers)
        return headers

    def answer(self, status: int, headers: Headers, body: bytes) -> None:
        """Answer without the backend; response filters do not apply."""
        self.status = status
        self.bytes_written = len(body)
        self.responder.respond(status, headers, body)

    def answer_text(self, status: int, text: bytes) -> None:
        self.answer(status, _TEXT, text)

    def answer_status(self, status: int) -> None:
        """Answer ``status`` with its reason phrase as the body (rule unavailableStatus)."""
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "status"
        self.answer_text(status, f"{phrase}\n".encode())


# ------------------------------------------------------------------ the filter steps


class FilterStep:
    """What one filter type does to an exchange (the runtime half of the filter
    registry, :mod:`routing.filterkinds`): at request time it edits the exchange or
    answers with a :class:`Shortcut`; at response time it edits the response headers.
    Each step reads the compiled form its type's registry entry made. The step of a
    type that ``waits`` (:attr:`routing.filters.kind.FilterKind.waits`: it reads the
    request body first) runs as :meth:`wait` instead."""

    def request(self, ex: Exchange, c: CompiledFilter) -> Shortcut | None:
        return None

    async def wait(self, ex: Exchange, c: CompiledFilter, mirrors: Mirrors) -> None:
        return None

    def response(self, ex: Exchange, c: CompiledFilter, headers: Headers) -> Headers:
        return headers


class _RequestHeaders(FilterStep):
    def request(self, ex: Exchange, c: CompiledFilter) -> Shortcut | None:
        ex.headers = apply_header_modifier(ex.headers, cast(HeaderEdit, c.compiled))
        return None


class _ResponseHeaders(FilterStep):
    def response(self, ex: Exchange, c: CompiledFilter, headers: Headers) -> Headers:
        return apply_header_modifier(headers, cast(HeaderEdit, c.compiled))


class _Redirect(FilterStep):
    def request(self, ex: Exchange, c: CompiledFilter) -> Shortcut | None:
        request = ex.request
        redirect = cast(Redirect, c.compiled)
        location = redirect_location(
            redirect, request.scheme, request.host, ex.path, ex.query, ex.matched_prefix)
        return Shortcut(redirect.status_code, [(b"Location", location.encode("latin-1"))])


class _Rewrite(FilterStep):
    def request(self, ex: Exchange, c: CompiledFilter) -> Shortcut | None:
        rewrite = cast(Rewrite, c.compiled)
        if rewrite.path is not None:
            ex.path = rewrite_path(ex.path, ex.matched_prefix, rewrite.path)
        if rewrite.hostname:
            ex.rewrite_host = rewrite.hostname
        return None


class _Mirror(FilterStep):
    """Sends a copy of the request (its body read first: the step waits)."""

    async def wait(self, ex: Exchange, c: CompiledFilter, mirrors: Mirrors) -> None:
        await mirrors.send(ex, cast(Mirror, c.compiled))


class _Cors(FilterStep):
    """GEP-1767: a preflight on a CORS-filtered path is answered at request time, never
    forwarded; actual requests get their CORS headers at response time. Both read
    the policy compiled with the table."""

    def request(self, ex: Exchange, c: CompiledFilter) -> Shortcut | None:
        request = ex.request
        if cors.is_preflight(request.method, request.headers):
            return Shortcut(cors.PREFLIGHT_STATUS, cors.preflight_headers(
                cast(CorsPolicy, c.compiled), request.headers))
        return None

    def response(self, ex: Exchange, c: CompiledFilter, headers: Headers) -> Headers:
        return cors.with_response_headers(headers, cors.response_headers(
            cast(CorsPolicy, c.compiled), ex.request.headers, headers))


# One step per filter type of routing.filterkinds.KINDS, keyed by its module's kind
# (tests/test_routing_filters.py checks that both registries name the same types).
STEPS: Final[dict[str, FilterStep]] = {
    REQUEST_HEADERS.type: _RequestHeaders(),
    RESPONSE_HEADERS.type: _ResponseHeaders(),
    REDIRECT.type: _Redirect(),
    REWRITE.type: _Rewrite(),
    MIRROR.type: _Mirror(),
    cors.KIND.type: _Cors(),
}


def waits(chain: Chain) -> bool:
    """Whether ``chain`` has a step that waits (then :func:`run_waiting_filters`)."""
    for c in chain:
        if c.waits:
            return True
    return False


def run_request_filters(ex: Exchange, chain: Chain) -> Shortcut | None:
    """Run a request-phase ``chain`` with no waiting step in list order; stop at the
    first that answers."""
    for c in chain:
        shortcut = STEPS[c.type].request(ex, c)
        if shortcut is not None:
            return shortcut
    return None


async def run_waiting_filters(ex: Exchange, chain: Chain, mirrors: Mirrors) -> Shortcut | None:
    """:func:`run_request_filters` for a chain with a step that waits (a mirror: its
    copy is taken at its place in the chain, earlier edits apply, later ones do not)."""
    for c in chain:
        step = STEPS[c.type]
        if c.waits:
            await step.wait(ex, c, mirrors)
            continue
        shortcut = step.request(ex, c)
        if shortcut is not None:
            return shortcut
    return None
