"""TurnEnd: steps put off to the end of the loop turn, one loop callback per turn.

The steps are the product's own :class:`~proxy.flow.turn.Deferred` classes (a compiled
class takes no subclass from a test): a client connection's request reader, whose step
clears its ``_start_due`` mark, and an awaited backend response, which defers nothing
and so fails when run (the base class's hook).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
import uvloop

from proxy.entrances.http1 import HTTP1Protocol
from proxy.entrances.listener import Entrance, EntranceSettings
from proxy.entrances.reader import RequestReader
from proxy.flow.turn import TurnEnd
from proxy.request import Request, Responder
from proxy.upstream.response import UpstreamResponse

LOOPS = [asyncio.new_event_loop, uvloop.new_event_loop]


async def _never_called(request: Request, responder: Responder) -> None:
    raise AssertionError("no request is served here")


def _reader(loop: asyncio.AbstractEventLoop) -> RequestReader:
    """A reader marked as :meth:`RequestReader.feed` marks one before deferring."""
    reader = RequestReader(HTTP1Protocol(Entrance(_never_called, EntranceSettings(), loop)))
    reader._start_due = True
    return reader


def _due(readers: list[RequestReader]) -> list[bool]:
    return [reader._start_due for reader in readers]


@pytest.mark.parametrize("new_loop", LOOPS)
def test_steps_run_at_the_end_of_the_turn_they_were_added_in(
        new_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
    loop = new_loop()
    try:
        readers = [_reader(loop) for _ in range(3)]
        turn = TurnEnd()
        seen: list[list[bool]] = []

        def during_the_turn() -> None:
            for reader in readers:
                turn.add(reader, loop)
            seen.append(_due(readers))

        loop.call_soon(during_the_turn)
        loop.call_soon(lambda: seen.append(_due(readers)))  # queued before the batch
        loop.run_until_complete(asyncio.sleep(0))
        assert seen == [[True] * 3, [True] * 3]
        assert _due(readers) == [False] * 3
    finally:
        loop.close()


@pytest.mark.parametrize("new_loop", LOOPS)
def test_a_failing_step_is_logged_and_the_others_still_run(
        new_loop: Callable[[], asyncio.AbstractEventLoop],
        caplog: pytest.LogCaptureFixture) -> None:
    loop = new_loop()
    try:
        before, after = _reader(loop), _reader(loop)
        turn = TurnEnd()
        turn.add(before, loop)
        turn.add(UpstreamResponse(loop), loop)  # defers nothing: its step raises
        turn.add(after, loop)
        with caplog.at_level(logging.ERROR, logger="tunnelgate.flow"):
            loop.run_until_complete(asyncio.sleep(0))
        assert _due([before, after]) == [False, False]
        failures = [r.exc_info[0] for r in caplog.records if r.exc_info]
        assert failures == [NotImplementedError]
    finally:
        loop.close()


def test_a_step_from_another_loop_starts_a_batch_there() -> None:
    """One owner, two loops one after the other (the first closed with a batch due):
    the second loop's steps still run."""
    turn = TurnEnd()
    first = asyncio.new_event_loop()
    stranded = _reader(first)
    turn.add(stranded, first)
    first.close()
    second = uvloop.new_event_loop()
    try:
        readers = [_reader(second), _reader(second)]
        for reader in readers:
            turn.add(reader, second)
        second.run_until_complete(asyncio.sleep(0))
        assert _due(readers) == [False, False]
        assert stranded._start_due  # its loop never ran it
    finally:
        second.close()
