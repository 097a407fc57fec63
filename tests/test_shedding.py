"""Load shedding: end to end over real sockets (a real tunnelgate in front of a
:class:`tests.flaky.FlakyBackend` that hangs, so one request holds the in-flight
limit of 1), and the adaptive limit and its turn meter on a real event loop. Outcomes
are statuses and counts (``/metrics``), never times."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator

import pytest

from proxy.exchange.shedding import MIN_LIMIT, LoadShedder, TurnMeter
from proxy.request import EMPTY_BODY, Headers, Request

from tests.flaky import FlakyBackend
from tests.helpers import RawClient
from tests.stack import Stack
from tests.test_e2e_routing import ask, request_bytes
from tests.test_outlier import ROUNDS, proxy
from tests.test_retry import HOST, metric, rule

SHED = "tunnelgate_shed_requests_total"
HANDLED = "cftunnel_proxy_requests_total"  # requests that reached the Handler


class Overloaded:
    """A proxy with an in-flight limit of 1, held by a request its backend never
    answers (until :meth:`release`)."""

    def __init__(self, stack: Stack, backend: FlakyBackend) -> None:
        self.stack = stack
        self.backend = backend
        self.hanging = asyncio.ensure_future(ask(stack.cluster_port, HOST, "/"))

    async def admitted(self, count: int) -> None:
        """Wait until the backend has seen ``count`` requests."""
        for _ in range(ROUNDS):
            if self.backend.hits >= count:
                break
            await asyncio.sleep(0.01)
        assert self.backend.hits == count

    def release(self) -> None:
        """The backend answers from now on, and the hanging request is dropped."""
        self.backend.status = None
        self.hanging.cancel()


@contextlib.asynccontextmanager
async def overloaded() -> AsyncIterator[Overloaded]:
    async with FlakyBackend() as backend, proxy(
            rule(backend.url, timeouts={"request": "10s"}),
            flags=("--shed-max-in-flight", "1", "--outlier-consecutive", "0")) as stack:
        backend.status = "hang"
        load = Overloaded(stack, backend)
        try:
            await load.admitted(1)
            yield load
        finally:
            load.hanging.cancel()


async def test_requests_over_the_in_flight_limit_are_shed_but_probes_are_not():
    async with overloaded() as load:
        port = load.stack.cluster_port
        shed = await ask(port, HOST, "/")
        assert (shed.status, shed.header(b"retry-after")) == (503, b"1")
        probe = asyncio.ensure_future(
            ask(port, HOST, "/", headers=[("K-Network-Probe", "probe")]))
        try:
            await load.admitted(2)  # the probe was
            assert await metric(load.stack, SHED, reason="in_flight") == 1
        finally:
            probe.cancel()


# Over the limit, each on a fresh connection: status, answered at the read (True: the
# Handler never saw it) or the parsed way, and whether the connection stays open.
@pytest.mark.parametrize("data, status, at_read, kept", [
    (request_bytes("GET", "/", HOST), 503, True, True),
    (request_bytes("GET", "/a?b=c", HOST, [("Accept", "*/*")]), 503, True, True),
    (b"GET / HTTP/1.1\r\n\r\n", 503, True, True),  # no Host: nothing of it is parsed
    (request_bytes("GET", "/", HOST, [("Connection", "close")]), 503, False, False),
    (request_bytes("POST", "/", HOST, body=b"x"), 503, False, True),
    (request_bytes("HEAD", "/", HOST), 503, False, True),
    (b"GET / HTTP/1.0\r\nHost: " + HOST.encode() + b"\r\n\r\n", 503, False, False),
    (request_bytes("GET", "/", HOST, [("Transfer-Encoding", "chunked")]) + b"0\r\n\r\n",
     503, False, True),
    (request_bytes("GET", "/healthz", "nowhere.example"), 404, False, True),  # never shed
    (request_bytes("GET", "/", HOST, [("k-network-probe", "x")]), 0, False, True),
], ids=["get", "get-query", "no-host", "close", "post", "head", "http10", "chunked",
        "healthz", "probe"])
async def test_which_requests_are_shed_at_their_read(data: bytes, status: int,
                                                     at_read: bool, kept: bool):
    """A bodyless HTTP/1.1 GET is answered at its read (the Handler never counts
    it); every other request is parsed first, then shed (or admitted) by the Handler:
    the same answer, and its framing (HEAD: no body; close: closed) is the parsed way's."""
    async with overloaded() as load:
        stack = load.stack
        handled, shed = await metric(stack, HANDLED), await metric(stack, SHED)
        client = await RawClient.connect(stack.cluster_port)
        try:
            client.send(data)
            if status == 0:  # admitted, waiting on the hanging backend
                assert await client.closed(timeout=0.2) is False
                assert await metric(stack, SHED) == shed
                return
            answer = await client.read_response(head=data.startswith(b"HEAD"))
            assert answer.status == status
            assert await metric(stack, SHED) == shed + (status == 503)
            assert await metric(stack, HANDLED) == handled + (not at_read)
            assert await client.closed(timeout=0.2) is not kept
        finally:
            client.close()


async def test_a_shed_connection_is_read_again_only_after_its_retry_after():
    """A client that re-sends at once after its 503: that request is not read (not
    shed again, the count stays) while other clients are served; once the hold ends it
    is read, and with the in-flight slot free by then it is admitted."""
    async with overloaded() as load:
        stack = load.stack
        impatient = await RawClient.connect(stack.cluster_port)
        try:
            impatient.send(request_bytes("GET", "/", HOST))
            assert (await impatient.read_response()).status == 503
            impatient.send(request_bytes("GET", "/", HOST))  # at once, on the same connection
            # Another client's request sent after it is read and shed: had the
            # impatient one's been read, it would have been shed with it.
            assert (await ask(stack.cluster_port, HOST, "/")).status == 503
            assert await metric(stack, SHED, reason="in_flight") == 2
            load.release()  # frees the one in-flight slot
            for _ in range(ROUNDS):
                if await metric(stack, "cftunnel_proxy_requests_in_flight") == 0:
                    break
                await asyncio.sleep(0.01)
            assert (await impatient.read_response()).status == 200
            assert await metric(stack, SHED, reason="in_flight") == 2
        finally:
            impatient.close()


# ------------------------------------------------------------ the adaptive limit


class InFlight:
    """The count a shedder watches (the Handler's, in the proxy)."""

    def __init__(self, count: int) -> None:
        self.count = count


# max_lag 1 ms, cap (0: none), limit before, in flight, measured turn → limit after.
@pytest.mark.parametrize("cap, before, count, turn, after", [
    (0, None, 40, 0.00125, 32),  # a quarter too long: cut to 4/5 of those in flight
    (0, 20, 40, 0.00125, 16),  # ... of the limit, when fewer are in than it allows
    (0, None, 40, 0.004, 20),  # 4x too long: halved, no more
    (0, None, 3, 0.5, MIN_LIMIT),  # never below the floor
    (0, 10, 10, 0.0005, 13),  # within: up by 1 + a quarter
    (12, 10, 10, 0.0005, 12),  # ... up to the fixed limit
    (0, None, 40, 0.0005, None),  # no limit stays none
    (8, None, 40, 0.004, 4),  # cut from the fixed limit
])
def test_the_limit_follows_the_measured_turns(cap: int, before: int | None, count: int,
                                              turn: float, after: int | None):
    shedder = LoadShedder(max_lag=0.001, max_in_flight=cap)
    shedder.watch(InFlight(count))
    if before is not None:
        shedder.limit = before
    shedder.turned(1.0, turn)  # (the wall time does not count: only the loop's work)
    assert shedder.limit == (after if after is not None else shedder.cap)


def test_without_max_lag_the_limit_stays_fixed():
    shedder = LoadShedder(max_in_flight=5)
    shedder.watch(InFlight(50))
    shedder.turned(10.0, 10.0)
    assert shedder.limit == 5 and shedder.overloaded()


async def test_a_stalled_loop_cuts_the_limit_but_probes_and_healthz_are_still_admitted():
    """Every turn keeps the loop busy for 60 ms (what a saturated proxy looks like):
    the turn meter (every 10 ms) measures one, over the 50 ms allowed, and the limit is
    cut to the floor: with that many in flight, a new request is shed, a probe and
    /healthz are not."""
    shedder = LoadShedder(max_lag=0.05)
    shedder.watch(InFlight(MIN_LIMIT))
    shedder.start(asyncio.get_running_loop())
    try:
        assert not shedder.overloaded()
        for _ in range(ROUNDS):
            if shedder.limit == MIN_LIMIT:
                break
            busy(0.06)
            await asyncio.sleep(0)
        assert shedder.overloaded()
        status, headers, _ = shedder.shed(request()) or (0, [], b"")
        assert (status, dict(headers)[b"Retry-After"]) == (503, b"1")
        assert shedder.shed(request(headers=[(b"k-network-probe", b"probe")])) is None
        assert shedder.shed(request("/healthz")) is None
    finally:
        shedder.stop()


def request(path: str = "/", headers: Headers | None = None) -> Request:
    return Request("GET", path, "", HOST, headers or [], EMPTY_BODY, "cluster")


async def test_the_turn_meter_measures_a_whole_turn_of_the_loop():
    """Every turn the test runs in keeps the loop busy for 50 ms: whatever the order
    of the meter's callbacks and the test's in a turn, a measured turn spans one such
    stretch, so its wall time and its work are at least that long (lower bounds: they
    cannot fail by being slow); a turn the loop spends asleep in a callback is long in
    wall time only."""
    turns: list[tuple[float, float]] = []
    meter = TurnMeter(lambda wall, cpu: turns.append((wall, cpu)), 0.001)
    meter.start(asyncio.get_running_loop())
    try:
        count = len(turns)
        for _ in range(ROUNDS):
            if len(turns) > count:
                break
            busy(0.05)
            await asyncio.sleep(0)
        assert min(turns[count]) >= 0.05
        count = len(turns)
        for _ in range(ROUNDS):
            if len(turns) > count:
                break
            time.sleep(0.05)
            await asyncio.sleep(0)
        wall, cpu = turns[count]
        assert wall >= 0.05 > cpu
    finally:
        meter.stop()


def busy(seconds: float) -> None:
    """Keep this thread on the CPU for ``seconds`` of its own CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
