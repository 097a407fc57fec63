"""h2c (and h2 over TLS) backends, end to end: an HTTP/1.1 client talks to the whole
proxy (``tests.stack.running``), which talks HTTP/2 to a real h2 server run by the test.

:class:`H2Backend` is written with the ``h2`` library (server side, prior knowledge, or
TLS with ALPN ``h2``). Behaviour by request path:

=====================  ==============================================================
``/echo`` (any other)  200 JSON ``{"method", "path", "authority", "scheme", "headers",
                       "body", "connection"}`` once the request body ended
``/mirror``            200 at once, then every request body byte straight back
``/big?size=N``        200 with N pattern bytes and a content-length
``/trailers``          200 ``application/grpc``, ``ok``, trailers ``grpc-status: 0``
``/hang``              never answers
``/barrier?n=N``       echo once N requests are in flight at the same time
``/goaway``            echo, then GOAWAY (last stream = this one) and close
``/drain``             GOAWAY (last stream = this one) first, then echo, then close
``/bad-status``        a response head whose ``:status`` is not a number
``/refuse``            on connection 1: GOAWAY that excludes this stream; else echo
``/freeze``            on connection 1: stop reading (no PING answers); else echo
=====================  ==============================================================

Flow control is the real thing on both sides: the backend sends only within the
windows the proxy grants and acknowledges request bytes as it gets them.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import ssl
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence
from urllib.parse import parse_qs, urlsplit

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest

from proxy.request import EMPTY_BODY, BodyError
from proxy.upstream.base import UpstreamError
from proxy.upstream.h2c import H2Pool
from proxy.upstream.h2link import STREAM_WINDOW
from proxy.upstream.h2stream import H2Response, request_fields
from proxy.wire.h2frames import GoAway as _GoAway, GoAwayFilter as _GoAwayFilter
from proxy.upstream.liveness import Liveness
from proxy.upstream.registry import Pools
from routing.model import Backend
from tests.helpers import (
    HOST, READ_TIMEOUT, LoopbackServer, RawClient, RawResponse, make_tls)
from tests.stack import running

LISTEN = ("--listen", f"{HOST}:0")
CANCEL = 0x8  # RST_STREAM error code (RFC 9113 §7)
MB = 1024 * 1024

Fields = list[tuple[bytes, bytes]]


def pattern(size: int) -> bytes:
    """Deterministic, non-repeating-looking bytes (catches reordered frames)."""
    block = bytes((i * 7 + i // 256) % 251 for i in range(65536))
    return (block * (size // len(block) + 1))[:size]


@dataclass
class H2Seen:
    """A request as the h2 backend received it."""

    method: str
    path: str
    authority: str
    scheme: str
    headers: Fields
    connection: int


class _Stream:
    def __init__(self) -> None:
        self.body = bytearray()
        self.chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.ended = asyncio.Event()
        self.sent = 0


class H2Backend(LoopbackServer):
    """A real HTTP/2 server; see the module docstring for its behaviours."""

    def __init__(self, *, max_streams: int = 100, tls: ssl.SSLContext | None = None) -> None:
        super().__init__()
        self.max_streams = max_streams
        self.tls = tls
        self.connections = 0
        self.requests: list[H2Seen] = []
        self.resets: list[int] = []  # error codes of RST_STREAM frames received
        self.streams: list[_Stream] = []
        self.active = 0
        self.peak = 0
        self.changed = asyncio.Event()  # set (and replaced) whenever ``active`` grows

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            await _Peer(self, reader, writer, self.connections).run()
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    def started(self) -> None:
        self.active += 1
        self.peak = max(self.peak, self.active)
        self.changed.set()
        self.changed = asyncio.Event()


class _Peer:
    """One connection of :class:`H2Backend`."""

    def __init__(self, backend: H2Backend, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, index: int) -> None:
        self.backend = backend
        self.reader = reader
        self.writer = writer
        self.index = index
        config = h2.config.H2Configuration(client_side=False, header_encoding=None,
                                           validate_outbound_headers=False)
        self.conn = h2.connection.H2Connection(config)
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: backend.max_streams})
        self.streams: dict[int, _Stream] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.window = asyncio.Event()
        self.reading = True

    async def run(self) -> None:
        self.conn.initiate_connection()
        self.flush()
        try:
            while self.reading and (data := await self.reader.read(65536)):
                for event in self.conn.receive_data(data):
                    self.dispatch(event)
                self.flush()
            if not self.reading:
                await asyncio.sleep(READ_TIMEOUT)  # frozen: read nothing, answer nothing
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            for task in self.tasks.values():
                task.cancel()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.transport.is_closing():
            self.writer.write(data)

    def dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            fields = dict(event.headers)
            stream = self.streams[event.stream_id] = _Stream()
            self.backend.streams.append(stream)
            seen = H2Seen(fields[b":method"].decode(), fields[b":path"].decode(),
                          fields.get(b":authority", b"").decode(), fields[b":scheme"].decode(),
                          [(n, v) for n, v in event.headers if not n.startswith(b":")],
                          self.index)
            self.backend.requests.append(seen)
            self.backend.started()
            self.tasks[event.stream_id] = asyncio.ensure_future(
                self.answer(event.stream_id, seen, stream))
        elif isinstance(event, h2.events.DataReceived):
            stream = self.streams[event.stream_id]
            stream.body += event.data
            stream.chunks.put_nowait(event.data)
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.streams[event.stream_id].ended.set()
            self.streams[event.stream_id].chunks.put_nowait(None)
        elif isinstance(event, h2.events.StreamReset):
            self.backend.resets.append(event.error_code)
            task = self.tasks.get(event.stream_id)
            if task is not None:
                task.cancel()
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.window.set()
            self.window = asyncio.Event()

    async def answer(self, sid: int, seen: H2Seen, stream: _Stream) -> None:
        try:
            await self._answer(sid, seen, stream)
        finally:
            self.backend.active -= 1

    async def _answer(self, sid: int, seen: H2Seen, stream: _Stream) -> None:
        url = urlsplit(seen.path)
        args = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
        if path == "/hang":
            await asyncio.sleep(READ_TIMEOUT * 2)
            return
        if path == "/mirror":
            self.head(sid, [])
            while (chunk := await stream.chunks.get()) is not None:
                await self.send(sid, stream, chunk)
            self.end(sid)
            return
        await asyncio.wait_for(stream.ended.wait(), READ_TIMEOUT)
        if path == "/refuse" and self.index == 1:
            self.go_away(max(sid - 2, 0))
            return
        if path == "/freeze" and self.index == 1:
            self.reading = False
            return
        if path == "/bad-status":
            self.conn.send_headers(sid, [(b":status", b"2x0")], end_stream=True)
            self.flush()
            return
        if path == "/drain":  # graceful: announce the end first, finish this stream
            self.writer.write(goaway_frame(sid, 0))
            await asyncio.sleep(0.05)
        if path == "/big":
            size = int(args["size"])
            self.head(sid, [(b"content-length", b"%d" % size)])
            await self.send(sid, stream, pattern(size))
            self.end(sid)
            return
        if path == "/trailers":
            self.head(sid, [(b"content-type", b"application/grpc")])
            await self.send(sid, stream, b"ok")
            self.conn.send_headers(sid, [(b"grpc-status", b"0"), (b"grpc-message", b"done")],
                                   end_stream=True)
            self.flush()
            return
        if path == "/barrier":
            await self.barrier(int(args["n"]))
        payload = json.dumps({
            "method": seen.method, "path": seen.path, "authority": seen.authority,
            "scheme": seen.scheme, "connection": seen.connection,
            "headers": [[n.decode("latin-1"), v.decode("latin-1")] for n, v in seen.headers],
            "body": stream.body.decode("latin-1"),
        }).encode()
        self.head(sid, [(b"content-type", b"application/json"),
                        (b"content-length", b"%d" % len(payload))])
        await self.send(sid, stream, payload)
        self.end(sid)
        if path == "/goaway":
            self.go_away(sid)
        elif path == "/drain":
            await self.writer.drain()
            self.writer.close()

    async def barrier(self, count: int) -> None:
        backend = self.backend
        async with asyncio.timeout(READ_TIMEOUT):
            while backend.peak < count:
                await backend.changed.wait()

    def head(self, sid: int, fields: Fields) -> None:
        self.conn.send_headers(sid, [(b":status", b"200"), *fields])
        self.flush()

    async def send(self, sid: int, stream: _Stream, data: bytes) -> None:
        """Send within the flow-control windows the proxy grants."""
        conn = self.conn
        while data:
            room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            if room <= 0:
                await asyncio.wait_for(self.window.wait(), READ_TIMEOUT)
                continue
            conn.send_data(sid, data[:room])
            stream.sent += min(room, len(data))
            data = data[room:]
            self.flush()
            await self.writer.drain()

    def end(self, sid: int) -> None:
        self.conn.end_stream(sid)
        self.flush()

    def go_away(self, last_stream_id: int) -> None:
        self.conn.close_connection(last_stream_id=last_stream_id)
        self.flush()
        self.writer.close()


# ------------------------------------------------------------------------ helpers


def goaway_frame(last_stream_id: int, error_code: int) -> bytes:
    """A raw GOAWAY frame (RFC 9113 §6.8), written past the h2 server's state machine,
    which cannot keep serving streams once it sent one itself."""
    return (b"\0\0\x08\x07\0\0\0\0\0" + last_stream_id.to_bytes(4, "big")
            + error_code.to_bytes(4, "big"))


def assert_grpc_trailers_relayed(answer: RawResponse) -> None:
    """``answer`` is H2Backend's ``/trailers`` reply as an HTTP/1.1 client that sent
    ``TE: trailers`` gets it: chunked, with gRPC's status in the trailer section."""
    assert answer.status == 200
    assert answer.header(b"content-type") == b"application/grpc"
    assert answer.header(b"transfer-encoding") == b"chunked"
    assert answer.body == b"ok"
    assert (b"grpc-status", b"0") in answer.trailers
    assert (b"grpc-message", b"done") in answer.trailers


def h2c_config(url: str, **rule: Any) -> dict[str, Any]:
    return {"version": 1, "rules": [
        {"backends": [{"url": url, "weight": 1, "protocol": "h2c"}], **rule}]}


async def ask(port: int, target: str, *, method: str = "GET", body: bytes = b"",
              headers: Sequence[tuple[bytes, bytes]] = (), chunked: bool = False,
              timeout: float = READ_TIMEOUT) -> RawResponse:
    client = await RawClient.connect(port)
    try:
        head = [b"%s %s HTTP/1.1" % (method.encode(), target.encode()), b"Host: app.example"]
        head += [name + b": " + value for name, value in headers]
        if chunked:
            head.append(b"Transfer-Encoding: chunked")
            body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        elif body or method == "POST":
            head.append(b"Content-Length: %d" % len(body))
        client.send(b"\r\n".join(head) + b"\r\n\r\n" + body)
        return await client.read_response(head=method == "HEAD", timeout=timeout)
    finally:
        client.close()


async def eventually(check: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Poll ``check`` every 10 ms for up to ``timeout`` seconds."""
    for _ in range(int(timeout / 0.01)):
        if check():
            return True
        await asyncio.sleep(0.01)
    return check()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@pytest.fixture
async def backend() -> AsyncIterator[H2Backend]:
    async with H2Backend() as server:
        yield server


# ---------------------------------------------------------------------- the proxy


async def test_get_and_post_round_trip_as_http2_requests(backend: H2Backend) -> None:
    async with running(*LISTEN, config=h2c_config(backend.url)) as stack:
        port = stack.cluster_port
        got = await ask(port, "/echo?x=1", headers=[
            (b"X-Custom", b"one"), (b"TE", b"trailers"), (b"Connection", b"keep-alive, X-Drop"),
            (b"Keep-Alive", b"timeout=5"), (b"X-Drop", b"gone"), (b"Cookie", b"a=b")])
        posted = await ask(port, "/echo", method="POST", body=b"hello h2")
        streamed = await ask(port, "/echo", method="PUT", body=b"in chunks", chunked=True)
        empty = await ask(port, "/echo", method="POST")
    assert got.status == posted.status == streamed.status == empty.status == 200
    seen = got.json()
    assert (seen["method"], seen["path"], seen["scheme"]) == ("GET", "/echo?x=1", "http")
    assert seen["authority"] == "app.example"  # Host became :authority ...
    names = [name for name, _ in seen["headers"]]
    assert "host" not in names  # ... and is not sent twice
    assert all(name == name.lower() for name in names)
    assert not {"connection", "keep-alive", "x-drop", "transfer-encoding"} & set(names)
    assert ["x-custom", "one"] in seen["headers"]
    assert ["te", "trailers"] in seen["headers"] and ["cookie", "a=b"] in seen["headers"]
    assert posted.json()["body"] == "hello h2"
    assert ["content-length", "8"] in posted.json()["headers"]
    assert streamed.json()["body"] == "in chunks"  # unknown length: no content-length
    assert "content-length" not in [name for name, _ in streamed.json()["headers"]]
    assert ["content-length", "0"] in empty.json()["headers"]
    assert backend.connections == 1  # every request a stream on one connection


async def test_five_megabytes_each_way_byte_exact(backend: H2Backend) -> None:
    upload = os.urandom(5 * MB)
    async with running(*LISTEN, config=h2c_config(backend.url)) as stack:
        mirrored = await ask(stack.cluster_port, "/mirror", method="POST", body=upload)
        download = await ask(stack.cluster_port, f"/big?size={5 * MB}")
    assert mirrored.status == 200 and mirrored.header(b"transfer-encoding") == b"chunked"
    assert mirrored.body == upload
    assert download.header(b"content-length") == b"%d" % (5 * MB)
    assert download.body == pattern(5 * MB)


async def test_fifty_concurrent_requests_share_one_connection(backend: H2Backend) -> None:
    async with running(*LISTEN, config=h2c_config(backend.url)) as stack:
        answers = await asyncio.gather(*(
            ask(stack.cluster_port, "/barrier?n=50") for _ in range(50)))
    assert [answer.status for answer in answers] == [200] * 50
    assert backend.peak == 50  # all in flight at once (the barrier waited for that) ...
    assert backend.connections == 1  # ... as streams of a single connection


async def test_second_connection_only_past_max_concurrent_streams() -> None:
    async with H2Backend(max_streams=3) as backend:
        async with running(*LISTEN, config=h2c_config(backend.url)) as stack:
            answers = await asyncio.gather(*(
                ask(stack.cluster_port, "/barrier?n=6") for _ in range(6)))
    assert [answer.status for answer in answers] == [200] * 6
    assert backend.connections == 2


async def test_grpc_trailers_reach_an_http1_client_as_chunked_trailers(
        backend: H2Backend) -> None:
    async with running(*LISTEN, config=h2c_config(backend.url)) as stack:
        answer = await ask(stack.cluster_port, "/trailers", method="POST", body=b"\0\0\0\0\0",
                           headers=[(b"TE", b"trailers"),
                                    (b"Content-Type", b"application/grpc")])
    assert_grpc_trailers_relayed(answer)


async def test_hanging_backend_is_a_504_and_its_stream_is_cancelled(
        backend: H2Backend) -> None:
    config = h2c_config(backend.url, timeouts={"request": "300ms"})
    async with running(*LISTEN, config=config) as stack:
        answer = await ask(stack.cluster_port, "/hang")
        assert answer.status == 504
        assert await eventually(lambda: CANCEL in backend.resets)
        after = await ask(stack.cluster_port, "/echo")  # the connection lives on
    assert after.status == 200 and backend.connections == 1


async def test_closed_port_is_a_502() -> None:
    url = f"http://{HOST}:{closed_port()}"
    async with running(*LISTEN, config=h2c_config(url)) as stack:
        answer = await ask(stack.cluster_port, "/")
    assert answer.status == 502


async def test_goaway_sends_the_next_request_over_a_new_connection(
        backend: H2Backend) -> None:
    async with running(*LISTEN, config=h2c_config(backend.url)) as stack:
        first = await ask(stack.cluster_port, "/goaway")
        second = await ask(stack.cluster_port, "/echo")
        # GOAWAY while a stream is in flight: that stream still completes (RFC 9113 §6.8).
        draining = await ask(stack.cluster_port, "/drain")
        third = await ask(stack.cluster_port, "/echo")
    assert first.status == second.status == draining.status == third.status == 200
    assert [answer.json()["connection"] for answer in (first, second, draining, third)] \
        == [1, 2, 2, 3]


async def test_malformed_response_head_is_a_502(backend: H2Backend) -> None:
    async with running(*LISTEN, config=h2c_config(backend.url)) as stack:
        bad = await ask(stack.cluster_port, "/bad-status")
        good = await ask(stack.cluster_port, "/echo")
    assert (bad.status, good.status) == (502, 200)


async def test_stream_excluded_by_goaway_is_retried_only_without_a_body(
        backend: H2Backend) -> None:
    async with running(*LISTEN, config=h2c_config(backend.url)) as stack:
        retried = await ask(stack.cluster_port, "/refuse")
        assert retried.status == 200 and retried.json()["connection"] == 2
        assert backend.connections == 2
    async with H2Backend() as fresh:
        async with running(*LISTEN, config=h2c_config(fresh.url)) as stack:
            with_body = await ask(stack.cluster_port, "/refuse", method="POST", body=b"once")
    assert with_body.status == 502  # its body is gone: never replayed
    assert fresh.connections == 1


async def test_h2_over_tls_with_alpn(tmp_path: Any) -> None:
    files = make_tls(str(tmp_path))
    context = files.server_context()
    context.set_alpn_protocols(["h2"])
    async with H2Backend(tls=context) as backend:
        config = {"version": 1, "rules": [{"backends": [{
            "url": backend.url, "weight": 1, "protocol": "h2c",
            "tls": {"caBundle": files.ca_pem, "serverName": "backend.test"}}]}]}
        async with running(*LISTEN, config=config) as stack:
            answer = await ask(stack.cluster_port, "/echo")
    assert answer.status == 200
    assert answer.json()["scheme"] == "https"


# ------------------------------------------------------------------- the pool alone


def h2_pool(url: str) -> H2Pool:
    pool = Pools().get(Backend(url=url, protocol="h2c"))
    assert isinstance(pool, H2Pool)
    return pool


async def collect(read: Callable[[], Awaitable[bytes]]) -> bytes:
    data = b""
    while chunk := await read():
        data += chunk
    return data


async def test_unread_response_stays_within_the_stream_window(backend: H2Backend) -> None:
    pool = h2_pool(backend.url)
    response = await pool.send("GET", f"/big?size={2 * MB}", [(b"Host", b"h")], EMPTY_BODY)
    await asyncio.sleep(0.2)  # the backend would send everything now if it could
    assert backend.streams[0].sent <= STREAM_WINDOW
    assert await collect(response.read) == pattern(2 * MB)  # reading opens the window
    pool.close()


async def test_close_resets_an_unfinished_stream(backend: H2Backend) -> None:
    pool = h2_pool(backend.url)
    response = await pool.send("GET", f"/big?size={2 * MB}", [(b"Host", b"h")], EMPTY_BODY)
    assert response.status == 200 and response.length == 2 * MB
    response.close()
    assert await eventually(lambda: CANCEL in backend.resets)
    again = await pool.send("GET", "/echo", [(b"Host", b"h")], EMPTY_BODY)
    assert json.loads(await collect(again.read))["connection"] == 1
    pool.close()


@pytest.mark.parametrize("path, read", [("/echo", True), (f"/big?size={2 * MB}", False)])
async def test_a_finished_stream_is_freed_without_the_collector(
        backend: H2Backend, path: str, read: bool) -> None:
    """Read to its end, or closed half-read: no reference cycle keeps the stream (a
    ``gc.freeze`` during a config build would keep cyclic garbage for good)."""
    pool = h2_pool(backend.url)
    gc.collect()
    gc.disable()
    try:
        response = await pool.send("GET", path, [(b"Host", b"h")], EMPTY_BODY)
        if read:
            assert await collect(response.read)
        else:
            assert await response.read()
            response.close()
        del response
        assert not [o for o in gc.get_objects() if isinstance(o, H2Response)]
    finally:
        gc.enable()
        pool.close()


async def test_silent_backend_fails_the_ping_and_the_request_is_retried(
        backend: H2Backend) -> None:
    pool = h2_pool(backend.url)
    pool.ping_after, pool.ping_timeout = 0.1, 0.2
    response = await pool.send("GET", "/freeze", [(b"Host", b"h")], EMPTY_BODY)
    assert json.loads(await collect(response.read))["connection"] == 2
    pool.close()


def watched(calls: list[str], *, ping_after: float = 60.0, ping_timeout: float = 60.0,
            idle_timeout: float = 60.0) -> Liveness:
    """A started :class:`Liveness` that records its verdicts in ``calls``."""
    liveness = Liveness(asyncio.get_running_loop(), ping_after=ping_after,
                        ping_timeout=ping_timeout, idle_timeout=idle_timeout,
                        ping=lambda: calls.append("ping"),
                        unanswered=lambda: calls.append("unanswered"),
                        expired=lambda: calls.append("expired"))
    liveness.start()
    return liveness


async def test_liveness_pings_after_silence_and_gives_up_without_an_answer() -> None:
    calls: list[str] = []
    liveness = watched(calls, ping_after=0.05, ping_timeout=0.1)
    liveness.busy()
    assert await eventually(lambda: calls == ["ping", "unanswered"])
    await asyncio.sleep(0.2)
    assert calls == ["ping", "unanswered"]  # a verdict: the timer is not set again
    liveness.stop()


async def test_liveness_takes_a_read_as_the_answer_and_pings_again() -> None:
    calls: list[str] = []
    liveness = watched(calls, ping_after=0.05, ping_timeout=0.5)
    liveness.busy()
    assert await eventually(lambda: calls == ["ping"])
    liveness.heard()  # the answer, well within ping_timeout
    assert await eventually(lambda: len(calls) >= 2)
    assert calls[:2] == ["ping", "ping"]
    liveness.stop()


async def test_liveness_expires_an_idle_connection_and_stop_ends_it() -> None:
    calls: list[str] = []
    watched(calls, idle_timeout=0.05)
    assert await eventually(lambda: calls == ["expired"])
    stopped = watched(calls, ping_after=0.05, idle_timeout=0.05)
    stopped.stop()
    await asyncio.sleep(0.15)
    assert calls == ["expired"]


async def test_client_body_breaking_after_the_head_fails_the_read(
        backend: H2Backend) -> None:
    broken = asyncio.Event()

    class Breaking:
        length = None
        sent = False

        async def read(self) -> bytes:
            if not self.sent:
                self.sent = True
                return b"first"
            await asyncio.wait_for(broken.wait(), READ_TIMEOUT)
            raise BodyError("client went away")

    pool = h2_pool(backend.url)
    response = await pool.send("POST", "/mirror", [(b"Host", b"h")], Breaking())
    assert response.status == 200  # /mirror answers before the body ends
    broken.set()
    with pytest.raises(UpstreamError) as caught:
        await collect(response.read)  # a truncated answer never reads as complete
    assert caught.value.reason == "canceled"
    assert await eventually(lambda: CANCEL in backend.resets)
    pool.close()


def test_goaway_filter_keeps_order_at_every_split_point() -> None:
    settings = b"\0\0\0\x04\0\0\0\0\0"
    data = b"\0\0\x05\0\x01\0\0\0\x01hello"
    stream = settings + goaway_frame(7, 2) + data + goaway_frame(9, 0) + settings
    for cut in range(len(stream) + 1):
        split = _GoAwayFilter()
        merged: list[bytes | _GoAway] = []  # adjacent byte runs joined
        for part in split.feed(stream[:cut]) + split.feed(stream[cut:]):
            if isinstance(part, bytes) and merged and isinstance(merged[-1], bytes):
                merged[-1] += part
            elif part:
                merged.append(part)
        assert merged == [settings, _GoAway(7, 2), data, _GoAway(9, 0), settings], cut
    with pytest.raises(ValueError):
        _GoAwayFilter().feed(b"\0\0\x03\x07\0\0\0\0\0abc")


def test_request_fields_follow_rfc_9113() -> None:
    fields = request_fields("OPTIONS", b"http", "*", [
        (b"Host", b"a.example:8080"), (b"Upgrade", b"h2c"), (b"HTTP2-Settings", b"x"),
        (b"TE", b"gzip, trailers"), (b"Transfer-Encoding", b"chunked"),
        (b"Proxy-Connection", b"keep-alive"), (b"Content-Length", b"3"), (b"X-A", b"1")],
        None)
    assert fields == [(b":method", b"OPTIONS"), (b":scheme", b"http"),
                      (b":authority", b"a.example:8080"), (b":path", b"*"),
                      (b"x-a", b"1"), (b"te", b"trailers")]
    assert (b"content-length", b"0") in request_fields("PATCH", b"https", "/", [], 0)
    assert request_fields("GET", b"http", "/", [(b"TE", b"gzip")], 0)[4:] == []
