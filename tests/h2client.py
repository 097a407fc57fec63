"""A small HTTP/2 client for the entrance tests, written with the ``h2`` library over a
real loopback socket: prior knowledge (or TLS with ALPN ``h2``), many streams at once,
resets, and raw bytes for the attack tests."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Iterable

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from proxy.wire.h2frames import GoAway, GoAwayFilter
from tests.helpers import HOST, READ_TIMEOUT

Fields = list[tuple[bytes, bytes]]


@dataclass
class Reply:
    """One stream's answer as the client saw it."""

    status: int = 0
    headers: Fields = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    frames: list[tuple[int, bool]] = field(default_factory=list)  # DATA: size, END_STREAM
    trailers: Fields = field(default_factory=list)
    reset: int | None = None  # RST_STREAM error code, if the server reset it
    interim: list[int] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n == name), None)


class H2Client:
    """An HTTP/2 connection to the proxy; ``goaway`` is the server's GOAWAY
    (error code, last stream id) once one arrived, ``closed`` once the socket ended."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 window: int | None, max_frame: int | None = None) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.replies: dict[int, Reply] = {}
        self.goaway: tuple[int, int] | None = None
        self.closed = asyncio.Event()
        self.auto_ack = True  # give response bytes back as window as they come
        self.window = asyncio.Event()  # set when the server grants window
        self.senders: set[asyncio.Future[None]] = set()
        values = {h2.settings.SettingCodes.ENABLE_PUSH: 0}
        if window is not None:
            values[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE] = window
        if max_frame is not None:
            values[h2.settings.SettingCodes.MAX_FRAME_SIZE] = max_frame
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values=values)
        if max_frame is not None:  # (h2 takes it from SETTINGS acknowledged as changed)
            self.conn.max_inbound_frame_size = max_frame
        self.conn.initiate_connection()
        self.flush()
        self._task = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, port: int, *, tls: ssl.SSLContext | None = None,
                      server_hostname: str | None = None,
                      window: int | None = None,
                      max_frame: int | None = None) -> "H2Client":
        reader, writer = await asyncio.open_connection(
            HOST, port, ssl=tls, server_hostname=server_hostname if tls else None)
        return cls(reader, writer, window, max_frame)

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def open(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]] = (),
             body: bytes = b"", *, authority: bytes = b"example.test",
             end: bool = True) -> int:
        """Start a request; returns its stream id (the body, if any, is sent whole)."""
        sid = self.conn.get_next_available_stream_id()
        fields = [(b":method", method.encode()), (b":scheme", b"http"),
                  (b":authority", authority), (b":path", path.encode()), *headers]
        self.replies[sid] = reply = Reply()
        if self.closed.is_set():
            reply.done.set()  # nobody will answer it
        self.conn.send_headers(sid, fields, end_stream=end and not body)
        self.flush()
        if body:
            self.senders.add(asyncio.ensure_future(self.send(sid, body, end)))
        return sid

    async def send(self, sid: int, data: bytes, end: bool = False) -> None:
        """Send ``data`` on stream ``sid`` as the windows allow."""
        view = memoryview(data)
        while view:
            room = min(self.conn.local_flow_control_window(sid),
                       self.conn.max_outbound_frame_size, len(view))
            if room <= 0:
                self.window.clear()
                await asyncio.wait_for(self.window.wait(), READ_TIMEOUT)
                continue
            self.conn.send_data(sid, bytes(view[:room]))
            view = view[room:]
            self.flush()
        if end:
            self.end(sid)

    def end(self, sid: int) -> None:
        self.conn.end_stream(sid)
        self.flush()

    def reset(self, sid: int, code: int = 0x8) -> None:
        self.conn.reset_stream(sid, code)
        self.flush()

    async def reply(self, sid: int, timeout: float = READ_TIMEOUT) -> Reply:
        reply = self.replies[sid]
        await asyncio.wait_for(reply.done.wait(), timeout)
        return reply

    async def request(self, method: str, path: str,
                      headers: Iterable[tuple[bytes, bytes]] = (), body: bytes = b"",
                      authority: bytes = b"example.test",
                      timeout: float = READ_TIMEOUT) -> Reply:
        return await self.reply(self.open(method, path, headers, body,
                                          authority=authority), timeout)

    async def wait_closed(self, timeout: float = READ_TIMEOUT) -> None:
        await asyncio.wait_for(self.closed.wait(), timeout)

    def close(self) -> None:
        self._task.cancel()
        for sender in self.senders:
            sender.cancel()
        self.writer.transport.abort()

    async def _read(self) -> None:
        try:
            # GOAWAY frames are taken out before h2 sees them (it would end the
            # connection at once; streams below the last id may still finish).
            goaways = GoAwayFilter()
            while data := await self.reader.read(65536):
                for part in goaways.feed(data):
                    if isinstance(part, GoAway):
                        self.goaway = (part.error_code, part.last_stream_id)
                        continue
                    try:
                        events = self.conn.receive_data(part)
                    except h2.exceptions.ProtocolError:
                        return
                    for event in events:
                        self._on(event)
                self.flush()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            for reply in self.replies.values():
                reply.done.set()

    def _on(self, event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", 0)
        reply = self.replies.get(sid)
        if isinstance(event, h2.events.ResponseReceived) and reply is not None:
            reply.headers = [(n, v) for n, v in event.headers if n[:1] != b":"]
            reply.status = int(dict(event.headers)[b":status"])
        elif isinstance(event, h2.events.InformationalResponseReceived) and reply:
            reply.interim.append(int(dict(event.headers)[b":status"]))
        elif isinstance(event, h2.events.DataReceived) and reply is not None:
            reply.body += event.data
            reply.frames.append((len(event.data), event.stream_ended is not None))
            if self.auto_ack:
                self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
        elif isinstance(event, h2.events.TrailersReceived) and reply is not None:
            reply.trailers = list(event.headers)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.window.set()
        elif isinstance(event, h2.events.StreamEnded) and reply is not None:
            reply.done.set()
        elif isinstance(event, h2.events.StreamReset) and reply is not None:
            reply.reset = event.error_code
            reply.done.set()
