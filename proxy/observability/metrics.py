"""Prometheus metrics with the anchor's names, types, labels and buckets (the Go data plane's).

Dashboards and HPAs written for the Go data plane keep working, so every name below is
part of the wire contract. The ``hostname`` label is always the *matched configuration
pattern* (exact host, ``*.example.com`` or ``""``), never the raw Host header: a client
must not be able to mint label values (cardinality rule).

Hot path: the Handler calls :meth:`Metrics.request_started` and one of
:meth:`Metrics.request_finished` / :meth:`Metrics.upgrade_completed` per request. The
series labelled by host pattern are :attr:`Metrics.hosts`
(:mod:`proxy.observability.hostseries`): one call per finished request. In one process
they are one list of plain numbers per host pattern, and the other labelled children
plain Python numbers (:class:`~proxy.observability.children.LocalMetric`); collectors
turn both into the same families at scrape time: no lock and no validation per
increment, the exposition unchanged. Call these methods from the event-loop thread.

Multiprocess seam (``--workers``): prometheus-client switches its
value storage to mmap files when ``PROMETHEUS_MULTIPROC_DIR`` is set *before* it is
imported. A worker then builds ``Metrics()`` as usual and the process serving
``/metrics`` builds ``Metrics(multiprocess_dir=...)``, which renders the aggregate of
all workers' files instead of its own registry. Gauges are declared ``livesum`` so the
aggregate is the sum over live workers; :func:`worker_exited` tells the directory which
ones are gone. Worker processes therefore keep prometheus-client's own (mmap-backed)
metric objects; only a single process uses the local ones.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, Counter, Gauge, Histogram,
    ProcessCollector, disable_created_metrics, generate_latest, values)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from proxy.observability.children import Child, LocalMetric, child_of
from proxy.observability.configmetrics import ConfigMetrics
from proxy.observability.hostseries import (
    BACKEND_ERROR_REASONS, DURATION_BUCKETS, STATUS_CLASSES, HostSeries, LocalHosts,
    SharedHosts, class_index)
from proxy.observability.resilience import ResilienceMetrics

# The Go client exposes no ``*_created`` series; leave them out so the exposition
# matches what existing dashboards were built against (process-wide switch).
disable_created_metrics()

# Why a Knative probe got the proxy's own 503 (see Handler): the backend error reasons
# above, plus a route without a selectable backend and an ``unavailableStatus``.
PROBE_FAILURE_REASONS = ("no_backend", "unavailable", *BACKEND_ERROR_REASONS)


def status_class(status: int) -> str:
    """The ``status_class`` label: 0 or <100 ⇒ ``aborted``, 100–599 ⇒ ``Nxx``, else ``other``."""
    return STATUS_CLASSES[class_index(status)]


def worker_exited(multiprocess_dir: str, pid: int) -> None:
    """Worker ``pid`` is gone: drop its live gauges (in flight, WebSocket sessions) from
    the aggregate. Its counters and histograms stay, so totals never go backwards."""
    mark_process_dead(pid, multiprocess_dir)


class _BackendSeries:
    """The labelled children of one backend URL (``tunnelgate_backend_*``)."""

    __slots__ = ("latency", "by_class", "failed")

    def __init__(self, metrics: "Metrics", backend: str) -> None:
        self.latency = child_of(metrics.backend_latency, backend)
        # The requests child per status class, by its STATUS_CLASSES index (made at its
        # first answer: a list read, where a dict keyed by the label cost ~190
        # instructions an answer with the label's lookup; callgrind, 2026-12-07), and the
        # one of calls that got no answer.
        self.by_class: list[Child | None] = [None] * len(STATUS_CLASSES)
        self.failed: Child | None = None


def _gauge(shared: bool, name: str, documentation: str,
           registry: CollectorRegistry) -> Gauge | LocalMetric:
    if shared:
        return Gauge(name, documentation, registry=registry, multiprocess_mode="livesum")
    return LocalMetric("gauge", name, documentation, registry=registry)


def _local_counter(name: str, documentation: str, labelnames: list[str], *,
                   registry: CollectorRegistry) -> LocalMetric:
    return LocalMetric("counter", name, documentation, tuple(labelnames), registry=registry)


def _local_histogram(name: str, documentation: str, labelnames: list[str], *,
                     buckets: tuple[float, ...], registry: CollectorRegistry) -> LocalMetric:
    return LocalMetric("histogram", name, documentation, tuple(labelnames), buckets,
                        registry=registry)


def _backend_and_entrance_series(shared: bool,
                                 reg: CollectorRegistry) -> tuple[Any, Any, Any, Any]:
    """The per-backend requests and latency, and the entrance's refusals (of requests,
    and of connections past the limit)."""
    counter = Counter if shared else _local_counter
    backend_requests = counter(
        "tunnelgate_backend_requests",
        "Calls to a backend, by backend URL and the class of its answer "
        "(error: no answer).", ["backend", "status_class"], registry=reg)
    backend_latency = (Histogram if shared else _local_histogram)(
        "tunnelgate_backend_latency_seconds",
        "Time from sending a request to a backend to its response head.",
        ["backend"], buckets=DURATION_BUCKETS, registry=reg)
    rejected_requests = counter(
        "tunnelgate_http_rejected_requests",
        "Requests an entrance refused while parsing them, by entrance and status.",
        ["entrance", "status"], registry=reg)
    refused_connections = counter(
        "tunnelgate_connections_refused",
        "Client connections an entrance refused at its --max-connections limit "
        "(answered 503 before reading, or reset in a flood), by entrance.",
        ["entrance"], registry=reg)
    return backend_requests, backend_latency, rejected_requests, refused_connections


def _exposed(reg: CollectorRegistry, multiprocess_dir: str | None) -> CollectorRegistry:
    """What a scrape renders: ``reg`` with the process collector in one process, the
    aggregate of the multiprocess directory in a worker."""
    if multiprocess_dir is None:
        ProcessCollector(registry=reg)
        return reg
    exposed = CollectorRegistry()
    MultiProcessCollector(exposed, path=multiprocess_dir)
    return exposed


class Metrics:
    """The seven anchor metrics on a private registry, plus the process collector, the
    per-backend and entrance-refusal series, and the config series (``config``:
    :class:`~proxy.observability.configmetrics.ConfigMetrics`).

    ``registry`` defaults to a fresh :class:`CollectorRegistry` (never the global one,
    so several instances can coexist in one test process). ``multiprocess_dir`` makes
    :meth:`render` expose the aggregate of a prometheus-client multiprocess directory.
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 multiprocess_dir: str | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        # A worker (prometheus-client imported in multiprocess mode) must write the
        # shared mmap files; one process keeps plain local values (module doc).
        shared = values.ValueClass is not values.MutexValue
        self.in_flight = _gauge(
            shared, "cftunnel_proxy_requests_in_flight",
            "Requests currently being served (upgraded WebSockets excluded).", reg)
        self.websocket_sessions = _gauge(
            shared, "cftunnel_proxy_websocket_active_sessions",
            "WebSocket sessions currently piped after a successful upgrade.", reg)
        # The series by host pattern (hostname label), in their exposition order.
        self.hosts: HostSeries = SharedHosts(reg) if shared else LocalHosts(reg)
        # Beyond the anchor's series (whose label sets stay as they are): per backend,
        # and the requests the entrance refused before any routing.
        (self.backend_requests, self.backend_latency, self.rejected_requests,
         self.refused_connections) = _backend_and_entrance_series(shared, reg)
        self._exposed = _exposed(reg, multiprocess_dir)
        self.config = ConfigMetrics(self._exposed)
        self._extra: list[Callable[[], Awaitable[bytes]]] = []
        self._backends: dict[str, _BackendSeries] = {}
        self._in_flight = child_of(self.in_flight)
        self.resilience = ResilienceMetrics(self)

    def request_started(self) -> None:
        """A request entered the Handler: in-flight + 1."""
        self._in_flight.inc()

    def request_finished(self, host_pattern: str, status: int, duration_s: float,
                         request_bytes: int, response_bytes: int) -> None:
        """A request that :meth:`request_started` counted has ended (not upgraded).

        ``status`` is what was sent to the client, 0 when nothing was (``aborted``).
        """
        self._in_flight.dec()
        self.hosts.finished(host_pattern, status, duration_s, request_bytes, response_bytes)

    def upgrade_completed(self, host_pattern: str, duration_s: float,
                          request_bytes: int = 0) -> None:
        """The 101 went out: count a ``1xx``, observe time-to-101, and move the
        request from the in-flight gauge to the WebSocket session gauge.

        Call :meth:`websocket_closed` when the piped session ends; do not call
        :meth:`request_finished` for this request.
        """
        self.request_finished(host_pattern, 101, duration_s, request_bytes, 0)
        self.websocket_opened()

    def websocket_opened(self) -> None:
        """A WebSocket session started piping (already done by :meth:`upgrade_completed`)."""
        self.websocket_sessions.inc()

    def websocket_closed(self) -> None:
        """A piped WebSocket session ended."""
        self.websocket_sessions.dec()

    def backend_error(self, host_pattern: str, reason: str) -> None:
        """Count a backend failure; ``reason`` is one of :data:`BACKEND_ERROR_REASONS`."""
        if reason not in BACKEND_ERROR_REASONS:
            reason = "other"  # never let a caller mint label values
        self.hosts.error(host_pattern, reason)

    def probe_failure(self, host_pattern: str, reason: str) -> None:
        """Count a Knative probe answered 503 by the proxy itself (the status hides the
        reason from the prober; the metric keeps it). ``reason`` is one of
        :data:`PROBE_FAILURE_REASONS`; probes are few, so no per-host cache."""
        if reason not in PROBE_FAILURE_REASONS:
            reason = "other"  # never let a caller mint label values
        self.hosts.probe_failures.labels(host_pattern, reason).inc()

    def backend_answered(self, backend: str, status: int, latency_s: float) -> None:
        """A backend's response head arrived ``latency_s`` after the request was sent."""
        series = self._backends.get(backend)
        if series is None:
            series = self._backends[backend] = _BackendSeries(self, backend)
        index = class_index(status)
        count = series.by_class[index]
        if count is None:
            count = series.by_class[index] = child_of(self.backend_requests, backend,
                                                      STATUS_CLASSES[index])
        count.inc()
        series.latency.observe(latency_s)

    def backend_failed(self, backend: str) -> None:
        """A call to ``backend`` got no answer (dial, TLS, timeout, broken head)."""
        series = self._backends.get(backend)
        if series is None:
            series = self._backends[backend] = _BackendSeries(self, backend)
        count = series.failed
        if count is None:
            count = series.failed = child_of(self.backend_requests, backend, "error")
        count.inc()

    def request_rejected(self, entrance: str, status: int) -> None:
        """An entrance answered a malformed or too slow request itself (no Handler)."""
        self.rejected_requests.labels(entrance, str(status)).inc()

    def describe_build(self, version: str, build: str) -> None:
        """Expose ``tunnelgate_build_info{version, build} 1``: which release and which
        build (``compiled`` or ``plain``) serve. Call once, from the process that
        serves ``/metrics``."""
        info = LocalMetric("gauge", "tunnelgate_build_info",
                            "Always 1; the labels say which version and build run.",
                            ("version", "build"), registry=self._exposed)
        info.labels(version, build).set(1.0)

    def connection_refused(self, entrance: str) -> None:
        """An entrance refused a connection at its connection limit."""
        self.refused_connections.labels(entrance).inc()

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition (format 0.0.4, what the Go client serves)
        and its Content-Type."""
        return generate_latest(self._exposed), CONTENT_TYPE_PLAIN_0_0_4

    # -- further expositions (the composition root adds them; see add_exposition)

    def add_collector(self, collector: Any) -> None:
        """Have every scrape also collect ``collector`` (a prometheus-client collector:
        with ``--workers``, the supervisor's and the workers' ``process_*`` series)."""
        self._exposed.register(collector)

    def add_exposition(self, source: Callable[[], Awaitable[bytes]]) -> None:
        """Append what ``await source()`` returns (text exposition lines) to every
        scrape by :meth:`render_all`. The composition root (:mod:`proxy.control.runtime`)
        wires other processes' series in here (cloudflared's); this module does not know
        them. A source bounds its own time and returns ``b""`` rather than raise: a
        scrape must not fail for it."""
        self._extra.append(source)

    async def render_all(self) -> tuple[bytes, str]:
        """:meth:`render` followed by every added exposition, fetched concurrently."""
        exposition, content_type = self.render()
        if not self._extra:
            return exposition, content_type
        extra = await asyncio.gather(*(source() for source in self._extra))
        return exposition + b"".join(extra), content_type
