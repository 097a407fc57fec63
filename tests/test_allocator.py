"""proxy.control.allocator: freed body-sized buffers stay on the heap; operators' MALLOC_* win.

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


def _probe(extra_env: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(extra_env)
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          timeout=60, env=env, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_a_freed_body_buffer_stays_on_the_heap() -> None:
    assert _probe({}) == "True True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_an_operators_malloc_setting_wins() -> None:
    assert _probe({"MALLOC_ARENA_MAX": "2"}) == "False False"
