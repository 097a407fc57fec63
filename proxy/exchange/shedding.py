"""Load shedding at admission: under overload, a fast 503 instead of a longer queue.

Two signals, either enough (``--shed-*`` flags):

- **event-loop lag**: a timer asks to run every ``interval`` seconds and measures how
  late it ran; while the last delay is over ``max_lag``, the loop is behind — every
  request already in is waiting for it — and new requests are shed;
- **in-flight requests** over ``max_in_flight`` (0: no limit).

A shed request is answered at once, ``503`` with ``Retry-After``, before any routing
or backend work, so it costs the proxy a fraction of a forwarded one and the requests
already admitted keep their latency. Its HTTP/1.1 connection is then not read for the
``Retry-After`` (:data:`HOLD`): a client that re-sends at once (a benchmark's closed
loop, an impatient script) would otherwise have its next request shed in the very next
loop turn, again and again, and a few hundred such connections fill every turn with
shedding — the admitted requests' answers, and a new client's, each wait a whole turn
of it. Held, their next requests wait in the kernel's buffer at no cost to the loop and
are read when the hold ends (then admitted if there is room). Measured at 4× the
saturating connections (benchmarks/RESULTS.md): without the hold a new client's shed
answer took 60–130 ms (p50) and, with a low in-flight limit, the admitted rate fell to a
few dozen requests a second; with it, 10–17 ms, the admitted rate near saturation's.
An HTTP/2 stream is not held: its connection carries other streams. Knative probes (a ``K-Network-Probe`` header:
a revision's readiness must not depend on the proxy's load) and ``/healthz`` are never
shed. It lives in the Handler because that is where every entrance's requests meet
(the tunnel's in-process bridge included).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Final

from proxy.observability.resilience import ResilienceMetrics
from proxy.request import Headers, Request

# Seconds; 0 = lag never sheds, the default: nginx and Envoy shed nothing unless told to,
# and on a shared 2-core host a loop that is merely slowed by a neighbour ran 0.5 s late
# often enough (the test suite beside the compiled build) to turn good requests into 503s.
DEFAULT_MAX_LAG: Final = 0.0
DEFAULT_INTERVAL: Final = 0.05
RETRY_AFTER: Final = b"1"
HOLD: Final = 1.0  # seconds a shed HTTP/1.1 connection is not read: the Retry-After
_SHED_HEADERS: Headers = [(b"Content-Type", b"text/plain; charset=utf-8"),
                          (b"Retry-After", RETRY_AFTER)]
SHED_BODY: Final = b"overloaded, retry later\n"


class LoadShedder:
    """Decides, per request, whether the proxy is too far behind to take it."""

    def __init__(self, metrics: ResilienceMetrics | None = None, *,
                 max_lag: float = DEFAULT_MAX_LAG, max_in_flight: int = 0,
                 interval: float = DEFAULT_INTERVAL) -> None:
        self.metrics = metrics
        self.max_lag = max_lag
        self.max_in_flight = max_in_flight if max_in_flight > 0 else sys.maxsize
        """Requests in the Handler beyond which new ones are shed (the Handler reads it
        on every request: an int compare)."""
        self.interval = interval
        self.lagging = False
        """The last measured loop delay was over ``max_lag`` (read on every request)."""
        self.lag = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._expected = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Measure the loop's lag from now on (nothing to do when it never sheds)."""
        if self.max_lag > 0 and self._timer is None:
            self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._expected = loop.time() + self.interval
        self._timer = loop.call_at(self._expected, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self.lag = max(0.0, loop.time() - self._expected)
        self.lagging = self.lag > self.max_lag
        if self.metrics is not None:
            self.metrics.lag.set(self.lag)
        self._arm(loop)

    def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self.lagging = False

    def exempt(self, request: Request) -> bool:
        """Never shed: Knative probes and ``/healthz``."""
        return request.path == "/healthz" or request.header(b"k-network-probe") is not None

    def shed(self, request: Request, in_flight: int) -> tuple[int, Headers, bytes] | None:
        """The answer for a request that arrived with ``in_flight`` requests in, or
        None to admit it."""
        if not (self.lagging or in_flight > self.max_in_flight) or self.exempt(request):
            return None
        if self.metrics is not None:
            self.metrics.shed_request("lag" if self.lagging else "in_flight")
        return 503, _SHED_HEADERS, SHED_BODY

    @staticmethod
    def hold(responder: object) -> None:
        """After a shed answer: read the client's next request no sooner than its
        Retry-After, if its entrance can hold a connection's reading (HTTP/1.1's can)."""
        hold_reading = getattr(responder, "hold_reading", None)
        if hold_reading is not None:
            hold_reading(HOLD)
