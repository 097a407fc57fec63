"""The raw byte stream of a connection after a protocol switch (``101``)."""

from __future__ import annotations

import asyncio
from typing import Final

from proxy.flow.buffer import BodyBuffer
from proxy.flow.control import STREAM, FlowControl

STREAM_HIGH_WATER: Final = 64 * 1024  # bytes from the peer buffered before reading pauses


class TransportStream:
    """A :class:`proxy.request.ByteStream` over a transport after a protocol switch.

    The owning protocol hands every received chunk to :meth:`feed` and the end of the
    stream to :meth:`feed_eof`; bytes that arrived before the switch are passed to the
    constructor and come out of the first :meth:`read`. Reading from the socket pauses
    while more than ``STREAM_HIGH_WATER`` bytes wait to be read.
    """

    __slots__ = ("_transport", "_flow", "_buffer")

    def __init__(self, transport: asyncio.Transport, flow: FlowControl,
                 initial: bytes = b"") -> None:
        self._transport = transport
        self._flow = flow
        self._buffer: BodyBuffer[bytes] = BodyBuffer(
            STREAM_HIGH_WATER, self._pause, self._resume, initial)

    def feed(self, data: bytes) -> None:
        """Queue bytes received from the peer."""
        self._buffer.feed(data)

    def feed_eof(self) -> None:
        """The peer finished sending (or the connection is gone)."""
        self._buffer.end()

    async def read(self) -> bytes:
        """Next bytes from the peer; ``b""`` at end of stream."""
        return await self._buffer.read()

    async def write(self, data: bytes) -> None:
        """Send bytes; waits while the peer is slow. Raises ConnectionError once closed."""
        if self._transport.is_closing():
            raise ConnectionError("stream closed")
        self._transport.write(data)
        if self._flow.write_paused:
            await self._flow.drain()

    def close(self) -> None:
        """Close the connection (buffered output is flushed first); idempotent. Bytes
        already received stay readable, then :meth:`read` returns ``b""``."""
        self._buffer.end()
        self._transport.close()

    def _pause(self) -> None:
        self._flow.pause_reading(STREAM)

    def _resume(self) -> None:
        self._flow.resume_reading(STREAM)
