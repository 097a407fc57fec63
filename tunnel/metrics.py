"""cloudflared's side of ``/metrics``: its own series, scraped live, and our view of it.

The Go data plane embeds cloudflared, so one scrape of its ``/metrics`` shows the
``cloudflared_*`` series too, and dashboards and alerts are built on that.
:class:`TunnelMetrics` keeps that working with cloudflared in another process: at
every scrape it fetches the metrics endpoint of the cloudflared we supervise (or the
one ``--cloudflared-metrics-url`` names for a sidecar container) with a short timeout
and appends the ``cloudflared_*`` families. A cloudflared that does not answer in time
adds nothing and never fails the scrape. Its Go-runtime and process series are left
out: they would collide with ours.

It also exposes what the supervisor knows, under ``tunnelgate_cloudflared_*``:

=========================================  =======  ====================================
``tunnelgate_cloudflared_state{state}``    gauge    1 for the child's current state
                                                    (``starting``, ``connected``,
                                                    ``reconnecting``, ``draining``,
                                                    ``stopped``), 0 for the others
``tunnelgate_cloudflared_restarts_total``  counter  children started after the first
                                                    (crash restarts, protocol switches)
``tunnelgate_cloudflared_edge_connections``  gauge  edge connections registered, from
                                                    cloudflared's ``/ready``
=========================================  =======  ====================================

``proxy.observability.metrics`` knows none of this: the composition root
(``proxy.control.runtime``) hands :meth:`TunnelMetrics.exposition` to
``Metrics.add_exposition``.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from tunnel.cloudflared import STATES, CloudflaredSupervisor
from tunnel.readiness import ReadyProbe, http_get

SCRAPE_TIMEOUT = 0.5  # seconds; a Prometheus scrape usually allows 10 s in all
_PREFIX = b"cloudflared_"


def cloudflared_families(text: bytes) -> bytes:
    """The ``cloudflared_*`` families of a text exposition: their samples and their
    ``# HELP`` / ``# TYPE`` lines, nothing else (``go_*``, ``process_*``, other
    comments, blank lines)."""
    kept = []
    for line in text.splitlines():
        name = line
        if line.startswith((b"# HELP ", b"# TYPE ")):
            name = line[7:]
        elif line.startswith(b"#"):
            continue
        if name.startswith(_PREFIX):
            kept.append(line + b"\n")
    return b"".join(kept)


class _Collector:
    """The ``tunnelgate_cloudflared_*`` families, read from the supervisor at scrape time."""

    def __init__(self, supervisor: CloudflaredSupervisor | None,
                 probe: ReadyProbe | None) -> None:
        self.supervisor = supervisor
        self.probe = probe

    def collect(self) -> Iterator[Metric]:
        sup = self.supervisor
        if sup is not None:
            state = GaugeMetricFamily("tunnelgate_cloudflared_state",
                                      "State of the supervised cloudflared child "
                                      "(1 for the current one).", labels=["state"])
            for name in STATES:
                state.add_metric([name], 1.0 if sup.state == name else 0.0)
            yield state
            restarts = CounterMetricFamily("tunnelgate_cloudflared_restarts",
                                           "cloudflared children started after the first.")
            restarts.add_metric([], float(sup.restarts))
            yield restarts
        if self.probe is not None:
            edges = GaugeMetricFamily("tunnelgate_cloudflared_edge_connections",
                                      "Edge connections cloudflared has registered.")
            edges.add_metric([], float(self.probe.connections))
            yield edges


class TunnelMetrics:
    """Text to append to ``/metrics`` (module doc).

    ``metrics_url`` returns where cloudflared's metrics are now (a supervised child's
    address changes with a protocol switch), or None for nowhere.
    """

    def __init__(self, *, supervisor: CloudflaredSupervisor | None = None,
                 probe: ReadyProbe | None = None,
                 metrics_url: Callable[[], str | None] | None = None,
                 timeout: float = SCRAPE_TIMEOUT) -> None:
        self.metrics_url = metrics_url
        self.timeout = timeout
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(supervisor, probe))  # type: ignore[arg-type]

    async def exposition(self) -> bytes:
        """Our ``tunnelgate_cloudflared_*`` families, then cloudflared's own ones if
        its endpoint answered 200 within ``timeout``. Never raises for a bad endpoint."""
        ours = generate_latest(self._registry)
        url = self.metrics_url() if self.metrics_url is not None else None
        if url is None:
            return ours
        answer = await http_get(url, self.timeout)
        if answer is None or answer[0] != 200:
            return ours
        return ours + cloudflared_families(answer[1])
