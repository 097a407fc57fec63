"""Knative's side of the readiness probe, played for real over loopback sockets.

- :class:`QueueProxy` answers like Knative's probe handler in front of a revision
  (REFERENCE §8.2 step 5): a request with ``K-Network-Probe: probe`` gets 400 when
  ``K-Network-Hash`` is empty, else 200 echoing the hash; anything else is the app's
  answer, with ``K-Network-Hash`` never reaching it.
- :func:`probe` sends net-gateway-api's exact probe request (step 3), optionally behind
  a PROXY protocol v2 header, and :func:`verdict` judges the answer with the prober's
  rules (step 6).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass

import h11

from tests.helpers import HOST, LoopbackServer

PROXY_V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"


@dataclass
class ProbeSeen:
    """What the queue-proxy saw of one request."""

    host: str
    path: str
    headers: dict[str, str]


class QueueProxy(LoopbackServer):
    """A fake revision pod: the probe handler plus a trivial app."""

    def __init__(self, revision: str) -> None:
        super().__init__()
        self.revision = revision
        self.seen: list[ProbeSeen] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        self._writers.add(writer)
        try:
            while True:
                request = await _read_request(conn, reader)
                if request is None:
                    return
                status, headers, body = self._answer(request)
                writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
                writer.write(conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
                await writer.drain()
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    def _answer(self, request: h11.Request) -> tuple[int, list[tuple[str, str]], bytes]:
        headers = {n.decode().lower(): v.decode() for n, v in request.headers}
        self.seen.append(ProbeSeen(headers.get("host", ""), request.target.decode(),
                                   headers))
        common = [("Content-Type", "text/plain")]
        if headers.get("k-network-probe") == "probe":
            digest = headers.get("k-network-hash", "")
            if not digest:
                return 400, common + [("Content-Length", "21")], b"no K-Network-Hash set"
            return 200, common + [("K-Network-Hash", digest), ("Content-Length", "0")], b""
        body = f"{self.revision}\n".encode()
        return 200, common + [("Content-Length", str(len(body)))], body


async def _read_request(conn: h11.Connection,
                        reader: asyncio.StreamReader) -> h11.Request | None:
    request = None
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.EndOfMessage):
            return request
        elif isinstance(event, h11.ConnectionClosed):
            return None


def proxy_v2_header(source: tuple[str, int], destination: tuple[str, int]) -> bytes:
    """The PROXY v2 header net-gateway-api writes first (§8.2 step 3), TCP over IPv4."""
    addresses = (socket.inet_aton(source[0]) + socket.inet_aton(destination[0])
                 + struct.pack("!HH", source[1], destination[1]))
    return PROXY_V2_SIGNATURE + b"\x21\x11" + struct.pack("!H", len(addresses)) + addresses


@dataclass
class ProbeResult:
    status: int  # 0 = dial error / timeout
    headers: dict[str, str]


async def probe(port: int, hostname: str, path: str = "/", *,
                proxy_protocol: bool = False, timeout: float = 1.0) -> ProbeResult:
    """One probe exactly as the prober sends it; a dial error or timeout is status 0."""
    request = (f"GET {path} HTTP/1.1\r\nHost: {hostname}\r\n"
               "User-Agent: Knative-Ingress-Probe\r\nK-Network-Probe: probe\r\n"
               "K-Network-Hash: override\r\nAccept-Encoding: gzip\r\n\r\n").encode()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(HOST, port)
            try:
                if proxy_protocol:
                    local = writer.get_extra_info("sockname")
                    request = proxy_v2_header(local, (HOST, port)) + request
                writer.write(request)
                return await _read_response(reader)
            finally:
                writer.close()
    except (OSError, TimeoutError, h11.ProtocolError):
        return ProbeResult(0, {})


async def _read_response(reader: asyncio.StreamReader) -> ProbeResult:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
            continue
        if isinstance(event, h11.Response):
            return ProbeResult(event.status_code,
                               {n.decode().lower(): v.decode() for n, v in event.headers})
        if isinstance(event, h11.ConnectionClosed):
            return ProbeResult(0, {})


def verdict(result: ProbeResult, expected_hash: str) -> str:
    """The prober's conclusion (§8.2 step 6): ``"ready"``, ``"retry"`` or ``"abandoned"``.

    ``abandoned`` is counted as success by Knative (it stops probing that URL); the tests
    require ``ready``.
    """
    if result.status == 0 or result.status in (404, 503):
        return "retry"
    if result.status != 200:
        return "abandoned"
    got = result.headers.get("k-network-hash")
    if got is None:
        return "abandoned"
    return "ready" if got == expected_hash else "retry"
