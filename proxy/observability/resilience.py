"""The series of retries, retry budgets, outlier ejection and load shedding.

Events, not per-request work: a retry, a budget refusal, an ejection, a shed request.
They hang on the process's :class:`~proxy.observability.metrics.Metrics` registry and
follow its multiprocess rules (gauges are summed over live workers).

- ``tunnelgate_retry_attempts_total{hostname,rule}``: tries of requests whose rule
  has a retry policy (first tries included);
- ``tunnelgate_retries_total{hostname,rule,reason}``: retries sent, by what failed
  (``status``: a listed code; ``connection``: refused or reset before any byte;
  ``timeout``: no head within the backend timeout; ``error``: another failure);
- ``tunnelgate_retries_skipped_total{hostname,rule,reason}``: a retry the policy
  asked for and that was not made (``budget``: the backend's retry budget,
  answered 503; ``deadline``: no time left in ``timeouts.request``; ``body``: the
  body was not kept; ``started``: a 1xx already went to the client);
- ``tunnelgate_outlier_ejections_total{backend}`` and the
  ``tunnelgate_outlier_ejected{backend}`` gauge (1 while ejected);
- ``tunnelgate_shed_requests_total{reason}`` (``lag``: over the limit the loop's
  turns adapted; ``in_flight``: over ``--shed-max-in-flight``), the
  ``tunnelgate_event_loop_lag_seconds`` gauge (the last measured turn of the event
  loop) and the ``tunnelgate_event_loop_turn_seconds{clock}`` histogram (every one
  measured: ``wall`` time, and ``cpu``, the loop thread's own work in it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from prometheus_client import Counter, Gauge, Histogram

if TYPE_CHECKING:
    from proxy.observability.metrics import Metrics

# Seconds: around the millisecond a shed request's answer is held to, then coarser.
TURN_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.005,
                       0.01, 0.025, 0.05, 0.1, 0.5)


class ResilienceMetrics:
    """Counts what the retry, outlier and shedding machinery did."""

    def __init__(self, metrics: "Metrics") -> None:
        reg = metrics.registry
        # Gauges are summed over live workers (ignored in one process).
        mode: Final = "livesum"
        self.attempts = Counter(
            "tunnelgate_retry_attempts", "Tries of requests whose rule has a retry policy.",
            ["hostname", "rule"], registry=reg)
        self.retries = Counter(
            "tunnelgate_retries", "Retries sent, by what made the previous try fail.",
            ["hostname", "rule", "reason"], registry=reg)
        self.skipped = Counter(
            "tunnelgate_retries_skipped",
            "Retries a policy asked for and that were not made, by why.",
            ["hostname", "rule", "reason"], registry=reg)
        self.ejections = Counter(
            "tunnelgate_outlier_ejections", "Endpoints ejected by outlier detection.",
            ["backend"], registry=reg)
        self.ejected = Gauge(
            "tunnelgate_outlier_ejected", "1 while an endpoint is ejected.",
            ["backend"], registry=reg, multiprocess_mode=mode)
        self.shed = Counter(
            "tunnelgate_shed_requests", "Requests answered 503 to shed load, by why.",
            ["reason"], registry=reg)
        self.lag = Gauge(
            "tunnelgate_event_loop_lag_seconds",
            "How long the last measured turn of the event loop ran (what a request "
            "that just arrived waits to be read).",
            registry=reg, multiprocess_mode=mode)
        self.turns = Histogram(
            "tunnelgate_event_loop_turn_seconds",
            "Measured turns of the event loop (one every 10 ms while shedding adapts "
            "to them, else every 100 ms): wall time, and the loop thread's CPU time.",
            ["clock"], registry=reg, buckets=TURN_BUCKETS)
        self._wall = self.turns.labels("wall")
        self._cpu = self.turns.labels("cpu")

    def attempt(self, hostname: str, rule: str) -> None:
        self.attempts.labels(hostname, rule).inc()

    def retried(self, hostname: str, rule: str, reason: str) -> None:
        self.retries.labels(hostname, rule, reason).inc()

    def not_retried(self, hostname: str, rule: str, reason: str) -> None:
        self.skipped.labels(hostname, rule, reason).inc()

    def ejection(self, backend: str, ejected: bool) -> None:
        """An endpoint was ejected (True) or is back in service (False)."""
        if ejected:
            self.ejections.labels(backend).inc()
        self.ejected.labels(backend).set(1 if ejected else 0)

    def shed_request(self, reason: str) -> None:
        self.shed.labels(reason).inc()

    def loop_turn(self, wall: float, cpu: float) -> None:
        self.lag.set(wall)
        self._wall.observe(wall)
        self._cpu.observe(cpu)
