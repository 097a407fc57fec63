"""Misbehaving backends, end to end over real sockets: every answer the client gets is
the backend's own answer to *its* request, or a 502 — never 0 bytes, never another
client's response, never a complete-looking truncated body.

Each backend here is a raw asyncio server on 127.0.0.1 that writes exactly the bytes a
case gives it; the proxy runs as ``tunnelgate serve`` would (tests.stack.running).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import threading
import time
from typing import Any, AsyncIterator

import pytest

from proxy.request import EMPTY_BODY
from proxy.upstream.registry import Pools
from routing.model import Backend
from tests.helpers import (
    HOST, READ_TIMEOUT, LoopbackServer, RawClient, RawResponse, ScriptBackend, Step)
from tests.stack import running
from tests.test_e2e_filters import one
from tests.test_e2e_routing import LISTEN, request_bytes

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
POISON = b"HTTP/1.1 200 OK\r\nX-Poison: 1\r\nContent-Length: 6\r\n\r\nPOISON"
# 100 KiB, no two adjacent 1 KiB blocks alike: a piece relayed twice or skipped shows.
BIG_BODY = b"".join(b"%04d" % i * 256 for i in range(100))
BIG_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG_BODY)
BIG = BIG_HEAD + BIG_BODY

def config_for(url: str) -> dict[str, Any]:
    return {"version": 1, "rules": [{"backends": one(url)}]}


@contextlib.asynccontextmanager
async def proxied(backend: LoopbackServer, *flags: str) -> AsyncIterator[int]:
    async with running(*LISTEN, *flags, config=config_for(backend.url)) as stack:
        yield stack.cluster_port


async def ask_raw(port: int, data: bytes, *, head: bool = False) -> RawResponse:
    client = await RawClient.connect(port)
    try:
        client.send(data)
        return await client.read_response(head=head)
    finally:
        client.close()


def get(path: str = "/", *headers: tuple[str, str], method: str = "GET") -> bytes:
    return request_bytes(method, path, "app.test", headers)


# ------------------------------------------------------------- early final response


async def upload(client: RawClient, head: bytes, pieces: list[bytes]) -> None:
    """Send ``head`` then ``pieces`` a little apart, as a slow uploader does; stop
    quietly when the proxy closes."""
    try:
        client.send(head)
        for piece in pieces:
            await asyncio.sleep(0.005)
            client.send(piece)
            await client.writer.drain()
    except ConnectionError:
        pass


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("close", [False, True], ids=["keep-open", "connection-close"])
async def test_an_early_answer_reaches_the_client_and_the_upload_stops(chunked, close):
    """A backend that answers (413, one write) before reading the body: the client
    gets that answer, then the connection ends (the body left is too large to
    swallow), and the proxy stays usable."""
    answer = (b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 4\r\n"
              + (b"Connection: close\r\n" if close else b"") + b"\r\nbig!")
    steps: list[Step] = [(0, answer)] + ([(0, b"")] if close else [(None, b"")])
    backend = ScriptBackend(steps, [(0, OK)])
    body = b"x" * 100_000
    pieces = [body[i:i + 16384] for i in range(0, len(body), 16384)]
    if chunked:
        head = (b"POST /up HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n")
        pieces = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]
    else:
        head = b"POST /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100000\r\n\r\n"
    async with backend:
        async with proxied(backend) as port:
            client = await RawClient.connect(port)
            sender = asyncio.ensure_future(upload(client, head, pieces))
            response = await client.read_response()
            assert (response.status, response.body) == (413, b"big!")
            assert response.header(b"connection") == b"close"
            assert await client.closed()
            await sender
            client.close()
            again = await ask_raw(port, get())
            assert (again.status, again.body) == (200, b"ok")


async def test_an_early_answer_to_a_small_upload_keeps_the_client_connection():
    """The rest of a body within the discard bound is read and dropped instead."""
    backend = ScriptBackend([(0, b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno")],
                            [(0, OK)])
    async with backend:
        async with proxied(backend) as port:
            client = await RawClient.connect(port)
            client.send(b"PUT /up HTTP/1.1\r\nHost: app.test\r\nContent-Length: 30000\r\n\r\n"
                        + b"y" * 20000)
            response = await client.read_response()
            assert (response.status, response.body) == (403, b"no")
            assert response.header(b"connection") is None
            client.send(b"y" * 10000 + get())
            again = await client.read_response()
            assert (again.status, again.body) == (200, b"ok")
            client.close()


# ------------------------------------------------------------------ response desync


async def two_clients(port: int, first: bytes, gap: float, *, head: bool) -> RawResponse:
    """``first`` from one client, then (``gap`` s later) a GET from another; the
    second client's response."""
    response = await ask_raw(port, first, head=head)
    assert response.status < 400
    await asyncio.sleep(gap)
    return await ask_raw(port, get("/second"))


DESYNC_CASES = {
    # HEAD answered with a length (kept alive: RFC 9110 §9.3.2 makes that length
    # normal); a whole response follows 300 ms later, while the connection is idle.
    # (Bytes a backend holds back until the next request went out are past any guard:
    # see proxy.wire.framing.poolable.)
    "head-late-response-idle": ("HEAD", [
        (0, b"HTTP/1.1 200 OK\r\nContent-Length: 57\r\n\r\n"), (0.3, POISON)], 0.5),
    # The same bytes in the same segment as the answer.
    "head-burst": ("HEAD", [(0, b"HTTP/1.1 200 OK\r\nContent-Length: 57\r\n\r\n" + POISON)],
                   0.0),
    "204-body-burst": ("GET", [(0, b"HTTP/1.1 204 No Content\r\n\r\n" + POISON)], 0.0),
    "204-announced-body-late": ("GET", [
        (0, b"HTTP/1.1 204 No Content\r\nContent-Length: 6\r\n\r\n"), (0.3, POISON)], 0.0),
    "304-chunked-late": ("GET", [
        (0, b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n"),
        (0.3, POISON)], 0.0),
    "past-content-length-burst": ("GET", [(0, OK + POISON)], 0.0),
    "past-content-length-no-body-burst": ("GET", [
        (0, OK + b"HTTP/1.1 200 OK\r\nX-Poison: 1\r\nContent-Length: 0\r\n\r\n")], 0.0),
    "past-content-length-idle": ("GET", [(0, OK), (0.3, POISON)], 0.5),
    # A body large enough to pass llhttp by (proxy.upstream.reader.PASS_THROUGH), and
    # the same bytes after it: in its last read, or in a read of their own.
    "large-past-content-length-burst": ("GET", [(0, BIG + POISON)], 0.0),
    "large-past-content-length-idle": ("GET", [(0, BIG), (0.3, POISON)], 0.5),
    "large-head-then-body-then-more": ("GET", [
        (0, BIG_HEAD), (0.05, BIG_BODY + POISON)], 0.0),
    "large-head-announced-late": ("HEAD", [(0, BIG_HEAD), (0.3, BIG_BODY)], 0.5),
    "large-304-announced-body-burst": ("GET", [
        (0, b"HTTP/1.1 304 Not Modified\r\nContent-Length: 100000\r\n\r\n" + POISON)],
        0.0),
}


@pytest.mark.parametrize("case", DESYNC_CASES)
async def test_bytes_after_a_complete_response_never_reach_the_next_client(case):
    method, steps, gap = DESYNC_CASES[case]
    backend = ScriptBackend(steps, [(0, OK)])
    async with backend:
        async with proxied(backend) as port:
            second = await two_clients(port, get("/first", method=method), gap,
                                       head=method == "HEAD")
            assert second.header(b"x-poison") is None
            assert (second.status, second.body) == (200, b"ok")


def test_a_reused_connection_with_unread_bytes_is_not_trusted():
    """Bytes that reached the socket before the next request was written (the loop had
    not delivered them yet) are not that request's answer: the connection is dropped
    and the request goes out on a fresh one. The backend runs in a thread so its late
    bytes arrive while the proxy's loop is blocked."""
    listener = socket.create_server((HOST, 0))
    port = listener.getsockname()[1]
    late = threading.Event()
    accepted: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(READ_TIMEOUT)
        first, _ = listener.accept()
        accepted.append(first)
        first.recv(65536)
        first.sendall(OK)
        late.wait(READ_TIMEOUT)
        first.sendall(POISON)  # out of turn, on the idle connection
        second, _ = listener.accept()
        accepted.append(second)
        second.recv(65536)
        second.sendall(OK)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def run() -> None:
        pools = Pools()
        pool = pools.get(Backend(url=f"http://{HOST}:{port}"))
        try:
            response = await pool.send("GET", "/a", [(b"Host", b"h")], EMPTY_BODY)
            assert await response.read() == b"ok"
            late.set()
            time.sleep(0.2)  # the loop is blocked: the late bytes wait in the socket
            response = await pool.send("GET", "/b", [(b"Host", b"h")], EMPTY_BODY)
            assert response.headers == [(b"Content-Length", b"2")]
            assert await response.read() == b"ok"
        finally:
            pools.close()

    try:
        asyncio.run(asyncio.wait_for(run(), 10))
        thread.join(READ_TIMEOUT)
        assert len(accepted) == 2
    finally:
        for sock in accepted:
            sock.close()
        listener.close()


# ------------------------------------------------------------------------- trailers


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_framing_and_hop_by_hop_trailers_are_dropped_and_do_not_break_the_next():
    trailer = (b"2\r\nok\r\n0\r\nConnection: close\r\nKeep-Alive: timeout=5\r\n"
               b"Host: evil.test\r\nTE: trailers\r\nUpgrade: h2c\r\nTrailer: X\r\n"
               b"Proxy-Authorization: secret\r\nX-Checksum: abc\r\n\r\n")
    backend = ScriptBackend([(0, CHUNKED_HEAD + trailer)], [(0, OK)])
    async with backend:
        async with proxied(backend) as port:
            first = await ask_raw(port, get("/t", ("TE", "trailers")))
            assert (first.status, first.body) == (200, b"ok")
            assert first.trailers == [(b"X-Checksum", b"abc")]
            second = await ask_raw(port, get("/next"))  # another client
            assert (second.status, second.body) == (200, b"ok")


async def test_response_trailers_only_for_clients_that_announce_them():
    trailer = b"2\r\nok\r\n0\r\nGrpc-Status: 0\r\n\r\n"
    backend = ScriptBackend([(0, CHUNKED_HEAD + trailer)])
    async with backend:
        async with proxied(backend) as port:
            without = await ask_raw(port, get("/t"))
            assert (without.body, without.trailers) == (b"ok", [])
            announced = await ask_raw(port, get("/t", ("TE", "trailers")))
            assert (announced.body, announced.trailers) == (b"ok", [(b"Grpc-Status", b"0")])


class RecordingBackend(LoopbackServer):
    """Reads one whole chunked or sized request (raw bytes kept in ``received``) and
    answers ``OK``."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[bytes] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if b"transfer-encoding: chunked" in head.lower():
                rest = await reader.readuntil(b"0\r\n")
                while not rest.endswith(b"\r\n\r\n"):
                    rest += await reader.readuntil(b"\r\n")
            else:
                rest = b""
            self.received.append(head + rest)
            writer.write(OK)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


async def test_request_trailers_are_forwarded_minus_framing_fields():
    backend = RecordingBackend()
    async with backend:
        async with proxied(backend) as port:
            response = await ask_raw(port, (
                b"POST /up HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n"
                b"\r\n3\r\nabc\r\n0\r\nX-Checksum: 900150983cd2\r\nHost: evil.test\r\n"
                b"Keep-Alive: timeout=1\r\nTrailer: X-Checksum\r\n\r\n"))
            assert response.status == 200
    sent = backend.received[0]
    assert sent.endswith(b"3\r\nabc\r\n0\r\nX-Checksum: 900150983cd2\r\n\r\n")
    assert b"evil.test" not in sent


async def test_te_reaches_an_http1_backend_as_trailers_alone():
    # TE is hop-by-hop (RFC 9110 §10.1.4): the client's value stops here, and this hop
    # announces "trailers" only when the client did (it relays them to that client).
    backend = RecordingBackend()
    async with backend:
        async with proxied(backend) as port:
            for te in ("trailers, deflate", "deflate"):
                response = await ask_raw(port, get("/", ("TE", te)))
                assert response.status == 200
    with_trailers, without = (received.lower() for received in backend.received)
    assert b"\r\nte: trailers\r\n" in with_trailers and b"deflate" not in with_trailers
    assert b"\r\nte:" not in without


# A backend answer's head, and whether its connection may carry the next request
# (RFC 9112 §9.3: HTTP/1.1 persists unless "close"; HTTP/1.0 only with "keep-alive";
# a body read to the close never does).
PERSISTENCE = {
    "1.1 length": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
    "1.1 chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"2\r\nok\r\n0\r\n\r\n", True),
    "1.1 close": (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
                  False),
    "1.1 keep-alive": (b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive\r\n"
                       b"Content-Length: 2\r\n\r\nok", True),
    "1.1 keep-alive then close": (b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n"
                                  b"Connection: close\r\nContent-Length: 2\r\n\r\nok",
                                  False),
    "1.1 keep-alive, close": (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\n"
                              b"Content-Length: 2\r\n\r\nok", False),
    "1.1 proxy-connection close": (b"HTTP/1.1 200 OK\r\nProxy-Connection: close\r\n"
                                   b"Content-Length: 2\r\n\r\nok", False),
    "1.0 length": (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
    "1.0 keep-alive": (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n"
                       b"Content-Length: 2\r\n\r\nok", True),
    "1.1 chunked, close in the trailers": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\nConnection: close\r\n\r\n", False),
}


@pytest.mark.parametrize("case", PERSISTENCE)
async def test_the_backend_connection_persists_as_its_answer_says(case):
    answer, persists = PERSISTENCE[case]
    closes = [] if persists else [(0, b"")]
    backend = ScriptBackend([(0, answer)] + closes, [(0, OK)])
    async with backend:
        async with proxied(backend) as port:
            first = await ask_raw(port, get("/first"))
            second = await ask_raw(port, get("/second"))
    assert (first.status, first.body, second.status) == (200, b"ok", 200)
    assert backend.connections == (1 if persists else 2)


@pytest.mark.parametrize("case", PERSISTENCE)
async def test_a_later_answer_on_a_kept_connection_decides_its_persistence_too(case):
    """The same answers as the second on a connection that an HTTP/1.1 answer kept, and
    from a backend that never closes: the version and fields of *that* answer decide
    (an HTTP/1.0 one after HTTP/1.1 ones ends the connection), and the next client's
    request gets its own answer either way."""
    answer, persists = PERSISTENCE[case]
    backend = ScriptBackend([(0, OK)], [(0, answer)], [(0, OK)])
    async with backend:
        async with proxied(backend) as port:
            answers = [await ask_raw(port, get(f"/{n}")) for n in range(3)]
    assert [(a.status, a.body) for a in answers] == [(200, b"ok")] * 3
    assert backend.connections == (1 if persists else 2)


async def test_an_answer_in_another_major_version_is_a_502_and_not_reused():
    other = b"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
    backend = ScriptBackend([(0, OK)], [(0, other)], [(0, OK)])
    async with backend:
        async with proxied(backend) as port:
            answers = [await ask_raw(port, get(f"/{n}")) for n in range(3)]
    assert [a.status for a in answers] == [200, 502, 200]
    assert backend.connections == 2


# ------------------------------------------------- large bodies relayed past llhttp

# How a backend may cut a large Content-Length answer into reads: head and body
# together, the head alone (a server sending its body from a file), the head split,
# a blank-line look-alike only inside the body, an interim answer first.
LARGE_ANSWERS = {
    "one-write": [(0, BIG)],
    "head-alone-then-pieces": [(0, BIG_HEAD)] + [
        (0.01, BIG_BODY[i:i + 30_000]) for i in range(0, len(BIG_BODY), 30_000)],
    "head-split": [(0, BIG_HEAD[:20]), (0.02, BIG_HEAD[20:] + BIG_BODY)],
    "blank-line-in-body": [(0, BIG_HEAD + b"\r\n\r\n" + BIG_BODY[4:])],
    "interim-first": [(0, b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + BIG)],
}


@pytest.mark.parametrize("case", LARGE_ANSWERS)
async def test_a_large_body_arrives_whole_and_the_connection_is_reused(case):
    body = BIG_BODY if case != "blank-line-in-body" else b"\r\n\r\n" + BIG_BODY[4:]
    backend = ScriptBackend(LARGE_ANSWERS[case], [(0, OK)])
    async with backend:
        async with proxied(backend) as port:
            client = await RawClient.connect(port)
            client.send(get("/large"))
            response = await client.read_response()
            while response.status < 200:
                response = await client.read_response()
            client.send(get("/after"))
            after = await client.read_response()
            client.close()
            assert (response.status, len(response.body)) == (200, len(body))
            assert response.body == body
            assert (after.status, after.body) == (200, b"ok")
            assert backend.connections == 1  # the answer ended where it said


async def test_a_large_body_cut_short_never_looks_complete():
    backend = ScriptBackend([(0, BIG[:60_000]), (0.05, b"")], [(0, OK)])
    async with backend:
        async with proxied(backend) as port:
            client = await RawClient.connect(port)
            client.send(get("/cut"))
            head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 5)
            rest = await client.read_all()
            client.close()
            assert head.startswith(b"HTTP/1.1 200")
            assert b"content-length: %d" % len(BIG_BODY) in head.lower()
            assert 0 < len(rest) < len(BIG_BODY) and BIG_BODY.startswith(rest)
            again = await ask_raw(port, get("/good"))
            assert (again.status, again.body) == (200, b"ok")


async def test_a_large_body_with_connection_close_is_not_reused():
    head = BIG_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    backend = ScriptBackend([(0, head + BIG_BODY), (None, b"")], [(0, OK)])
    async with backend:
        async with proxied(backend) as port:
            first = await ask_raw(port, get("/large"))
            second = await ask_raw(port, get("/after"))
            assert first.body == BIG_BODY and (second.status, second.body) == (200, b"ok")
            assert backend.connections == 2


# -------------------------------------------------------- broken framing, statuses


BAD_RESPONSES = {
    "trailer-content-length": CHUNKED_HEAD + b"2\r\nok\r\n0\r\nContent-Length: 999\r\n\r\n",
    "chunk-size-18-hex-digits": CHUNKED_HEAD + b"123456789012345678\r\nok\r\n",
    "status-999": b"HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\nok",
    "status-600": b"HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok",
    "status-line-http2": b"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "101-unasked": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
    # Chunked by RFC 9110's list rules, not to llhttp: relaying would pass the framing on.
    "te-chunked-trailing-comma": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked,\r\n\r\n"
                                 b"2\r\nok\r\n0\r\n\r\n",
    "te-chunked-trailing-tab": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\t\r\n\r\n"
                               b"2\r\nok\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("case", BAD_RESPONSES)
async def test_a_response_broken_in_its_first_read_is_a_502(case):
    backend = ScriptBackend([(0, BAD_RESPONSES[case])], [(0, OK)])
    async with backend:
        async with proxied(backend) as port:
            response = await ask_raw(port, get("/bad"))
            assert (response.status, response.body) == (502, b"bad gateway\n")
            again = await ask_raw(port, get("/good"))
            assert (again.status, again.body) == (200, b"ok")


async def test_a_close_delimited_gzip_coded_body_is_reframed_with_its_end():
    """RFC 9112 §6.3 rule 4: Transfer-Encoding without chunked last ends at close.
    The client gets the coded bytes announced as ``gzip, chunked``, with a last chunk."""
    coded = gzip.compress(b"hello " * 1000)
    backend = ScriptBackend([(0, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"),
                             (0.05, coded), (0, b"")])
    async with backend:
        async with proxied(backend) as port:
            client = await RawClient.connect(port)
            client.send(get("/gz"))
            head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            assert head.startswith(b"HTTP/1.1 200 ")
            assert b"\r\nTransfer-Encoding: gzip, chunked\r\n" in head
            body, _ = await asyncio.wait_for(client._read_chunked(), READ_TIMEOUT)
            assert gzip.decompress(body) == b"hello " * 1000
            client.close()


# ------------------------------------------------------------------ head size caps


class EndlessHeadBackend(LoopbackServer):
    """Answers with a head that grows by ``piece`` bytes per write, up to ``total``;
    ``sent`` counts what it managed to write before the proxy hung up."""

    def __init__(self, piece: bytes, total: int) -> None:
        super().__init__()
        self.piece = piece
        self.total = total
        self.sent = 0
        self.cut = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\n")
            while self.sent < self.total:
                writer.write(self.piece)
                self.sent += len(self.piece)
                await writer.drain()
            writer.write(b"\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        except ConnectionError:
            self.cut.set()
        finally:
            self._writers.discard(writer)
            writer.close()


@pytest.mark.parametrize(("piece", "why"), [
    (b"X-Big: " + b"v" * (1 << 20), "one huge field"),
    (b"".join(b"X-F%d: 1\r\n" % i for i in range(10_000)), "ten thousand fields"),
])
async def test_an_oversized_response_head_is_a_502_and_never_buffered_whole(piece, why):
    backend = EndlessHeadBackend(piece, 100 << 20)  # up to 100 MB of head
    async with backend:
        async with proxied(backend) as port:
            response = await ask_raw(port, get("/big"))
            assert (response.status, response.body) == (502, b"bad gateway\n"), why
            await asyncio.wait_for(backend.cut.wait(), READ_TIMEOUT)
            assert backend.sent < 8 << 20  # cut off long before the 100 MB


@pytest.mark.parametrize(("flags", "environ_fields", "fields", "status"), [
    ((), None, 150, 200),  # under the default count
    ((), None, 250, 502),
    (("--max-response-header-count", "20"), None, 30, 502),
    (("--max-response-header-count", "20"), None, 10, 200),
    ((), "20", 30, 502),  # PROXY_MAX_RESPONSE_HEADER_COUNT
    (("--max-response-header-bytes", "2048"), None, 150, 502),  # ~4 KB of fields
    (("--max-response-header-bytes", "2048"), None, 40, 200),
])
async def test_response_head_caps_are_configurable(flags, environ_fields, fields, status):
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(
        b"X-Field-%03d: %s\r\n" % (i, b"v" * 10) for i in range(fields))
    backend = ScriptBackend([(0, head + b"Content-Length: 2\r\n\r\nok")])
    environ = ({"PROXY_MAX_RESPONSE_HEADER_COUNT": environ_fields}
               if environ_fields else None)
    async with backend:
        async with running(*LISTEN, *flags, config=config_for(backend.url),
                           environ=environ) as stack:
            response = await ask_raw(stack.cluster_port, get("/h"))
            assert response.status == status


# ------------------------------------------------------------------- 1xx, Date


INTERIM = (b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
           b"HTTP/1.1 102 Processing\r\n\r\n"
           b"HTTP/1.1 100 Continue\r\n\r\n")


async def test_interim_answers_reach_http11_clients_only():
    backend = ScriptBackend([(0, INTERIM), (0.05, OK)])
    async with backend:
        async with proxied(backend) as port:
            client = await RawClient.connect(port)
            client.send(get("/hints"))
            hints = await client.read_response()
            assert (hints.status, hints.header(b"link")) == (103, b"</style.css>; rel=preload")
            assert (await client.read_response()).status == 102
            final = await client.read_response()  # 100 is the proxy's own, not relayed
            assert (final.status, final.body) == (200, b"ok")
            client.close()
            old = await ask_raw(port, b"GET /hints HTTP/1.0\r\nHost: app.test\r\n\r\n")
            assert (old.status, old.body) == (200, b"ok")


def _hint(size: int) -> bytes:
    """A 103 head whose one field holds ``size`` bytes."""
    return b"HTTP/1.1 103 Early Hints\r\nLink: " + b"x" * size + b"\r\n\r\n"


@pytest.mark.parametrize(("steps", "status"), [
    # Two heads of 40 KB each: apart they fit the 64 KiB limit, together they do not.
    ([(0, _hint(40_000)), (0.02, BIG_HEAD.replace(b"OK\r\n", b"OK\r\nX: " + b"y" * 40_000
                                                  + b"\r\n") + BIG_BODY)], 502),
    ([(0, _hint(40_000)), (0.02, OK)], 200),
    # Empty 103s, forever: their status lines count too.
    ([(0, b"HTTP/1.1 103 Early Hints\r\n\r\n" * 20_000), (0, OK)], 502),
])
async def test_the_head_limit_counts_the_interim_heads_before_the_final_one(steps, status):
    backend = ScriptBackend(steps)
    async with backend:
        async with proxied(backend) as port:
            client = await RawClient.connect(port)
            client.send(get("/hints"))
            relayed = 0  # the backend's bytes of the 103 heads relayed
            while (response := await client.read_response()).status == 103:
                link = response.header(b"link")
                relayed += len(_hint(len(link))) if link else 28
            client.close()
    assert response.status == status
    assert relayed <= 65_536  # never more 1xx bytes relayed than the limit


async def test_a_date_is_added_when_the_backend_sends_none():
    dated = b"HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\nContent-Length: 2\r\n\r\nok"
    backend = ScriptBackend([(0, OK)], [(0, dated)])
    async with backend:
        async with proxied(backend) as port:
            plain = await ask_raw(port, get("/a"))
            date = plain.header(b"date")
            assert date is not None and date.endswith(b" GMT")
            kept = await ask_raw(port, get("/b"))
            assert [v for n, v in kept.headers if n.lower() == b"date"] == [
                b"Tue, 01 Dec 2026 10:00:00 GMT"]
            missing = await ask_raw(port, b"GET /x HTTP/1.1\r\nHost: nowhere\r\n\r\n")
            assert missing.header(b"date") is not None  # the proxy's own answers too


# ------------------------------------------------------------ request chunk sizes


@pytest.mark.parametrize("size", [b"ffffffffffffffff", b"8000000000000000",
                                  b"00000000000000000000ffffffffffffffff"])
async def test_a_chunk_size_beyond_2_63_is_refused_at_once(size):
    backend = RecordingBackend()  # waits for the whole body before answering
    async with backend:
        async with proxied(backend) as port:
            for split in (False, True):
                client = await RawClient.connect(port)
                head = b"POST /c HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n"
                if split:
                    client.send(head)
                    await asyncio.sleep(0.05)
                    client.send(size + b"\r\nabc")
                else:
                    client.send(head + size + b"\r\nabc")
                started = time.monotonic()
                response = await client.read_response(timeout=2)
                assert response.status == 400
                assert time.monotonic() - started < 1.5
                client.close()


async def test_a_large_chunk_size_within_bounds_is_still_streamed():
    backend = RecordingBackend()
    async with backend:
        async with proxied(backend) as port:
            response = await ask_raw(port, (
                b"POST /c HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"0000000000000000000003\r\nabc\r\n0\r\n\r\n"))
            assert response.status == 200
    assert backend.received[0].endswith(b"3\r\nabc\r\n0\r\n\r\n")
