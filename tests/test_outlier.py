"""Passive outlier detection end to end, over real sockets: a real
tunnelgate in front of :class:`tests.flaky.FlakyBackend` backends, with short
configured times; outcomes are counts (the backends', ``/metrics``, ``/debug``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

import httpx

from tests.flaky import FlakyBackend
from tests.stack import Stack, running
from tests.test_e2e_routing import LISTEN, ask
from tests.test_retry import HOST, metric, rule

ROUNDS = 200  # bound on any polling loop here


@contextlib.asynccontextmanager
async def proxy(*rules: dict[str, Any], flags: tuple[str, ...]) -> AsyncIterator[Stack]:
    async with running(*LISTEN, *flags, config={"version": 1, "rules": list(rules)}) as stack:
        yield stack


async def statuses(stack: Stack, count: int) -> list[int]:
    return [(await ask(stack.cluster_port, HOST, "/")).status for _ in range(count)]


async def test_an_endpoint_failing_every_request_is_ejected_within_its_threshold():
    """Three failures in a row eject it: from then on every request goes to the good
    backend (a long base time, so no probe comes back within the test)."""
    async with FlakyBackend("bad") as bad, FlakyBackend("good") as good, proxy(
            rule(bad.url, good.url),
            flags=("--outlier-consecutive", "3", "--outlier-base-time", "1h")) as stack:
        bad.status = 500
        for _ in range(ROUNDS):
            if bad.hits >= 3:
                break
            await ask(stack.cluster_port, HOST, "/")
        assert bad.hits == 3
        assert await statuses(stack, 20) == [200] * 20
        assert bad.hits == 3
        assert await metric(stack, "tunnelgate_outlier_ejections_total",
                            backend=bad.url) == 1
        assert await metric(stack, "tunnelgate_outlier_ejected", backend=bad.url) == 1
        async with httpx.AsyncClient() as client:
            state = (await client.get(f"{stack.admin_url}/debug/routes")).json()
        assert state["outliers"][bad.url]["ejected"] is True


async def test_an_ejected_endpoint_comes_back_after_it_recovers():
    """Ejected for 50ms at a time: while it still fails, each probe ejects it again;
    once it answers well, a probe brings it back and it serves its share."""
    async with FlakyBackend("bad") as bad, FlakyBackend("good") as good, proxy(
            rule(bad.url, good.url),
            flags=("--outlier-consecutive", "2", "--outlier-base-time", "50ms",
                   "--outlier-max-time", "50ms")) as stack:
        bad.status = 500
        for _ in range(ROUNDS):
            if bad.hits >= 2:
                break
            await ask(stack.cluster_port, HOST, "/")
        assert await metric(stack, "tunnelgate_outlier_ejected", backend=bad.url) == 1
        bad.status = None  # recovered
        served = 0
        for _ in range(ROUNDS):
            await asyncio.sleep(0.01)
            response = await ask(stack.cluster_port, HOST, "/")
            served += response.body.startswith(b"bad 200")
            if served >= 3:
                break
        assert served >= 3
        assert await metric(stack, "tunnelgate_outlier_ejected", backend=bad.url) == 0


async def test_all_endpoints_ejected_still_serve():
    async with FlakyBackend("a") as a, FlakyBackend("b") as b, proxy(
            rule(a.url, b.url),
            flags=("--outlier-consecutive", "1", "--outlier-base-time", "1h",
                   "--outlier-max-percent", "100")) as stack:
        a.status = b.status = 500
        await statuses(stack, 10)
        assert await metric(stack, "tunnelgate_outlier_ejected") == 2
        before = a.hits + b.hits
        assert await statuses(stack, 10) == [500] * 10  # the backends' own answers
        assert a.hits + b.hits == before + 10


async def test_ejection_learned_on_one_route_protects_another():
    other = "other.test"
    async with FlakyBackend("bad") as bad, FlakyBackend("good") as good:
        second = rule(bad.url, good.url)
        second["hostnames"] = [other]
        async with proxy(rule(bad.url, good.url), second,
                         flags=("--outlier-consecutive", "2",
                                "--outlier-base-time", "1h")) as stack:
            bad.status = 500
            for _ in range(ROUNDS):
                if bad.hits >= 2:
                    break
                await ask(stack.cluster_port, HOST, "/")
            answers = [(await ask(stack.cluster_port, other, "/")).status
                       for _ in range(10)]
            assert answers == [200] * 10
            assert bad.hits == 2


async def test_outlier_detection_can_be_turned_off():
    async with FlakyBackend("bad") as bad, FlakyBackend("good") as good, proxy(
            rule(bad.url, good.url), flags=("--outlier-consecutive", "0")) as stack:
        bad.status = 500
        answers = await statuses(stack, 40)
        assert 500 in answers[20:]  # still picked
        assert await metric(stack, "tunnelgate_outlier_ejections_total") == 0
