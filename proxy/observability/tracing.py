"""OpenTelemetry tracing: a server span per request, a client span per backend call.

Turned on by ``PROXY_TRACING_ENABLED`` like the Go data plane; spans go
to an OTLP/gRPC collector (``PROXY_TRACING_ENDPOINT``, else the exporter's own
``OTEL_EXPORTER_OTLP_*`` variables) through a batch processor, so exporting happens on
the processor's thread, never on the request path.

Context travels as W3C Trace Context (``traceparent`` / ``tracestate``):

- an incoming ``traceparent`` becomes the parent of the server span; sampling is
  parent-based (a sampled parent is sampled, an unsampled one is not) and, for a
  request without a (valid) one, the configured ratio (``PROXY_TRACING_SAMPLE_RATE``).
  That ratio is drawn here, before any span exists, so that an unsampled request
  never enters the SDK; the SDK's own sampler is parent-based with an always-on root;
- the backend receives the client span's context in place of the client's
  ``traceparent`` (its ``tracestate`` carried along);
- a request that is not sampled costs one header scan and no span at all: its
  ``traceparent``/``tracestate`` reach the backend untouched, as ordinary headers.

Attribute names follow the OpenTelemetry HTTP semantic conventions (``http.request.method``,
``url.path``, ``http.route``, ``http.response.status_code``, ``server.address``, …);
what has no convention carries the ``tunnelgate.`` prefix (entrance, rule, backend).

The SDK is imported only when tracing is enabled. With ``--workers N`` every worker
process builds its own :class:`Tracing` and exports its own spans.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any, Callable, Final

from proxy.observability.settings import TracingSettings
from proxy.request import Headers, Request

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("tunnelgate.tracing")

SERVICE_NAME: Final = "tunnelgate"
_TRACEPARENT: Final = b"traceparent"
_TRACESTATE: Final = b"tracestate"


def _trace_headers(headers: Headers) -> tuple[bytes | None, bytes | None]:
    """The request's (traceparent, tracestate) values, first of each."""
    parent = state = None
    for name, value in headers:
        if len(name) == 11 and parent is None and name.lower() == _TRACEPARENT:
            parent = value
        elif len(name) == 10 and state is None and name.lower() == _TRACESTATE:
            state = value
    return parent, state


def _unsampled_parent(traceparent: bytes) -> bool:
    """True for a well-formed version-00 ``traceparent`` whose sampled flag is clear:
    a parent-based sampler drops those, so no span needs to be started to know it."""
    if len(traceparent) != 55 or traceparent[:3] != b"00-":
        return False
    try:
        return not int(traceparent[53:55], 16) & 1
    except ValueError:
        return False


class Tracing:
    """The tracer of one process. ``exporter`` replaces the OTLP exporter (tests)."""

    def __init__(self, settings: TracingSettings,
                 exporter: "SpanExporter | None" = None, *,
                 rand: Callable[[], float] = random.random) -> None:
        from opentelemetry.propagators.textmap import DefaultGetter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
        from opentelemetry.trace import (
            SpanKind, Status, StatusCode, get_current_span, set_span_in_context)
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator)

        self.rate = min(1.0, max(0.0, settings.sample_rate))
        self.rand = rand
        self.provider = TracerProvider(
            sampler=ParentBased(ALWAYS_ON),  # roots: the ratio is drawn in start_server
            resource=Resource.create({"service.name": SERVICE_NAME}))
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter or _otlp_exporter(settings.endpoint)))
        self.tracer = self.provider.get_tracer("tunnelgate")
        self._propagator = TraceContextTextMapPropagator()
        self._getter = DefaultGetter()
        self._server, self._client = SpanKind.SERVER, SpanKind.CLIENT
        self._error = Status(StatusCode.ERROR)
        self._in_context = set_span_in_context
        self._span_of = get_current_span

    # -- server span

    def start_server(self, request: Request) -> Any:
        """The recording server span of ``request``, or None when it is not sampled."""
        traceparent, tracestate = _trace_headers(request.headers)
        parent = None
        if traceparent is not None:
            if _unsampled_parent(traceparent):
                return None
            parent = self._extract(traceparent, tracestate)
        if parent is None and not (self.rate >= 1.0 or self.rand() < self.rate):
            return None  # a new trace, not drawn
        attributes: dict[str, Any] = {
            "http.request.method": request.method,
            "url.path": request.path,
            "url.scheme": request.scheme,
            "server.address": _host_only(request.host),
            "network.protocol.version": request.http_version,
            "tunnelgate.entrance": request.entrance,
        }
        if request.query:
            attributes["url.query"] = request.query
        if request.client_ip is not None:
            attributes["client.address"] = request.client_ip
        agent = request.header(b"user-agent")
        if agent is not None:
            attributes["user_agent.original"] = agent.decode("latin-1")
        span = self.tracer.start_span(request.method, context=parent, kind=self._server,
                                      attributes=attributes)
        return span if span.is_recording() else None

    def _extract(self, traceparent: bytes, tracestate: bytes | None) -> Any:
        """The remote parent context, or None if ``traceparent`` is not valid."""
        carrier = {"traceparent": traceparent.decode("latin-1")}
        if tracestate is not None:
            carrier["tracestate"] = tracestate.decode("latin-1")
        context = self._propagator.extract(carrier, getter=self._getter)
        return context if self._span_of(context).get_span_context().is_valid else None

    def routed(self, span: Any, route: str, rule: str, host_pattern: str) -> None:
        """The request matched ``rule`` (``rules[i].matches[j]``); ``route`` is the
        matched path pattern (``http.route``: low cardinality, from the config)."""
        span.update_name(f"{span.name} {route}" if route else span.name)
        if route:
            span.set_attribute("http.route", route)
        span.set_attribute("tunnelgate.rule", rule)
        span.set_attribute("tunnelgate.host_pattern", host_pattern)

    def end_server(self, span: Any, status: int, backend: str | None) -> None:
        """End the server span with the status the client got (0 = nothing sent)."""
        if backend is not None:
            span.set_attribute("tunnelgate.backend", backend)
        if status:
            span.set_attribute("http.response.status_code", status)
        if status >= 500 or not status:
            # Server spans: only 5xx (or an aborted exchange) is an error.
            span.set_attribute("error.type", str(status) if status else "aborted")
            span.set_status(self._error)
        span.end()

    # -- client span

    def start_client(self, server: Any, method: str, backend_url: str,
                     target: str, host: str, port: int) -> Any:
        """A client span for one call to the backend, child of ``server``."""
        return self.tracer.start_span(
            method, context=self._in_context(server), kind=self._client,
            attributes={"http.request.method": method, "server.address": host,
                        "server.port": port,
                        "url.full": backend_url.rstrip("/") + target,
                        "tunnelgate.backend": backend_url})

    def inject(self, client: Any, headers: Headers) -> Headers:
        """``headers`` with ``traceparent``/``tracestate`` naming ``client`` instead of
        whatever the client sent."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._in_context(client))
        out: Headers = [(n, v) for n, v in headers
               if n.lower() not in (_TRACEPARENT, _TRACESTATE)]
        out.extend((name.encode("latin-1"), value.encode("latin-1"))
                   for name, value in carrier.items())
        return out

    def end_client(self, span: Any, status: int, error: str | None = None) -> None:
        """End a client span: the backend's status, or the failure reason."""
        if status:
            span.set_attribute("http.response.status_code", status)
        if error is not None or status >= 400:
            span.set_attribute("error.type", error or str(status))
            span.set_status(self._error)
        span.end()

    # -- lifecycle

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Export every finished span now (tests, drain)."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Flush and stop the batch processor (process exit)."""
        self.provider.shutdown()


def _host_only(host: str) -> str:
    """The Host without its port (``server.address``), IPv6 brackets kept."""
    if host.startswith("["):
        end = host.find("]")
        return host[:end + 1] if end != -1 else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _otlp_exporter(endpoint: str) -> "SpanExporter":
    """The OTLP/gRPC exporter. ``endpoint``: ``host:port`` or ``http://host:port``
    (plaintext, the usual in-cluster collector), ``https://host:port`` (TLS); empty =
    the exporter's ``OTEL_EXPORTER_OTLP_*`` variables."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    if not endpoint:
        return OTLPSpanExporter()
    if endpoint.startswith("https://"):
        return OTLPSpanExporter(endpoint=endpoint, insecure=False)
    return OTLPSpanExporter(endpoint=endpoint.removeprefix("http://"), insecure=True)


def from_settings(settings: TracingSettings) -> Tracing | None:
    """A :class:`Tracing` when tracing is enabled, else None (nothing imported)."""
    if not settings.enabled:
        return None
    log.info("tracing enabled", extra={"endpoint": settings.endpoint or "(OTEL_* env)",
                                       "sample_rate": settings.sample_rate})
    return Tracing(settings)
