"""The count of bytes waiting unread on a socket, asked before a pooled backend
connection is reused (:meth:`proxy.upstream.http1.UpstreamConnection.quiet`)."""

from __future__ import annotations

import fcntl
import sys
import termios
from typing import Callable, Final


def unread_bytes(fd: int) -> int:
    """The bytes waiting to be read on ``fd``; -1 if the ioctl fails. The reference
    for ``_unread.c``, and what runs when that is not built."""
    answer = bytearray(4)  # (a mutable buffer is filled in place)
    try:
        fcntl.ioctl(fd, termios.FIONREAD, answer)
    except (OSError, OverflowError, ValueError):  # (ValueError: a negative fd)
        return -1
    return int.from_bytes(answer, sys.byteorder, signed=True)


def _c_unread() -> Callable[[int], int] | None:
    """The C function (``_unread.c``), built with the compiled hot path; None when the
    tree runs as pure Python."""
    try:
        from proxy.upstream import _unread
    except ImportError:
        return None
    return _unread.unread


# What quiet() calls: the C function where it is built.
UNREAD: Final[Callable[[int], int]] = _c_unread() or unread_bytes
