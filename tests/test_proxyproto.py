"""PROXY protocol v1/v2 parsing (sans-IO), including Knative's prober bytes."""

from __future__ import annotations

import pytest

from proxy.entrances.proxyproto import ProxyHeader, ProxyHeaderError, parse

SIG = bytes.fromhex("0D0A0D0A000D0A515549540A")
# net-gateway-api's prober, byte for byte: signature, 0x21 (v2 PROXY), 0x11 (TCP/IPv4),
# length 12, source 10.244.1.7, destination 10.244.2.9, ports 41234 -> 8080.
PROBER = (SIG + b"\x21\x11\x00\x0c" + bytes([10, 244, 1, 7]) + bytes([10, 244, 2, 9])
          + (41234).to_bytes(2, "big") + (8080).to_bytes(2, "big"))


def v2(command: int, family: int, payload: bytes) -> bytes:
    return SIG + bytes([command, family]) + len(payload).to_bytes(2, "big") + payload


def test_prober_bytes() -> None:
    assert parse(PROBER + b"GET / HTTP/1.1\r\n") == ProxyHeader(28, ("10.244.1.7", 41234))


def test_v2_every_prefix_needs_more_then_parses() -> None:
    for cut in range(len(PROBER)):
        assert parse(PROBER[:cut]) is None, cut
    assert parse(PROBER) is not None


@pytest.mark.parametrize("data, expected", [
    (v2(0x21, 0x21, bytes.fromhex("20010db8" + "00" * 11 + "01") + b"\x00" * 16
        + b"\x13\x88\x00\x50"), ProxyHeader(52, ("2001:db8::1", 5000))),
    (v2(0x20, 0x11, b"\x00" * 12), ProxyHeader(28, None)),  # LOCAL: health check
    (v2(0x21, 0x00, b""), ProxyHeader(16, None)),  # UNSPEC
    (v2(0x21, 0x11, bytes([1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 2]) + b"\x03\x00\x02ab"),
     ProxyHeader(33, ("1.2.3.4", 1))),  # a TLV after the addresses is skipped
])
def test_v2_variants(data: bytes, expected: ProxyHeader) -> None:
    assert parse(data + b"rest") == expected


@pytest.mark.parametrize("data", [
    v2(0x31, 0x11, b"\x00" * 12),  # version 3
    v2(0x22, 0x11, b"\x00" * 12),  # command 2
    v2(0x21, 0x41, b"\x00" * 12),  # unknown family
    v2(0x21, 0x11, b"\x00" * 8),  # address block too short for IPv4
    v2(0x21, 0x21, b"\x00" * 12),  # ... and for IPv6
    SIG[:11] + b"X",  # broken signature
])
def test_v2_malformed(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        parse(data)


@pytest.mark.parametrize("line, source", [
    (b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n", ("192.168.0.1", 56324)),
    (b"PROXY TCP6 ::1 ::1 1 65535\r\n", ("::1", 1)),
    (b"PROXY UNKNOWN\r\n", None),
    (b"PROXY UNKNOWN ffff:f::1 ffff:f::2 1 2\r\n", None),
])
def test_v1(line: bytes, source: tuple[str, int] | None) -> None:
    assert parse(line + b"GET") == ProxyHeader(len(line), source)
    for cut in range(len(line) - 1):
        assert parse(line[:cut]) is None


@pytest.mark.parametrize("data", [
    b"PROXY TCP4 192.168.0.1 192.168.0.11 56324\r\n",  # missing port
    b"PROXY TCP4 ::1 192.168.0.11 1 2\r\n",  # family mismatch
    b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",  # leading zero
    b"PROXY TCP4 1.2.3.4 5.6.7.8 1 70000\r\n",  # port out of range
    b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
    b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n",  # double space
    b"PROXY TCP4 1.2.3.4 5.6.7.8 \xd9\xa1 2\r\n",  # non-ASCII digit
    b"PROXY " + b"1" * 120,  # no CRLF within 107 bytes
    b"GET / HTTP/1.1\r\n",  # no header at all
    b"PROXZ",
])
def test_v1_malformed(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        parse(data)
