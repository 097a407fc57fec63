"""Questions asked of a read: what the fields of a plain response head are and where
it ends
(:mod:`proxy.upstream.reader`, which then spares llhttp a call into Python per field
and lets the body pass llhttp by), and whether the store a backend read went to is
free again (:mod:`proxy.upstream.readbuffer`).
``split_response_head`` and ``sole_view`` are the reference for ``_scan.c`` and what
runs when that is not built; :data:`SPLIT_RESPONSE_HEAD` and :data:`SOLE_VIEW` are what
the request path calls.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable, Final

from proxy.request import Headers, Piece
from proxy.wire.request import TCHAR

# The fields a plain head may have (more take llhttp's way: the C function fills its
# list from a fixed array).
_MOST_FIELDS: Final = 64


def split_response_head(data: bytes | bytearray, size: int, max_fields: int,
                        max_bytes: int) -> tuple[int, bytes, Headers] | None:
    """``(end, reason, fields)`` when ``data[:size]`` begins with a whole final response
    head of the plain shape, else None (the caller lets llhttp report the fields).

    Plain: a status line ``HTTP/1.1 <three digits>``, the first of them 2 to 9 (no 1xx:
    interim heads and 101 take llhttp's way; so does any other version, which the
    reader then reads from llhttp), then CR LF or a space, the reason and CR LF; field
    lines ``name:value`` ending in CR LF, the name a token, no
    line folded onto the one before (RFC 9112 §5.2), no CR but before an LF, no
    Transfer-Encoding field (a chunked body's trailers are llhttp's to report); at most
    ``max_fields`` fields (and never more than 64) and ``max_bytes`` of names and
    values together (the head limits, checked as llhttp's callbacks would). ``end`` is
    the index after the blank line; a value is given without the spaces and tabs around
    it (RFC 9110 §5.5).

    For every head llhttp accepts, ``end`` is where llhttp finds the head to end, and
    the fields and reason are those llhttp reports: its strict parse ends each line at
    a CR LF (a lone CR or LF is an error) and the head at the first empty line (a test
    compares the two). llhttp still parses the head and rejects what it must."""
    size = min(size, len(data))
    first = data.find(b"\r\n", 0, size)
    if first < 0:
        return None
    line = bytes(data[:first])
    if not _plain_status_line(line):
        return None
    reason = line[13:]
    fields: Headers = []
    total = 0
    at = first + 2
    while at + 2 <= size:
        if data[at] == 13:  # a CR: the blank line, or a CR with no LF
            return (at + 2, reason, fields) if data[at + 1] == 10 else None
        end = data.find(b"\r", at, size)
        if end < 0 or end + 2 > size or data[end + 1] != 10:
            return None
        name, colon, value = bytes(data[at:end]).partition(b":")
        if not colon or not name or name.translate(None, TCHAR) \
                or name.lower() == b"transfer-encoding":
            return None
        value = value.strip(b" \t")
        fields.append((name, value))
        total += len(name) + len(value)
        if len(fields) > min(max_fields, _MOST_FIELDS) or total > max_bytes:
            return None
        at = end + 2
        if at < size and data[at] in (32, 9):  # SP, HTAB: an obsolete line folding
            return None
    return None


def _plain_status_line(line: bytes) -> bool:
    """``HTTP/1.1 ddd`` and nothing or a space and a reason with no CR in it."""
    return len(line) >= 12 and line[:9] == b"HTTP/1.1 " \
        and line[9:12].isdigit() and 50 <= line[9] <= 57 \
        and (len(line) == 12 or line[12] == 32) and 13 not in line


def sole_view(view: memoryview) -> bool:
    """Whether ``view`` is the only view of its ``bytearray`` alive, so its bytes may be
    overwritten. Python cannot tell without releasing the view: this answers False,
    "not known", and the caller checks its own way (:func:`proxy.upstream.readbuffer.held`)."""
    return False


def as_view(data: Piece) -> memoryview:
    """``data`` as a memoryview, to slice without copying: a read of a store already
    is one (another view of it would be one more object per message)."""
    return memoryview(data) if isinstance(data, bytes) else data  # (a test inlined)


def as_bytes(data: Piece) -> bytes:
    """``data`` as ``bytes``: a copy only of a view (for a reader that was promised
    bytes)."""
    return data if isinstance(data, bytes) else bytes(data)


def _c_module() -> ModuleType | None:
    """The C functions' module (``_scan.c``), built with the compiled hot path; None
    when the tree runs as pure Python."""
    try:
        from proxy.wire import _scan
    except ImportError:
        return None
    return _scan


_C: Final = _c_module()
SPLIT_RESPONSE_HEAD: Final[
    Callable[[bytes | bytearray, int, int, int], tuple[int, bytes, Headers] | None]] = \
    split_response_head if _C is None else _C.split_response_head
SOLE_VIEW: Final[Callable[[memoryview], bool]] = sole_view if _C is None else _C.sole_view
