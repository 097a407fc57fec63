"""glibc malloc settings for a proxy process: keep freed body buffers for reuse, in one
arena.

Every body chunk a proxy reads from a client is a fresh ``bytes`` object the size of one
socket read (uvloop reads up to 256 KiB at a time), freed again once written (backend
reads land in a reused buffer instead, ``proxy.upstream.readbuffer``). With glibc's
defaults a freed block at the top of the heap above 128 KiB is handed back to the kernel
at once (``brk``), and the next read takes it back page by page, each page faulted in
and zeroed: relaying 64 KiB responses, when backend reads were such chunks too, spent
about half of the process's kernel time on that (benchmarks/RESULTS.md, 2026-11-30).
Raising the trim threshold and the top pad lets the heap keep that memory, and the mmap
threshold keeps buffers of up to 1 MiB on the heap.

The price is resident memory: up to :data:`TRIM_THRESHOLD` of freed heap may stay
mapped after a burst. An operator's own ``MALLOC_*`` environment settings win: nothing
is changed when any is present. No-op outside glibc.

A config push is the one burst that is not bodies: a new table is built while the old
one serves, then the old one and the decoded push are freed, tens of MB at 10,000
routes. :func:`trim` hands that back to the kernel once a push is complete.

Builds run in threads of their own (``proxy.control.builds``), and glibc gives a thread
that allocates an arena of its own, up to eight per core; every arena keeps its own free
memory and top pad. A push's memory then ended up spread over more arenas as pushes went
on (10,000 routes, 100 one-route pushes under load: RSS 66 → 76 MB). One arena for the
process keeps it where the next push reuses it (the same run: 65.4 → 65.5 MB, and the
add → 200 latency no worse; two runs each of ``benchmarks.propagation``'s method,
2026-12-07). The threads hardly contend for it: a build runs only while the event loop
waits for it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger("tunnelgate.allocator")

# mallopt(3) parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

TRIM_THRESHOLD = 32 << 20
TOP_PAD = 8 << 20
MMAP_THRESHOLD = 1 << 20
ARENA_MAX = 1


def tune() -> bool:
    """Apply the settings above to this process; True if they were applied."""
    if platform.libc_ver()[0] != "glibc":
        return False
    if any(name.startswith("MALLOC_") for name in os.environ):
        return False
    libc = ctypes.CDLL(None)
    applied = all(libc.mallopt(param, value) == 1 for param, value in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_TOP_PAD, TOP_PAD),
        (_M_ARENA_MAX, ARENA_MAX)))
    if not applied:
        log.warning("mallopt refused the allocator settings; keeping glibc's defaults")
    return applied


def trim() -> None:
    """Return the heap's free memory to the kernel (``malloc_trim``; glibc only). It
    walks the heap, so call it off the event loop: ctypes drops the GIL meanwhile."""
    if platform.libc_ver()[0] == "glibc":
        ctypes.CDLL(None).malloc_trim(0)
