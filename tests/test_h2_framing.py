"""How an HTTP/2 answer is cut into DATA frames (issue 41, the 64 KiB GET): pieces
flushed in one loop turn leave in frames of the client's SETTINGS_MAX_FRAME_SIZE, the
last one carrying END_STREAM (no empty DATA frame after it), and a streamed answer's
bytes still leave in the turn they were flushed in. Over real loopback sockets, seen by
an ``h2`` client."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

import pytest

from proxy.entrances.h2output import WRITE_AT
from proxy.entrances.http1 import HTTP1Protocol
from proxy.entrances.listener import Entrance, EntranceSettings
from proxy.request import Headers, Request, Responder
from proxy.upstream.unread import unread_bytes
from tests.h2client import H2Client
from tests.helpers import HOST, READ_TIMEOUT, LoopbackServer, on_uvloop
from tests.stack import running

FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE's initial value (RFC 9113 §6.5.2)
TRAILERS: Headers = [(b"grpc-status", b"0")]
Handle = Callable[[Request, Responder], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    name: str
    pieces: list[int]  # sizes of the pieces pushed and flushed one by one, in one turn
    trailers: bool  # the answer ends with trailers (the client sent "te: trailers")
    max_frame: int | None  # the client's SETTINGS_MAX_FRAME_SIZE, if not the default
    frames: list[tuple[int, bool]]  # the DATA frames the client sees: size, END_STREAM


CASES = [
    Case("small pieces join into full frames", [1000] * 64, False, None,
         [(FRAME, False)] * 3 + [(14848, True)]),
    Case("trailers end it, not the last DATA frame", [1000] * 64, True, None,
         [(FRAME, False)] * 3 + [(14848, False)]),
    Case("the client's larger frame size", [1000] * 64, False, 32768,
         [(32768, False), (31232, True)]),
    Case("one large piece", [60000], False, None, [(FRAME, False)] * 3 + [(10848, True)]),
    Case("a whole number of frames", [FRAME] * 3, False, None,
         [(FRAME, False)] * 2 + [(FRAME, True)]),
]


def _pushing(case: Case) -> Handle:
    """A Handler that relays ``case.pieces`` as an exchange relays a backend's reads:
    push and flush each, then finish; all in one loop turn."""

    async def handle(request: Request, responder: Responder) -> None:
        responder.start(200, [(b"content-type", b"application/octet-stream")])
        for size in case.pieces:
            responder.push(b"x" * size)
            responder.flush()
        responder.finish(TRAILERS if case.trailers else None)

    return handle


async def _served(handle: Handle) -> AsyncIterator[int]:
    """A cleartext entrance with ``handle`` as its Handler; yields its port."""
    loop = asyncio.get_running_loop()
    entrance = Entrance(handle, EntranceSettings(name="cluster"), loop)
    server = await loop.create_server(lambda: HTTP1Protocol(entrance), HOST, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
@on_uvloop
async def test_pieces_flushed_in_one_turn_leave_in_full_frames(case: Case) -> None:
    async for port in _served(_pushing(case)):
        client = await H2Client.connect(port, max_frame=case.max_frame)
        try:
            te = [(b"te", b"trailers")] if case.trailers else []
            reply = await client.request("GET", "/", te)
        finally:
            client.close()
        assert reply.status == 200 and reply.reset is None
        assert reply.frames == case.frames
        assert len(reply.body) == sum(case.pieces)
        assert reply.trailers == (TRAILERS if case.trailers else [])


@on_uvloop
async def test_a_streamed_answer_leaves_in_the_turn_it_was_flushed_in() -> None:
    """The bytes held back for the end of the turn go out then, not only when the
    answer ends or a frame is full (a gRPC message must not wait for the next)."""
    seen = asyncio.Event()

    async def handle(request: Request, responder: Responder) -> None:
        responder.start(200, [])
        responder.push(b"first message")
        responder.flush()
        await asyncio.wait_for(seen.wait(), READ_TIMEOUT)  # the client has it
        responder.push(b"second")
        responder.finish()

    async for port in _served(handle):
        client = await H2Client.connect(port)
        try:
            sid = client.open("GET", "/")
            reply = client.replies[sid]
            for _ in range(int(READ_TIMEOUT / 0.01)):
                if reply.body:
                    break
                await asyncio.sleep(0.01)
            assert bytes(reply.body) == b"first message"
            seen.set()
            await client.reply(sid)
        finally:
            client.close()
        assert reply.frames == [(13, False), (6, True)]


@on_uvloop
async def test_a_large_answer_is_written_as_it_is_made() -> None:
    """What a turn sends is written whenever WRITE_AT bytes of it wait, not all at the
    turn's end: h2 keeps it in one buffer, copied whole on every write, and megabytes
    of it would be copied over and over as it grows. Seen as bytes arriving at the
    client's socket while the answer is still being made."""
    unread: list[int] = []
    fd = -1

    async def handle(request: Request, responder: Responder) -> None:
        unread.append(unread_bytes(fd))
        responder.respond(200, [], b"x" * (3 * WRITE_AT))
        unread.append(unread_bytes(fd))

    async for port in _served(handle):
        client = await H2Client.connect(port, window=4 * WRITE_AT)
        client.conn.increment_flow_control_window(4 * WRITE_AT)  # the connection's too
        fd = client.writer.transport.get_extra_info("socket").fileno()
        try:
            reply = await client.request("GET", "/")
        finally:
            client.close()
        assert len(reply.body) == 3 * WRITE_AT
        before, after = unread
        assert after > before  # (the socket buffers of loopback bound how much)


class ChunkedBackend(LoopbackServer):
    """An HTTP/1.1 backend whose answer is 60 chunks of 1000 bytes, written in one go
    (head, chunks and the last chunk in one write): the proxy reads them together."""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        chunks = b"3e8\r\n" + b"x" * 1000 + b"\r\n"
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + chunks * 60 + b"0\r\n\r\n")


@on_uvloop
async def test_a_backend_answer_in_small_chunks_reaches_the_client_in_full_frames() -> None:
    """The exchange over a real HTTP/1.1 backend: the pieces of an answer read in one
    turn leave in frames of the client's frame size; END_STREAM rides on the last."""
    async with ChunkedBackend() as backend, running(
            "--listen", f"{HOST}:0", config={"version": 1, "rules": [
                {"backends": [{"url": backend.url, "weight": 1}]}]}) as stack:
        client = await H2Client.connect(stack.cluster_port)
        try:
            reply = await client.request("GET", "/")
        finally:
            client.close()
    assert reply.status == 200 and len(reply.body) == 60000
    assert reply.frames == [(FRAME, False)] * 3 + [(10848, True)]
