"""The build thread's pause (proxy.control.builds._Pacer and pause_after).

A build shares the proxy's core with the event loop. When the loop's thread is busy,
the build sleeps BUILD_YIELD times as long as it had worked, so requests during a push
are not slowed 3–4× over; when the loop's thread is idle, the pause costs the build
next to nothing.

The decision is a pure function of three durations and is checked as a table. What the
pacer measures is checked with a real idle thread, and by what it *asks for* (it is
handed a recording ``sleep``), not by how long a pause took: on a shared 2-core machine
a measured pause, or a busy thread's share of a core, swings with the load, and a
wall-clock bound made the former test flaky (issue 39, item 22).
"""

from __future__ import annotations

import threading

import pytest

from proxy.control.builds import BUILD_YIELD, LOOP_BUSY_SHARE, _Pacer, pause_after

SPANS = 3  # build spans (work, then pause) in the thread test


@pytest.mark.parametrize("worked, elapsed, loop_cpu, sleep", [
    (0.02, 0.02, 0.0, 0.0),                                    # idle loop: no pause
    (0.02, 0.02, 0.02 * LOOP_BUSY_SHARE, 0.0),                 # at the share: not busy
    (0.02, 0.02, 0.02 * LOOP_BUSY_SHARE * 1.01, 0.02 * BUILD_YIELD),  # just over it
    (0.02, 0.06, 0.03, 0.02 * BUILD_YIELD),                    # busy over a longer span
    (0.001, 0.5, 0.05, 0.0),                                   # a tenth of a core: idle
])
def test_the_build_yields_the_core_only_to_a_busy_loop(
        worked: float, elapsed: float, loop_cpu: float, sleep: float) -> None:
    assert pause_after(worked, elapsed, loop_cpu) == pytest.approx(sleep)


def test_beside_a_real_idle_thread_the_build_never_sleeps() -> None:
    asked: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, args=(10,), daemon=True)
    thread.start()
    try:
        pause = _Pacer(thread.ident or 0, sleep=asked.append)
        for _ in range(SPANS):
            for _ in range(200_000):  # work in bytecode, as a build does
                pass
            pause()
    finally:
        stop.set()
        thread.join(5)
    assert asked == [0.0] * SPANS
