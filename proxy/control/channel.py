"""The channel between the ``--workers`` supervisor and one worker process.

One socketpair per worker. A frame is two big-endian u32 (header size, body size), a
JSON header and an optional body: the wire config that the worker parses and compiles
in a thread, so its loop keeps serving meanwhile. What the headers say is
:mod:`proxy.control.workers`' protocol (its module doc lists the operations).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

from routing.model import Config
from routing.wire import to_wire

_SIZES = struct.Struct(">II")
MAX_HEADER = 64 * 1024
MAX_BODY = 64 * 1024 * 1024  # a start-up YAML file can compile to more than 1 MiB of JSON

Header = dict[str, Any]


class Channel:
    """Framed messages over one end of a socketpair (see the module doc)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> "Channel":
        return cls(*await asyncio.open_unix_connection(sock=sock))

    def send(self, header: Header, body: bytes = b"") -> bool:
        """Queue one frame; False if the channel is already closed. No drain: frames are
        small except configs, and the peer reads continuously."""
        if self._writer.is_closing():
            return False
        head = json.dumps(header, separators=(",", ":")).encode()
        self._writer.writelines([_SIZES.pack(len(head), len(body)), head, body])
        return True

    async def receive(self) -> tuple[Header, bytes]:
        """The next frame; raises ``EOFError`` when the peer is gone or broke framing."""
        try:
            head_size, body_size = _SIZES.unpack(await self._reader.readexactly(_SIZES.size))
            if head_size > MAX_HEADER or body_size > MAX_BODY:
                raise EOFError(f"oversized frame ({head_size}+{body_size} bytes)")
            header = json.loads(await self._reader.readexactly(head_size))
            body = await self._reader.readexactly(body_size) if body_size else b""
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            raise EOFError(str(exc)) from None
        return header, body

    def close(self) -> None:
        self._writer.close()


def encode_config(config: Config) -> bytes:
    """The wire JSON a worker parses: the inverse of ``routing.config.parse_config``."""
    return json.dumps(to_wire(config), separators=(",", ":")).encode()
