"""The HTTP/1.1 entrance over real sockets: keep-alive, pipelining, bodies, framing,
100-continue, upgrades, limits, timeouts, PROXY protocol, admission."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import stat

import pytest

from proxy.entrances.body import BODY_HIGH_WATER
from proxy.entrances.listener import EntranceSettings, serve_entrance
from proxy.request import BodyError, Request, Responder
from tests.helpers import HOST, RawClient, on_uvloop, running_entrance

GET = b"GET /x HTTP/1.1\r\nHost: a.example\r\n\r\n"


class Recorder:
    """A test handle: records each request (with its body) and answers per request."""

    def __init__(self) -> None:
        self.requests: list[tuple[Request, bytes]] = []

    async def __call__(self, request: Request, responder: Responder) -> None:
        body = b""
        while chunk := await request.body.read():
            body += chunk
        self.requests.append((request, body))
        text = f"{request.method} {request.host} {request.path}?{request.query} {len(body)}"
        responder.respond(200, [(b"Content-Type", b"text/plain")], text.encode())


# ------------------------------------------------------------------ keep-alive, order


@on_uvloop
async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        for i in range(3):
            client.send(b"GET /r%d?q=%d HTTP/1.1\r\nHost: a.example\r\n\r\n" % (i, i))
            response = await client.read_response()
            assert response.status == 200
            assert response.body == b"GET a.example /r%d?q=%d 0" % (i, i)
            assert response.header(b"connection") is None  # 1.1 default: kept alive
        client.close()
    assert [r.path for r, _ in recorder.requests] == ["/r0", "/r1", "/r2"]


@on_uvloop
async def test_pipelined_requests_are_answered_in_order() -> None:
    handled: list[str] = []

    async def handle(request: Request, responder: Responder) -> None:
        # The first request is the slowest: answers must still come out in order.
        await asyncio.sleep({"/1": 0.05, "/2": 0.01, "/3": 0.0}[request.path])
        handled.append(request.path)
        responder.respond(200, [], request.path.encode())

    async with running_entrance(handle) as port:
        client = await RawClient.connect(port)
        client.send(b"".join(b"GET /%d HTTP/1.1\r\nHost: h\r\n\r\n" % i for i in (1, 2, 3)))
        bodies = [(await client.read_response()).body for _ in range(3)]
        client.close()
    assert bodies == [b"/1", b"/2", b"/3"]
    assert handled == ["/1", "/2", "/3"]  # one at a time, never overlapping


@on_uvloop
async def test_pipelined_bodies_stay_with_their_requests() -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
                    b"POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"2\r\nde\r\n1\r\nf\r\n0\r\n\r\n"
                    b"GET /c HTTP/1.1\r\nHost: h\r\n\r\n")
        for _ in range(3):
            assert (await client.read_response()).status == 200
        client.close()
    assert [(r.path, body) for r, body in recorder.requests] == [
        ("/a", b"abc"), ("/b", b"def"), ("/c", b"")]


# ---------------------------------------------------------------------------- bodies


@on_uvloop
async def test_request_bodies_content_length_and_chunked() -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        payload = os.urandom(200_000)
        client.send(b"PUT /cl HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(payload)
                    + payload)
        assert (await client.read_response()).body.endswith(b" 200000")
        client.send(b"POST /ch HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
        assert (await client.read_response()).body.endswith(b" 11")
        client.close()
    assert recorder.requests[0][0].body.length == 200_000
    assert recorder.requests[0][1] == payload
    assert recorder.requests[1][0].body.length is None
    assert recorder.requests[1][1] == b"hello world"


@on_uvloop
async def test_streamed_responses_chunked_with_trailers_or_content_length() -> None:
    async def handle(request: Request, responder: Responder) -> None:
        if request.path == "/chunked":
            responder.start(200, [(b"Content-Type", b"text/plain")])
            await responder.write(b"hello ")
            await asyncio.sleep(0.01)
            await responder.write(b"world")
            responder.finish([(b"Grpc-Status", b"0")])
        else:
            responder.start(200, [(b"Content-Length", b"10")])
            await responder.write(b"01234")
            await responder.write(b"56789")
            responder.finish()

    async with running_entrance(handle) as port:
        client = await RawClient.connect(port)
        client.send(b"GET /chunked HTTP/1.1\r\nHost: h\r\nTE: trailers\r\n\r\n")
        response = await client.read_response()
        assert response.header(b"transfer-encoding") == b"chunked"
        assert response.body == b"hello world"
        assert response.trailers == [(b"Grpc-Status", b"0")]
        # Trailers go only to a client that announced it takes them (RFC 9110 §6.5).
        client.send(b"GET /chunked HTTP/1.1\r\nHost: h\r\n\r\n")
        response = await client.read_response()
        assert (response.body, response.trailers) == (b"hello world", [])
        client.send(b"GET /length HTTP/1.1\r\nHost: h\r\n\r\n")
        response = await client.read_response()
        assert response.header(b"content-length") == b"10"
        assert response.header(b"transfer-encoding") is None
        assert response.body == b"0123456789"
        client.close()


@on_uvloop
async def test_request_body_backpressure_bounds_buffering() -> None:
    seen: list[int] = []

    async def handle(request: Request, responder: Responder) -> None:
        await asyncio.sleep(0.3)  # the client keeps sending meanwhile
        seen.append(request.body.buffered)  # type: ignore[attr-defined]
        total = 0
        while chunk := await request.body.read():
            total += len(chunk)
        responder.respond(200, [], str(total).encode())

    size = 8 * 1024 * 1024
    async with running_entrance(handle) as port:
        client = await RawClient.connect(port)
        client.send(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % size)
        client.send(b"z" * size)
        response = await client.read_response()
        client.close()
    assert response.body == str(size).encode()
    assert seen[0] <= BODY_HIGH_WATER + 512 * 1024  # paused, not 8 MiB in memory


@on_uvloop
async def test_expect_100_continue_sent_on_first_read_only() -> None:
    recorder = Recorder()

    async def refuse(request: Request, responder: Responder) -> None:
        responder.respond(413, [], b"too big")

    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n"
                    b"Expect: 100-continue\r\n\r\n")
        interim = await client.read_response()
        assert interim.status == 100
        client.send(b"data")
        response = await client.read_response()
        assert response.status == 200 and response.body.endswith(b" 4")
        client.close()
    assert recorder.requests[0][1] == b"data"

    async with running_entrance(refuse) as port:
        client = await RawClient.connect(port)
        client.send(b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n"
                    b"Expect: 100-continue\r\n\r\n")
        response = await client.read_response()
        assert response.status == 413  # no 100 first: the handler never read
        assert response.header(b"connection") == b"close"
        assert await client.closed()


@on_uvloop
async def test_unread_small_body_is_discarded_large_one_closes() -> None:
    async def ignore_body(request: Request, responder: Responder) -> None:
        responder.respond(200, [], request.path.encode())

    async with running_entrance(ignore_body) as port:
        client = await RawClient.connect(port)
        client.send(b"POST /small HTTP/1.1\r\nHost: h\r\nContent-Length: 1000\r\n\r\n"
                    + b"s" * 1000 + GET)
        assert (await client.read_response()).body == b"/small"
        assert (await client.read_response()).body == b"/x"  # connection kept
        client.send(b"POST /big HTTP/1.1\r\nHost: h\r\nContent-Length: 1000000\r\n\r\n")
        response = await client.read_response()
        assert response.header(b"connection") == b"close"
        assert await client.closed()


# --------------------------------------------------------------------------- framing


@on_uvloop
async def test_head_204_304_have_no_body_and_keep_the_connection() -> None:
    async def handle(request: Request, responder: Responder) -> None:
        if request.path == "/204":
            responder.respond(204, [(b"Content-Length", b"99")])
        elif request.path == "/304":
            responder.start(304, [(b"ETag", b'"v1"')])
            responder.finish()
        elif request.path == "/head-stream":
            responder.start(200, [(b"Content-Length", b"1234")])
            await responder.write(b"ignored")
            responder.finish()
        else:
            responder.respond(200, [(b"Content-Type", b"text/plain")], b"hello")

    async with running_entrance(handle) as port:
        client = await RawClient.connect(port)
        client.send(b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n")
        response = await client.read_response(head=True)
        assert (response.status, response.header(b"content-length")) == (200, b"5")
        client.send(b"HEAD /head-stream HTTP/1.1\r\nHost: h\r\n\r\n")
        response = await client.read_response(head=True)
        assert response.header(b"content-length") == b"1234"
        client.send(b"GET /204 HTTP/1.1\r\nHost: h\r\n\r\n")
        response = await client.read_response()
        assert response.status == 204
        assert response.header(b"content-length") is None
        client.send(b"GET /304 HTTP/1.1\r\nHost: h\r\n\r\n")
        response = await client.read_response()
        assert response.status == 304 and response.header(b"transfer-encoding") is None
        client.send(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")  # nothing stray in between
        assert (await client.read_response()).body == b"hello"
        client.close()


@on_uvloop
async def test_http10_keep_alive_only_when_asked_and_close_delimited_streams() -> None:
    async def handle(request: Request, responder: Responder) -> None:
        if request.path == "/stream":
            responder.start(200, [])
            await responder.write(b"streamed")
            responder.finish()
        else:
            responder.respond(200, [], b"ok")

    async with running_entrance(handle) as port:
        client = await RawClient.connect(port)
        client.send(b"GET / HTTP/1.0\r\n\r\n")
        response = await client.read_response()
        assert response.header(b"connection") == b"close"
        assert await client.closed()

        client = await RawClient.connect(port)
        client.send(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        response = await client.read_response()
        assert response.header(b"connection") == b"keep-alive"
        client.send(b"GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        response = await client.read_response()  # no length: read to EOF
        assert response.body == b"streamed"
        assert response.header(b"transfer-encoding") is None

        # RFC 9112 §9.6: "close" wins over a "keep-alive" beside it (llhttp lets the
        # keep-alive of an HTTP/1.0 request outweigh it), in one field or two.
        for fields in (b"Connection: keep-alive, close\r\n",
                       b"Connection: keep-alive\r\nConnection: close\r\n"):
            client = await RawClient.connect(port)
            client.send(b"GET / HTTP/1.0\r\n" + fields + b"\r\nGET / HTTP/1.0\r\n\r\n")
            response = await client.read_response()
            assert response.header(b"connection") == b"close"
            assert await client.closed()


# Each read as the client sends it (a short pause between reads), and the version each
# request must be seen with. The request line is read from the bytes when a request
# begins a read, from llhttp otherwise: every shape must agree with llhttp.
VERSION_READS = {
    "one-1.1": ([b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"], ["1.1"]),
    "one-1.0": ([b"GET /a HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n"],
                ["1.0"]),
    "pipelined-1.1-then-1.0": ([b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
                                b"GET /b HTTP/1.0\r\nHost: h\r\n\r\n"], ["1.1", "1.0"]),
    "pipelined-1.0-then-1.1": ([b"GET /a HTTP/1.0\r\nHost: h\r\nConnection: keep-alive"
                                b"\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n"],
                               ["1.0", "1.1"]),
    "line-split": ([b"GET /a HTT", b"P/1.0\r\nHost: h\r\n\r\n"], ["1.0"]),
    "head-split-after-line": ([b"GET /a HTTP/1.1\r\n", b"Host: h\r\n\r\n"], ["1.1"]),
    "absolute-form-1.0": ([b"GET http://h/a?b HTTP/1.0\r\nHost: h\r\n\r\n"], ["1.0"]),
    "absolute-form-1.1": ([b"GET http://h/a?b HTTP/1.1\r\nHost: h\r\n\r\n"], ["1.1"]),
    "large-read-1.1": ([b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 40000\r\n\r\n"
                        + b"x" * 40000], ["1.1"]),
    "large-read-1.0": ([b"POST /a HTTP/1.0\r\nHost: h\r\nContent-Length: 40000\r\n\r\n"
                        + b"x" * 40000], ["1.0"]),
    "leading-blank-line": ([b"\r\nGET /a HTTP/1.0\r\nHost: h\r\n\r\n"], ["1.0"]),
    "1.1-look-alike-in-a-field": (
        [b"GET /a HTTP/1.0\r\nX: y HTTP/1.1\r\nHost: h\r\n\r\n"], ["1.0"]),
    # A later 1.x minor is served as 1.1, the highest this side speaks (RFC 9112 §2.3),
    # kept alive like one.
    "1.2-then-1.1": ([b"GET /a HTTP/1.2\r\nHost: h\r\n\r\n"
                      b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n"], ["1.1", "1.1"]),
    "1.9-split": ([b"GET /a HTTP/1.", b"9\r\nHost: h\r\n\r\n"], ["1.1"]),
    "next-begins-in-the-body-read": (
        [b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n",
         b"okGET /b HTTP/1.0\r\nHost: h\r\n\r\n"], ["1.1", "1.0"]),
}


@pytest.mark.parametrize("case", VERSION_READS)
@on_uvloop
async def test_the_http_version_is_the_request_lines_whatever_the_reads(case: str) -> None:
    reads, versions = VERSION_READS[case]
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        for data in reads:
            client.send(data)
            await client.writer.drain()
            await asyncio.sleep(0.02)
        for _ in versions:
            assert (await client.read_response()).status == 200
        client.close()
    assert [request.http_version for request, _ in recorder.requests] == versions


@on_uvloop
async def test_connection_close_from_client_is_honoured() -> None:
    async with running_entrance(Recorder()) as port:
        client = await RawClient.connect(port)
        client.send(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" + GET)
        response = await client.read_response()
        assert response.header(b"connection") == b"close"
        assert await client.closed()  # the pipelined second request is not served


@on_uvloop
async def test_absolute_form_target_routes_by_its_authority() -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(b"GET http://B.example:8080/p/q?x=1#frag HTTP/1.1\r\nHost: other\r\n\r\n")
        assert (await client.read_response()).status == 200
        client.close()
    request = recorder.requests[0][0]
    assert (request.host, request.path, request.query) == ("B.example:8080", "/p/q", "x=1")


# ------------------------------------------------------------------- handler failures


@on_uvloop
async def test_handler_errors_500_before_start_abort_after() -> None:
    async def handle(request: Request, responder: Responder) -> None:
        if request.path == "/late":
            responder.start(200, [])
            await responder.write(b"partial")
            await asyncio.sleep(0.01)
        elif request.path == "/split":
            responder.respond(200, [(b"X-Evil", b"a\r\nSet-Cookie: x=1")], b"")
        raise RuntimeError("boom")

    async with running_entrance(handle) as port:
        client = await RawClient.connect(port)
        client.send(b"GET /early HTTP/1.1\r\nHost: h\r\n\r\n")
        assert (await client.read_response()).status == 500
        client = await RawClient.connect(port)
        client.send(b"GET /split HTTP/1.1\r\nHost: h\r\n\r\n")
        response = await client.read_response()
        assert response.status == 500 and response.header(b"set-cookie") is None
        client = await RawClient.connect(port)
        client.send(b"GET /late HTTP/1.1\r\nHost: h\r\n\r\n")
        raw = await client.read_all()
        assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"partial" in raw and not raw.endswith(b"0\r\n\r\n")  # no clean end


@on_uvloop
async def test_client_going_away_aborts_and_cancels_the_handler() -> None:
    events: list[str] = []
    started = asyncio.Event()

    async def handle(request: Request, responder: Responder) -> None:
        started.set()
        try:
            await request.body.read()  # the client vanishes mid-body
        except BodyError:
            events.append("body error")
        try:
            await asyncio.sleep(10)  # e.g. waiting on a backend
        except asyncio.CancelledError:
            events.append(f"cancelled aborted={responder.aborted}")
            raise

    async with running_entrance(handle) as port:
        client = await RawClient.connect(port)
        client.send(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n")
        await started.wait()
        client.close()
        for _ in range(100):
            if len(events) == 2:
                break
            await asyncio.sleep(0.01)
    assert events == ["body error", "cancelled aborted=True"]


# ------------------------------------------------------------------------- upgrades


@on_uvloop
async def test_upgrade_hands_over_the_raw_stream_with_early_bytes_first() -> None:
    async def handle(request: Request, responder: Responder) -> None:
        assert request.upgrade == "websocket"
        stream = await responder.upgrade([(b"Sec-WebSocket-Accept", b"x")])
        data = await stream.read()
        await stream.write(b"echo:" + data)
        data = await stream.read()
        await stream.write(b"echo:" + data)
        stream.close()

    async with running_entrance(handle) as port:
        client = await RawClient.connect(port)
        client.send(b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Upgrade\r\n"
                    b"Upgrade: WebSocket\r\n\r\nearly")
        response = await client.read_response(head=True)
        assert response.status == 101
        assert response.header(b"upgrade") == b"websocket"
        assert (await client.reader.readexactly(10)) == b"echo:early"
        client.send(b"later")
        assert (await client.reader.readexactly(10)) == b"echo:later"
        assert await client.closed()


@on_uvloop
async def test_upgrade_request_answered_normally_keeps_parsing() -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n"
                    b"Upgrade: websocket\r\n\r\n" + GET)
        assert (await client.read_response()).status == 200
        assert (await client.read_response()).status == 200
        # An upgrade request with a body: the Upgrade is ignored, the body is a body.
        client.send(b"POST /h2c HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n"
                    b"Upgrade: h2c\r\nContent-Length: 5\r\n\r\nhello" + GET)
        assert (await client.read_response()).body.endswith(b" 5")
        assert (await client.read_response()).status == 200
        client.close()
    assert [r.upgrade for r, _ in recorder.requests] == ["websocket", None, None, None]
    assert recorder.requests[2][1] == b"hello"


@on_uvloop
async def test_upgrade_request_with_a_chunked_body_is_read_as_a_request() -> None:
    # llhttp takes what follows an upgrade head for the new protocol; the entrance
    # ignores the Upgrade and parses the chunked body (and its trailer) itself, also
    # when the chunks arrive in reads of their own.
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(b"POST /h2c HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n"
                    b"Upgrade: h2c\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
        await asyncio.sleep(0.05)
        client.send(b"lo\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n" + GET)
        assert (await client.read_response()).body.endswith(b" 8")
        assert (await client.read_response()).status == 200
        client.close()
    assert [(r.upgrade, body) for r, body in recorder.requests] == [
        (None, b"helloabc"), (None, b"")]
    assert recorder.requests[0][0].body.trailers == [(b"X-T", b"1")]


# --------------------------------------------------------------------- limits, timers


@on_uvloop
async def test_request_line_and_header_limits() -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        cases = [
            (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: h\r\n\r\n", 414),
            (b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + b"v" * 70_000 + b"\r\n\r\n", 431),
            (b"GET / HTTP/1.1\r\nHost: h\r\n"
             + b"".join(b"X-%d: v\r\n" % i for i in range(101)) + b"\r\n", 431),
        ]
        for raw, status in cases:
            client = await RawClient.connect(port)
            client.send(raw)
            response = await client.read_response()
            assert response.status == status
            assert response.header(b"connection") == b"close"
            assert await client.closed()
        # Just inside the limits is fine.
        client = await RawClient.connect(port)
        client.send(b"GET /" + b"a" * 8000 + b" HTTP/1.1\r\nHost: h\r\nX-Big: "
                    + b"v" * 60_000 + b"\r\n\r\n")
        assert (await client.read_response()).status == 200
        client.close()
    assert len(recorder.requests) == 1


@on_uvloop
async def test_endless_header_is_cut_off_without_buffering_it_all() -> None:
    async with running_entrance(Recorder()) as port:
        client = await RawClient.connect(port)
        client.send(b"GET / HTTP/1.1\r\nHost: h\r\nX-Endless: ")
        for _ in range(20):
            client.send(b"v" * 16384)
        response = await client.read_response()
        assert response.status == 431


@on_uvloop
async def test_header_timeout_408_after_partial_head_silent_when_idle() -> None:
    async with running_entrance(Recorder(), header_timeout=0.2, idle_timeout=0.3) as port:
        client = await RawClient.connect(port)
        client.send(b"GET / HTTP/1.1\r\nHost:")
        response = await client.read_response(timeout=2)
        assert response.status == 408
        assert await client.closed()

        silent = await RawClient.connect(port)
        assert await silent.read_all(timeout=2) == b""  # no byte sent: just closed

        kept = await RawClient.connect(port)
        kept.send(GET)
        assert (await kept.read_response()).status == 200
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert await kept.read_all(timeout=2) == b""  # idle timeout: closed, no 408
        assert loop.time() - began >= 0.25


@on_uvloop
async def test_max_connections_refuses_extra_connections() -> None:
    async with running_entrance(Recorder(), max_connections=2) as port:
        first = await RawClient.connect(port)
        second = await RawClient.connect(port)
        for client in (first, second):
            client.send(GET)
            assert (await client.read_response()).status == 200
        third = await RawClient.connect(port)
        assert (await third.read_response()).status == 503  # told why, then closed
        assert await third.closed(timeout=2)
        first.close()
        await asyncio.sleep(0.05)
        fourth = await RawClient.connect(port)
        fourth.send(GET)
        assert (await fourth.read_response()).status == 200
        second.close()
        fourth.close()


# -------------------------------------------------------------- PROXY protocol, admission

PROBER_V2 = (bytes.fromhex("0D0A0D0A000D0A515549540A") + b"\x21\x11\x00\x0c"
             + bytes([10, 1, 2, 3]) + bytes([10, 9, 9, 9])
             + (40001).to_bytes(2, "big") + (80).to_bytes(2, "big"))


@pytest.mark.parametrize("header, client_ip", [
    (PROBER_V2, "10.1.2.3"),
    (b"PROXY TCP4 192.0.2.7 198.51.100.1 5555 80\r\n", "192.0.2.7"),
    (b"PROXY TCP6 2001:db8::1 2001:db8::2 5555 80\r\n", "2001:db8::1"),
    (b"PROXY UNKNOWN\r\n", HOST),
])
@on_uvloop
async def test_proxy_protocol_sets_the_client_address(header: bytes, client_ip: str) -> None:
    recorder = Recorder()
    async with running_entrance(recorder, proxy_protocol=True) as port:
        client = await RawClient.connect(port)
        client.send(header[:5])  # the header may arrive in pieces
        await asyncio.sleep(0.01)
        client.send(header[5:] + GET)
        assert (await client.read_response()).status == 200
        client.send(GET)  # only the first bytes of a connection are a PROXY header
        assert (await client.read_response()).status == 200
        client.close()
    assert [r.client_ip for r, _ in recorder.requests] == [client_ip, client_ip]


@pytest.mark.parametrize("opening", [
    GET,  # header required
    b"PROXY TCP4 999.0.0.1 10.0.0.1 1 2\r\n" + GET,
    PROBER_V2[:12] + b"\x31" + PROBER_V2[13:] + GET,  # version 3
    b"PROXY " + b"x" * 200,
])
@on_uvloop
async def test_malformed_or_missing_proxy_header_closes_silently(opening: bytes) -> None:
    recorder = Recorder()
    async with running_entrance(recorder, proxy_protocol=True) as port:
        client = await RawClient.connect(port)
        client.send(opening)
        assert await client.read_all() == b""
    assert recorder.requests == []


@on_uvloop
async def test_allow_list_filters_the_client_address() -> None:
    recorder = Recorder()
    ten = [ipaddress.ip_network("10.0.0.0/8")]
    async with running_entrance(recorder, allow=ten) as port:
        client = await RawClient.connect(port)
        client.send(GET)
        assert await client.read_all() == b""  # 127.0.0.1 is not allowed
    async with running_entrance(recorder, allow=ten, proxy_protocol=True) as port:
        client = await RawClient.connect(port)
        client.send(PROBER_V2 + GET)  # claiming source 10.1.2.3 does not get it in
        assert await client.read_all() == b""
    loopback = [ipaddress.ip_network("127.0.0.0/8")]
    async with running_entrance(recorder, allow=loopback, proxy_protocol=True) as port:
        client = await RawClient.connect(port)
        client.send(PROBER_V2 + GET)  # allowed peer; the PROXY source is the client
        assert (await client.read_response()).status == 200
        client.close()
    assert [r.client_ip for r, _ in recorder.requests] == ["10.1.2.3"]


@on_uvloop
@pytest.mark.parametrize("header", [PROBER_V2, b"PROXY TCP4 10.1.2.3 10.0.0.1 5 80\r\n"])
async def test_proxy_header_on_an_entrance_without_proxy_protocol_gets_no_answer(
        header: bytes) -> None:
    # An HTTP 400 here would count as success for Knative's prober.
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(header + GET)
        assert await client.read_all() == b""
    assert recorder.requests == []


@on_uvloop
async def test_unix_socket_entrance(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "origin.sock")
    recorder = Recorder()
    server = await serve_entrance(recorder, EntranceSettings(name="tunnel"), path=path)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
        client = await RawClient.connect(0, path=path)
        client.send(GET)
        assert (await client.read_response()).status == 200
        client.close()
    finally:
        server.close()
        await server.wait_closed()
    request = recorder.requests[0][0]
    assert (request.entrance, request.client_ip) == ("tunnel", None)
