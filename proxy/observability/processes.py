"""The ``process_*`` series of a supervisor and its workers (``serve --workers N``).

prometheus-client's multiprocess aggregate has no ``process_*`` series (each worker's
memory and CPU would be summed into nonsense), and its process collector sees only the
process serving ``/metrics``. :class:`WorkerProcesses` exposes, in one family per
series: the supervisor's own samples without labels (as a single process shows them)
and each live worker's, read from ``/proc/<pid>``, labelled ``worker="<slot>"``. It
also exposes ``tunnelgate_worker_restarts_total{worker}``: how often each slot's
worker was started again after it exited while the supervisor was not stopping.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, NamedTuple

from prometheus_client import ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, Metric


class WorkerProcess(NamedTuple):
    """One worker slot as the supervisor sees it now."""

    slot: int
    pid: int | None   # None while it is being restarted
    restarts: int


Workers = Callable[[], Iterable[WorkerProcess]]


class WorkerProcesses:
    """A collector (register it on the registry that serves ``/metrics``)."""

    def __init__(self, workers: Workers) -> None:
        self.workers = workers
        self._own = ProcessCollector(registry=None)
        self._by_pid: dict[int, ProcessCollector] = {}

    def collect(self) -> Iterator[Metric]:
        slots = list(self.workers())
        live = {slot.pid for slot in slots if slot.pid is not None}
        for pid in set(self._by_pid) - live:  # exited workers: forget their readers
            del self._by_pid[pid]
        families: dict[str, Metric] = {}
        for family in self._own.collect():
            families[family.name] = merged = Metric(family.name, family.documentation,
                                                    family.type)
            merged.samples = list(family.samples)
        for slot in slots:
            if slot.pid is not None:
                self._add_worker(families, slot)
        yield from families.values()
        restarts = CounterMetricFamily(
            "tunnelgate_worker_restarts",
            "Workers started again after exiting unexpectedly, by worker slot.",
            labels=["worker"])
        for slot in slots:
            restarts.add_metric([str(slot.slot)], slot.restarts)
        yield restarts

    def _add_worker(self, families: dict[str, Metric], slot: WorkerProcess) -> None:
        assert slot.pid is not None
        reader = self._by_pid.get(slot.pid)
        if reader is None:
            pid = slot.pid
            reader = self._by_pid[pid] = ProcessCollector(pid=lambda: pid, registry=None)
        labels = {"worker": str(slot.slot)}
        for family in reader.collect():  # nothing if it exited meanwhile
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation,
                                                        family.type)
            for sample in family.samples:
                merged.add_sample(sample.name, {**sample.labels, **labels}, sample.value)
