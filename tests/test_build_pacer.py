"""The build thread's pause (proxy.control.builds._Pacer).

A build shares the proxy's core with the event loop. When the loop's thread is busy,
the build sleeps BUILD_YIELD times as long as it had worked, so requests during a push
are not slowed 3–4× over; when the loop's thread is idle, the pause costs the build
next to nothing. Real threads, real GIL, real thread CPU clocks.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import pytest

from proxy.control.builds import BUILD_YIELD, _Pacer

WORK = 0.02  # seconds the "build" computes between two pauses


def _work_then_pause(pause: _Pacer) -> float:
    """Spin for WORK seconds holding the GIL, then pause; how long the pause took."""
    end = time.monotonic() + WORK
    while time.monotonic() < end:
        pass
    start = time.monotonic()
    pause()
    return time.monotonic() - start


def _idle(stop: threading.Event) -> None:
    stop.wait(10)


def _busy(stop: threading.Event) -> None:  # wants the GIL all the time: a loaded loop
    deadline = time.monotonic() + 10
    while not stop.is_set() and time.monotonic() < deadline:
        pass


def _pause_beside(loop: Callable[[threading.Event], None]) -> float:
    """The shortest of three pauses of a build whose event loop runs ``loop``."""
    stop = threading.Event()
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    thread = threading.Thread(target=loop, args=(stop,), daemon=True)
    thread.start()
    try:
        pause = _Pacer(thread.ident)
        return min(_work_then_pause(pause) for _ in range(3))
    finally:
        stop.set()
        thread.join(5)
        sys.setswitchinterval(old)


@pytest.mark.parametrize("loop, shortest, longest", [
    (_idle, 0, WORK * BUILD_YIELD / 4),
    (_busy, WORK * BUILD_YIELD * 0.9, 10),
])
def test_the_build_yields_the_core_only_to_a_busy_loop(
        loop: Callable[[threading.Event], None], shortest: float, longest: float) -> None:
    assert shortest <= _pause_beside(loop) <= longest
