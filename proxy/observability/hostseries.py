"""The series labelled by host pattern (``cftunnel_proxy_*`` with a ``hostname``), kept
per host pattern that has seen a request.

Every configured hostname that serves traffic has its own duration histogram, byte
counters and requests counters, so what one host costs is multiplied by the size of
the route table (issue 43: memory per route). Two implementations with one interface,
:meth:`HostSeries.finished` (one call per request) and :meth:`HostSeries.error`:

- :class:`LocalHosts` (one process): a host is one small record (the requests by
  status class and the histogram's bucket counts in one list of ints, the sum and the
  two byte counters): about 250 bytes where a child object, a float, a label tuple and
  a dict entry per series took about 1.1 KB. A scrape turns the records into the
  families prometheus-client would expose, in the same order, with the same values.
- :class:`SharedHosts` (a ``--workers`` worker): prometheus-client's mmap-backed
  children, resolved once per host pattern and cached.
"""

from __future__ import annotations

from typing import Any, Callable, Final, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import (
    CounterMetricFamily, HistogramMetricFamily, Metric)
from prometheus_client.utils import floatToGoString

from proxy.observability.children import LocalMetric

# The anchor's buckets, ending at 30 s rather than the client default of 10 s.
DURATION_BUCKETS: Final[tuple[float, ...]] = (
    .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5, 5.0, 10.0, 30.0)

# Backend error reasons, in the anchor's classification order.
BACKEND_ERROR_REASONS = ("canceled", "dial", "tls", "timeout", "ws_dial", "ws_handshake",
                         "other")

# ``status_class`` label values by index: 0 aborted, 1-5 the hundreds, 6 other.
STATUS_CLASSES: Final[tuple[str, ...]] = (
    "aborted", "1xx", "2xx", "3xx", "4xx", "5xx", "other")

_DURATION: Final = ("cftunnel_proxy_request_duration_seconds",
                    "Request duration; WebSockets observe the time to the 101.")
_REQUESTS: Final = ("cftunnel_proxy_requests",
                    "Requests served, by matched host pattern and status class.")
_ERRORS: Final = ("cftunnel_proxy_backend_errors", "Failures talking to a backend, by reason.")
_PROBES: Final = ("tunnelgate_knative_probe_failures",
                  "Knative probes answered 503 by the proxy itself, by the real reason.")
_RESPONSE_BYTES: Final = ("cftunnel_proxy_response_bytes",
                          "Response body bytes sent to clients (post-upgrade bytes excluded).")
_REQUEST_BYTES: Final = ("cftunnel_proxy_request_bytes", "Request body bytes read from clients.")

# One host's counts: the requests by status class (at the STATUS_CLASSES index), then
# the histogram's buckets from _BUCKETS on (the last is +Inf). The list is only as long
# as the highest slot counted so far: a host whose requests all took under 5 ms and
# answered 2xx has 8 slots, not 20 (~100 bytes less per host: 10,000 hosts ~1 MB).
_BUCKETS: Final = len(STATUS_CLASSES)


def class_index(status: int) -> int:
    """Index in :data:`STATUS_CLASSES`: <100 ⇒ aborted, 100–599 ⇒ Nxx, else other."""
    return 0 if status < 100 else status // 100 if status < 600 else 6


class HostSeries:
    """The per-host-pattern series of one process, and the families they belong to
    (``backend_errors`` and ``probe_failures``: labelled metrics, used as such)."""

    backend_errors: Any
    probe_failures: Any

    def finished(self, host: str, status: int, duration_s: float,
                 request_bytes: int, response_bytes: int) -> None:
        """Count a finished request (``status`` 0: nothing was sent)."""
        raise NotImplementedError

    def error(self, host: str, reason: str) -> None:
        """Count a backend failure; ``reason`` is one of :data:`BACKEND_ERROR_REASONS`."""
        raise NotImplementedError


class _Family:
    """One family that :class:`LocalHosts` renders, as a registry collector: registered
    where the family's metric object used to be, so the exposition order is kept."""

    def __init__(self, render: Callable[[], Metric]) -> None:
        self._render = render

    def collect(self) -> Iterator[Metric]:
        yield self._render()


class _Host:
    """What one host pattern's series hold in one process. Counts and bytes are ints:
    exact, and the small ones shared objects, so a host that served a few requests
    costs this object and its list (compiled: the sum and the bytes unboxed).
    ``counts``: see :data:`_BUCKETS`; a slot past its end counts 0."""

    __slots__ = ("counts", "sum", "request_bytes", "response_bytes")

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.sum = 0.0
        self.request_bytes = 0
        self.response_bytes = 0


class LocalHosts(HostSeries):
    """One process: a :class:`_Host` per host pattern (see module doc). No lock: the
    event-loop thread is the only writer."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._hosts: dict[str, _Host] = {}
        # The (host, class) requests series in the order they first counted, which is
        # the order prometheus-client (and the per-series children before) exposes them.
        self._seen_hosts: list[str] = []
        self._seen_classes = bytearray()
        registry.register(_Family(self._durations))
        registry.register(_Family(self._requests))
        self.backend_errors = LocalMetric("counter", *_ERRORS, ("hostname", "reason"),
                                          registry=registry)
        self.probe_failures = LocalMetric("counter", *_PROBES, ("hostname", "reason"),
                                          registry=registry)
        registry.register(_Family(lambda: self._bytes(
            _RESPONSE_BYTES, {host: h.response_bytes for host, h in self._items()})))
        registry.register(_Family(lambda: self._bytes(
            _REQUEST_BYTES, {host: h.request_bytes for host, h in self._items()})))

    def _host(self, host: str) -> _Host:
        series = self._hosts[host] = _Host()
        return series

    def finished(self, host: str, status: int, duration_s: float,
                 request_bytes: int, response_bytes: int) -> None:
        series = self._hosts.get(host)
        if series is None:
            series = self._host(host)
        # le: the first bucket whose bound is >= the duration (most are the first few).
        index = _BUCKETS
        for bound in DURATION_BUCKETS:
            if duration_s <= bound:
                break
            index += 1
        counts = series.counts
        if index >= len(counts):  # the bucket's slot is past every class's slot
            counts.extend([0] * (index + 1 - len(counts)))
        slot = class_index(status)
        count = counts[slot]
        if not count:
            self._seen_hosts.append(host)
            self._seen_classes.append(slot)
        counts[slot] = count + 1
        counts[index] += 1
        series.sum += duration_s
        if request_bytes:
            series.request_bytes += request_bytes
        if response_bytes:
            series.response_bytes += response_bytes

    def error(self, host: str, reason: str) -> None:
        # A failing host has its other series too (zero), as it always had.
        if host not in self._hosts:
            self._host(host)
        self.backend_errors.labels(host, reason).inc()

    def _items(self) -> list[tuple[str, _Host]]:
        return list(self._hosts.items())

    def _durations(self) -> Metric:
        family = HistogramMetricFamily(*_DURATION, labels=("hostname",))
        edges = [floatToGoString(b) for b in DURATION_BUCKETS] + ["+Inf"]
        for host, series in self._items():
            running, cumulative = 0.0, []
            buckets = series.counts[_BUCKETS:]
            for edge, count in zip(edges, buckets + [0] * (len(edges) - len(buckets))):
                running += count
                cumulative.append((edge, running))
            family.add_metric((host,), cumulative, series.sum)
        return family

    def _requests(self) -> Metric:
        family = CounterMetricFamily(*_REQUESTS, labels=("hostname", "status_class"))
        for host, index in list(zip(self._seen_hosts, self._seen_classes)):
            family.add_metric((host, STATUS_CLASSES[index]),
                              float(self._hosts[host].counts[index]))
        return family

    @staticmethod
    def _bytes(described: tuple[str, str], by_host: dict[str, int]) -> Metric:
        family = CounterMetricFamily(*described, labels=("hostname",))
        for host, count in by_host.items():
            family.add_metric((host,), float(count))
        return family


class _ClientRecord:
    """The prometheus-client children of one host pattern, resolved once."""

    __slots__ = ("duration", "request_bytes", "response_bytes", "by_status", "errors")

    def __init__(self, hosts: "SharedHosts", host: str) -> None:
        self.duration = hosts.duration.labels(host)
        self.request_bytes = hosts.request_bytes.labels(host)
        self.response_bytes = hosts.response_bytes.labels(host)
        # status code → the requests_total child; at most ~600 entries per host.
        self.by_status: dict[int, Any] = {}
        self.errors: dict[str, Any] = {}


class SharedHosts(HostSeries):
    """A ``--workers`` worker: prometheus-client's (mmap-backed) metrics and children."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.duration = Histogram(*_DURATION, ["hostname"], buckets=DURATION_BUCKETS,
                                  registry=registry)
        self.requests = Counter(*_REQUESTS, ["hostname", "status_class"], registry=registry)
        self.backend_errors = Counter(*_ERRORS, ["hostname", "reason"], registry=registry)
        self.probe_failures = Counter(*_PROBES, ["hostname", "reason"], registry=registry)
        self.response_bytes = Counter(*_RESPONSE_BYTES, ["hostname"], registry=registry)
        self.request_bytes = Counter(*_REQUEST_BYTES, ["hostname"], registry=registry)
        self._hosts: dict[str, _ClientRecord] = {}

    def _record(self, host: str) -> _ClientRecord:
        record = self._hosts[host] = _ClientRecord(self, host)
        return record

    def finished(self, host: str, status: int, duration_s: float,
                 request_bytes: int, response_bytes: int) -> None:
        record = self._hosts.get(host) or self._record(host)
        count = record.by_status.get(status)
        if count is None:
            count = record.by_status[status] = self.requests.labels(
                host, STATUS_CLASSES[class_index(status)])
        count.inc()
        record.duration.observe(duration_s)
        if request_bytes:
            record.request_bytes.inc(request_bytes)
        if response_bytes:
            record.response_bytes.inc(response_bytes)

    def error(self, host: str, reason: str) -> None:
        record = self._hosts.get(host) or self._record(host)
        count = record.errors.get(reason)
        if count is None:
            count = record.errors[reason] = self.backend_errors.labels(host, reason)
        count.inc()
