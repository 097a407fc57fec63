"""The build thread's pause (proxy.control.builds._Pacer).

A build shares the proxy's core with the event loop. When the loop's thread is busy,
the build sleeps BUILD_YIELD times as long as it had worked, so requests during a push
are not slowed 3–4× over; when the loop's thread is idle, the pause costs the build
next to nothing. Real threads, real GIL, real thread CPU clocks.

What is checked is what the pacer *asks for* (it is handed a recording ``sleep``), not
how long a pause took: on a shared 2-core machine a measured pause swings with the
load, and a wall-clock bound made this test flaky (issue 39, item 22).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from proxy.control.builds import _Pacer

SPANS = 3  # build spans (work, then pause) per case


def _idle(stop: threading.Event) -> None:
    stop.wait(10)


def _busy(stop: threading.Event) -> None:  # wants the GIL all the time: a loaded loop
    deadline = time.monotonic() + 10
    while not stop.is_set() and time.monotonic() < deadline:
        pass


def _asked_beside(loop: Callable[[threading.Event], None]) -> list[float]:
    """The sleeps a build asks for in SPANS pauses while its event loop runs ``loop``.

    Each span does a fixed amount of work (a count, not a time) in bytecode, so the GIL
    can change hands during it as it does during a real build."""
    asked: list[float] = []
    stop = threading.Event()
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    thread = threading.Thread(target=loop, args=(stop,), daemon=True)
    thread.start()
    try:
        pause = _Pacer(thread.ident or 0, sleep=asked.append)
        for _ in range(SPANS):
            for _ in range(200_000):
                pass
            pause()
        return asked
    finally:
        stop.set()
        thread.join(5)
        sys.setswitchinterval(old)


def test_beside_an_idle_loop_the_build_never_sleeps() -> None:
    assert _asked_beside(_idle) == [0] * SPANS


def test_beside_a_busy_loop_the_build_sleeps_after_every_span() -> None:
    assert all(seconds > 0 for seconds in _asked_beside(_busy))
