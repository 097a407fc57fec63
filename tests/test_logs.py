"""The log under floods, over real sockets: clients that vanish mid-body are counted,
not logged as errors; refused connections are one warning per interval; a huge value
in a log line is clipped."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from proxy.observability.logs import LogfmtFormatter, RateLimit, clip
from tests.helpers import RawClient, TestBackend
from tests.stack import running

HOST = "app.test"
ORDERS = {
    "length, closed": b"Content-Length: 100000\r\n\r\n" + b"z" * 20_000,
    "small length, closed": b"Content-Length: 1000\r\n\r\n" + b"z" * 100,
    "chunked, closed": b"Transfer-Encoding: chunked\r\n\r\n1000\r\n" + b"z" * 100,
}


def route(url: str) -> dict:
    return {"version": 1, "rules": [{"hostnames": [HOST],
                                     "backends": [{"url": url, "weight": 1}]}]}


def loud(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records
            if r.levelno >= logging.WARNING and not r.getMessage().startswith(
                "config API is unauthenticated")]


@pytest.mark.parametrize("half_close", [False, True])
async def test_clients_gone_mid_body_are_counted_not_logged(
        caplog: pytest.LogCaptureFixture, half_close: bool) -> None:
    """Issue: each such client logged `Task exception was never retrieved … BodyError`
    or `handler returned without answering` at error level."""
    async with TestBackend() as backend, running(
            "--listen", "127.0.0.1:0", config=route(backend.url)) as stack:
        with caplog.at_level(logging.INFO):
            for framing in ORDERS.values():
                for _ in range(3):
                    client = await RawClient.connect(stack.cluster_port)
                    client.send(b"POST /echo HTTP/1.1\r\nHost: app.test\r\n" + framing)
                    await asyncio.sleep(0.05)  # the request is on its way upstream
                    if half_close:
                        client.writer.write_eof()
                        await asyncio.sleep(0.05)
                    client.close()
            await asyncio.sleep(0.2)
            gc.collect()  # an unretrieved task exception is reported when collected
            await asyncio.sleep(0)
        exposition = stack.runtime.plane.metrics.render()[0].decode()
    assert loud(caplog) == []
    assert (f'cftunnel_proxy_requests_total{{hostname="{HOST}",status_class="aborted"}} '
            f'{3 * len(ORDERS)}.0') in exposition


async def test_clients_gone_before_the_backend_answered_are_counted_not_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue: the backend connection, abandoned with its request, raised an
    AssertionError in ``connection_lost`` (logged by the event loop at error level)
    and never reached its closed state."""
    async with TestBackend() as backend, running(
            "--listen", "127.0.0.1:0", config=route(backend.url)) as stack:
        with caplog.at_level(logging.INFO):
            for _ in range(3):
                client = await RawClient.connect(stack.cluster_port)
                client.send(b"GET /hang HTTP/1.1\r\nHost: app.test\r\n\r\n")
                await asyncio.sleep(0.05)  # the request waits for the backend's head
                client.close()
            await asyncio.sleep(0.2)
        exposition = stack.runtime.plane.metrics.render()[0].decode()
    assert loud(caplog) == []
    assert (f'cftunnel_proxy_requests_total{{hostname="{HOST}",status_class="aborted"}} '
            '3.0') in exposition


async def test_refused_connections_are_one_warning_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    async with TestBackend() as backend, running(
            "--listen", "127.0.0.1:0", "--max-connections", "2",
            config=route(backend.url)) as stack:
        held = [await RawClient.connect(stack.cluster_port) for _ in range(2)]
        await asyncio.sleep(0.05)
        with caplog.at_level(logging.INFO):
            for _ in range(30):
                refused = await RawClient.connect(stack.cluster_port)
                assert (await refused.read_response()).status == 503  # told why
                assert await refused.closed()
                refused.close()
        for client in held:
            client.close()
    warnings = [r for r in caplog.records if "connection limit" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert warnings[0].refused_since_last == 0  # type: ignore[attr-defined]


def test_rate_limit_lets_one_through_per_interval_and_counts_the_rest() -> None:
    limit = RateLimit(10.0)
    assert limit.allow(100.0) == 0
    assert [limit.allow(100.0 + t) for t in (1, 2, 9.9)] == [None, None, None]
    assert limit.allow(110.0) == 3  # the next line says how many it stands for
    assert limit.allow(115.0) is None and limit.allow(120.5) == 1


def test_logged_values_are_clipped_but_tracebacks_are_not() -> None:
    huge = "h" * 1_000_000
    assert clip("short") == "short"
    assert clip(huge) == "h" * 512 + "… (999488 more characters)"
    record = logging.makeLogRecord({"name": "t", "levelname": "WARNING", "levelno": 30,
                                    "msg": "config push rejected", "reason": huge})
    line = LogfmtFormatter().format(record)
    assert len(line) < 1_000 and "999488 more characters" in line
    try:
        raise ValueError("x" * 5_000)
    except ValueError:
        import sys
        record.exc_info = sys.exc_info()
    assert "x" * 5_000 in LogfmtFormatter().format(record)


async def test_a_rejected_megabyte_push_logs_a_short_line(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue: a rejected 1 MiB push logged the whole value."""
    async with TestBackend() as backend, running(
            "--listen", "127.0.0.1:0", config=route(backend.url)) as stack:
        bad = route(backend.url)
        bad["rules"][0]["hostnames"] = ["x" * 1_000_000 + "!"]  # not a hostname
        with caplog.at_level(logging.INFO):
            response = await stack.push(bad)
    assert response.status_code == 400
    lines = [LogfmtFormatter().format(r) for r in caplog.records
             if r.getMessage() == "config push rejected"]
    assert len(lines) == 1 and len(lines[0]) < 2_000, len(lines[0])
