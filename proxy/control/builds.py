"""Config builds off the event loop, and what they leave for the cyclic GC.

A push is parsed and compiled in a worker thread (a 10k-rule table takes up to a second,
far less when most rules repeat) so requests in flight keep being served; meanwhile the
GIL switch interval is short, the build yields more of the core when the loop is busy
(:class:`_Pacer`), and automatic GC is paused, so neither the builder nor a full
collection over a big table (~50 ms holding the GIL) stalls the loop. Afterwards
the survivors are frozen (``gc.freeze``) so that no collection on the loop walks a
fresh snapshot.

The switch interval, automatic GC and the frozen generation are interpreter state:
:class:`Builds` keeps the count of builds in flight and the collection threshold that
go with them, so a process has exactly one, made by the composition root
(``proxy.control.cli``) and handed to everything that builds — the config API, the
``/debug`` views, a worker's prepare. Two would restore each other's settings while a
build still runs.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from typing import Callable, TypeVar

log = logging.getLogger("tunnelgate.admin")  # its messages are the config API's

# While a push is parsed/compiled in a thread, the thread gives the GIL back after this
# many seconds when the event loop wants it. uvloop takes the GIL anew for every I/O
# callback, so while the build works each callback waits up to this long: CPython's
# default of 5 ms raised request p99 under pushes ×26, 0.5 ms still ×7 at 10,000 routes
# (a cold push, 2026-12-07). Much below 0.1 ms the kernel's timer slack (50 µs) sets the
# wait, not this. On the shared 2-core test machine, a loop waiting on a socket to
# another CPU while a cold 10,000-rule build ran: p99 1.1–1.2× the p99 without, against
# 1.5–1.6× at 0.5 ms, the build's CPU time the same (an indication: the host was busy).
BUILD_SWITCH_INTERVAL = 0.0001
# When the loop used more than LOOP_BUSY_SHARE of a core since the build's last pause,
# the build sleeps BUILD_YIELD times as long as it last worked: it gets a third of the
# core, the loop two thirds (see _Pacer).
LOOP_BUSY_SHARE = 0.2
BUILD_YIELD = 2.0
T = TypeVar("T")


class Builds:
    """Runs builds off the loop (:meth:`run`) and settles the GC after a push
    (:meth:`settle`). One per process (module doc)."""

    def __init__(self) -> None:
        self.running = 0  # threaded builds in progress (pushes may overlap)
        self.saved_interval = 0.0
        # Frozen objects above which collect() collects; None until the first push.
        self.frozen_limit: int | None = None
        # Allocated blocks up to which the frozen generation is not even counted.
        self.heap_limit = 0

    async def run(self, build: Callable[..., T], *args: object) -> T:
        """``build(*args, pause=...)`` in a worker thread, the GIL switch interval
        shortened (see BUILD_SWITCH_INTERVAL) and automatic GC paused meanwhile — the
        build allocates a lot, and a full collection it triggers would hold the GIL for
        tens of ms — both restored, and the survivors frozen, when the last overlapping
        build ends. ``build`` must call ``pause`` every so often (routing.pause.Pause):
        compiled code never gives up the GIL by itself; each build gets its own
        :class:`_Pacer` as that pause. Call :meth:`settle` once the push these builds
        were for is complete."""
        self.open()
        try:
            pause = _Pacer(threading.get_ident())  # run() is on the loop's thread
            return await asyncio.to_thread(build, *args, pause=pause)
        finally:
            self.close()

    def settle(self) -> None:
        """A push is complete: reclaim cyclic garbage its builds froze, if it is worth
        a full collection now (:meth:`collect`)."""
        freed = self.collect()
        if freed is not None:
            log.debug("frozen generation collected",
                      extra={"freed": freed, "frozen": gc.get_freeze_count()})

    def open(self) -> None:
        if not self.running:
            self.saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(self.saved_interval, BUILD_SWITCH_INTERVAL))
            gc.disable()
        self.running += 1

    def close(self) -> None:
        """Take everything alive after a build, above all the snapshot just built, out
        of the cyclic GC's reach (``gc.freeze``). Otherwise the next collections walk
        those ~10^5 new objects on the event loop: 7–67 ms stalls per 10,000-rule push,
        measured. A collection first would cost as much as it saves: it walks them too.

        The price: whatever cyclic garbage exists at the freeze is frozen with the
        snapshot, never collected. While the build ran with automatic GC paused, every
        object that fell into a reference cycle on the loop meanwhile — a closed
        connection with its parser, an exception with its traceback — is such garbage.
        The runtime avoids making any on its common paths (replaced snapshots, closed
        connections are freed by reference counting: tests/test_build_gc.py), and
        :meth:`collect` collects whatever still gets frozen."""
        self.running -= 1
        if not self.running:
            sys.setswitchinterval(self.saved_interval)
            gc.freeze()
            gc.enable()

    def collect(self) -> int | None:
        """After a push (the replaced snapshot released): if the frozen generation
        grew by more than a quarter since the last full collection (CPython's own rule
        for when a full collection is worth its cost), unfreeze, collect and freeze
        again; returns the objects it freed, or None if it did not collect. Garbage
        that a freeze took cannot pile up beyond a quarter of the live heap, however
        long a controller keeps pushing. The first push only sets the baseline.

        ``gc.get_freeze_count`` walks the frozen generation object by object: about
        6 ms on the loop per push with a 10,000-rule table, measured, and each of those
        stalls raised request p99 under pushes. So it is asked only once the heap,
        counted in allocated memory blocks (``sys.getallocatedblocks``, a walk over the
        allocator's pools: microseconds), grew by as many blocks as the frozen
        generation may still grow by before it is collected. Each frozen object but a
        large one (over 512 bytes, allocated apart; few) takes at least one block, so
        the frozen generation cannot grow by its quarter unless the heap grows by about
        as many blocks (or the rest of the heap shrinks meanwhile, which only delays a
        collection to a later push).

        The cost of a collection is one full walk of the heap on the loop: 0.3 s with a
        10,000-rule table on this project's 2-core test machine, over 1 s when it is
        loaded. Pushes of a table that does not grow never pay it while nothing leaks
        into the frozen set, which is why the runtime must not make cyclic garbage."""
        heap = sys.getallocatedblocks()
        if self.running or heap <= self.heap_limit:
            return None
        frozen = gc.get_freeze_count()
        if self.frozen_limit is None:  # the first push
            self._baseline(frozen)
            return None
        if frozen <= self.frozen_limit:
            # The heap grew, the frozen generation not by its quarter (yet): count
            # again once the heap grew by as many blocks as it may still grow by.
            self.heap_limit = heap + self.frozen_limit - frozen
            return None
        gc.unfreeze()
        freed = gc.collect()
        gc.freeze()
        self._baseline(gc.get_freeze_count())
        return freed

    def _baseline(self, frozen: int) -> None:
        """Collect again once ``frozen`` has grown by a quarter (see :meth:`collect`)."""
        self.frozen_limit = frozen * 5 // 4
        self.heap_limit = sys.getallocatedblocks() + frozen // 4


class _Pacer:
    """The build thread's pause (``routing.pause.Pause``), one per build: gives the GIL
    to the event loop and, when the loop is busy, sleeps ``BUILD_YIELD`` times as long
    as the build has just worked, so the build takes no more than its share of a core
    the loop needs.

    Sleeping gives up the GIL, and CPython hands it over (FORCE_SWITCHING) to a thread
    that has asked for it for a switch interval: the event loop, when requests are
    waiting. That alone let the build hold the GIL about half of the time: on a core
    the loop keeps busy, every request in the build's window (a tenth of a second in
    every second of pushes, for a 10,000-rule table) took 3–4× as long, and request
    p99 under pushes was 2.7–3.4× the p99 without. Whether the loop is busy is read
    from its thread's CPU clock, not from how long the GIL took to come back: uvloop
    drops the GIL whenever it polls, so a busy loop hands it back within tens of µs —
    as fast as an idle handover on a virtual machine. An idle loop costs the build one
    ``sleep(0)`` per pause."""

    __slots__ = ("_clock", "_mark", "_loop_cpu", "_since", "_sleep")

    def __init__(self, loop_thread: int,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """``loop_thread``: ``threading.get_ident()`` of the event loop's thread;
        ``sleep``: how the pause sleeps (a test records what it asks for)."""
        self._sleep = sleep
        self._clock = time.pthread_getcpuclockid(loop_thread)
        self._since = self._mark = time.monotonic()  # build took the GIL / last pause
        self._loop_cpu = time.clock_gettime(self._clock)  # loop's CPU time at _mark

    def __call__(self) -> None:
        now, loop_cpu = time.monotonic(), time.clock_gettime(self._clock)
        self._sleep(pause_after(now - self._since, now - self._mark,
                                loop_cpu - self._loop_cpu))
        self._mark, self._loop_cpu = now, loop_cpu
        self._since = time.monotonic()


def pause_after(worked: float, elapsed: float, loop_cpu: float) -> float:
    """How long a build that just ``worked`` seconds sleeps, when the event loop's thread
    used ``loop_cpu`` seconds of CPU in the ``elapsed`` seconds since the last pause:
    ``BUILD_YIELD`` times its work if the loop was busy (over ``LOOP_BUSY_SHARE`` of a
    core), else nothing."""
    return worked * BUILD_YIELD if loop_cpu > elapsed * LOOP_BUSY_SHARE else 0.0
