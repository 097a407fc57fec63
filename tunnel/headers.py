"""The ``cf-cloudflared-response-headers`` blob codec and the control-header filter.

Over cloudflared's HTTP/2 edge transport every *user* response header travels inside one
header whose value is ``base64(name):base64(value)`` pairs joined by ``;``
Base64 is the standard alphabet **without padding** (Go's RawStdEncoding), which
never produces ``:`` or ``;``, so both separators are unambiguous.

Names and values may be given as ``str`` (encoded as UTF-8) or ``bytes`` (sent as is);
:func:`decode` returns ``str`` and :func:`decode_bytes` the raw bytes.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final, Iterable, TypeVar

RESPONSE_HEADERS: Final = "cf-cloudflared-response-headers"
RESPONSE_META: Final = "cf-cloudflared-response-meta"
META_ORIGIN: Final = '{"src":"origin"}'
META_CLOUDFLARED: Final = '{"src":"cloudflared"}'

# cloudflared: response header names with these prefixes (checked lower-cased) are
# cloudflared/edge control headers and are left out of the blob on HTTP/2.
CONTROL_PREFIXES: Final = (":", "cf-int-", "cf-cloudflared-", "cf-proxy-")
_CONTROL_PREFIXES_BYTES: Final = tuple(prefix.encode("ascii") for prefix in CONTROL_PREFIXES)

_B64_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")

HeaderText = str | bytes
T = TypeVar("T", str, bytes)


class BlobError(ValueError):
    """The blob is not a well-formed ``cf-cloudflared-response-headers`` value."""


def is_control_header(name: HeaderText) -> bool:
    """True for names cloudflared reserves (``:``, ``cf-int-``, ``cf-cloudflared-``, ``cf-proxy-``)."""
    if isinstance(name, bytes):
        return is_control_lowered(name.lower())
    return name.lower().startswith(CONTROL_PREFIXES)


def is_control_lowered(name: bytes) -> bool:
    """:func:`is_control_header` of a name already lower-cased. Every prefix starts
    with ``:`` or ``c``: other names are told by their first byte."""
    if not name:
        return False
    first = name[0]
    return first == 0x3A or (first == 0x63 and name.startswith(_CONTROL_PREFIXES_BYTES))


def user_headers(headers: Iterable[tuple[T, T]]) -> list[tuple[T, T]]:
    """The headers that survive the HTTP/2 transport: control-prefixed names removed."""
    return [(name, value) for name, value in headers if not is_control_header(name)]


def encode(headers: Iterable[tuple[HeaderText, HeaderText]]) -> str:
    """Serialise headers into the blob, one pair per (name, value), order preserved.

    No filtering happens here; apply :func:`user_headers` first for what cloudflared
    sends.
    """
    return encode_bytes(headers).decode("ascii")


def encode_bytes(headers: Iterable[tuple[HeaderText, ...]]) -> bytes:
    """:func:`encode`, as the bytes of the header value (what the writer sends)."""
    parts: list[bytes] = []
    for name, value in headers:  # a flat list and one join: no bytes per pair
        if parts:
            parts.append(b";")
        parts.append(_b64(name))
        parts.append(b":")
        parts.append(_b64(value))
    return b"".join(parts)


def decode_bytes(blob: str) -> list[tuple[bytes, ...]]:
    """Parse a blob strictly into raw ``(name, value)`` pairs.

    Empty parts are skipped (Go's deserialiser does the same); every other part must be
    exactly ``name:value`` with both halves unpadded standard base64. Raises
    :class:`BlobError` otherwise.
    """
    pairs: list[tuple[bytes, ...]] = []
    for index, part in enumerate(blob.split(";")):
        if not part:
            continue
        pieces = part.split(":")
        if len(pieces) != 2:
            raise BlobError(f"part {index}: expected exactly one ':'")
        pairs.append((_unb64(pieces[0], index), _unb64(pieces[1], index)))
    return pairs


def decode(blob: str) -> list[tuple[str, str]]:
    """Like :func:`decode_bytes`, names and values decoded as UTF-8 (strictly)."""
    try:
        return [(n.decode("utf-8"), v.decode("utf-8")) for n, v in decode_bytes(blob)]
    except UnicodeDecodeError as err:
        raise BlobError(f"not UTF-8: {err}") from None


def _b64(text: HeaderText) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    # Unpadded: the first ceil(4n/3) characters (cut, not stripped: no method call)
    return binascii.b2a_base64(raw)[:(len(raw) * 4 + 2) // 3]


def _unb64(piece: str, index: int) -> bytes:
    # RawStdEncoding: no '=' at all, and a length of 1 mod 4 can never be produced.
    if not _B64_CHARS.issuperset(piece) or len(piece) % 4 == 1:
        raise BlobError(f"part {index}: not unpadded standard base64: {piece[:40]!r}")
    return base64.b64decode(piece + "=" * (-len(piece) % 4), validate=True)
