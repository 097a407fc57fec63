"""Shared test utilities: a real configurable backend, a raw-socket client, entrances.

Everything here uses real sockets on 127.0.0.1. The backend parses with h11, so it is
independent of the llhttp parser the proxy uses.

:class:`TestBackend` — ``async with TestBackend() as backend:`` then ``backend.url``.
Behaviour is chosen by the request path (query parameters tune it):

==========================  ===========================================================
``/echo`` (any other path)  200, JSON ``{"method", "path", "query", "headers": [[n, v]],
                            "body"}`` (strings are latin-1 decoded bytes)
``/fixed?size=N``           200 with N bytes of ``x`` and a Content-Length
``/chunked?size=N&chunk=M`` 200 chunked: N bytes of ``x`` in M-byte chunks
                            (``&delay=S`` sleeps S seconds between chunks)
``/trailers``               200 chunked ``ok`` with trailer ``Grpc-Status: 0``
``/interim``                ``100 Continue`` and ``103 Early Hints`` first, then echo
``/eof?size=N``             200 without length: N bytes, then the connection closes
``/status/NNN``             status NNN, empty body
``/slow?delay=S``           echo after S seconds
``/hang``                   never answers (the connection stays open)
``/garbage``                non-HTTP bytes, then close
``/close``                  closes without answering
``/close-early``            head with Content-Length 100, 10 bytes, then close
``/upgrade``                101 if the request asks to upgrade, then echoes raw bytes
==========================  ===========================================================

Options: ``tls`` (an ``ssl.SSLContext`` for the server side), ``idle_close`` (close a
kept-alive connection after that many idle seconds), ``drop_reused`` (close, without a
byte of answer, any request that arrives on an already used connection — a backend that
closed a keep-alive connection just as the proxy reused it).

The backend records ``connections`` (accepted count) and ``requests`` (every
:class:`Seen` request, in order).

:class:`ScriptBackend` writes raw bytes by script instead, for answers no well-behaved
server gives (``ScriptBackend.replying(*replies)`` for one reply per request head).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import json
import os
import ssl
import subprocess
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Awaitable, Callable, Self, Sequence
from urllib.parse import parse_qs

import h11
import uvloop

from proxy.entrances.listener import EntranceSettings, serve_entrance
from proxy.request import Handle, Headers

HOST = "127.0.0.1"
READ_TIMEOUT = 5.0  # every helper read gives up after this long
TEST_TIMEOUT = 20.0  # an on_uvloop test is cancelled after this long


def on_uvloop(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an ``async def`` test on a fresh uvloop loop (the production loop), bounded
    by ``TEST_TIMEOUT``. Use on plain (non-fixture-async) test functions."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        async def bounded() -> None:
            await asyncio.wait_for(test(*args, **kwargs), TEST_TIMEOUT)

        uvloop.run(bounded())

    return run


@dataclass
class Seen:
    """A request as the test backend received it."""

    method: str
    target: str
    headers: list[tuple[bytes, ...]]
    body: bytes
    connection: int  # 1-based index of the connection it arrived on

    def header(self, name: bytes) -> bytes | None:
        """First value of header ``name`` (case-insensitive)."""
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


class LoopbackServer(abc.ABC):
    """A stream server on 127.0.0.1 on a port the kernel picks; ``async with`` starts it.

    Subclasses implement :meth:`_serve` and register each connection's writer in
    ``_writers`` while it is open: leaving the ``async with`` closes the listener and
    drops those connections, so kept-alive ones end with the test.
    """

    __test__ = False  # not a pytest test class
    tls: ssl.SSLContext | None = None

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        """``http(s)://127.0.0.1:<port>``."""
        return f"{'https' if self.tls else 'http'}://{HOST}:{self.port}"

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._serve, HOST, 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stop listening and drop every open connection."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @abc.abstractmethod
    async def _serve(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        """Serve one connection."""


Step = tuple[float | None, bytes]  # (seconds to wait first, bytes to write)


class ScriptBackend(LoopbackServer):
    """A backend that writes raw bytes it is given. Answers the n-th request head it reads (over all connections) with the n-th
    script (the last repeats): a list of (delay, bytes) steps, written in order on that
    connection before the next head is read. ``b""`` as bytes closes the connection;
    a delay of None waits (reading and dropping) until the proxy closes it.
    Records every head, and the bytes after it up to the next read, in ``seen``."""

    def __init__(self, *scripts: Sequence[Step]) -> None:
        super().__init__()
        self.scripts = scripts
        self.seen: list[bytes] = []
        self.connections = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            while True:
                self.seen.append(await reader.readuntil(b"\r\n\r\n"))
                script = self.scripts[min(len(self.seen), len(self.scripts)) - 1]
                for delay, data in script:
                    if delay is None:
                        while await reader.read(65536):
                            pass
                    elif delay:
                        await asyncio.sleep(delay)
                    if not data:
                        return
                    writer.write(data)
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # cancelled: the test ended while this step still waited
        finally:
            self._writers.discard(writer)
            writer.close()

    @classmethod
    def replying(cls, *replies: bytes, keep_alive: bool = False) -> "ScriptBackend":
        """For replies :class:`TestBackend` cannot produce (broken heads, truncated
        chunked bodies, extra bytes after a response, hop-by-hop response headers): the
        n-th request head gets ``replies[n]`` (the last one repeats). Without
        ``keep_alive`` the connection then ends (FIN, after the bytes are flushed);
        with it, the connection waits for more heads."""
        end: tuple[Step, ...] = () if keep_alive else ((0.0, b""),)
        return cls(*(((0.0, reply), *end) for reply in replies))



class TestBackend(LoopbackServer):
    """A small real HTTP/1.1 server; see the module docstring for its behaviours."""

    def __init__(self, *, tls: ssl.SSLContext | None = None, idle_close: float | None = None,
                 drop_reused: bool = False) -> None:
        super().__init__()
        self.tls = tls
        self.idle_close = idle_close
        self.drop_reused = drop_reused
        self.connections = 0
        self.requests: list[Seen] = []
        self._method = ""  # of the request being answered (a HEAD gets no body)

    # -- serving

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        index = self.connections
        self._writers.add(writer)
        conn = h11.Connection(h11.SERVER)
        served = 0
        try:
            while True:
                request = await self._next_request(conn, reader, idle=served > 0)
                if request is None:
                    return
                method, target, headers, body = request
                self._method = method
                self.requests.append(Seen(method, target, headers, body, index))
                if self.drop_reused and served > 0:
                    return
                served += 1
                keep = await self._answer(conn, reader, writer, method, target, headers, body)
                if not keep or conn.our_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def _next_request(self, conn: h11.Connection, reader: asyncio.StreamReader,
                            idle: bool) -> tuple[str, str, Headers, bytes] | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                timeout = self.idle_close if idle and head is None else None
                try:
                    data = await asyncio.wait_for(reader.read(65536), timeout)
                except TimeoutError:
                    return None
                conn.receive_data(data)
                if not data and conn.their_state is not h11.DONE and head is None:
                    return None
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return (head.method.decode(), head.target.decode("latin-1"),
                        list(head.headers.raw_items()), bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _answer(self, conn: h11.Connection, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, method: str, target: str,
                      headers: Headers, body: bytes) -> bool:
        path, _, query = target.partition("?")
        args = {k: v[0] for k, v in parse_qs(query).items()}
        size = int(args.get("size", "0"))
        if path == "/hang":
            await reader.read()  # until the peer closes
            return False
        if path == "/garbage":
            writer.write(b"this is not http at all\r\n\r\n")
            await writer.drain()
            return False
        if path == "/close":
            return False
        if path == "/close-early":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
            await writer.drain()
            return False
        if path == "/eof":
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * size)
            await writer.drain()
            return False
        if path == "/upgrade":
            return await self._upgrade(conn, reader, writer, headers)
        if path.startswith("/status/"):
            status = int(path[len("/status/"):])
            await self._send(conn, writer, status, [], b"")
            return True
        if path == "/fixed":
            await self._send(conn, writer, 200, [], b"x" * size)
            return True
        if path == "/chunked":
            await self._stream(conn, writer, size, int(args.get("chunk", "1024")),
                               float(args.get("delay", "0")))
            return True
        if path == "/trailers":
            writer.write(conn.send(h11.Response(status_code=200, headers=[
                ("Transfer-Encoding", "chunked"), ("Trailer", "Grpc-Status")])))
            writer.write(conn.send(h11.Data(data=b"ok")))
            writer.write(conn.send(h11.EndOfMessage(headers=[("Grpc-Status", "0")])))
            await writer.drain()
            return True
        if path == "/slow":
            await asyncio.sleep(float(args.get("delay", "1")))
        if path == "/interim":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n"
                         b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n")
        payload = json.dumps({
            "method": method, "path": path, "query": query,
            "headers": [[n.decode("latin-1"), v.decode("latin-1")] for n, v in headers],
            "body": body.decode("latin-1"),
        }).encode()
        await self._send(conn, writer, 200, [("Content-Type", "application/json")], payload)
        return True

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int,
                    headers: list[tuple[str, str]], body: bytes) -> None:
        if status not in (204, 304) and not any(n.lower() == "content-length" for n, _ in headers):
            headers = headers + [("Content-Length", str(len(body)))]
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        data = conn.send(h11.Response(status_code=status, headers=headers, reason=reason))
        if body and self._method != "HEAD":
            data += conn.send(h11.Data(data=body))
        writer.write(data + conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _stream(self, conn: h11.Connection, writer: asyncio.StreamWriter, size: int,
                      chunk: int, delay: float) -> None:
        writer.write(conn.send(h11.Response(
            status_code=200, headers=[("Transfer-Encoding", "chunked")])))
        sent = 0
        while sent < size:
            piece = min(chunk, size - sent)
            writer.write(conn.send(h11.Data(data=b"x" * piece)))
            sent += piece
            await writer.drain()
            if delay:
                await asyncio.sleep(delay)
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _upgrade(self, conn: h11.Connection, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter, headers: Headers) -> bool:
        upgrade = next((v for n, v in headers if n.lower() == b"upgrade"), None)
        if upgrade is None:
            await self._send(conn, writer, 400, [], b"no upgrade asked\n")
            return True
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                     b"Upgrade: " + upgrade + b"\r\n\r\n")
        leftover, _ = conn.trailing_data
        if leftover:
            writer.write(bytes(leftover))
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        return False


# --------------------------------------------------------------------------- client


@dataclass
class RawResponse:
    """A response read off a raw socket."""

    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def header(self, name: bytes) -> bytes | None:
        """First value of header ``name`` (case-insensitive)."""
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    def json(self) -> Any:
        return json.loads(self.body)


class RawClient:
    """A client that writes exactly the bytes you give it and parses what comes back.

    ``await RawClient.connect(port)``; ``send(b"...")``; ``await read_response()``
    (pass ``head=True`` for the answer to a HEAD); ``await closed()`` tells whether the
    server closed the connection. Every read gives up after ``READ_TIMEOUT`` seconds
    (raising TimeoutError).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int, host: str = HOST, *, path: str | None = None) -> "RawClient":
        if path is not None:
            reader, writer = await asyncio.open_unix_connection(path)
        else:
            reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def read_response(self, *, head: bool = False,
                            timeout: float = READ_TIMEOUT) -> RawResponse:
        """Read one response (a 1xx interim answer counts as one)."""
        return await asyncio.wait_for(self._read_response(head), timeout)

    async def _read_response(self, head: bool) -> RawResponse:
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw[:-4].split(b"\r\n")
        version, status, reason = (lines[0].split(b" ", 2) + [b""])[:3]
        assert version in (b"HTTP/1.1", b"HTTP/1.0"), lines[0]
        headers = [(n, v.strip()) for n, v in (line.split(b":", 1) for line in lines[1:])]
        response = RawResponse(int(status), reason, headers)
        code = response.status
        if head or code < 200 or code in (204, 304):
            return response
        length = response.header(b"content-length")
        if (response.header(b"transfer-encoding") or b"").lower() == b"chunked":
            response.body, response.trailers = await self._read_chunked()
        elif length is not None:
            response.body = await self.reader.readexactly(int(length))
        else:
            response.body = await self.reader.read()
        return response

    async def _read_chunked(self) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        body = bytearray()
        while True:
            size_line = await self.reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            body += await self.reader.readexactly(size)
            assert await self.reader.readexactly(2) == b"\r\n"
        trailers = []
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, value = line[:-2].split(b":", 1)
            trailers.append((name, value.strip()))
        return bytes(body), trailers

    async def read_all(self, timeout: float = READ_TIMEOUT) -> bytes:
        """Everything until the server closes."""
        return await asyncio.wait_for(self.reader.read(), timeout)

    async def closed(self, timeout: float = READ_TIMEOUT) -> bool:
        """True if the server closes the connection (with nothing more to read) within
        ``timeout``; False if bytes arrive or it stays open."""
        try:
            data = await asyncio.wait_for(self.reader.read(1), timeout)
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        return data == b""

    def close(self) -> None:
        self.writer.transport.abort()


# ------------------------------------------------------------------------ entrances


@contextlib.asynccontextmanager
async def running_entrance(handle: Handle, **settings: Any):  # type: ignore[no-untyped-def]
    """Serve ``handle`` on a fresh 127.0.0.1 port; yields the port.

    Keyword arguments become :class:`EntranceSettings` fields.
    """
    server = await serve_entrance(handle, EntranceSettings(**settings), host=HOST, port=0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


# ------------------------------------------------------------------------------ TLS


@dataclass
class TLSFiles:
    """A throwaway CA and a leaf certificate it signed (PEM files in one directory)."""

    ca_pem: str  # the CA certificate, as text (a BackendTLS caBundle)
    ca_key: str  # path
    cert: str  # path of the leaf certificate
    key: str  # path of the leaf key

    def server_context(self, client_ca: str | None = None) -> ssl.SSLContext:
        """A server-side context presenting the leaf; ``client_ca`` (PEM text) makes
        client certificates required and trusted from that CA."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=client_ca)
        return context

    def read(self, path: str) -> bytes:
        with open(path, "rb") as handle:
            return handle.read()


def make_tls(directory: str, san: str = "DNS:backend.test", name: str = "leaf") -> TLSFiles:
    """Create a CA and a leaf certificate with subjectAltName ``san`` (openssl CLI,
    P-256 keys, valid one day) in ``directory``."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)

    ca_key, ca_pem = (os.path.join(directory, f"{name}-ca.{ext}") for ext in ("key", "pem"))
    key, csr, cert, ext = (os.path.join(directory, f"{name}.{e}")
                           for e in ("key", "csr", "pem", "cnf"))
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca_pem, "-days", "1",
            "-subj", f"/CN={name} test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    with open(ext, "w") as handle:
        handle.write(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
                     "extendedKeyUsage=serverAuth,clientAuth\n")
    openssl("x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key,
            "-CAcreateserial", "-out", cert, "-days", "1", "-extfile", ext)
    with open(ca_pem) as handle:
        return TLSFiles(handle.read(), ca_key, cert, key)
