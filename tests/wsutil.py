"""A minimal RFC 6455 WebSocket peer for tests: handshake, framing, masking, close.

Written for these tests, independent of the proxy (which never parses WebSocket frames:
after the 101 it only pipes bytes). Both ends validate what they receive strictly —
client frames must be masked, server frames must not be (RFC 6455 §5.1), reserved bits
must be clear, control frames short and unfragmented — so a proxy that corrupts,
reorders or re-masks a single byte makes a test fail rather than pass by accident.
Fragmented data messages are not supported (not needed here).

- :class:`WebSocket` speaks frames over any :class:`proxy.request.ByteStream`
  (a socket via :class:`SocketStream`, or the edge end of a hijacked bridge stream).
- :func:`connect` opens a client session over HTTP/1.1 (the handshake request's extra
  headers are the caller's: a browser's, or cloudflared's).
- :class:`EchoServer` is a real WebSocket server that echoes every data message, with
  a few behaviours chosen by path (see its docstring).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
from dataclasses import dataclass, field

from proxy.request import ByteStream, Headers
from tests.helpers import LoopbackServer

HOST = "127.0.0.1"
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x1, 0x2, 0x8, 0x9, 0xA
MAX_MESSAGE = 16 * 1024 * 1024
READ_CHUNK = 256 * 1024


class ProtocolViolation(Exception):
    """The peer sent something RFC 6455 forbids (or this helper does not support)."""


def new_key() -> bytes:
    """A fresh ``Sec-WebSocket-Key``: 16 random bytes, base64 (RFC 6455 §4.1)."""
    return base64.b64encode(os.urandom(16))


def accept_for(key: bytes) -> bytes:
    """The ``Sec-WebSocket-Accept`` a server must answer ``key`` with (RFC 6455 §4.2.2)."""
    return base64.b64encode(hashlib.sha1(key.strip() + GUID).digest())


def mask(payload: bytes, key: bytes) -> bytes:
    """XOR ``payload`` with the 4-byte ``key`` repeated (its own inverse)."""
    if not payload:
        return b""
    n = len(payload)
    stream = (key * (n // 4 + 1))[:n]
    mixed = int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")
    return mixed.to_bytes(n, "big")


def encode_frame(opcode: int, payload: bytes, *, masked: bool) -> bytes:
    """One final (FIN) frame; clients mask, servers don't."""
    n = len(payload)
    first = bytes([0x80 | opcode])
    bit = 0x80 if masked else 0
    if n < 126:
        length = bytes([bit | n])
    elif n < 1 << 16:
        length = bytes([bit | 126]) + struct.pack("!H", n)
    else:
        length = bytes([bit | 127]) + struct.pack("!Q", n)
    if not masked:
        return first + length + payload
    key = os.urandom(4)
    return first + length + key + mask(payload, key)


@dataclass
class Message:
    """A received data message."""

    opcode: int
    data: bytes


class SocketStream:
    """A :class:`ByteStream` over an asyncio socket stream pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 initial: bytes = b"") -> None:
        self._reader = reader
        self._writer = writer
        self._initial = initial

    async def read(self) -> bytes:
        if self._initial:
            data, self._initial = self._initial, b""
            return data
        try:
            return await self._reader.read(READ_CHUNK)
        except ConnectionError:
            return b""

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    def close(self) -> None:
        self._writer.transport.abort()


class WebSocket:
    """One end of a WebSocket session over a byte stream.

    ``client=True`` masks what it sends and requires unmasked frames from the peer;
    ``client=False`` the opposite. :meth:`recv` answers pings itself and returns
    ``None`` once the peer sent a close frame or the stream ended (``close_code`` and
    ``eof`` tell which).
    """

    def __init__(self, stream: ByteStream, *, client: bool) -> None:
        self.stream = stream
        self.client = client
        self.close_code: int | None = None
        self.eof = False
        self._buf = bytearray()

    async def send(self, data: bytes | str) -> None:
        opcode = OP_TEXT if isinstance(data, str) else OP_BINARY
        payload = data.encode() if isinstance(data, str) else data
        await self.stream.write(encode_frame(opcode, payload, masked=self.client))

    async def send_close(self, code: int = 1000) -> None:
        await self.stream.write(
            encode_frame(OP_CLOSE, struct.pack("!H", code), masked=self.client))

    async def recv(self) -> Message | None:
        while True:
            frame = await self._frame()
            if frame is None:
                return None
            opcode, payload = frame
            if opcode in (OP_TEXT, OP_BINARY):
                return Message(opcode, payload)
            if opcode == OP_PING:
                await self.stream.write(encode_frame(OP_PONG, payload, masked=self.client))
            elif opcode == OP_CLOSE:
                self.close_code = struct.unpack("!H", payload[:2])[0] if payload else 1005
                return None

    def close(self) -> None:
        self.stream.close()

    async def _fill(self, size: int) -> bool:
        while len(self._buf) < size:
            data = await self.stream.read()
            if not data:
                self.eof = True
                return False
            self._buf += data
        return True

    async def _frame(self) -> tuple[int, bytes] | None:
        if not await self._fill(2):
            if self._buf:
                raise ProtocolViolation("stream ended inside a frame header")
            return None
        first, second = self._buf[0], self._buf[1]
        opcode, is_masked, length = first & 0x0F, bool(second & 0x80), second & 0x7F
        if first & 0x70:
            raise ProtocolViolation("reserved bits set")
        if not first & 0x80:
            raise ProtocolViolation("fragmented messages are not supported")
        if is_masked == self.client:
            raise ProtocolViolation(f"{'server' if self.client else 'client'} frame "
                                    f"{'masked' if is_masked else 'not masked'}")
        if opcode >= 0x8 and length > 125:
            raise ProtocolViolation("control frame longer than 125 bytes")
        offset = 2
        if length >= 126:
            extra = 2 if length == 126 else 8
            if not await self._fill(2 + extra):
                raise ProtocolViolation("stream ended inside a frame header")
            length = int.from_bytes(self._buf[2:2 + extra], "big")
            offset += extra
        if length > MAX_MESSAGE:
            raise ProtocolViolation(f"message of {length} bytes is over the limit")
        key_len = 4 if is_masked else 0
        if not await self._fill(offset + key_len + length):
            raise ProtocolViolation("stream ended inside a frame")
        start = offset + key_len
        payload = bytes(self._buf[start:start + length])
        if is_masked:
            payload = mask(payload, bytes(self._buf[offset:start]))
        del self._buf[:start + length]
        return opcode, payload


# --------------------------------------------------------------------------- client


@dataclass
class Handshake:
    """The HTTP answer to a client's opening handshake."""

    status: int
    headers: Headers
    body: bytes = b""

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, Headers]:
    """The start line and header fields of an HTTP/1.1 message."""
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw[:-4].split(b"\r\n")
    fields = (line.split(b":", 1) for line in lines[1:])
    headers = [(name.strip(), value.strip()) for name, value in fields]
    return lines[0], headers


async def connect(address: int | str, path: str, headers: Headers, *,
                  key: bytes | None = None,
                  early: bytes = b"") -> tuple[Handshake, WebSocket | None]:
    """Send an opening handshake to ``address`` (a 127.0.0.1 port, or a unix socket
    path) with exactly ``headers`` (plus
    ``Sec-WebSocket-Key`` unless they carry one), and ``early`` bytes in the same write
    (frames sent before the 101 arrived). On a 101 whose accept value checks out,
    return the session; otherwise the answer (body read by Content-Length) and
    ``None``."""
    if not any(n.lower() == b"sec-websocket-key" for n, _ in headers):
        key = key or new_key()
        headers = headers + [(b"Sec-WebSocket-Key", key)]
    key = next(v for n, v in headers if n.lower() == b"sec-websocket-key")
    if isinstance(address, str):
        reader, writer = await asyncio.open_unix_connection(address)
    else:
        reader, writer = await asyncio.open_connection(HOST, address)
    head = b"".join(n + b": " + v + b"\r\n" for n, v in headers)
    writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\n" + head + b"\r\n" + early)
    start, response_headers = await read_head(reader)
    status = int(start.split(b" ")[1])
    answer = Handshake(status, response_headers)
    if status != 101:
        length = answer.header(b"content-length")
        answer.body = await reader.readexactly(int(length)) if length else b""
        writer.transport.abort()
        return answer, None
    if answer.header(b"sec-websocket-accept") != accept_for(key):
        writer.transport.abort()
        raise ProtocolViolation("wrong Sec-WebSocket-Accept")
    return answer, WebSocket(SocketStream(reader, writer), client=True)


# --------------------------------------------------------------------------- server


@dataclass
class Session:
    """One accepted connection of the :class:`EchoServer`."""

    path: str
    headers: Headers
    echoed: int = 0
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the session is over, whichever side ended it."""
    saw_eof: bool = False
    """True if the session ended because the proxy's side of the TCP stream ended."""

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)


class EchoServer(LoopbackServer):
    """A WebSocket echo server on 127.0.0.1 (``async with EchoServer() as server``).

    Any path: validate the handshake (400 if it is not a WebSocket upgrade), answer 101,
    then echo every data message with its opcode. A text message ``close-now`` makes the
    server send a close frame (1000) and drop the connection. Path ``/deny`` answers
    ``403`` with a body instead of switching; path ``/greet`` sends a text message
    ``welcome`` in the same write as its 101; path ``/slow-handshake`` answers after
    one second unless the proxy hangs up first. ``sessions`` records every handshake.
    """

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[Session] = []

    async def _serve(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        session = None
        try:
            start, headers = await read_head(reader)
            path = start.split(b" ")[1].decode()
            session = Session(path, headers)
            self.sessions.append(session)
            if not await self._handshake(session, reader, writer):
                return
            await self._echo(session, WebSocket(SocketStream(reader, writer), client=False))
        except (ConnectionError, asyncio.IncompleteReadError, ProtocolViolation):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()
            if session is not None:
                session.ended.set()

    async def _handshake(self, session: Session, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> bool:
        key = session.header(b"sec-websocket-key")
        connection = (session.header(b"connection") or b"").lower()
        if session.path == "/deny":
            body = b"no websockets for you\n"
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            return False
        if session.path == "/slow-handshake":
            try:
                session.saw_eof = await asyncio.wait_for(reader.read(1), 1.0) == b""
            except TimeoutError:
                pass
            if session.saw_eof:
                return False
        if (key is None or (session.header(b"upgrade") or b"").lower() != b"websocket"
                or b"upgrade" not in [t.strip() for t in connection.split(b",")]
                or session.header(b"sec-websocket-version") != b"13"):
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return False
        greeting = (encode_frame(OP_TEXT, b"welcome", masked=False)
                    if session.path == "/greet" else b"")
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept_for(key)
                     + b"\r\n\r\n" + greeting)
        await writer.drain()
        return True

    async def _echo(self, session: Session, ws: WebSocket) -> None:
        try:
            while (message := await ws.recv()) is not None:
                if message.opcode == OP_TEXT and message.data == b"close-now":
                    await ws.send_close(1000)
                    return
                await ws.stream.write(encode_frame(message.opcode, message.data,
                                                   masked=False))
                session.echoed += 1
            if ws.close_code is not None:
                await ws.send_close(ws.close_code)  # answer the close handshake
        finally:
            session.saw_eof = ws.eof
