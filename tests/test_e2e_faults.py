"""Acceptance, end to end: every status of REFERENCE §5.1 produced by a real fault, and
the proxy still serving after each one.

Faults are real: a closed port, a backend that writes garbage, closes mid-head, hangs,
or dies mid-body, and a client that goes away mid-response.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

import pytest

from tests.helpers import RawClient, TestBackend
from tests.stack import running
from tests.test_e2e_filters import eventually, one
from tests.test_e2e_routing import LISTEN, ScriptedBackend, ask, request_bytes

HEALTHY = "ok.test"


def with_healthy(echo: TestBackend, rules: list[dict[str, Any]]) -> dict[str, Any]:
    """``rules`` plus a rule for ``HEALTHY`` to check the proxy still serves."""
    return {"version": 1, "rules": [
        {"hostnames": [HEALTHY], "backends": one(echo.url)}, *rules]}


async def still_serving(port: int) -> None:
    response = await ask(port, HEALTHY, "/echo")
    assert response.status == 200 and response.json()["path"] == "/echo"


async def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    return port


@pytest.fixture
async def echo() -> AsyncIterator[TestBackend]:
    async with TestBackend() as backend:
        yield backend


# ----------------------------------------------------------------------------- no route / no backend


async def test_no_route_is_404_and_grpc_gets_trailers_only_unimplemented(echo):
    async with running(*LISTEN, config=with_healthy(echo, [])) as stack:
        port = stack.cluster_port
        miss = await ask(port, "nowhere.test", "/x")
        assert (miss.status, miss.body) == (404, b"no matching route\n")
        for content_type in ("application/grpc", "application/grpc+proto"):
            grpc = await ask(port, "nowhere.test", "/pkg.Svc/Call", method="POST",
                             headers=[("Content-Type", content_type), ("TE", "trailers")],
                             body=b"\x00\x00\x00\x00\x00")
            assert grpc.status == 200
            assert grpc.header(b"content-type") == b"application/grpc"
            assert grpc.header(b"grpc-status") == b"12"
            assert grpc.header(b"grpc-message") == b"no matching route"
            assert grpc.body == b""
        await still_serving(port)
        assert len(echo.requests) == 1


async def test_rule_unavailable_status_answers_without_calling_the_backend(echo):
    rules = [{"hostnames": [f"s{code}.test"], "unavailableStatus": code,
              "backends": one(echo.url)} for code in (500, 503, 418)]
    async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
        for code in (500, 503, 418):
            assert (await ask(stack.cluster_port, f"s{code}.test", "/")).status == code
        await still_serving(stack.cluster_port)
    assert [seen.target for seen in echo.requests] == ["/echo"]


async def test_no_backends_or_all_weights_zero_is_500(echo):
    rules = [
        {"hostnames": ["null.test"], "backends": None},
        {"hostnames": ["empty.test"], "backends": []},
        {"hostnames": ["zero.test"], "backends": [
            {"url": echo.url, "weight": 0}, {"url": echo.url, "weight": 0}]},
    ]
    async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
        for host in ("null.test", "empty.test", "zero.test"):
            response = await ask(stack.cluster_port, host, "/")
            assert (response.status, response.body) == (
                500, b"no backend available for this route\n"), host
        await still_serving(stack.cluster_port)
    assert len(echo.requests) == 1


async def test_backend_unavailable_status_for_its_share(echo):
    rules = [{"hostnames": [f"b{code}.test"],
              "backends": [{"url": echo.url, "weight": 1, "unavailableStatus": code}]}
             for code in (503, 502, 500)]
    async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
        for code in (503, 502, 500):
            response = await ask(stack.cluster_port, f"b{code}.test", "/")
            assert (response.status, response.body) == (code, b"backend unavailable\n")
        await still_serving(stack.cluster_port)
    assert len(echo.requests) == 1


# ----------------------------------------------------------------------------- broken backends


async def test_502_for_closed_port_garbage_and_closing_backends(echo):
    broken_head = b"HTTP/1.1 200 OK\r\nContent-Le"
    async with ScriptedBackend(broken_head) as mid_head:
        dead = await closed_port()
        rules = [
            {"hostnames": ["closed.test"], "backends": one(f"http://127.0.0.1:{dead}")},
            {"hostnames": ["echo-faults.test"], "backends": one(echo.url)},
            {"hostnames": ["mid-head.test"], "backends": one(mid_head.url)},
        ]
        async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
            port = stack.cluster_port
            for host, target in (("closed.test", "/"), ("echo-faults.test", "/garbage"),
                                 ("echo-faults.test", "/close"), ("mid-head.test", "/")):
                response = await ask(port, host, target)
                assert (response.status, response.body) == (502, b"bad gateway\n"), target
                await still_serving(port)
        assert mid_head.heads  # the broken backend was really dialed


@pytest.mark.parametrize("timeouts", [{"request": "300ms"}, {"backend": "300ms"},
                                      {"request": "10s", "backend": "300ms"}])
async def test_504_when_the_backend_hangs_past_the_deadline(echo, timeouts):
    rules = [{"hostnames": ["hang.test"], "backends": one(echo.url), "timeouts": timeouts}]
    async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
        started = time.monotonic()
        response = await ask(stack.cluster_port, "hang.test", "/hang")
        elapsed = time.monotonic() - started
        assert (response.status, response.body) == (504, b"gateway timeout\n")
        assert 0.25 <= elapsed < 2.0, elapsed
        # The deadline bounds only the wait for headers: a slow-enough body is fine.
        slow = await ask(stack.cluster_port, "hang.test", "/chunked?size=6&chunk=2&delay=0.2")
        assert (slow.status, slow.body) == (200, b"xxxxxx")
        await still_serving(stack.cluster_port)


# ----------------------------------------------------------------------------- mid-response


async def test_client_disconnect_mid_response_does_not_hurt_the_proxy(echo):
    rules = [{"hostnames": ["big.test"], "backends": one(echo.url)}]
    async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
        port = stack.cluster_port
        for _ in range(3):
            client = await RawClient.connect(port)
            client.send(request_bytes("GET", "/chunked?size=20000000&chunk=65536&delay=0.001",
                                      "big.test"))
            await client.reader.readuntil(b"\r\n\r\n")
            await client.reader.readexactly(100_000)
            client.close()
            await still_serving(port)
        assert await eventually(lambda: stack.runtime.in_flight.count == 0)
        await still_serving(port)


async def test_backend_dying_mid_body_aborts_the_client_response(echo):
    truncated_chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"5\r\nhello\r\n")
    async with ScriptedBackend(truncated_chunked) as dying:
        rules = [{"hostnames": ["early.test"], "backends": one(echo.url)},
                 {"hostnames": ["dying.test"], "backends": one(dying.url)}]
        async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
            port = stack.cluster_port
            # Content-Length 100, 10 bytes, close: the client must never see a clean end.
            await _assert_truncated(port, "early.test", "/close-early", b"0123456789")
            await still_serving(port)
            await _assert_truncated(port, "dying.test", "/", b"hello")
            await still_serving(port)


async def _assert_truncated(port: int, host: str, target: str, prefix: bytes) -> None:
    """The response head arrives, then the connection ends before the body does."""
    client = await RawClient.connect(port)
    client.send(request_bytes("GET", target, host))
    head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200"), head
    rest = await client.read_all()
    client.close()
    assert prefix in rest
    if b"content-length: 100" in head.lower():
        assert len(rest) < 100
    else:
        assert b"transfer-encoding: chunked" in head.lower()
        assert not rest.endswith(b"0\r\n\r\n")  # no terminating chunk
