"""The labelled metric children the request path increments, and the single-process
metrics they belong to.

:class:`Child` is the one interface the hot path calls (``inc``/``dec``/``set``/
``observe``). In one process the children are plain Python numbers of a
:class:`LocalMetric` (:class:`LocalValue`, :class:`LocalBuckets`), which a scrape turns
into the families prometheus-client would expose: no lock and no validation per
increment. In a ``--workers`` worker they wrap prometheus-client's own mmap-backed
children (:class:`ClientChild`). :func:`child_of` gives either kind for a metric and
its label values. :mod:`proxy.observability.metrics` decides which kind a process uses.
Call them from the event-loop thread.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric)
from prometheus_client.utils import floatToGoString

class Child:
    """One labelled child as the hot path holds it: a local value or histogram of this
    module, or a prometheus-client child behind :class:`ClientChild`. One native
    class hierarchy, so an increment per request is a direct call, not a bound method
    looked up and called through the interpreter."""

    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        raise NotImplementedError

    def dec(self, amount: float = 1.0) -> None:
        raise NotImplementedError

    def set(self, value: float) -> None:
        raise NotImplementedError

    def observe(self, amount: float) -> None:
        raise NotImplementedError


class ClientChild(Child):
    """A prometheus-client metric or child (multiprocess workers: mmap-backed)."""

    __slots__ = ("client",)

    def __init__(self, client: Any) -> None:
        self.client = client

    def inc(self, amount: float = 1.0) -> None:
        self.client.inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self.client.dec(amount)

    def set(self, value: float) -> None:
        self.client.set(value)

    def observe(self, amount: float) -> None:
        self.client.observe(amount)


def child_of(metric: Any, *labels: str) -> Child:
    """``metric``'s child for ``labels`` (the metric itself when it has no labels),
    whichever kind of metric it is."""
    found = metric.labels(*labels) if labels else metric
    if isinstance(found, LocalMetric):
        found = found.labels()
    return found if isinstance(found, Child) else ClientChild(found)


class LocalValue(Child):
    """One counter or gauge child of a :class:`LocalMetric`: a float, no lock (the
    event-loop thread is its only writer; a scrape reads a value at most one update old)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value


class LocalBuckets(Child):
    """One histogram child: per-bucket counts (cumulated at scrape time, as
    prometheus-client does) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        # le: amount <= bound. A dozen float compares, no call and no boxing.
        i = 0
        for bound in self.bounds:
            if amount <= bound:
                break
            i += 1
        self.counts[i] += 1
        self.sum += amount


class LocalMetric:
    """A single-process stand-in for a prometheus-client Counter, Gauge or Histogram
    (only ``labels``/``inc``/``dec``/``observe``), exposed through :meth:`collect` with
    the family name, type, help, labels and buckets the client would expose."""

    def __init__(self, kind: str, name: str, documentation: str,
                 labelnames: tuple[str, ...] = (), buckets: tuple[float, ...] = (),
                 registry: CollectorRegistry | None = None) -> None:
        self.kind = kind
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.buckets = buckets
        self._children: dict[tuple[str, ...], LocalValue | LocalBuckets] = {}
        if not labelnames:
            self._unlabelled = self.labels()
            self.inc = self._unlabelled.inc
            self.dec = self._unlabelled.dec
            self.set = self._unlabelled.set
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> Any:
        """The child for these label values: a :class:`LocalBuckets` for a histogram,
        else a :class:`LocalValue` (typed ``Any`` like prometheus-client's own
        ``labels``, whose callers know which kind of metric they hold)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = (
                LocalBuckets(self.buckets) if self.kind == "histogram" else LocalValue())
        return child

    def collect(self) -> Iterator[Metric]:
        if self.kind == "histogram":
            family: Metric = HistogramMetricFamily(self.name, self.documentation,
                                                   labels=self.labelnames)
            edges = [floatToGoString(b) for b in self.buckets] + ["+Inf"]
            for labels, child in list(self._children.items()):
                assert isinstance(child, LocalBuckets)
                running, cumulative = 0.0, []
                for edge, count in zip(edges, list(child.counts)):
                    running += count
                    cumulative.append((edge, running))
                family.add_metric(labels, cumulative, child.sum)  # type: ignore[attr-defined]
        else:
            kind = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
            family = kind(self.name, self.documentation, labels=self.labelnames)
            for labels, child in list(self._children.items()):
                assert isinstance(child, LocalValue)
                family.add_metric(labels, child.value)  # type: ignore[attr-defined]
        yield family
