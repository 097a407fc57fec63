"""Load shedding: under overload, a fast 503 instead of a longer queue.

Two limits on the requests in the proxy (``--shed-*`` flags), the lower one applies:

- ``max_in_flight``: a fixed one (0: none);
- ``max_lag``: the longest one turn of the event loop may run, which is how long a
  request that just arrived waits before it is even read. The turn's work is measured
  (see :class:`TurnMeter`) and the in-flight limit adapted to it: a turn over
  ``max_lag`` cuts the limit to the requests in flight times ``max_lag`` / the turn,
  at most by half and to no less than :data:`MIN_LIMIT`; a turn within it raises the
  limit by a quarter. The work of a turn is the admitted requests' reads, starts,
  answers and ends: a bounded number of them keeps the turn, and so every client's
  wait, bounded.

A shed request gets ``503`` with ``Retry-After``, and its HTTP/1.1 connection is then
not read for that long (:data:`HOLD`, and up to half as long again, at random): a
client that re-sends at once (a benchmark's closed loop, an impatient script) would
otherwise have its next request shed in the very next turn, again and again, and a few
hundred such connections fill every turn with shedding. Held, their next requests wait
in the kernel's buffer at no cost to the loop and are read when the hold ends (then
admitted if there is room). The random part spreads the ends of holds that began in
one turn, which would otherwise all be read again in one turn a second later (in the
overload benchmark the turns' work p99 went from ≤ 5 ms to ≤ 1.5 ms with it; one run
each, on a shared host). An HTTP/2 stream is not held: its connection carries other
streams.

Where: an HTTP/1.1 ``GET`` read whole, without a body, is shed in the read callback,
before it is parsed (:func:`proxy.entrances.admission.shed_at_read` asks
:meth:`LoadShedder.overloaded` and :meth:`LoadShedder.shed_head`), so its answer waits
for nothing else of the turn; every other request (HTTP/2 streams, the tunnel's bridge,
requests with a body) is shed where every entrance's requests meet, in the Handler
before routing (:meth:`LoadShedder.shed`). Knative probes (a ``K-Network-Probe``
header: a revision's readiness must not depend on the proxy's load) and ``/healthz``
are never shed. docs/config.md#load-shedding explains the bound and the numbers.
"""

from __future__ import annotations

import asyncio
import random
import re
import sys
import time
from typing import Callable, Final, Protocol

from proxy.observability.resilience import ResilienceMetrics
from proxy.request import Headers, Request
from proxy.wire.head import render_head, status_line

# Seconds; 0 = no adaptive limit, the default: nginx and Envoy shed nothing unless told
# to, and on a shared host a loop merely stalled by a neighbour (0.5 s, seen beside the
# test suite) would cut the limit and turn good requests into 503s.
DEFAULT_MAX_LAG: Final = 0.0
INTERVAL: Final = 0.01  # seconds between turn measurements while adapting the limit
IDLE_INTERVAL: Final = 0.1  # ... while they are only reported (the gauge, the histogram)
MIN_LIMIT: Final = 2  # the adaptive limit never cuts below this many requests in flight
GROWTH: Final = 4  # a good turn raises the limit by 1 + limit // GROWTH
RETRY_AFTER: Final = b"1"
HOLD: Final = 1.0  # seconds a shed HTTP/1.1 connection is not read: the Retry-After
_SHED_HEADERS: Headers = [(b"Content-Type", b"text/plain; charset=utf-8"),
                          (b"Retry-After", RETRY_AFTER)]
SHED_BODY: Final = b"overloaded, retry later\n"
_SHED_HEAD: Final = (status_line(503), _SHED_HEADERS
                     + [(b"Content-Length", b"%d" % len(SHED_BODY))])
# In a raw request head, a sign it may be exempt (looked for anywhere, case-blind: a
# false match only sends the request the parsed way, where exempt() decides).
_MAY_BE_EXEMPT: Final = re.compile(rb"/healthz|k-network-probe", re.IGNORECASE)


class Counted(Protocol):
    """What holds the count of requests in flight (the Handler)."""

    count: int


class LoadShedder:
    """Decides, per request, whether the proxy is too far behind to take it."""

    def __init__(self, metrics: ResilienceMetrics | None = None, *,
                 max_lag: float = DEFAULT_MAX_LAG, max_in_flight: int = 0,
                 interval: float | None = None,
                 rand: Callable[[], float] = random.random) -> None:
        self.metrics = metrics
        self.max_lag = max_lag
        self.cap = max_in_flight if max_in_flight > 0 else sys.maxsize
        self.limit = self.cap
        """Requests in flight beyond which new ones are shed: ``max_in_flight``, or
        lower while the loop's turns run long (read on every request that
        :attr:`active` lets through: an int compare)."""
        self.active = max_lag > 0 or max_in_flight > 0
        """False: no limit, ever (``limit`` stays ``sys.maxsize``); the Handler tests
        this first, as a compare with ``sys.maxsize``, too large for mypyc's unboxed
        ints, cost ~160 instructions per request (callgrind, 2026-12-07)."""
        self._rand = rand
        self._counted: Counted | None = None
        self.meter = TurnMeter(self.turned, interval if interval is not None
                               else INTERVAL if max_lag > 0 else IDLE_INTERVAL)

    def watch(self, counted: Counted) -> None:
        """Count the requests in flight from ``counted.count``."""
        self._counted = counted

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Measure the loop's turns from now on."""
        self.meter.start(loop)

    def stop(self) -> None:
        self.meter.stop()
        self.limit = self.cap

    def turned(self, wall: float, turn: float) -> None:
        """A turn of the loop took ``wall`` seconds, ``turn`` of them its own work (the
        loop thread's CPU time): reported, and the limit adapted to the work. (A turn
        that other processes stretched is no sign of too much admitted work, and a
        lower limit would not shorten it.)"""
        if self.metrics is not None:
            self.metrics.loop_turn(wall, turn)
        if self.max_lag <= 0:
            return
        if turn > self.max_lag:
            in_flight = self._counted.count if self._counted is not None else 0
            # At most halved per turn: one turn a neighbour's process stretched says
            # little about the work of a turn (a sustained overload halves it again
            # every INTERVAL).
            cut = int(min(self.limit, in_flight) * max(self.max_lag / turn, 0.5))
            self.limit = min(self.cap, max(MIN_LIMIT, cut))
        elif self.limit < self.cap:
            self.limit = min(self.cap, self.limit + 1 + self.limit // GROWTH)

    def overloaded(self) -> bool:
        """Whether a request arriving now would be one too many (not yet counted)."""
        counted = self._counted
        return counted is not None and counted.count >= self.limit

    def exempt(self, request: Request) -> bool:
        """Never shed: Knative probes and ``/healthz``."""
        return request.path == "/healthz" or request.header(b"k-network-probe") is not None

    def shed(self, request: Request) -> tuple[int, Headers, bytes] | None:
        """The answer for a request the Handler took over the limit, or None (it is
        exempt: admit it)."""
        if self.exempt(request):
            return None
        self._count()
        return 503, _SHED_HEADERS, SHED_BODY

    def shed_head(self, head: bytes, date_line: bytes) -> bytes | None:
        """For an HTTP/1.1 request head read whole over the limit (its bytes as they
        came): the whole answer, or None if it may be exempt (then it is parsed and
        the Handler decides). ``date_line``: the answer's ``Date`` field line."""
        if _MAY_BE_EXEMPT.search(head) is not None:
            return None
        self._count()
        return render_head(_SHED_HEAD[0], _SHED_HEAD[1], date_line) + SHED_BODY

    def _count(self) -> None:
        if self.metrics is not None:
            self.metrics.shed_request("in_flight" if self.limit == self.cap else "lag")

    def hold_time(self) -> float:
        """How long a shed connection is not read: its Retry-After, and up to half as
        long again (module docstring)."""
        return HOLD * (1 + self._rand() / 2)

    def hold(self, responder: object) -> None:
        """After a shed answer: read the client's next request no sooner than its
        Retry-After, if its entrance can hold a connection's reading (HTTP/1.1's can)."""
        hold_reading = getattr(responder, "hold_reading", None)
        if hold_reading is not None:
            hold_reading(self.hold_time())


class TurnMeter:
    """Measures one whole turn of the event loop every ``interval`` seconds: its wall
    time and its work (the loop thread's CPU time, user and system).

    asyncio runs, per turn, what was ready when the turn began: a callback scheduled
    now runs in the next turn, before that turn's reads. So a timer schedules ``begin``
    (it runs first thing in the next turn), which schedules ``end`` (first thing in the
    turn after): between them, one turn's callbacks and the next poll, which does not
    sleep (a callback is ready). That span is how long a read that became ready
    meanwhile waits for its turn. A lag timer's lateness alone would measure part of a
    turn, and on an idle loop the poll's millisecond rounding."""

    def __init__(self, report: Callable[[float, float], None], interval: float) -> None:
        self._report = report
        self.interval = interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._began = 0.0
        self._began_cpu = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is None:
            self._loop = loop
            self._timer = loop.call_later(self.interval, self._begin_next)

    def stop(self) -> None:
        self._loop = None  # a measurement under way ends without re-arming
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _begin_next(self) -> None:
        self._timer = None
        if self._loop is not None:
            self._loop.call_soon(self._begin)

    def _begin(self) -> None:
        loop = self._loop
        if loop is not None:
            self._began = loop.time()
            self._began_cpu = time.thread_time()
            loop.call_soon(self._end)

    def _end(self) -> None:
        loop = self._loop
        if loop is None:
            return
        self._report(loop.time() - self._began, time.thread_time() - self._began_cpu)
        self._timer = loop.call_later(self.interval, self._begin_next)
