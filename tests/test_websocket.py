"""WebSocket sessions through every entrance, end to end.

One real tunnelgate (``proxy.control.runtime.Runtime`` from CLI flags, on uvloop like production)
serves the same table on every entrance, in front of a real WebSocket echo server
(``tests.wsutil.EchoServer``, which validates masking and the handshake itself):

- ``tunnel``  — the sidecar entrance, dialed the way cloudflared dials it: the upgrade
  headers re-added (``Connection: Upgrade``, ``Upgrade: websocket``,
  ``Sec-WebSocket-Version: 13``), the edge headers, no body;
- ``tunnel-unix`` — the same over a unix socket (cloudflared's ``unix:`` origin);
- ``cluster`` — the in-cluster listener (scope ``all``), dialed like a browser;
- ``bridge``  — the in-process OriginProxy with the HTTP/2 transport writer
  (``is_websocket=True``): the 101 goes out as 200, then the hijacked stream pipes;
- ``bridge-quic`` — the same with the QUIC transport writer, which keeps the 101.

The route carries ``timeouts.request: 300ms``: it bounds the handshake only, never the
session.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import tempfile
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import httpx
import pytest

from proxy.request import Headers
from tests.helpers import RawClient, TestBackend, on_uvloop
from tests.stack import Stack, running
from tests.wsutil import (
    OP_BINARY, OP_TEXT, EchoServer, Session, WebSocket, accept_for, connect, encode_frame,
    new_key)
from tunnel.origin import Bridge, TunnelRequest
from tunnel.writers import RecordedResponse

ENTRANCES = ("tunnel", "tunnel-unix", "cluster", "bridge", "bridge-quic")
BRIDGES = ("bridge", "bridge-quic")
WS_HOST = "ws.example.com"
EDGE_IP = "203.0.113.7"  # the eyeball address the edge vouches for (CF-Connecting-IP)
BOUND = 3.0  # seconds within which a close must reach the other side
BIG = 10 * 1024 * 1024
SESSIONS = "cftunnel_proxy_websocket_active_sessions"
IN_FLIGHT = "cftunnel_proxy_requests_in_flight"

# What cloudflared sends a sidecar origin for a WebSocket.
CLOUDFLARED: Headers = [
    (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket"),
    (b"Sec-WebSocket-Version", b"13"), (b"User-Agent", b"Mozilla/5.0 (X11; Linux)"),
    (b"Cf-Connecting-Ip", EDGE_IP.encode()), (b"Cf-Ray", b"8f1d2c3b4a596877-AMS"),
    (b"Cf-Visitor", b'{"scheme":"https"}'), (b"X-Forwarded-For", EDGE_IP.encode()),
    (b"X-Forwarded-Proto", b"https"), (b"Accept-Encoding", b"gzip")]
BROWSER: Headers = [
    (b"Connection", b"keep-alive, Upgrade"), (b"Upgrade", b"websocket"),
    (b"Sec-WebSocket-Version", b"13"), (b"Origin", f"https://{WS_HOST}".encode())]
# What the edge hands the in-process origin: no Connection/Upgrade (is_websocket says it).
EDGE: list[tuple[str, str]] = [
    ("User-Agent", "Mozilla/5.0 (X11; Linux)"), ("Cf-Connecting-Ip", EDGE_IP),
    ("Cf-Visitor", '{"scheme":"https"}'), ("Sec-WebSocket-Version", "13")]
# (X-Forwarded-For, X-Forwarded-Proto) the backend must see per entrance.
FORWARDED = {"tunnel": (EDGE_IP, "https"), "tunnel-unix": (EDGE_IP, "https"),
             "bridge": (EDGE_IP, "https"), "bridge-quic": (EDGE_IP, "https"),
             "cluster": ("127.0.0.1", "http")}


def ws_config(backend_url: str) -> dict:
    return {"version": 1, "rules": [{
        "hostnames": [WS_HOST],
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {
            "set": [{"name": "X-Via", "value": "tunnelgate"}]}}],
        "backends": [{"url": backend_url, "weight": 1, "websocket": True}],
        "timeouts": {"request": "300ms"}}]}


@dataclass
class Opened:
    """The answer to an opening handshake through one entrance."""

    status: int
    headers: Headers  # as the client sees them (the HTTP/2 blob decoded)
    body: bytes
    ws: WebSocket | None
    record: RecordedResponse | None = None  # bridge only

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)


class World:
    """The echo server behind a running tunnelgate, reachable through every entrance."""

    def __init__(self, server: EchoServer, stack: Stack) -> None:
        self.server = server
        self.stack = stack
        handle = stack.runtime.in_flight  # the Handler the socket entrances use
        self.bridges = {"bridge": Bridge(handle),
                        "bridge-quic": Bridge(handle, transport="quic")}

    async def open(self, entrance: str, path: str = "/chat", early: bytes = b"") -> Opened:
        """Open a session; ``early`` bytes ride in the handshake's own write (sockets)."""
        key = new_key()
        if entrance in BRIDGES:
            return await self._open_bridge(self.bridges[entrance], path, key)
        listening = self.stack.listening
        address: int | str
        if entrance == "cluster":
            address, extra = self.stack.cluster_port, BROWSER
        else:
            assert listening.tunnel is not None
            address = listening.tunnel.path or listening.tunnel.port
            extra = CLOUDFLARED
        headers = [(b"Host", WS_HOST.encode()), (b"Sec-WebSocket-Key", key), *extra]
        answer, ws = await connect(address, path, headers, early=early)
        return Opened(answer.status, answer.headers, answer.body, ws)

    async def _open_bridge(self, bridge: Bridge, path: str, key: bytes) -> Opened:
        request = TunnelRequest("GET", f"https://{WS_HOST}{path}",
                                [*EDGE, ("Sec-WebSocket-Key", key.decode())])
        record = await asyncio.wait_for(bridge.serve(request, is_websocket=True), BOUND)
        ws = None
        if record.stream is not None:
            assert record.header(b"sec-websocket-accept") == accept_for(key)
            ws = WebSocket(record.stream, client=True)
        return Opened(record.status or 0, record.headers(), record.body, ws, record)

    def session(self) -> Session:
        assert self.server.sessions, "the backend saw no handshake"
        return self.server.sessions[-1]

    async def gauges(self) -> dict[str, float]:
        """The two unlabelled gauges."""
        samples = await scrape(self.stack)
        return {SESSIONS: samples[SESSIONS], IN_FLIGHT: samples[IN_FLIGHT]}

    async def settle(self, name: str, want: float) -> None:
        """Wait (bounded) until gauge ``name`` reads ``want``."""
        deadline = time.monotonic() + BOUND
        while (value := (await self.gauges())[name]) != want:
            assert time.monotonic() < deadline, f"{name} stuck at {value}, want {want}"
            await asyncio.sleep(0.02)


async def scrape(stack: Stack) -> dict[str, float]:
    """Every sample on /metrics (admin port), keyed by its name and labels."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{stack.admin_url}/metrics")).text
    return {name: float(value) for name, _, value in
            (line.rpartition(" ") for line in text.splitlines())
            if name and not name.startswith("#")}


@asynccontextmanager
async def world(entrance: str = "tunnel") -> AsyncIterator[World]:
    """The echo server behind tunnelgate; the tunnel entrance on a unix socket for
    ``tunnel-unix``, else on a loopback port."""
    with tempfile.TemporaryDirectory() as directory:
        tunnel = (f"unix:{directory}/origin.sock" if entrance == "tunnel-unix"
                  else "127.0.0.1:0")
        async with EchoServer() as server, running(
                "--listen", "127.0.0.1:0", "--tunnel-listen", tunnel,
                "--cluster-scope", "all", config=ws_config(server.url)) as stack:
            yield World(server, stack)


async def established(w: World, entrance: str, path: str = "/chat") -> WebSocket:
    opened = await w.open(entrance, path)
    # HTTP/2 has no 101: that writer sends 200 and the edge restores the 101.
    assert opened.status == (200 if entrance == "bridge" else 101)
    assert opened.ws is not None
    return opened.ws


def per_entrance(test: Callable[[str], object]) -> Callable[..., None]:
    """Run ``test(entrance)`` on uvloop for each entrance."""
    return pytest.mark.parametrize("entrance", ENTRANCES)(on_uvloop(test))


def messages(count: int) -> list[bytes | str]:
    """``count`` text and binary messages of assorted sizes (0 to ~70 kB), seeded."""
    rand = random.Random(6455)
    out: list[bytes | str] = []
    for i in range(count):
        size = rand.choice((0, 1, 125, 126, 300, 65535, 65536, 70000)) if i % 50 == 0 \
            else rand.randrange(0, 2000)
        if i % 2:
            out.append(rand.randbytes(size))
        else:
            out.append(f"{i}:" + "é" * (size // 2))
    return out


# ------------------------------------------------------------------------------ tests


@per_entrance
async def test_echo_thousand_messages_and_ten_megabytes(entrance: str) -> None:
    async with world(entrance) as w:
        ws = await established(w, entrance)
        session = w.session()
        xff, proto = FORWARDED[entrance]
        assert session.header(b"x-forwarded-for") == xff.encode()
        assert session.header(b"x-forwarded-proto") == proto.encode()
        assert await w.gauges() == {SESSIONS: 1.0, IN_FLIGHT: 0.0}

        sent = messages(1000)
        sender = asyncio.ensure_future(_send_all(ws, sent))
        for i, message in enumerate(sent):
            got = await asyncio.wait_for(ws.recv(), 5)
            assert got is not None, f"session ended after {i} messages"
            want = message.encode() if isinstance(message, str) else message
            assert (got.opcode, got.data) == (
                OP_TEXT if isinstance(message, str) else OP_BINARY, want), i
        await sender

        big = os.urandom(BIG)
        await ws.send(big)
        echoed = await asyncio.wait_for(ws.recv(), 10)
        assert echoed is not None and echoed.data == big
        assert session.echoed == 1001

        await ws.send_close(1000)
        assert await asyncio.wait_for(ws.recv(), BOUND) is None
        assert ws.close_code == 1000  # the backend answered the close handshake
        ws.close()
        await w.settle(SESSIONS, 0.0)
        samples = await scrape(w.stack)
        assert samples[IN_FLIGHT] == 0.0
        # Counted once, as 1xx, at takeover; the duration observed time-to-101.
        assert samples[f'cftunnel_proxy_requests_total{{hostname="{WS_HOST}",'
                       'status_class="1xx"}'] == 1.0
        assert samples['cftunnel_proxy_request_duration_seconds_bucket'
                       f'{{hostname="{WS_HOST}",le="1.0"}}'] == 1.0
        for direction in ("request", "response"):  # post-upgrade bytes are excluded
            assert samples[f'cftunnel_proxy_{direction}_bytes_total'
                           f'{{hostname="{WS_HOST}"}}'] == 0.0


async def _send_all(ws: WebSocket, sent: list[bytes | str]) -> None:
    for message in sent:
        await ws.send(message)


@per_entrance
async def test_client_close_reaches_the_backend(entrance: str) -> None:
    async with world(entrance) as w:
        ws = await established(w, entrance)
        await ws.send("hello")
        assert (await asyncio.wait_for(ws.recv(), BOUND)).data == b"hello"
        ws.close()  # the client goes away without a close frame
        session = w.session()
        await asyncio.wait_for(session.ended.wait(), BOUND)
        assert session.saw_eof
        await w.settle(SESSIONS, 0.0)


@per_entrance
async def test_backend_close_reaches_the_client(entrance: str) -> None:
    async with world(entrance) as w:
        ws = await established(w, entrance)
        await ws.send("close-now")
        assert await asyncio.wait_for(ws.recv(), BOUND) is None
        assert ws.close_code == 1000
        assert await asyncio.wait_for(ws.recv(), BOUND) is None
        assert ws.eof  # the stream itself ended: the proxy closed its side too
        await w.settle(SESSIONS, 0.0)
        ws.close()


@per_entrance
async def test_refused_upgrade_is_relayed_as_a_normal_response(entrance: str) -> None:
    async with world(entrance) as w:
        opened = await w.open(entrance, "/deny")
        assert opened.status == 403
        assert opened.body == b"no websockets for you\n"
        assert opened.ws is None and opened.header(b"sec-websocket-accept") is None
        assert opened.header(b"x-via") == b"tunnelgate"  # response filters still apply
        if opened.record is not None:
            assert opened.record.error is None and opened.record.stream is None
        assert await w.gauges() == {SESSIONS: 0.0, IN_FLIGHT: 0.0}


@per_entrance
async def test_route_timeout_does_not_cut_an_established_session(entrance: str) -> None:
    async with world(entrance) as w:
        ws = await established(w, entrance)
        for word in ("early", "late"):
            await asyncio.sleep(0.6)  # 1.2 s in all: four times the route's 300 ms
            await ws.send(word)
            echoed = await asyncio.wait_for(ws.recv(), BOUND)
            assert echoed is not None and echoed.data == word.encode()
        assert (await w.gauges())[SESSIONS] == 1.0
        ws.close()
        await w.settle(SESSIONS, 0.0)


@per_entrance
async def test_route_timeout_bounds_the_handshake(entrance: str) -> None:
    """A backend slower than the route's 300 ms to answer the handshake gets a 504,
    and its half-open session is hung up on."""
    async with world(entrance) as w:
        started = time.monotonic()
        opened = await w.open(entrance, "/slow-handshake")
        assert opened.status == 504 and opened.ws is None
        assert time.monotonic() - started < 0.9  # well before the backend's 1 s
        session = w.session()
        await asyncio.wait_for(session.ended.wait(), 0.9)
        assert session.saw_eof  # hung up on before the backend got round to answering
        samples = await scrape(w.stack)
        assert samples[f'cftunnel_proxy_backend_errors_total{{hostname="{WS_HOST}",'
                       'reason="timeout"}'] == 1.0
        assert samples[SESSIONS] == 0.0 and samples[IN_FLIGHT] == 0.0


@on_uvloop
async def test_the_websocket_dial_has_its_own_timeout() -> None:
    """PROXY_WS_DIAL_TIMEOUT bounds dialing the backend of an upgrade, not the
    pools' 5 s: a backend whose accept queue is full (SYNs dropped) gets a 502 fast."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        fillers = [socket.socket() for _ in range(3)]  # fill the accept queue
        try:
            for filler in fillers:
                filler.setblocking(False)
                filler.connect_ex(listener.getsockname())
            url = "http://127.0.0.1:%d" % listener.getsockname()[1]
            async with running("--listen", "127.0.0.1:0", "--cluster-scope", "all",
                               config=ws_config(url),
                               environ={"PROXY_WS_DIAL_TIMEOUT": "300ms"}) as stack:
                w = World(EchoServer(), stack)
                started = time.monotonic()
                opened = await w.open("cluster")
                assert opened.status == 502 and opened.ws is None
                assert time.monotonic() - started < 2.0  # the pools' own dial: 5 s
                samples = await scrape(stack)
                assert samples[f'cftunnel_proxy_backend_errors_total{{hostname="{WS_HOST}",'
                               'reason="dial"}'] == 1.0
        finally:
            for filler in fillers:
                filler.close()


@per_entrance
async def test_config_push_does_not_cut_an_established_session(entrance: str) -> None:
    """A request keeps the snapshot it started with; pruning the backend's pool on a
    push closes idle connections only, never a piped session."""
    async with world(entrance) as w:
        ws = await established(w, entrance)
        response = await w.stack.push({"version": 2, "rules": []})
        assert response.status_code == 200
        await ws.send("still there?")
        echoed = await asyncio.wait_for(ws.recv(), BOUND)
        assert echoed is not None and echoed.data == b"still there?"
        assert (await w.open(entrance)).status == 404  # new sessions see the new table
        ws.close()
        await w.settle(SESSIONS, 0.0)


@per_entrance
async def test_switch_answer_and_bytes_around_it(entrance: str) -> None:
    """The 101 carries the backend's accept and the route's response filters
    step 4); a frame the backend sent with its 101, and one the client sent with its
    handshake, are both delivered first."""
    async with world(entrance) as w:
        early = b"" if entrance in BRIDGES else encode_frame(OP_TEXT, b"eager", masked=True)
        opened = await w.open(entrance, "/greet", early=early)
        assert opened.ws is not None
        assert opened.header(b"upgrade") == b"websocket"
        assert opened.header(b"x-via") == b"tunnelgate"
        greeting = await asyncio.wait_for(opened.ws.recv(), BOUND)
        assert greeting is not None and greeting.data == b"welcome"
        if early:
            echoed = await asyncio.wait_for(opened.ws.recv(), BOUND)
            assert echoed is not None and echoed.data == b"eager"
        session = w.session()
        assert session.header(b"upgrade") == b"websocket"
        if entrance != "cluster":  # cluster entrance drops cf-*
            assert session.header(b"cf-visitor") == b'{"scheme":"https"}'
        opened.ws.close()


@on_uvloop
async def test_bytes_after_a_pipelined_upgrade_belong_to_the_upgraded_stream() -> None:
    async with TestBackend() as backend, running(
            "--listen", "127.0.0.1:0", config={"version": 1, "rules": [{
                "backends": [{"url": backend.url, "weight": 1, "websocket": True}]}]},
    ) as stack:
        client = await RawClient.connect(stack.cluster_port)
        after_head = b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"  # opaque once switched
        client.send(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n"
                    b"GET /upgrade HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\n"
                    b"Upgrade: websocket\r\n\r\n" + after_head)
        first = await client.read_response()
        switched = await client.read_response(head=True)
        echoed = await client.reader.readexactly(len(after_head))
        client.close()
    assert (first.status, first.json()["path"]) == (200, "/first")
    assert switched.status == 101
    assert echoed == after_head  # piped to the backend's raw echo, byte for byte
    assert [seen.target for seen in backend.requests] == ["/first", "/upgrade"]


@pytest.mark.parametrize("upgrade", [b"h2c", b"H2C", b"websocket, h2c"])
@on_uvloop
async def test_an_h2c_upgrade_is_answered_as_a_plain_request(upgrade: bytes) -> None:
    """h2c smuggling: a relayed switch to h2c would let a client speak HTTP/2 to the
    backend, past every route. The request goes out without its Upgrade (the backend
    that would switch answers 400 here), and the connection parses on after it."""
    async with TestBackend() as backend, running(
            "--listen", "127.0.0.1:0", config={"version": 1, "rules": [{
                "backends": [{"url": backend.url, "weight": 1, "websocket": True}]}]},
    ) as stack:
        client = await RawClient.connect(stack.cluster_port)
        client.send(b"GET /upgrade HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings"
                    b"\r\nUpgrade: " + upgrade + b"\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA"
                    b"\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n")
        refused = await client.read_response()
        after = await client.read_response()
        client.close()
    assert (refused.status, refused.body) == (400, b"no upgrade asked\n")
    assert (after.status, after.json()["path"]) == (200, "/next")
    first = backend.requests[0]
    assert [n.lower() for n, _ in first.headers
            if n.lower() in (b"upgrade", b"http2-settings", b"connection")] == []
