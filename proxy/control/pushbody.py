"""The body of a ``PUT /config``: its size caps and its content coding (docs/config.md).

A push is capped as sent, at 1 MiB by default (the anchor's limit; ``--config-max-bytes``
or ``PROXY_CONFIG_MAX_BYTES`` raises it). A 10,000-route config is about 1.5 MB of
JSON but compresses about tenfold, so a push may come ``Content-Encoding: gzip``: the
cap then applies to the compressed body, and the JSON it inflates to is capped at
32 MiB (or at the body cap, if that is larger). Inflating stops as soon as the output
passes that cap, so a zip bomb costs at most the cap in memory and time, then a 413.
"""

from __future__ import annotations

import gzip
import zlib
from typing import Final

from routing.pause import Pause

DEFAULT_MAX_BYTES: Final = 1 << 20
MAX_INFLATED_BYTES: Final = 32 << 20
GZIP: Final = "gzip"
_STEP: Final = 1 << 16  # bytes inflated per step: the most a bomb gets past the cap
_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS  # a gzip wrapper, not zlib or raw deflate


class BodyRejected(Exception):
    """A push body refused with HTTP ``status`` and a one-line ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def content_coding(header: bytes | None) -> str:
    """The body's coding from its ``Content-Encoding`` (``""``: none), or
    :class:`BodyRejected` 415 for a coding other than gzip (RFC 9110 §15.5.16).
    ``x-gzip`` is gzip's old name (RFC 9110 §8.4.1.3)."""
    codings = [c.strip() for c in (header or b"").decode("latin-1").lower().split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return ""
    if codings in (["gzip"], ["x-gzip"]):
        return GZIP
    raise BodyRejected(415, "unsupported Content-Encoding: send gzip or none")


def inflated_cap(body_cap: int) -> int:
    """The most bytes a gzip body may inflate to, with this body cap."""
    return max(MAX_INFLATED_BYTES, body_cap)


def inflate(body: bytes, cap: int, pause: Pause | None = None) -> bytes:
    """The JSON a gzip ``body`` inflates to, at most 64 KiB per step so that it stops
    as soon as the output passes ``cap`` bytes (:class:`BodyRejected` 413); 400 if it
    is not one whole gzip stream. ``pause`` (routing.pause.Pause) is called between
    steps: zlib gives up the GIL while it inflates, but a build's slice ends only at a
    pause, and the event loop waits for it (proxy.control.builds); inflating a
    10,000-route push is ~3 ms."""
    stream = zlib.decompressobj(_GZIP_WBITS)
    pieces: list[bytes] = []
    size = 0
    pending = body
    try:
        while not stream.eof:
            piece = stream.decompress(pending, min(_STEP, cap + 1 - size))
            pending = stream.unconsumed_tail
            size += len(piece)
            pieces.append(piece)
            if size > cap:
                raise BodyRejected(413, "config body exceeds maximum size once "
                                   f"decompressed ({cap} bytes)")
            if not piece and not pending:
                break  # input used up before the end of the stream
            if pause is not None:
                pause()
    except zlib.error as exc:
        raise BodyRejected(400, f"invalid gzip body: {exc}") from None
    if not stream.eof or stream.unused_data:
        raise BodyRejected(400, "invalid gzip body: " + (
            "data after the end of the stream" if stream.eof else "truncated"))
    return b"".join(pieces)


def size_advice(wire: bytes, body_cap: int = DEFAULT_MAX_BYTES) -> str | None:
    """What it takes to push the wire JSON ``wire`` to a config API capping bodies at
    ``body_cap`` (``check``'s warning), or None if it can be pushed as it is."""
    if len(wire) <= body_cap:
        return None
    packed = len(gzip.compress(wire, compresslevel=6, mtime=0))
    said = (f"the wire JSON is {len(wire):,} bytes, over the {body_cap:,} bytes a "
            "PUT /config accepts")
    if packed <= body_cap and len(wire) <= inflated_cap(body_cap):
        return f"{said}: push it with Content-Encoding: gzip ({packed:,} bytes)"
    return (f"{said}, {packed:,} gzip-compressed: raise the cap (--config-max-bytes or "
            "PROXY_CONFIG_MAX_BYTES)")
