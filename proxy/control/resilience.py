"""The ``serve`` flags of outlier detection and load shedding, and their settings.

Kept apart from :mod:`proxy.control.settings` (which holds them in
:attr:`Settings.resilience <proxy.control.settings.Settings>`) as one group; the
frozen dataclass is interpreted code, so it crosses to worker processes pickled.
Defaults, and why, are :mod:`proxy.upstream.outlier`'s and :mod:`proxy.exchange.shedding`'s.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from proxy.exchange.shedding import DEFAULT_MAX_LAG, LoadShedder
from proxy.observability.resilience import ResilienceMetrics
from proxy.upstream.outlier import (
    DEFAULT_BASE_TIME, DEFAULT_CONSECUTIVE, DEFAULT_MAX_SHARE, DEFAULT_MAX_TIME, Outliers)
from routing.values import format_duration


@dataclass(frozen=True, slots=True)
class ResilienceSettings:
    """``--outlier-*`` and ``--shed-*``; 0 turns ejection (consecutive) or a shedding
    signal off."""

    outlier_consecutive: int = DEFAULT_CONSECUTIVE
    outlier_base_time: float = DEFAULT_BASE_TIME
    outlier_max_time: float = DEFAULT_MAX_TIME
    outlier_max_share: float = DEFAULT_MAX_SHARE
    shed_max_lag: float = DEFAULT_MAX_LAG
    shed_max_in_flight: int = 0

    def outliers(self) -> Outliers:
        return Outliers(self.outlier_consecutive, self.outlier_base_time,
                        self.outlier_max_time, self.outlier_max_share)

    def shedder(self, metrics: ResilienceMetrics) -> LoadShedder:
        return LoadShedder(metrics, max_lag=self.shed_max_lag,
                           max_in_flight=self.shed_max_in_flight)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument_group("outlier detection and load shedding").add_argument
    add("--outlier-consecutive", default=str(DEFAULT_CONSECUTIVE), metavar="N",
        help="failures in a row (5xx, no answer) that eject an endpoint (default "
             f"{DEFAULT_CONSECUTIVE}; 0: no outlier detection)")
    add("--outlier-base-time", default=format_duration(DEFAULT_BASE_TIME),
        metavar="DURATION", help="first ejection time, times the ejections so far "
        f"(default {format_duration(DEFAULT_BASE_TIME)})")
    add("--outlier-max-time", default=format_duration(DEFAULT_MAX_TIME), metavar="DURATION",
        help=f"longest ejection (default {format_duration(DEFAULT_MAX_TIME)})")
    add("--outlier-max-percent", default=str(round(DEFAULT_MAX_SHARE * 100)), metavar="P",
        help="most of a rule's backends skipped for ejection at once, in percent; at "
             f"least one (default {round(DEFAULT_MAX_SHARE * 100)})")
    add("--shed-max-lag", default=format_duration(DEFAULT_MAX_LAG), metavar="DURATION",
        help="event-loop delay over which new requests get 503 + Retry-After, e.g. "
             "500ms (default 0: never)")
    add("--shed-max-in-flight", default="0", metavar="N",
        help="requests in flight over which new ones get 503 + Retry-After (default "
             "0: no limit)")


Integer = Callable[..., int]  # resolve's _integer(text, name, low=, high=)
Duration = Callable[[str, str], float]  # resolve's _duration(text, name)


def from_args(args: argparse.Namespace, integer: Integer,
              duration: Duration) -> ResilienceSettings:
    """The settings the flags ask for (``integer``/``duration``: the flag parsers of
    :mod:`proxy.control.resolve`, which raise a SettingsError)."""
    lag = 0.0 if args.shed_max_lag.strip() in ("0", "0s") else \
        duration(args.shed_max_lag, "--shed-max-lag")
    return ResilienceSettings(
        outlier_consecutive=integer(args.outlier_consecutive, "--outlier-consecutive", low=0),
        outlier_base_time=duration(args.outlier_base_time, "--outlier-base-time"),
        outlier_max_time=duration(args.outlier_max_time, "--outlier-max-time"),
        outlier_max_share=integer(args.outlier_max_percent, "--outlier-max-percent",
                                  low=0, high=100) / 100,
        shed_max_lag=lag,
        shed_max_in_flight=integer(args.shed_max_in_flight, "--shed-max-in-flight", low=0))
