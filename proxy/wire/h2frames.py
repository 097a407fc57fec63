"""Taking GOAWAY frames out of an HTTP/2 byte stream before the h2 library parses it.

The h2 library ends a connection as soon as it sees a GOAWAY, sent or received
(python-hyper/h2 #1181), but RFC 9113 §6.8 lets the streams up to the GOAWAY's last
stream id finish. Both HTTP/2 sides of the proxy (the h2c backend pool and the HTTP/2
entrance) therefore take GOAWAY frames out of what they read, in order, and handle
them themselves.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import h2.connection
import h2.exceptions

_GOAWAY: Final = 0x7  # frame type (RFC 9113 §6.8)
_MAX_GOAWAY: Final = 16384  # payload bytes: the default SETTINGS_MAX_FRAME_SIZE


class GoAway(NamedTuple):
    last_stream_id: int
    error_code: int


class GoAwayFilter:
    """Takes GOAWAY frames out of the peer's byte stream (frames only: after any
    connection preface), keeping the order.

    Every other frame passes through untouched (frame bodies are never copied; only a
    frame header split across reads, or a GOAWAY frame, is held back until complete).
    """

    __slots__ = ("_skip", "_partial")

    def __init__(self) -> None:
        self._skip = 0  # bytes of a frame that started in an earlier read
        self._partial = b""  # an incomplete frame header, or an incomplete GOAWAY

    def feed(self, data: bytes) -> list[bytes | GoAway]:
        """Split ``data`` into byte runs for h2 and GOAWAYs; raises ValueError for a
        GOAWAY of impossible size (a connection error, RFC 9113 §6.8)."""
        if self._partial:
            data, self._partial = self._partial + data, b""
        size = len(data)
        pos = self._skip
        if pos >= size:
            self._skip = pos - size
            return [data]
        parts: list[bytes | GoAway] = []
        start = 0
        while pos < size:
            if size - pos < 9:
                break
            length = int.from_bytes(data[pos:pos + 3], "big")
            end = pos + 9 + length
            if data[pos + 3] == _GOAWAY:
                if not 8 <= length <= _MAX_GOAWAY:
                    raise ValueError(f"GOAWAY frame of {length} bytes")
                if end > size:
                    break
                if pos > start:
                    parts.append(data[start:pos])
                parts.append(GoAway(int.from_bytes(data[pos + 9:pos + 13], "big") & 0x7FFFFFFF,
                                     int.from_bytes(data[pos + 13:pos + 17], "big")))
                start = end
            pos = end
        else:
            self._skip = pos - size
            if start < size:
                parts.append(data[start:] if start else data)
            return parts
        self._skip = 0
        self._partial = data[pos:]
        if pos > start:
            parts.append(data[start:pos])
        return parts


def reset_stream(conn: h2.connection.H2Connection, stream_id: int, code: int) -> bool:
    """Queue RST_STREAM ``code`` for ``stream_id`` on ``conn``; False when the stream is
    already closed on both sides (nothing to reset, nothing queued)."""
    try:
        conn.reset_stream(stream_id, code)
    except h2.exceptions.ProtocolError:
        return False
    return True
