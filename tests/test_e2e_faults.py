"""Acceptance, end to end: every status tunnelgate produces by a real fault, and
the proxy still serving after each one.

Faults are real: a closed port, a backend that writes garbage, closes mid-head, hangs,
or dies mid-body, and a client that goes away mid-response.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from typing import Any, AsyncIterator

import httpx
import pytest

from tests.helpers import RawClient, ScriptBackend, TestBackend
from tests.stack import running
from tests.test_e2e_filters import eventually, one
from tests.test_e2e_routing import LISTEN, ask, request_bytes

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


# ------------------------------------------------------------------------ no route / no backend


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
    async with ScriptBackend.replying(broken_head) as mid_head:
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
        assert mid_head.seen  # the broken backend was really dialed


@pytest.mark.parametrize("timeouts", [{"request": "300ms"}, {"backend": "300ms"},
                                      {"request": "10s", "backend": "300ms"}])
async def test_504_when_the_backend_hangs_past_the_deadline(echo, timeouts):
    rules = [{"hostnames": ["hang.test"], "backends": one(echo.url), "timeouts": timeouts}]
    async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
        await times_out_at_the_deadline(stack.cluster_port, "hang.test", "/hang")


async def times_out_at_the_deadline(port: int, host: str, path: str) -> None:
    """The 300 ms route deadline answers 504, in time, and the proxy serves on."""
    started = time.monotonic()
    response = await ask(port, host, path)
    elapsed = time.monotonic() - started
    assert (response.status, response.body) == (504, b"gateway timeout\n")
    assert 0.25 <= elapsed < 2.0, elapsed
    await still_serving(port)


@contextlib.contextmanager
def stalled_backend():
    """A backend whose connect() never completes: its listen queue is full, so the
    kernel drops the next SYN (Linux) and the dialer keeps retrying."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@pytest.mark.skipif(sys.platform != "linux", reason="a full listen queue stalls connect")
@pytest.mark.parametrize("protocol", ["http", "h2c"])
async def test_the_route_timeout_bounds_the_dial_too(echo, protocol):
    # GEP-1742: the request timeout covers as much of the exchange as it can; a backend
    # that cannot be reached in time is a timeout (504), not a dial error after the
    # 5 s connect limit.
    with stalled_backend() as url:
        extra = {"protocol": "h2c"} if protocol == "h2c" else {}
        rules = [{"hostnames": ["stall.test"], "backends": one(url, **extra),
                  "timeouts": {"request": "300ms"}}]
        async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
            await times_out_at_the_deadline(stack.cluster_port, "stall.test", "/")


async def test_the_deadline_bounds_only_the_wait_for_response_headers(echo):
    rules = [{"hostnames": ["slow.test"], "backends": one(echo.url),
              "timeouts": {"request": "300ms"}}]
    async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
        # Neither a response body nor a request body slower than the deadline
        # is cut.
        slow = await ask(stack.cluster_port, "slow.test", "/chunked?size=4&chunk=2&delay=0.2")
        assert (slow.status, slow.body) == (200, b"xxxx")
        upload = await RawClient.connect(stack.cluster_port)
        upload.send(b"POST /echo HTTP/1.1\r\nHost: slow.test\r\nTransfer-Encoding: chunked"
                    b"\r\n\r\n")
        for _ in range(3):
            upload.send(b"2\r\nab\r\n")
            await asyncio.sleep(0.15)
        upload.send(b"0\r\n\r\n")
        assert (await upload.read_response()).json()["body"] == "ababab"
        upload.close()


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


async def test_client_gone_while_the_backend_hangs_ends_the_request(echo):
    rules = [{"hostnames": ["hang.test"], "backends": one(echo.url)}]  # no deadline
    async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
        client = await RawClient.connect(stack.cluster_port)
        client.send(request_bytes("GET", "/hang", "hang.test"))
        assert await eventually(lambda: stack.runtime.in_flight.count == 1)
        client.close()
        assert await eventually(lambda: stack.runtime.in_flight.count == 0)
        async with httpx.AsyncClient() as admin:
            metrics = (await admin.get(f"{stack.admin_url}/metrics")).text
        assert ('cftunnel_proxy_requests_total{hostname="hang.test",status_class="aborted"}'
                ' 1.0') in metrics
        await still_serving(stack.cluster_port)


async def test_expect_100_continue_on_a_route_miss_gets_the_final_answer(echo):
    async with running(*LISTEN, config=with_healthy(echo, [])) as stack:
        client = await RawClient.connect(stack.cluster_port)
        client.send(b"POST /x HTTP/1.1\r\nHost: nowhere.test\r\nContent-Length: 10\r\n"
                    b"Expect: 100-continue\r\n\r\n")
        answer = await client.read_response()
        client.close()
        assert answer.status == 404  # no 100 Continue for a body nobody will read
        await still_serving(stack.cluster_port)


async def test_backend_dying_mid_body_aborts_the_client_response(echo):
    truncated_chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"5\r\nhello\r\n")
    async with ScriptBackend.replying(truncated_chunked) as dying:
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


# ----------------------------------------------------------------------------- pooled connections


async def test_a_pooled_connection_the_backend_closed_is_not_a_502():
    async with TestBackend(idle_close=0.05) as closing, TestBackend(drop_reused=True) as racing:
        config = {"version": 1, "rules": [
            {"hostnames": ["idle.test"], "backends": one(closing.url)},
            {"hostnames": ["race.test"], "backends": one(racing.url)}]}
        async with running(*LISTEN, config=config) as stack:
            for host in ("idle.test", "race.test"):
                for _ in range(3):
                    response = await ask(stack.cluster_port, host, "/echo")
                    assert response.status == 200, host
                    if host == "idle.test":
                        await asyncio.sleep(0.15)  # past the backend's idle close
        assert closing.connections == 3  # each request found its idle connection closed
        assert all(seen.connection == index for index, seen in
                   enumerate(closing.requests, 1))
        # The raced reuse was dropped without an answer and retried on a new connection.
        assert [seen.connection for seen in racing.requests] == [1, 1, 2, 2, 3]


async def test_bytes_after_a_complete_response_never_answer_the_next_request():
    poisoned = (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nPOISON")
    fresh = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh"
    async with ScriptBackend.replying(poisoned, fresh, keep_alive=True) as backend:
        config = {"version": 1, "rules": [{"backends": one(backend.url)}]}
        async with running(*LISTEN, config=config) as stack:
            first = await ask(stack.cluster_port, "p.test", "/1")
            assert (first.status, first.body) == (200, b"ok")
            second = await ask(stack.cluster_port, "p.test", "/2")
            assert (second.status, second.body) == (200, b"fresh")


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nokk",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2x\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok",
])
async def test_ambiguous_response_framing_is_never_relayed_as_is(reply):
    fresh = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh"
    async with ScriptBackend.replying(reply, fresh, keep_alive=True) as backend:
        config = {"version": 1, "rules": [{"backends": one(backend.url)}]}
        async with running(*LISTEN, config=config) as stack:
            response = await ask(stack.cluster_port, "a.test", "/")
            assert response.status == 502, (response.status, response.headers)
            again = await ask(stack.cluster_port, "a.test", "/")
            assert (again.status, again.body) == (200, b"fresh")


async def test_http_1_0_close_delimited_response_is_relayed_whole():
    reply = b"HTTP/1.0 200 OK\r\nX-Old: 1\r\n\r\n" + b"z" * 70_000
    async with ScriptBackend.replying(reply) as backend:
        config = {"version": 1, "rules": [{"backends": one(backend.url)}]}
        async with running(*LISTEN, config=config) as stack:
            response = await ask(stack.cluster_port, "a.test", "/")
            assert (response.status, response.body) == (200, b"z" * 70_000)
            assert response.header(b"x-old") == b"1"


# ----------------------------------------------------------------------------- client side


async def test_an_unread_request_body_is_never_parsed_as_a_request(echo):
    smuggled = request_bytes("GET", "/smuggled", HEALTHY)
    async with running(*LISTEN, config=with_healthy(echo, [
            {"hostnames": ["moved.test"], "filters": [
                {"type": "RequestRedirect", "requestRedirect": {"statusCode": 301}}]}])
            ) as stack:
        for host in ("nowhere.test", "moved.test"):
            client = await RawClient.connect(stack.cluster_port)
            client.send(request_bytes("POST", "/upload", host, body=smuggled))
            answer = await client.read_response()
            assert answer.status in (404, 301)
            client.send(request_bytes("GET", "/echo", HEALTHY))
            try:
                follow = await client.read_response()
            except (asyncio.IncompleteReadError, ConnectionError):
                follow = None  # closing the connection instead is fine too
            client.close()
            assert follow is None or follow.json()["path"] == "/echo"
    assert "/smuggled" not in [seen.target for seen in echo.requests]


# ----------------------------------------------------------------------------- step order


async def test_request_filters_answer_before_backend_availability_is_checked(echo):
    cors = {"type": "CORS", "cors": {"allowOrigins": ["https://a.test"],
                                     "allowMethods": ["GET"]}}
    rules = [
        # The redirect answers before the unavailable backend would.
        {"hostnames": ["redirect.test"], "filters": [
            {"type": "RequestRedirect", "requestRedirect": {"hostname": "b.test"}}],
         "backends": [{"url": echo.url, "weight": 1, "unavailableStatus": 503}]},
        # A preflight is answered even on a rule without backends...
        {"hostnames": ["cors.test"], "filters": [cors], "backends": None},
        # ...but a rule's unavailableStatus beats every filter (step 1).
        {"hostnames": ["down.test"], "unavailableStatus": 503, "filters": [
            {"type": "RequestRedirect", "requestRedirect": {"hostname": "b.test"}}]},
    ]
    async with running(*LISTEN, config=with_healthy(echo, rules)) as stack:
        port = stack.cluster_port
        moved = await ask(port, "redirect.test", "/x")
        assert (moved.status, moved.header(b"location")) == (302, b"http://b.test/x")
        preflight = await ask(port, "cors.test", "/", method="OPTIONS", headers=[
            ("Origin", "https://a.test"), ("Access-Control-Request-Method", "GET")])
        assert preflight.header(b"access-control-allow-origin") == b"https://a.test"
        assert (await ask(port, "cors.test", "/")).status == 500
        assert (await ask(port, "down.test", "/")).status == 503
    assert echo.requests == []
