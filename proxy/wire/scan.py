"""Questions asked of a read that holds a large message: where its head ends (the
request and response readers, :mod:`proxy.entrances.reader` and
:mod:`proxy.upstream.reader`, which let a large Content-Length body pass llhttp by),
and whether the store a backend read went to is free again
(:mod:`proxy.upstream.readbuffer`). ``find_blank_line`` and ``sole_view`` are the
reference for ``_scan.c`` and what runs when that is not built; :data:`FIND_BLANK_LINE`
and :data:`SOLE_VIEW` are what the request path calls.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable, Final

from proxy.request import Piece

_BLANK_LINE: Final = b"\r\n\r\n"


def find_blank_line(data: bytes | bytearray, size: int) -> int:
    """The index of the first CR LF CR LF within ``data[:size]``; -1 if there is none."""
    return data.find(_BLANK_LINE, 0, max(size, 0))


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
FIND_BLANK_LINE: Final[Callable[[bytes | bytearray, int], int]] = \
    find_blank_line if _C is None else _C.find_blank_line
SOLE_VIEW: Final[Callable[[memoryview], bool]] = sole_view if _C is None else _C.sole_view
