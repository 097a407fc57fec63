"""Passive outlier detection: endpoints that keep failing are ejected for a while.

An endpoint is a backend URL (the wire format sends one URL per pod of a headless
Service). Its state is one per process and shared by every rule that
names it, the way its pool is — what one route learns protects all the others (Envoy
Gateway keeps one per route backend, so it cannot).

- **Ejection.** ``consecutive`` failures in a row — an answer of 5xx, or no answer
  (refused, reset, timed out) — eject the endpoint for ``base_time`` × the number of
  times it was ejected so far, at most ``max_time``. Any other answer resets the count.
- **Probe.** When the ejection ends the endpoint is pickable again, but only for one
  request: the first one picked (:meth:`Outliers.picked`) is its probe, and until it
  answers the endpoint stays out. A good answer brings it back; a failure ejects it
  again, for longer. A probe that never reports (its client left) frees the endpoint
  for another probe after ``base_time``.
- **Forgetting.** The ejection count of an endpoint back in service is forgotten once
  it served ``max_time`` without being ejected again.

What the pick needs is :attr:`Outliers.ejected`: URL → ejection order, a dict replaced
(never changed in place) on every change, handed to :mod:`routing.ejection`, which
decides per rule which backends to skip (at most ``max_share`` of them; all serve when
all are ejected). Defaults (``--outlier-*`` flags) next to Envoy's: 5 consecutive
failures (Envoy: 5 consecutive 5xx), 30 s base ejection time (Envoy: 30 s), 300 s at
most (Envoy: 300 s), 50 % of a rule's backends at most, at least one (Envoy: 10 % of a
cluster, at least one host); Envoy has no probe (an ejected host simply returns).
"""

from __future__ import annotations

import asyncio
from typing import Callable, Final

DEFAULT_CONSECUTIVE: Final = 5
DEFAULT_BASE_TIME: Final = 30.0
DEFAULT_MAX_TIME: Final = 300.0
DEFAULT_MAX_SHARE: Final = 0.5

Listener = Callable[[str, bool], None]
"""Hears each ejection (URL, True) and each return to service (URL, False): metrics."""


def _nobody(url: str, ejected: bool) -> None:
    pass


class Outliers:
    """The ejection state of every endpoint of the process (``consecutive`` 0: off)."""

    def __init__(self, consecutive: int = DEFAULT_CONSECUTIVE,
                 base_time: float = DEFAULT_BASE_TIME, max_time: float = DEFAULT_MAX_TIME,
                 max_share: float = DEFAULT_MAX_SHARE) -> None:
        self.consecutive = consecutive
        self.base_time = base_time
        self.max_time = max_time
        self.max_share = max_share
        self.listener: Listener = _nobody
        self.ejected: dict[str, int] = {}
        """URL → ejection order (replaced whole on every change: the pick's data)."""
        self.failing: dict[str, int] = {}
        """URL → consecutive failures, for endpoints with at least one (or probing)."""
        self.probing: set[str] = set()
        """Endpoints whose ejection ended and whose next pick is the probe."""
        self._times: dict[str, int] = {}  # URL → times ejected (the time multiplier)
        self._in_probe: set[str] = set()  # endpoints with a probe request out
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._order = 0

    # -- what the exchanges report (the hot path: one test when all is well)

    def answered(self, url: str, status: int) -> None:
        """A response head from ``url``."""
        if status >= 500:
            self.failed(url)
        elif self.failing:
            self._succeeded(url)

    def failed(self, url: str) -> None:
        """A 5xx, or no answer at all, from ``url``."""
        if self.consecutive <= 0:
            return
        count = self.failing.get(url, 0) + 1
        if url in self._in_probe or count >= self.consecutive:
            self._eject(url)
        else:
            self.failing[url] = count

    def picked(self, url: str) -> None:
        """``url`` was picked for a request: if it waited for a probe, this is it."""
        if url in self.probing:
            self.probing.discard(url)
            self._in_probe.add(url)
            self.failing[url] = self.consecutive  # (so that a success is reported)
            self._set_ejected(url, True)  # no other traffic until the probe answers
            self._at(url, self.base_time, self._probe_lost)

    # -- the state changes

    def _succeeded(self, url: str) -> None:
        if self.failing.pop(url, None) is None:
            return
        if url in self._in_probe:
            self._in_probe.discard(url)
            self._set_ejected(url, False)
            self._at(url, self.max_time, self._forget)
            self.listener(url, False)

    def _eject(self, url: str) -> None:
        self.failing.pop(url, None)
        self._in_probe.discard(url)
        self.probing.discard(url)
        times = self._times[url] = self._times.get(url, 0) + 1
        self._set_ejected(url, True)
        self._at(url, min(self.base_time * times, self.max_time), self._ejection_over)
        self.listener(url, True)

    def _ejection_over(self, url: str) -> None:
        self._timers.pop(url, None)
        self._set_ejected(url, False)
        self.probing.add(url)

    def _probe_lost(self, url: str) -> None:
        self._timers.pop(url, None)
        if url in self._in_probe:
            self._in_probe.discard(url)
            self.failing.pop(url, None)
            self._set_ejected(url, False)
            self.probing.add(url)

    def _forget(self, url: str) -> None:
        self._timers.pop(url, None)
        self._times.pop(url, None)

    def _set_ejected(self, url: str, ejected: bool) -> None:
        now = dict(self.ejected)
        if ejected:
            self._order += 1
            now[url] = self._order
        else:
            now.pop(url, None)
        self.ejected = now

    def _at(self, url: str, delay: float, then: Callable[[str], None]) -> None:
        timer = self._timers.pop(url, None)
        if timer is not None:
            timer.cancel()
        self._timers[url] = asyncio.get_running_loop().call_later(delay, then, url)

    # -- reading and ending it

    def state(self) -> dict[str, dict[str, object]]:
        """Every endpoint with something to say, for ``/debug/routes``."""
        urls = set(self.ejected) | set(self.failing) | self.probing | set(self._times)
        return {url: {"ejected": url in self.ejected and url not in self._in_probe,
                      "probing": url in self.probing or url in self._in_probe,
                      "consecutive_failures": self.failing.get(url, 0),
                      "times_ejected": self._times.get(url, 0)}
                for url in sorted(urls)}

    def close(self) -> None:
        """Stop every timer (shutdown)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
