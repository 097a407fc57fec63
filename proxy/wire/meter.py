"""What llhttp's callbacks cannot show of a request, measured slice by slice: a head
that stays incomplete (its bytes sit inside the parser, no callback counts them) and
the framing of a chunked body (chunk extensions make no callback at all, and llhttp
takes chunk sizes up to 2^64-1, then waits for that body forever).

:class:`FramingMeter` is fed what :class:`proxy.wire.server.ServerConnection` sees:
the start of each message and slice, the body bytes and chunk headers the callbacks
report, and each slice once llhttp returned; it answers with the refusal the slice
earned, if any. Pure: no I/O, no connection.
"""

from __future__ import annotations

from typing import Final

from proxy.wire.framing import MAX_CHUNK_SIZE, chunk_size_before

CHUNK_OVERHEAD: Final = 4096  # bytes of chunk framing tolerated beyond…
CHUNK_OVERHEAD_PER_CHUNK: Final = 64  # …this much per chunk (size line, CRLFs, short extensions)
CHUNK_LINE_SCAN: Final = CHUNK_OVERHEAD + 64  # longest chunk-size line looked at (extensions)


class FramingMeter:
    """The counts of one connection's message being parsed (see the module docstring).

    ``fed_body`` is the body (and trailer) bytes of the slice being fed, counted by the
    reader's callbacks; ``chunk_mark`` what it was at the slice's last chunk header.
    """

    __slots__ = ("max_head", "fed_body", "chunk_mark", "_head_stream", "_chunks",
                 "_overhead", "_line_start")

    def __init__(self, max_head: int) -> None:
        self.max_head = max_head  # head bytes allowed in all (request line and fields)
        self.fed_body = 0
        self.chunk_mark = -1
        self._head_stream = 0  # bytes fed while the head stayed incomplete
        self._chunks = 0
        self._overhead = 0  # chunk framing bytes of the body so far
        self._line_start = False  # the last slice fed ended a line (see chunk_too_large)

    def begin_message(self) -> None:
        self._head_stream = 0
        self._chunks = 0
        self._overhead = 0

    def begin_slice(self) -> None:
        self.fed_body = 0
        self.chunk_mark = -1

    def chunk_header(self) -> None:
        self._chunks += 1
        self.chunk_mark = self.fed_body  # body bytes of this slice before this chunk

    def unchunked(self) -> bool:
        """No chunk header came yet in this message's body."""
        return self._chunks == 0

    def chunk_size_refused(self, data: bytes | memoryview) -> bool:
        """After a slice of a chunked body: whether the chunk it ends in is too large."""
        too_large = self.chunk_mark >= 0 and chunk_too_large(
            data, self.fed_body - self.chunk_mark, self._line_start)
        self._line_start = data[-1:] == b"\n"
        return too_large

    def head_refused(self, size: int) -> bool:
        """After a slice that lay wholly inside a head: whether the head grew too long."""
        self._head_stream += size
        return self._head_stream > self.max_head

    def framing_refused(self, size: int) -> bool:
        """After a slice that lay wholly inside a chunked body: whether its framing
        (all but the body bytes) outgrew what its chunks may carry."""
        self._overhead += size - self.fed_body
        return self._overhead > CHUNK_OVERHEAD + CHUNK_OVERHEAD_PER_CHUNK * self._chunks


def chunk_too_large(data: bytes | memoryview, data_after: int, line_start: bool) -> bool:
    """Whether the size of the chunk a slice ends in exceeds MAX_CHUNK_SIZE.

    Everything after the last chunk's size line is chunk data (``data_after`` bytes),
    so the line ends exactly that far from the slice's end; llhttp already checked its
    syntax (``line_start``: the slice before ended a line).
    """
    end = len(data) - data_after
    start = max(0, end - CHUNK_LINE_SCAN)
    size = chunk_size_before(bytes(data[start:end]), end - start, start == 0 and line_start)
    return size is not None and size > MAX_CHUNK_SIZE
