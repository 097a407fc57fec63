"""Every attempt to make a config current, kept where an operator can see it.

A config arrives from a ``PUT /config`` (source ``push``) or from the ``--config``
file (source ``file``: at start, on SIGHUP, with ``--watch-config``); the demo's
built-in config is ``embedded``. Each attempt is counted by source and result in
``tunnelgate_config_applies_total`` and sets the last-attempt gauges
(:class:`proxy.observability.metrics.ConfigMetrics`), and :meth:`ConfigAttempts.state`
is what ``GET /debug/config`` answers: the config being served, the last attempt, and
the last rejection with its message (clipped like a logged value). A rejected file
reload otherwise shows only in the log, while the old config keeps serving.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from proxy.observability.accesslog import timestamp
from proxy.observability.logs import clip
from proxy.observability.configmetrics import ConfigMetrics

SOURCES = ("file", "push", "embedded")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt: where the config came from, when, and how it ended."""

    source: str
    at: float                  # Unix time
    applied: bool
    version: int | None        # the applied config's; None when rejected
    message: str               # why it was rejected ("" when applied), clipped

    def describe(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"source": self.source, "at": timestamp(self.at),
                                  "result": "applied" if self.applied else "rejected"}
        if self.applied:
            answer["version"] = self.version
        else:
            answer["message"] = self.message
        return answer


class ConfigAttempts:
    """The config API's record of attempts (one per process that runs it)."""

    def __init__(self, metrics: ConfigMetrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.metrics = metrics
        self.clock = clock
        self.serving: Attempt | None = None       # the attempt that made it current
        self.last: Attempt | None = None
        self.last_rejection: Attempt | None = None

    def applied(self, source: str, version: int) -> None:
        self.last = self.serving = Attempt(source, self.clock(), True, version, "")
        self.metrics.attempted(source, True, self.last.at)

    def rejected(self, source: str, message: str) -> None:
        """A config from ``source`` was refused; ``message`` says why (the 4xx/5xx
        body of a push, the file's error for a reload)."""
        self.last = self.last_rejection = Attempt(source, self.clock(), False, None,
                                                  clip(message))
        self.metrics.attempted(source, False, self.last.at)

    def state(self) -> dict[str, Any]:
        """``GET /debug/config``: each part ``null`` until it happened."""
        return {"serving": _described(self.serving), "last_attempt": _described(self.last),
                "last_rejection": _described(self.last_rejection)}


def _described(attempt: Attempt | None) -> dict[str, Any] | None:
    return attempt.describe() if attempt is not None else None
