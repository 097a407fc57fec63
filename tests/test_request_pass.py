"""Large request bodies (fed to llhttp in slices: proxy.wire.server): the handler sees
the same requests and bodies whatever the reads they came in, pipelined requests after
such a body are still parsed and answered in order, and a pushed body arrives whole."""

from __future__ import annotations

import asyncio

import pytest

from proxy.flow.push import PushBody
from proxy.request import BodyError, Headers, Piece, Request, Responder
from tests.helpers import RawClient, on_uvloop, running_entrance

LARGE = 64 * 1024  # (the body size llhttp was once passed by at)
BIG = bytes(range(256)) * 320  # 81,920 bytes: above LARGE
SMALL_BIG = BIG[:LARGE - 1]
EDGE = BIG[:LARGE]
BIGGER = BIG * 2


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n%s\r\n"
            % (path.encode(), len(body), b"".join(extra)))


def get(path: str) -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: h\r\n\r\n" % path.encode()


def chunked(path: str, body: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"%x\r\n%s\r\n0\r\n\r\n" % (path.encode(), len(body), body))


class Recorder:
    """Records each request's path and body (read as a handler reads it)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []

    async def __call__(self, request: Request, responder: Responder) -> None:
        body = b""
        while chunk := await request.body.read():
            assert isinstance(chunk, bytes)  # read() promises bytes, views or not
            body += chunk
        self.seen.append((request.path, body))
        responder.respond(200, [], b"%s %d" % (request.path.encode(), len(body)))


# Each case: the writes a client makes (pause before each, bytes) and the requests the
# handler must see, in order.
SHAPES: dict[str, tuple[list[tuple[float, bytes]], list[tuple[str, bytes]]]] = {
    "head-and-body-one-read": ([(0, post("/a", BIG) + BIG)], [("/a", BIG)]),
    "head-alone-then-body-in-pieces": (
        [(0, post("/a", BIG)), (0.03, BIG[:5000]), (0.03, BIG[5000:])], [("/a", BIG)]),
    "part-of-body-then-rest-and-next": (
        [(0, post("/a", BIG) + BIG[:7000]), (0.03, BIG[7000:] + get("/b"))],
        [("/a", BIG), ("/b", b"")]),
    "a-little-with-the-head-then-the-rest-and-next": (
        [(0, post("/a", BIGGER) + BIGGER[:5000]), (0.03, BIGGER[5000:90000]),
         (0.03, BIGGER[90000:] + get("/b"))],
        [("/a", BIGGER), ("/b", b"")]),
    "head-alone-then-body-and-next": (
        [(0, post("/a", BIG)), (0.03, BIG + get("/b"))], [("/a", BIG), ("/b", b"")]),
    "two-large-pipelined": (
        [(0, post("/a", BIG) + BIG + post("/b", EDGE) + EDGE)],
        [("/a", BIG), ("/b", EDGE)]),
    "large-small-chunked-get-pipelined": (
        [(0, post("/a", BIG) + BIG + post("/b", b"xyz") + b"xyz" + chunked("/c", BIG)
          + get("/d"))],
        [("/a", BIG), ("/b", b"xyz"), ("/c", BIG), ("/d", b"")]),
    "get-then-large-head-last": (
        [(0, get("/a") + post("/b", BIG)), (0.03, BIG)], [("/a", b""), ("/b", BIG)]),
    "one-short-of-passing": ([(0, post("/a", SMALL_BIG) + SMALL_BIG + get("/b"))],
                             [("/a", SMALL_BIG), ("/b", b"")]),
    "exactly-passing": ([(0, post("/a", EDGE) + EDGE + get("/b"))],
                        [("/a", EDGE), ("/b", b"")]),
    "one-byte-bodies-pipelined": (
        [(0, b"".join(post("/%d" % i, b"x") + b"x" for i in range(50)))],
        [("/%d" % i, b"x") for i in range(50)]),
    "head-split-across-reads": (
        [(0, post("/a", BIG)[:20]), (0.03, post("/a", BIG)[20:] + BIG + get("/b"))],
        [("/a", BIG), ("/b", b"")]),
    "chunked-head-alone-then-chunks": (
        [(0, chunked("/a", BIG)[:60]), (0.03, chunked("/a", BIG)[60:] + get("/b"))],
        [("/a", BIG), ("/b", b"")]),
    "transfer-encoding-in-lower-case": (
        [(0, chunked("/a", BIG).replace(b"Transfer-Encoding", b"transfer-encoding")
          + post("/b", BIG) + BIG)],
        [("/a", BIG), ("/b", BIG)]),
    "many-small-gets-one-read": (
        [(0, b"".join(get("/%d" % i) for i in range(2000)))],
        [("/%d" % i, b"") for i in range(2000)]),
    "upgrade-ignored-for-a-large-body": (
        [(0, post("/a", BIG, b"Connection: Upgrade\r\nUpgrade: h2c\r\n") + BIG
          + get("/b"))],
        [("/a", BIG), ("/b", b"")]),
    "large-read-of-many-bodies": (
        [(0, b"".join(post("/%d" % i, BIG) + BIG for i in range(12)))],
        [("/%d" % i, BIG) for i in range(12)]),
}


@on_uvloop
@pytest.mark.parametrize("case", SHAPES)
async def test_the_handler_sees_the_same_bodies_whatever_the_reads(case: str) -> None:
    writes, expected = SHAPES[case]
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        for pause, data in writes:
            await asyncio.sleep(pause)
            client.send(data)
        for path, body in expected:
            response = await client.read_response()
            assert (response.status, response.body) == (200, b"%s %d" % (path.encode(),
                                                                        len(body)))
        client.close()
    assert recorder.seen == expected


@on_uvloop
async def test_garbage_after_a_passed_body_is_refused_in_its_turn() -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(post("/a", BIG) + BIG + b"GET / HTTP/1.1\r\nHost h\r\n\r\n")
        assert (await client.read_response()).body == b"/a %d" % len(BIG)
        refused = await client.read_response()
        assert refused.status == 400 and refused.header(b"connection") == b"close"
        assert await client.closed()
    assert recorder.seen == [("/a", BIG)]


@on_uvloop
async def test_a_client_gone_half_way_through_a_passed_body_fails_it() -> None:
    failures: list[str] = []

    async def handle(request: Request, responder: Responder) -> None:
        try:
            while await request.body.read():
                pass
        except BodyError as error:
            failures.append(str(error))
            raise

    async with running_entrance(handle) as port:
        client = await RawClient.connect(port)
        client.send(post("/a", BIG) + BIG[:70000])
        await asyncio.sleep(0.05)
        client.close()
        for _ in range(100):
            if failures:
                break
            await asyncio.sleep(0.01)
    assert len(failures) == 1


@on_uvloop
async def test_a_large_body_waiting_for_100_continue_passes_once_sent() -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(post("/a", BIG, b"Expect: 100-continue\r\n"))
        assert (await client.read_response()).status == 100
        client.send(BIG + get("/b"))
        assert (await client.read_response()).body == b"/a %d" % len(BIG)
        assert (await client.read_response()).body == b"/b 0"
        client.close()
    assert recorder.seen == [("/a", BIG), ("/b", b"")]


class Pieces:
    """A sink for a pushed body: keeps the pieces as they were handed over."""

    def __init__(self) -> None:
        self.pieces: list[Piece] = []
        self.ended = asyncio.Event()

    def body_data(self, data: Piece) -> None:
        self.pieces.append(data)

    def body_end(self, trailers: Headers) -> None:
        self.ended.set()

    def body_failed(self, error: BaseException) -> None:
        self.ended.set()


# Each case: the writes, the body, and whether its first piece (which came in the read
# its head came in) is a view of that read; later reads pass as they are (``bytes``),
# which a test cannot tell from a parser's copy.
PUSHED: dict[str, tuple[list[bytes], bytes]] = {
    "large-one-read": ([post("/a", BIG) + BIG], BIG),
    "large-in-two-reads": ([post("/a", BIG) + BIG[:70000], BIG[70000:]], BIG),
    "a-little-with-the-head": ([post("/a", BIGGER) + BIGGER[:5000], BIGGER[5000:]],
                               BIGGER),
    "edge": ([post("/a", EDGE) + EDGE], EDGE),
    "one-short-of-the-edge": ([post("/a", SMALL_BIG) + SMALL_BIG], SMALL_BIG),
    "chunked": ([chunked("/a", BIG)], BIG),
}


@on_uvloop
@pytest.mark.parametrize("case", PUSHED)
async def test_a_pushed_body_arrives_whole_in_bytes(case: str) -> None:
    writes, expected = PUSHED[case]
    kinds: list[type] = []

    async def handle(request: Request, responder: Responder) -> None:
        body = request.body
        assert isinstance(body, PushBody)
        sink = Pieces()
        pieces = list(body.attach(sink))
        if not body.complete:
            await sink.ended.wait()
        pieces += sink.pieces
        kinds.extend(type(piece) for piece in pieces)
        responder.respond(200, [], b"".join(pieces))

    async with running_entrance(handle) as port:
        client = await RawClient.connect(port)
        for data in writes:
            client.send(data)
            await asyncio.sleep(0.03)
        assert (await client.read_response()).body == expected
        client.close()
    assert set(kinds) == {bytes}
