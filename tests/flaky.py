"""A backend that fails on request, for the retry, budget and outlier tests.

Per request, as Gateway API's retry conformance backend does: ``?id=U&fail=N&status=S``
fails the first N requests carrying id U with status S — or, for S ``reset``, by
resetting the connection (RST) before any response byte, or for S ``hang`` by never
answering — and answers 200 after. Per backend, :attr:`FlakyBackend.status` (when set)
is the answer to every request, and :attr:`FlakyBackend.broken_body` sends a 200 head
and half a body, then resets. Every request's body is kept in ``bodies``.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import Counter
from urllib.parse import parse_qs

from tests.helpers import LoopbackServer


class FlakyBackend(LoopbackServer):
    """A keep-alive HTTP/1.1 backend with failures on demand (module docstring)."""

    def __init__(self, name: str = "backend") -> None:
        super().__init__()
        self.name = name
        self.status: int | str | None = None  # every request: this status / reset / hang
        self.broken_body = False
        self.seen: Counter[str] = Counter()  # requests per id
        self.bodies: list[bytes] = []
        self.hits = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target, length = _parse(head)
                body = await reader.readexactly(length) if length else b""
                self.hits += 1
                self.bodies.append(body)
                outcome = self._outcome(target)
                if outcome == "reset":
                    _reset(writer)
                    return
                if outcome == "hang":
                    await reader.read()  # until the proxy gives up and closes
                    return
                if self.broken_body:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
                    await writer.drain()
                    _reset(writer)
                    return
                text = f"{self.name} {outcome}".encode()
                writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s"
                             % (int(outcome), len(text), text))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def _outcome(self, target: str) -> str:
        if self.status is not None:
            return str(self.status)
        args = {k: v[0] for k, v in parse_qs(target.partition("?")[2]).items()}
        key = args.get("id", "")
        self.seen[key] += 1
        if self.seen[key] <= int(args.get("fail", "0")):
            return args.get("status", "500")
        return "200"


def _parse(head: bytes) -> tuple[str, int]:
    lines = head.decode("latin-1").split("\r\n")
    target = lines[0].split(" ")[1]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return target, length


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0): a connection reset, not a clean FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def refused_url() -> str:
    """A loopback URL nothing listens on (a port bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
