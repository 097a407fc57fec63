"""The bare HTTP/2 forwarding loop: the floor of a Python HTTP/2 proxy.

Written for the benchmark only and never imported by the product: the HTTP/2 analogue
of :mod:`benchmarks.bareloop`. Clients speak HTTP/2 with prior knowledge (h2c), parsed
and written by the same ``h2`` library tunnelgate uses; each stream is forwarded as one
HTTP/1.1 request over a pool of keep-alive backend connections (httptools parses the
answers), and the answer goes back on the stream. It does nothing a product must do
(no routing, filters, limits, timeouts, metrics, flow-control backpressure towards the
backend, error answers), so the gap between it and tunnelgate over h2c is the price of
design and features, not of the HTTP/2 library.

One ``asyncio.Protocol`` per client connection, one per backend connection; no Task
and no coroutine per request. Request bodies are read whole before forwarding (the
benchmark's are 16 KiB); response bodies are sent as the windows allow.

    python -m benchmarks.bareloop_h2 --listen PORT --backend PORT
"""

from __future__ import annotations

import argparse
import asyncio

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import httptools
import uvloop

from benchmarks.bareloop import HOP_BY_HOP

_CONFIG = h2.config.H2Configuration(client_side=False, header_encoding=None,
                                    validate_inbound_headers=False,
                                    validate_outbound_headers=False,
                                    normalize_inbound_headers=False,
                                    normalize_outbound_headers=False)
_NOT_SENT = HOP_BY_HOP | {b"host", b"content-length"}  # (the length is set again)


class Upstream(asyncio.Protocol):
    """One keep-alive backend connection; relays one response at a time."""

    def __init__(self, pool: list["Upstream"]) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: Client | None = None
        self.stream_id = 0
        self.fields: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)

    def send(self, client: "Client", stream_id: int, head: bytes, body: bytes) -> None:
        self.client, self.stream_id = client, stream_id
        self.fields, self.body = [], []
        assert self.transport is not None
        self.transport.write(head + body if body else head)

    # -- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower not in HOP_BY_HOP:
            self.fields.append((lower, value))

    def on_headers_complete(self) -> None:
        self.fields.insert(0, (b":status", b"%d" % self.parser.get_status_code()))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        assert client is not None
        self.pool.append(self)
        client.answer(self.stream_id, self.fields, b"".join(self.body))


class Client(asyncio.Protocol):
    """One HTTP/2 client connection."""

    def __init__(self, backend: int, pool: list[Upstream]) -> None:
        self.backend = backend
        self.pool = pool
        self.conn = h2.connection.H2Connection(_CONFIG)
        self.transport: asyncio.Transport | None = None
        self.heads: dict[int, bytes] = {}  # request heads waiting for their body
        self.bodies: dict[int, list[bytes]] = {}
        self.pending: dict[int, bytes] = {}  # response bytes waiting for window

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        codes = h2.settings.SettingCodes
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
            codes.MAX_CONCURRENT_STREAMS: 128, codes.INITIAL_WINDOW_SIZE: 256 * 1024})
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(1024 * 1024 - 65535)
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.flush()
            assert self.transport is not None
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.heads[event.stream_id] = self._head(event.headers)
                self.bodies[event.stream_id] = []
            elif isinstance(event, h2.events.DataReceived):
                self.bodies[event.stream_id].append(event.data)
                self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                    event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self._forward(event.stream_id)
            elif isinstance(event, h2.events.WindowUpdated):
                for stream_id in list(self.pending):
                    self._send(stream_id, self.pending.pop(stream_id))
        self.flush()

    def _head(self, fields: list[tuple[bytes, bytes]]) -> bytes:
        method = path = authority = b""
        lines = []
        for name, value in fields:
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            elif name == b":authority":
                authority = value
            elif name[:1] != b":" and name not in _NOT_SENT:
                lines.append(b"%s: %s\r\n" % (name, value))
        return b"".join([method, b" ", path, b" HTTP/1.1\r\nhost: ", authority,
                         b"\r\n", *lines])

    def _forward(self, stream_id: int) -> None:
        head = self.heads.pop(stream_id)
        body = b"".join(self.bodies.pop(stream_id))
        head += b"content-length: %d\r\n\r\n" % len(body) if body else b"\r\n"
        if self.pool:
            self.pool.pop().send(self, stream_id, head, body)
        else:
            asyncio.ensure_future(self._dial(stream_id, head, body))

    async def _dial(self, stream_id: int, head: bytes, body: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(
            lambda: Upstream(self.pool), "127.0.0.1", self.backend)
        upstream.send(self, stream_id, head, body)

    def answer(self, stream_id: int, fields: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.conn.send_headers(stream_id, fields, end_stream=not body)
        if body:
            self._send(stream_id, body)
        self.flush()

    def _send(self, stream_id: int, data: bytes) -> None:
        conn = self.conn
        while data:
            room = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size)
            if room <= 0:
                self.pending[stream_id] = data
                return
            conn.send_data(stream_id, data[:room], end_stream=len(data) <= room)
            data = data[room:]


async def serve(listen: int, backend: int) -> None:
    pool: list[Upstream] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(backend, pool), "127.0.0.1", listen,
                                      backlog=1024)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--backend", type=int, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.listen, args.backend))


if __name__ == "__main__":
    main()
