"""proxy.control.allocator: freed body-sized buffers stay on the heap, threads share one
arena; operators' MALLOC_* win.

Each case runs in a fresh interpreter: mallopt settings are process-wide and final.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Allocates and frees a 512 KiB buffer, then prints whether the heap (mallinfo2.arena)
# kept it: glibc's defaults serve such a block by mmap and unmap it on free.
_PROBE = textwrap.dedent("""
    import ctypes
    from proxy.control import allocator

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    tuned = allocator.tune()
    before = libc.mallinfo2().arena
    buffer = bytes(512 * 1024)
    del buffer
    kept = libc.mallinfo2().arena - before >= 512 * 1024
    print(tuned, kept)
""")

# A thread allocates (4 KiB bytes objects come from malloc, not Python's small-object
# allocator), then glibc's malloc_stats prints one "Arena N:" block per arena to stderr.
_ARENAS_PROBE = textwrap.dedent("""
    import ctypes, threading
    from proxy.control import allocator

    allocator.tune()
    worker = threading.Thread(target=lambda: [bytes(4096) for _ in range(64)])
    worker.start()
    worker.join()
    ctypes.CDLL(None).malloc_stats()
""")


def _run(probe: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(extra_env)
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, env=env, check=True)


def _probe(extra_env: dict[str, str]) -> str:
    return _run(_PROBE, extra_env).stdout.strip()


def _arenas(extra_env: dict[str, str]) -> int:
    return sum(line.startswith("Arena ") for line in
               _run(_ARENAS_PROBE, extra_env).stderr.splitlines())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_a_freed_body_buffer_stays_on_the_heap() -> None:
    assert _probe({}) == "True True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_an_operators_malloc_setting_wins() -> None:
    assert _probe({"MALLOC_ARENA_MAX": "2"}) == "False False"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_a_thread_allocates_in_the_one_arena() -> None:
    """A build thread's memory stays where the next push reuses it (module doc)."""
    assert _arenas({}) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_without_the_settings_a_thread_gets_an_arena_of_its_own() -> None:
    """The probe above can fail: an operator's MALLOC_* setting keeps glibc's default."""
    assert _arenas({"MALLOC_CHECK_": "0"}) == 2
