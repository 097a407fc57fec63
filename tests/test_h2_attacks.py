"""The known HTTP/2 attacks against the entrance (issue 41 point 3),
each over a real socket with raw frames, each with a clear outcome: GOAWAY with the
right error code, the connection closed, memory bounded (the attacker's stream is
reset, its backend held back), and another connection served meanwhile.

Every test fails without its defence (``proxy.entrances.h2guard`` and the limits of
``proxy.entrances.h2server`` / ``h2stream``): the attack then goes on unanswered, or
the server keeps taking what it should refuse.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import hpack
import pytest
from hyperframe.frame import (
    ContinuationFrame, DataFrame, Frame, HeadersFrame, PingFrame, RstStreamFrame,
    SettingsFrame)

from proxy.entrances.h2sniff import PREFACE
from proxy.request import BodyError, Request, Responder
from proxy.wire.h2frames import GoAway, GoAwayFilter
from tests.h2client import H2Client
from tests.helpers import HOST, READ_TIMEOUT, TestBackend, on_uvloop, running_entrance
from tests.stack import running

PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
CANCEL = 0x8
ENHANCE_YOUR_CALM = 0xB
GET = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"example.test"),
       (b":path", b"/slow?delay=5")]


class RawH2:
    """A client that writes frames as it likes and reads only when asked."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = hpack.Encoder()
        writer.write(PREFACE + SettingsFrame(0).serialize())

    @classmethod
    async def connect(cls, port: int, *, receive_buffer: int | None = None) -> "RawH2":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:  # before connecting: it sets the TCP window
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (HOST, port))
        reader, writer = await asyncio.open_connection(sock=sock)
        return cls(reader, writer)

    def send(self, *frames: Frame) -> None:
        self.writer.write(b"".join(frame.serialize() for frame in frames))

    def headers(self, sid: int, fields: list[tuple[bytes, bytes]] = GET, *,
                end_stream: bool = True) -> HeadersFrame:
        flags = ["END_HEADERS", "END_STREAM"] if end_stream else ["END_HEADERS"]
        return HeadersFrame(sid, self.encoder.encode(fields), flags=flags)

    async def goaway(self, timeout: float = READ_TIMEOUT) -> int | None:
        """Read until the server's GOAWAY (its error code) or the end (None)."""
        frames = GoAwayFilter()
        async with asyncio.timeout(timeout):
            try:
                while data := await self.reader.read(65536):
                    for part in frames.feed(data):
                        if isinstance(part, GoAway):
                            return part.error_code
            except ConnectionError:
                return None
        return None

    async def closed(self, timeout: float = READ_TIMEOUT) -> bool:
        """Whether the server ended the connection (read to its end) in time."""
        async with asyncio.timeout(timeout):
            try:
                while await self.reader.read(1 << 20):
                    pass
            except ConnectionError:
                pass
        return True

    def close(self) -> None:
        self.writer.transport.abort()


async def _still_served(port: int) -> None:
    """Another connection is served as usual meanwhile."""
    client = await H2Client.connect(port)
    try:
        reply = await client.request("GET", "/echo")
    finally:
        client.close()
    assert reply.status == 200


def _config(url: str) -> dict[str, Any]:
    return {"version": 1, "rules": [{"backends": [{"url": url, "weight": 1}]}]}


@on_uvloop
async def test_rapid_reset_ends_the_connection_and_starts_no_backend_work() -> None:
    async with TestBackend() as backend, running(
            "--listen", f"{HOST}:0", config=_config(backend.url)) as stack:
        attacker = await RawH2.connect(stack.cluster_port)
        try:
            for sid in range(1, 2 * 400, 2):  # HEADERS then RST_STREAM, 400 times
                attacker.send(attacker.headers(sid), RstStreamFrame(sid, error_code=CANCEL))
            assert await attacker.goaway() == ENHANCE_YOUR_CALM
            assert await attacker.closed()
        finally:
            attacker.close()
        await _still_served(stack.cluster_port)
        assert len(backend.requests) <= 1  # (the one /echo above)


@on_uvloop
async def test_continuation_flood_is_cut_at_the_header_limit() -> None:
    async with TestBackend() as backend, running(
            "--listen", f"{HOST}:0", config=_config(backend.url)) as stack:
        attacker = await RawH2.connect(stack.cluster_port)
        try:
            block = attacker.encoder.encode(GET)
            attacker.send(HeadersFrame(1, block))  # no END_HEADERS: CONTINUATION follows
            for _ in range(40):  # 40 × 16 KiB: far past the 64 KiB header limit
                attacker.send(ContinuationFrame(1, b"\x00" * 16384))
            assert await attacker.goaway() == ENHANCE_YOUR_CALM
            assert await attacker.closed()
        finally:
            attacker.close()
        await _still_served(stack.cluster_port)


def _hpack_bomb(entries: int) -> bytes:
    """A small header block that decodes to ``entries`` × 4 KiB: one 4 KiB field
    added to the dynamic table, then referenced by its one-byte index again and
    again (CVE-2016-6581)."""
    encoder = hpack.Encoder()
    block = encoder.encode(GET)
    block += encoder.encode([(b"x-bomb", b"b" * 4000)])  # incremental indexing: index 62
    return block + bytes([0x80 | 62]) * entries


@on_uvloop
async def test_hpack_bomb_is_bounded_by_the_decoded_header_list_size() -> None:
    async with TestBackend() as backend, running(
            "--listen", f"{HOST}:0", config=_config(backend.url)) as stack:
        attacker = await RawH2.connect(stack.cluster_port)
        try:
            block = _hpack_bomb(10_000)  # 10 KiB on the wire, 40 MB decoded
            attacker.send(HeadersFrame(1, block, flags=["END_HEADERS", "END_STREAM"]))
            assert await attacker.goaway() == ENHANCE_YOUR_CALM
            assert await attacker.closed()
        finally:
            attacker.close()
        await _still_served(stack.cluster_port)
        assert len(backend.requests) == 1


@on_uvloop
@pytest.mark.parametrize("flood", ["ping", "settings"])
async def test_control_frame_flood_from_a_client_that_does_not_read(flood: str) -> None:
    async with TestBackend() as backend, running(
            "--listen", f"{HOST}:0", config=_config(backend.url)) as stack:
        attacker = await RawH2.connect(stack.cluster_port, receive_buffer=4096)
        frame = (PingFrame(0, opaque_data=b"12345678") if flood == "ping"
                 else SettingsFrame(0, settings={SettingsFrame.MAX_FRAME_SIZE: 16384}))
        batch = frame.serialize() * 10_000
        try:
            for _ in range(60):  # at most 600,000 frames, each owing an ACK
                if attacker.writer.is_closing():
                    break
                attacker.writer.write(batch)
                try:
                    await asyncio.wait_for(attacker.writer.drain(), READ_TIMEOUT)
                except ConnectionError:
                    break
            assert await attacker.closed()
        finally:
            attacker.close()
        await _still_served(stack.cluster_port)


async def _endless(request: Request, responder: Responder) -> None:
    """Streams an answer for as long as the client takes it; counts what it wrote."""
    responder.start(200, [])
    while not responder.aborted:
        WRITTEN.append(16384)
        await responder.write(b"x" * 16384)


WRITTEN: list[int] = []


@on_uvloop
async def test_zero_window_reader_is_reset_and_holds_the_producer_back() -> None:
    WRITTEN.clear()
    async with running_entrance(_endless, send_timeout=0.5) as port:
        client = await H2Client.connect(port, window=0)  # it never grants a byte
        try:
            reply = await client.request("GET", "/")
        finally:
            client.close()
    assert reply.reset == INTERNAL_ERROR
    assert sum(WRITTEN) <= 256 * 1024  # held back at the stream's high-water mark


async def _read_all(request: Request, responder: Responder) -> None:
    try:
        while await request.body.read():
            pass
    except BodyError:
        return
    responder.respond(200, [], b"read")


@on_uvloop
async def test_a_stream_that_never_sends_its_body_is_reset() -> None:
    async with running_entrance(_read_all, body_timeout=0.3) as port:
        client = await H2Client.connect(port)
        try:
            stalled = client.open("POST", "/", [(b"content-length", b"100")], b"ten bytes!",
                                  end=False)
            done = await client.request("POST", "/", body=b"complete")
            reply = await client.reply(stalled)
        finally:
            client.close()
    assert done.status == 200 and bytes(done.body) == b"read"
    assert reply.reset == CANCEL


@on_uvloop
async def test_more_streams_than_advertised_end_the_connection() -> None:
    async with TestBackend() as backend, running(
            "--listen", f"{HOST}:0", config=_config(backend.url)) as stack:
        attacker = await RawH2.connect(stack.cluster_port)
        try:
            # 129 streams left open (no END_STREAM): one past SETTINGS_MAX_CONCURRENT_STREAMS
            attacker.send(*(attacker.headers(sid, end_stream=False)
                            for sid in range(1, 2 * 129, 2)))
            assert await attacker.goaway() == PROTOCOL_ERROR
            assert await attacker.closed()
        finally:
            attacker.close()
        await _still_served(stack.cluster_port)


@on_uvloop
async def test_empty_data_frame_flood() -> None:
    async with TestBackend() as backend, running(
            "--listen", f"{HOST}:0", config=_config(backend.url)) as stack:
        attacker = await RawH2.connect(stack.cluster_port)
        try:
            attacker.send(attacker.headers(1, end_stream=False))
            attacker.send(*(DataFrame(1, b"") for _ in range(1000)))
            assert await attacker.goaway() == ENHANCE_YOUR_CALM
        finally:
            attacker.close()
        await _still_served(stack.cluster_port)
