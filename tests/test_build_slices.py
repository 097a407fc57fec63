"""A config build runs beside the event loop in slices (proxy.control.builds._Slices).

The build's thread runs only while the loop has handed it a turn, and gives the turn
back at its first pause past BUILD_SLICE; the loop serves what is ready before the next
turn. Checked by what happens, in order, not by how long anything took: the slices are
timed with a counting clock the test hands in, so each case is exact on a loaded
machine.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Callable

import pytest

from proxy.control.builds import BUILD_SLICE, Builds, _Slices

STEPS = 6


class Ticks:
    """A clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def stepping_build(events: list[str]) -> Callable[..., int]:
    def build(pause: Callable[[], None]) -> int:
        for step in range(STEPS):
            events.append(f"build {step}")
            pause()
        return STEPS
    return build


async def run_beside_a_ticker(slices: _Slices[int], events: list[str]) -> int:
    """Run ``slices`` while a loop task records each pass it gets."""
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            events.append("loop")
            await asyncio.sleep(0)

    task = asyncio.ensure_future(ticker())
    try:
        return await slices.run()
    finally:
        done.set()
        await task


def test_a_used_up_slice_gives_the_loop_a_pass_at_every_pause() -> None:
    events: list[str] = []
    # Every clock read is a whole slice later: each pause ends the slice.
    slices = _Slices(stepping_build(events), (), clock=Ticks(BUILD_SLICE))
    assert asyncio.run(run_beside_a_ticker(slices, events)) == STEPS
    builds = [i for i, event in enumerate(events) if event.startswith("build")]
    assert [events[i] for i in builds] == [f"build {s}" for s in range(STEPS)]
    # Between two steps of the build the loop ran: the two never ran at once.
    assert all("loop" in events[a:b] for a, b in zip(builds, builds[1:]))
    assert slices.slices == STEPS + 1  # the first turn, then one per pause


def test_within_its_slice_the_build_does_not_stop_at_a_pause() -> None:
    events: list[str] = []
    slices = _Slices(stepping_build(events), (), clock=Ticks(BUILD_SLICE / 100))
    assert asyncio.run(run_beside_a_ticker(slices, events)) == STEPS
    builds = [i for i, event in enumerate(events) if event.startswith("build")]
    assert builds == list(range(builds[0], builds[0] + STEPS))  # one run, no pass
    assert slices.slices == 1


def test_a_failing_build_raises_in_the_task_that_awaits_it() -> None:
    def build(pause: Callable[[], None]) -> None:
        pause()
        raise ValueError("bad rule")

    with pytest.raises(ValueError, match="bad rule"):
        asyncio.run(_Slices(build, (), clock=Ticks(BUILD_SLICE)).run())


def test_a_cancelled_build_stops_at_its_next_pause() -> None:
    steps: list[int] = []
    ended = threading.Event()

    def build(pause: Callable[[], None]) -> None:
        try:
            for step in range(1_000_000):  # bounded; the cancel stops it far earlier
                steps.append(step)
                try:
                    pause()
                except Exception:  # a build's own handler must not swallow the stop
                    pass
        finally:
            ended.set()

    async def cancel_it() -> None:
        task = asyncio.ensure_future(_Slices(build, (), clock=Ticks(BUILD_SLICE)).run())
        for _ in range(3):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    assert ended.wait(10)
    assert len(steps) < 1_000_000


def test_builds_hand_back_the_result_and_leave_gc_as_it_was() -> None:

    async def two() -> tuple[int, int]:
        builds = Builds()
        return await asyncio.gather(builds.run(stepping_build([])),
                                    builds.run(stepping_build([])))

    assert gc.isenabled()
    assert asyncio.run(two()) == [STEPS, STEPS]
    assert gc.isenabled()
