"""Config builds beside the event loop, in slices it hands out, and what they leave for
the cyclic GC.

A push is parsed and compiled in a worker thread (a cold 10,000-rule push takes 0.1-0.15
s of CPU, measured in process, far less when most rules repeat), but the thread runs only
while the event loop waits for it: the loop hands the build a slice of at most
:data:`BUILD_SLICE`, the build gives the core back at its next pause past that, and the
loop serves whatever became ready before it hands out the next (and, once it had
something to serve, gets :data:`BUILD_YIELD` slices' time to itself: :class:`_Slices`).
So requests in flight during a push wait at most about one slice per loop pass, and
never for the GIL: only one of the two threads ever wants it.

Letting the two threads compete for the GIL instead (CPython's switch interval shortened
to 0.1 ms, the build sleeping twice as long as it had worked when the loop was busy) kept
request p99 during a cold 10,000-rule push at 2.7-3.3x the p99 without pushes on the
2-core test machine (2026-12-07): the loop waited a switch interval or a whole pause
span (up to 128 rules, ~0.6 ms) for the GIL on every pass, and compiled code never
gives it up by itself.

Automatic GC is paused while a build runs, and afterwards the survivors are frozen
(``gc.freeze``) so that no collection on the loop walks a fresh snapshot. Automatic GC
and the frozen generation are interpreter state: :class:`Builds` keeps the count of
builds in flight and the collection threshold that go with them, so a process has
exactly one, made by the composition root (``proxy.control.cli``) and handed to
everything that builds: the config API, the ``/debug`` views, a worker's prepare.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from typing import Callable, Generic, TypeVar

log = logging.getLogger("tunnelgate.admin")  # its messages are the config API's

# The longest the build runs before it gives the core back to the loop, give or take
# one pause span (routing.pause.PAUSE_EVERY steps, ~20 us). A request in flight waits
# for at most one slice per loop pass it needs.
BUILD_SLICE = 50e-6
# Once a pass between two slices served something (it took longer than IDLE_PASS), the
# next slice waits until the loop has had BUILD_YIELD times a slice to itself, even if
# a later pass finds nothing to do: under load the build takes at most a fifth of the
# core, and only a loop with nothing to serve lends it all. Letting any quick pass start
# the next slice handed the build all of a loaded loop's idle time: request p50 during a
# cold 10,000-rule push 0.26 -> 0.58 ms, p99 3.1x the p99 without. With this rule the
# p99 during a cold push over the p99 before it, median of three pushes (quiet 2-core
# host, benchmarks/propagation.py's load, 2026-12-07): BUILD_YIELD 3: 1.89-2.22x, the
# push 0.44-0.58 s; 4: 1.71-1.73x, 0.63-0.69 s; 5: 1.63-1.88x, 0.62-0.75 s. A shorter
# slice (25 us) with 3 did no better (1.78-2.06x): what a loaded loop loses is the
# build's share of the core, not the length of one slice. IDLE_PASS at 6 us (an empty
# pass is ~1 us) did no better either.
IDLE_PASS = 20e-6
BUILD_YIELD = 4.0
T = TypeVar("T")


class BuildCancelled(BaseException):
    """Raised at a build's pause when the task waiting for it was cancelled: the
    build thread unwinds instead of waiting for a slice that never comes. Not an
    :class:`Exception`, like :class:`asyncio.CancelledError`, so that a build's
    ``except Exception`` does not swallow it."""


class Builds:
    """Runs builds off the loop (:meth:`run`) and settles the GC after a push
    (:meth:`settle`). One per process (module doc)."""

    def __init__(self) -> None:
        self.running = 0  # threaded builds in progress (pushes may overlap)
        # Frozen objects above which collect() collects; None until the first push.
        self.frozen_limit: int | None = None
        # Allocated blocks up to which the frozen generation is not even counted.
        self.heap_limit = 0

    async def run(self, build: Callable[..., T], *args: object) -> T:
        """``build(*args, pause=...)`` in a worker thread that runs only in the slices
        this task hands it (see the module doc), automatic GC paused meanwhile (the
        build allocates a lot, and a full collection it triggered would hold the
        interpreter for tens of ms); the survivors are frozen when the last
        overlapping build ends. ``build`` must call ``pause`` every few steps
        (routing.pause.Pause): the loop waits for it until it does. Call
        :meth:`settle` once the push these builds were for is complete."""
        self.open()
        try:
            return await _Slices(build, args).run()
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


class _Slices(Generic[T]):
    """One build, run in a thread of its own in slices: the loop hands the thread a
    turn (:meth:`_turn`) and blocks until the build gives it back at a pause past
    :data:`BUILD_SLICE`, or ends. Two semaphores pass the turn, so exactly one of the
    two threads runs at any time and neither waits for the GIL."""

    def __init__(self, build: Callable[..., T], args: tuple[object, ...],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``clock``: what slices are timed with (a test passes a counting one)."""
        self._build, self._args, self._clock = build, args, clock
        self._go = threading.Semaphore(0)    # loop -> build: run a slice
        self._back = threading.Semaphore(0)  # build -> loop: the slice is over
        self._ends = 0.0  # when the running slice is used up (build thread's clock)
        self._cancelled = False
        self._done = False
        self._result: T | None = None
        self._error: BaseException | None = None
        self.slices = 0  # handed out so far

    async def run(self) -> T:
        """Start the thread and hand out slices until the build ends; its result, or
        its exception raised here. Cancelled, the build is stopped at its next pause."""
        threading.Thread(target=self._work, name="tunnelgate-build", daemon=True).start()
        try:
            while not self._turn():
                await self._pace(self._clock())
        except asyncio.CancelledError:
            self._cancelled = True
            self._go.release()  # the thread raises BuildCancelled at its pause
            raise
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]  # set when no error

    async def _pace(self, ended: float) -> None:
        """Between two slices: let the loop serve what is ready; if it had something
        to serve, give it BUILD_YIELD slices' time in all before the build's next turn
        (see BUILD_YIELD)."""
        busy = False
        while True:
            before = self._clock()
            await asyncio.sleep(0)  # one loop pass: the ready callbacks and I/O
            now = self._clock()
            busy = busy or now - before >= IDLE_PASS
            if not busy or now - ended >= BUILD_YIELD * BUILD_SLICE:
                return

    def _turn(self) -> bool:
        """The loop's side: one slice of the build; True once the build has ended."""
        self.slices += 1
        self._go.release()
        self._back.acquire()  # blocks, the GIL released, until the build pauses
        return self._done

    def pause(self) -> None:
        """The build's side (its ``pause``): give the turn back once the slice is
        used up; a clock read otherwise."""
        if self._cancelled:
            raise BuildCancelled()
        if self._clock() < self._ends:
            return
        self._back.release()
        self._wait_turn()

    def _wait_turn(self) -> None:
        self._go.acquire()
        if self._cancelled:
            raise BuildCancelled()
        self._ends = self._clock() + BUILD_SLICE

    def _work(self) -> None:
        try:
            self._wait_turn()
            self._result = self._build(*self._args, pause=self.pause)
        except BuildCancelled:
            pass
        except BaseException as exc:  # handed to the awaiting task
            self._error = exc
        finally:
            self._done = True
            self._back.release()
