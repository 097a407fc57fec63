"""What the observability rooms are configured with, as the settings resolve it
(:mod:`proxy.control.settings` reads the environment into these).

Plain interpreted dataclasses, never compiled: worker processes receive them pickled,
and a compiled frozen dataclass does not unpickle (``setup.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AccessLogSettings:
    """``PROXY_ACCESS_LOG_ENABLED`` / ``_SAMPLING_RATE`` / ``_STRIP_QUERY``, read by
    :class:`proxy.observability.accesslog.AccessLog`."""

    enabled: bool = False
    sampling_rate: float = 1.0
    strip_query: bool = False


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """``PROXY_TRACING_ENABLED`` / ``_ENDPOINT`` / ``_SAMPLE_RATE``, read by
    :mod:`proxy.observability.tracing`.

    ``endpoint`` empty = the OpenTelemetry exporter's own ``OTEL_EXPORTER_OTLP_*``
    variables decide; ``sample_rate`` is clamped to [0, 1].
    """

    enabled: bool = False
    endpoint: str = ""
    sample_rate: float = 1.0
