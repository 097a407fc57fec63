"""Telling an HTTP/2 connection from an HTTP/1.1 one, at its start.

Prior knowledge (RFC 9113 §3.3): a cleartext client that knows the server speaks
HTTP/2 opens with the 24-byte preface, which no HTTP/1.1 request line can be. Over TLS,
ALPN settled it during the handshake (RFC 9113 §3.2). Either way the choice is made once per
connection, on its first bytes, and HTTP/1.1 connections go on untouched.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from proxy.entrances.h2server import H2ServerConnection

if TYPE_CHECKING:
    from proxy.entrances.listener import Entrance

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP1: Final = 0
PARTIAL: Final = 1  # a beginning of the preface: more bytes will tell
HTTP2: Final = 2


def sniff(data: bytes) -> int:
    """Which protocol a connection's first bytes ``data`` open."""
    n = min(len(data), 24)
    if data[:n] != PREFACE[:n]:
        return HTTP1
    return HTTP2 if n == 24 else PARTIAL


def alpn_h2(transport: asyncio.BaseTransport) -> bool:
    """Whether TLS on ``transport`` chose ``h2`` by ALPN."""
    tls = transport.get_extra_info("ssl_object")
    return tls is not None and tls.selected_alpn_protocol() == "h2"


def serve_h2(entrance: "Entrance", client_ip: str | None) -> H2ServerConnection:
    """The protocol that serves a connection found to be HTTP/2."""
    return H2ServerConnection(entrance, client_ip)
