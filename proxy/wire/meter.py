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

from proxy.wire.framing import MAX_CHUNK_SIZE, last_chunk_size

CHUNK_OVERHEAD: Final = 4096  # bytes of chunk framing tolerated beyond…
CHUNK_OVERHEAD_PER_CHUNK: Final = 64  # …this much per chunk (size line, CRLFs, short extensions)
CHUNK_LINE_SCAN: Final = CHUNK_OVERHEAD + 64  # longest chunk-size line looked at (extensions)


class FramingMeter:
    """The counts of one connection's message being parsed (see the module docstring).

    ``fed_body`` is the body (and trailer) bytes of the slice being fed, counted by the
    reader's callbacks; ``chunk_mark`` what it was at the slice's last chunk header.
    """

    __slots__ = ("max_head", "fed_body", "chunk_mark", "_head_stream", "_chunks",
                 "_overhead", "_tail")

    def __init__(self, max_head: int) -> None:
        self.max_head = max_head  # head bytes allowed in all (request line and fields)
        self.fed_body = 0
        self.chunk_mark = -1
        self._head_stream = 0  # bytes fed while the head stayed incomplete
        self._chunks = 0
        self._overhead = 0  # chunk framing bytes of the body so far
        # The last bytes of the chunked slices fed so far: a chunk-size line that began
        # in an earlier slice (a read, or one byte) is read whole from them.
        self._tail = b""

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
        too_large = False
        if self.chunk_mark >= 0:
            end = len(data) - (self.fed_body - self.chunk_mark)
            line = bytes(data[max(0, end - CHUNK_LINE_SCAN):end])
            if end < CHUNK_LINE_SCAN:
                line = self._tail + line
            too_large = chunk_too_large(line)
        self._tail = (self._tail + bytes(data[-CHUNK_LINE_SCAN:]))[-CHUNK_LINE_SCAN:]
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


def chunk_too_large(before: bytes) -> bool:
    """Whether the chunk-size line that ``before`` ends with (its CRLF last) gives a
    size over MAX_CHUNK_SIZE.

    Everything after the last chunk's size line is chunk data (the callbacks count it),
    so the caller knows exactly where the line ends; llhttp already checked its syntax.
    The line starts after the LF before it: the head's last one, or the previous
    chunk's. A line longer than the bytes kept is not read (the framing count refuses
    it).
    """
    size = last_chunk_size(before)
    return size is not None and size > MAX_CHUNK_SIZE
