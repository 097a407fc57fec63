"""The bare uvloop + httptools forwarding loop: the floor of what an asyncio proxy costs.

Written for the benchmark only and never imported by the product. It forwards HTTP/1.1
to one backend and does nothing a product must do (no routing, filters, limits,
timeouts, metrics, pipelining or error answers), so the gap between it and tunnelgate
is the price of design and features, not of Python or the event loop.

One ``asyncio.Protocol`` per client connection with an ``HttpRequestParser``, one per
upstream connection with an ``HttpResponseParser``, a list of idle keep-alive upstream
connections; hop-by-hop headers dropped, each head rebuilt with one ``b"".join``, body
slices written as they arrive. No Task and no coroutine per request: the client's
callbacks write to an upstream connection, the upstream's straight to the client
transport. Only dialing a new upstream connection (pool empty) waits on a Future.

    python -m benchmarks.bareloop --listen PORT --backend PORT
"""

from __future__ import annotations

import argparse
import asyncio

import httptools
import uvloop

# RFC 9110 §7.6.1: fields only meaningful for one connection, never forwarded. The body
# framing is redone here (httptools hands over de-chunked body slices).
HOP_BY_HOP = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"te",
                        b"trailer", b"transfer-encoding", b"upgrade"))


class Upstream(asyncio.Protocol):
    """One keep-alive connection to the backend; relays one response at a time."""

    def __init__(self, pool: list["Upstream"]) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: Client | None = None
        self.reason = b""
        self.headers: list[bytes] = []
        self.chunked = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)
        if self.client is not None:
            self.client.transport.close()  # mid-response: the client sees it cut

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in HOP_BY_HOP:
            self.chunked = self.chunked or name.lower() == b"transfer-encoding"
            return
        self.headers += (name, b": ", value, b"\r\n")

    def on_headers_complete(self) -> None:
        status = b"%d " % self.parser.get_status_code()
        framing = b"Transfer-Encoding: chunked\r\n" if self.chunked else b""
        assert self.client is not None
        self.client.transport.write(b"".join((b"HTTP/1.1 ", status, self.reason, b"\r\n",
                                              *self.headers, framing, b"\r\n")))
        self.reason, self.headers = b"", []

    def on_body(self, body: bytes) -> None:
        assert self.client is not None
        transport = self.client.transport
        if self.chunked:
            transport.write(b"".join((b"%x\r\n" % len(body), body, b"\r\n")))
        else:
            transport.write(body)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        assert client is not None
        if self.chunked:
            client.transport.write(b"0\r\n\r\n")
            self.chunked = False
        if self.parser.should_keep_alive():
            self.pool.append(self)
        else:
            self.close()
        client.response_done()


class Client(asyncio.Protocol):
    """One client connection; one request at a time (wrk does not pipeline)."""

    def __init__(self, backend: tuple[str, int], pool: list[Upstream]) -> None:
        self.backend = backend
        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.url = b""
        self.headers: list[bytes] = []
        self.chunked = False
        self.upstream: Upstream | None = None
        self.pending: list[bytes] | None = None  # written once a dialed upstream is up
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.client is self:
            self.upstream.client = None
            self.upstream.close()  # its response has nowhere to go

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in HOP_BY_HOP:
            self.chunked = self.chunked or name.lower() == b"transfer-encoding"
            return
        self.headers += (name, b": ", value, b"\r\n")

    def on_headers_complete(self) -> None:
        if self.upstream is not None:  # pipelined: out of scope for the floor
            self.transport.close()
            return
        framing = b"Transfer-Encoding: chunked\r\n" if self.chunked else b""
        head = b"".join((self.parser.get_method(), b" ", self.url, b" HTTP/1.1\r\n",
                         *self.headers, framing, b"\r\n"))
        self.url, self.headers = b"", []
        self.keep_alive = self.parser.should_keep_alive()
        if self.pool:
            self.upstream = self.pool.pop()
            self.upstream.client = self
            self.upstream.transport.write(head)  # type: ignore[union-attr]
        else:
            self.pending = [head]
            asyncio.get_running_loop().create_task(self._dial())

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: Upstream(self.pool),
                                                   *self.backend)
        upstream.client = self
        self.upstream = upstream
        pending, self.pending = self.pending or [], None
        upstream.transport.writelines(pending)  # type: ignore[union-attr]

    def _send(self, data: bytes) -> None:
        if self.pending is not None:
            self.pending.append(data)
        elif self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.write(data)

    def on_body(self, body: bytes) -> None:
        self._send(b"".join((b"%x\r\n" % len(body), body, b"\r\n")) if self.chunked
                   else body)

    def on_message_complete(self) -> None:
        if self.chunked:
            self._send(b"0\r\n\r\n")
            self.chunked = False

    def response_done(self) -> None:
        self.upstream = None
        if not self.keep_alive:
            self.transport.close()


async def serve(listen: int, backend: int) -> None:
    loop = asyncio.get_running_loop()
    pool: list[Upstream] = []
    server = await loop.create_server(lambda: Client(("127.0.0.1", backend), pool),
                                      "127.0.0.1", listen, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--backend", type=int, required=True, help="port on 127.0.0.1")
    args = parser.parse_args()
    uvloop.run(serve(args.listen, args.backend))


if __name__ == "__main__":
    main()
