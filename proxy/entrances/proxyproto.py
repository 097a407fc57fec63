"""PROXY protocol v1/v2 header parsing, sans-IO.

A load balancer (or Knative's prober with ``proxy-protocol-enabled: true``)
writes this header before the first HTTP byte to tell us the original
client address. Spec: HAProxy "The PROXY protocol" versions 1 and 2.

:func:`parse` looks at the start of a byte buffer and either returns a
:class:`ProxyHeader` (how many bytes the header took and the source address), returns
``None`` when more bytes are needed to decide, or raises :class:`ProxyHeaderError`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MAX = 107  # longest legal v1 line, CRLF included (spec §2.1)
V2_HEADER = 16  # signature, ver/cmd, family, 2-byte length

_V2_LOCAL = 0x20
_V2_PROXY = 0x21
# family/transport byte -> (address bytes, IP version); UDP carries the same layout.
_V2_INET = {0x11: (4, 4), 0x12: (4, 4), 0x21: (16, 6), 0x22: (16, 6)}
_V2_OTHER = {0x00, 0x31, 0x32}  # UNSPEC, UNIX stream/dgram: no IP source to report


class ProxyHeaderError(ValueError):
    """The bytes are not a valid PROXY protocol header."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A parsed header: ``consumed`` bytes belong to it; ``source`` is ``(ip, port)``,
    or ``None`` for ``UNKNOWN``/``LOCAL``/non-IP families (use the socket peer)."""

    consumed: int
    source: tuple[str, int] | None


def parse(data: bytes | bytearray) -> ProxyHeader | None:
    """Parse a v1 or v2 header at the start of ``data``; ``None`` = need more bytes."""
    if data[:1] == b"\r":
        return _parse_v2(data)
    if data[:1] == b"P":
        return _parse_v1(data)
    if not data:
        return None
    raise ProxyHeaderError("missing PROXY protocol header")


def _parse_v1(data: bytes | bytearray) -> ProxyHeader | None:
    if not V1_PREFIX.startswith(bytes(data[:len(V1_PREFIX)])):
        raise ProxyHeaderError("missing PROXY protocol header")
    end = data.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(data) >= V1_MAX:
            raise ProxyHeaderError("PROXY v1 line too long")
        return None
    try:
        line = bytes(data[:end]).decode("ascii")
    except UnicodeDecodeError:
        raise ProxyHeaderError("PROXY v1 line is not ASCII") from None
    fields = line.split(" ")
    if len(fields) >= 2 and fields[1] == "UNKNOWN":
        return ProxyHeader(end + 2, None)  # the rest of an UNKNOWN line is ignored
    if len(fields) != 6 or fields[1] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError(f"malformed PROXY v1 line {line!r}")
    version = 4 if fields[1] == "TCP4" else 6
    source = _v1_address(fields[2], version)
    _v1_address(fields[3], version)
    port = _v1_port(fields[4])
    _v1_port(fields[5])
    return ProxyHeader(end + 2, (source, port))


def _v1_address(text: str, version: int) -> str:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ProxyHeaderError(f"bad address {text!r} in PROXY v1 line") from None
    if address.version != version:
        raise ProxyHeaderError(f"address {text!r} does not match the protocol family")
    return str(address)


def _v1_port(text: str) -> int:
    # Decimal 0..65535 without sign or leading zeros (spec §2.1).
    if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0"):
        raise ProxyHeaderError(f"bad port {text!r} in PROXY v1 line")
    port = int(text)
    if port > 65535:
        raise ProxyHeaderError(f"bad port {text!r} in PROXY v1 line")
    return port


def _parse_v2(data: bytes | bytearray) -> ProxyHeader | None:
    head = bytes(data[:len(V2_SIGNATURE)])
    if not V2_SIGNATURE.startswith(head):
        raise ProxyHeaderError("missing PROXY protocol header")
    if len(data) < V2_HEADER:
        return None
    command, family = data[12], data[13]
    length = int.from_bytes(data[14:16], "big")
    total = V2_HEADER + length
    if command not in (_V2_LOCAL, _V2_PROXY):
        raise ProxyHeaderError(f"unsupported PROXY v2 version/command 0x{command:02x}")
    if family not in _V2_INET and family not in _V2_OTHER:
        raise ProxyHeaderError(f"unsupported PROXY v2 address family 0x{family:02x}")
    if len(data) < total:
        return None
    if command == _V2_LOCAL or family in _V2_OTHER:
        return ProxyHeader(total, None)  # health check from the proxy itself / no IP
    size, version = _V2_INET[family]
    if length < 2 * size + 4:
        raise ProxyHeaderError("PROXY v2 address block too short")
    raw = bytes(data[V2_HEADER:V2_HEADER + size])
    address = ipaddress.IPv4Address(raw) if version == 4 else ipaddress.IPv6Address(raw)
    port_at = V2_HEADER + 2 * size
    port = int.from_bytes(data[port_at:port_at + 2], "big")
    # TLVs after the addresses (ALPN, authority, ...) carry nothing we use: skipped.
    return ProxyHeader(total, (str(address), port))


def looks_like_header(data: bytes) -> bool:
    """True when ``data`` (a connection's first bytes) opens with a PROXY header.

    Used where PROXY protocol is *off*: such a connection is closed without an answer,
    because an HTTP 400 would count as success for Knative's prober (it only
    checks for an answer) and mark a revision Ready through a misconfigured gateway.
    """
    return data[:6] == b"PROXY " or data[:5] == V2_SIGNATURE[:5]
