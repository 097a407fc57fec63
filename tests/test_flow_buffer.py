"""BodyBuffer: one producer, one reader, backpressure through two callbacks."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from proxy.flow.buffer import BodyBuffer


class Calls:
    """Records the backpressure callbacks in order."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def full(self) -> None:
        self.seen.append("full")

    def drained(self) -> None:
        self.seen.append("drained")

    def buffer(self, high_water: int) -> BodyBuffer:
        return BodyBuffer(high_water, self.full, self.drained)


@pytest.mark.parametrize("high_water, steps, seen", [
    # the callbacks fire once per crossing, not once per chunk
    (4, ["1234"], []),
    (4, ["12345"], ["full"]),
    (4, ["123", "45", "6"], ["full"]),
    (4, ["12345", "take"], ["full", "drained"]),
    (4, ["12345", "take", "take"], ["full", "drained"]),
    (4, ["12345", "take", "123456"], ["full", "drained", "full"]),
    (4, ["12", "take"], []),
    (4, ["12345", "clear"], ["full", "drained"]),
    (4, ["123", "45", "pieces", "6"], ["full", "drained"]),
    # high_water 0: every take of fed bytes drains (an HTTP/2 window acknowledgment)
    (0, ["a", "take", "b", "c", "take"], ["full", "drained", "full", "drained"]),
    (0, ["take"], []),
])
def test_backpressure_callbacks(high_water: int, steps: list[str], seen: list[str]) -> None:
    calls = Calls()
    buf = calls.buffer(high_water)
    for step in steps:
        if step == "take":
            buf.take()
        elif step == "pieces":
            buf.take_pieces()
        elif step == "clear":
            buf.clear()
        else:
            buf.feed(step.encode())
    assert calls.seen == seen


def test_take_hands_one_chunk_over_as_is() -> None:
    buf = BodyBuffer(1024)
    assert buf.take() is None
    chunk = b"x" * 100
    buf.feed(chunk)
    assert buf.buffered == 100
    assert buf.take() is chunk  # no join, no copy
    assert buf.buffered == 0
    buf.feed(b"ab")
    buf.feed(b"cd")
    assert buf.buffered == 4
    assert buf.take() == b"abcd"
    assert buf.take() is None


def test_take_pieces_hands_the_chunks_over_unjoined() -> None:
    buf = BodyBuffer(1024)
    assert buf.take_pieces() == []
    first, second = b"x" * 100, b"y" * 50
    buf.feed(first)
    buf.feed(second)
    pieces = buf.take_pieces()
    assert len(pieces) == 2 and pieces[0] is first and pieces[1] is second
    assert (buf.buffered, buf.take_pieces(), buf.take()) == (0, [], None)
    buf.feed(b"z")
    assert pieces == [first, second]  # the list handed over is not reused


@pytest.mark.parametrize("after", ["end", "fail"])
def test_data_after_the_end_or_a_failure_is_dropped(after: str) -> None:
    buf = BodyBuffer(1024)
    buf.feed(b"kept")
    if after == "end":
        buf.end()
    else:
        buf.fail(ValueError("broken"))
    buf.feed(b"dropped")
    buf.feed(b"")
    assert buf.take() == b"kept"
    assert buf.take() is None


def test_empty_data_is_not_an_end() -> None:
    buf = BodyBuffer(1024)
    buf.feed(b"")
    assert buf.take() is None and not buf.done


@pytest.mark.parametrize("first, second, done, error", [
    ("end", "fail", True, None),  # a complete message stays complete
    ("fail", "end", False, "first"),  # a failed one stays failed
    ("fail", "fail", False, "first"),  # the first cause is reported
])
def test_end_and_failure_are_final(first: str, second: str, done: bool,
                                   error: str | None) -> None:
    buf = BodyBuffer(1024)
    for name, step in (("first", first), ("second", second)):
        if step == "end":
            buf.end()
        else:
            buf.fail(ValueError(name))
    assert buf.done is done
    assert (str(buf.error) if buf.error is not None else None) == error


def test_initial_bytes_come_first() -> None:
    calls = Calls()
    buf = BodyBuffer(2, calls.full, calls.drained, initial=b"early")
    buf.feed(b"late")
    assert calls.seen == ["full"]
    assert buf.take() == b"earlylate"


async def test_read_waits_for_data_then_the_end() -> None:
    buf = BodyBuffer(1024)
    reader = asyncio.ensure_future(buf.read())
    await asyncio.sleep(0)
    assert not reader.done()
    buf.feed(b"hello")
    assert await asyncio.wait_for(reader, 1) == b"hello"
    reader = asyncio.ensure_future(buf.read())
    await asyncio.sleep(0)
    buf.end()
    assert await asyncio.wait_for(reader, 1) == b""
    assert await buf.read() == b""  # the end is sticky


async def test_read_drains_what_arrived_before_a_failure() -> None:
    buf = BodyBuffer(1024)
    buf.feed(b"partial")
    buf.fail(ConnectionError("gone"))
    assert await buf.read() == b"partial"
    with pytest.raises(ConnectionError, match="gone"):
        await buf.read()
    with pytest.raises(ConnectionError):
        await buf.read()


async def test_a_failure_wakes_a_waiting_reader() -> None:
    buf = BodyBuffer(1024)
    reader = asyncio.ensure_future(buf.read())
    await asyncio.sleep(0)
    buf.fail(TimeoutError("slow"))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader, 1)


async def test_a_cancelled_reader_leaves_the_buffer_usable() -> None:
    buf = BodyBuffer(1024)
    reader = asyncio.ensure_future(buf.read())
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    buf.feed(b"next")  # no waiter is left to wake
    assert await asyncio.wait_for(buf.read(), 1) == b"next"


async def test_a_read_drains_a_full_buffer_and_resumes_the_producer() -> None:
    """The owner's mechanism: a producer that waits while the buffer is full."""
    room = asyncio.Event()
    room.set()
    buf = BodyBuffer(3, room.clear, room.set)
    sent: list[bytes] = []

    async def produce() -> None:
        for chunk in (b"ab", b"cd", b"ef", b"gh"):
            await room.wait()
            buf.feed(chunk)
            sent.append(chunk)
        buf.end()

    producer = asyncio.ensure_future(produce())
    await asyncio.sleep(0.01)
    assert sent == [b"ab", b"cd"]  # 4 bytes > 3: the producer waits
    received = []
    while data := await asyncio.wait_for(buf.read(), 1):
        received.append(data)
    await asyncio.wait_for(producer, 1)
    assert b"".join(received) == b"abcdefgh"


class Owner:
    """An owner that hands the buffer its own bound methods (a reference cycle)."""

    def __init__(self) -> None:
        self.paused = False
        self.buffer = BodyBuffer(2, self.pause, self.resume)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False


@pytest.mark.parametrize("steps, freed", [
    (["end"], True),
    (["fail"], True),
    (["abc", "end"], False),  # full: on_drained is still due
    (["abc", "end", "take"], True),
    (["abc", "fail", "take"], True),
    (["abc", "fail", "clear"], True),
    (["ab", "end"], True),  # not full: the unread bytes owe no callback
    (["abc", "take"], False),  # the message is not over: more may come
])
def test_a_finished_buffer_lets_its_callbacks_go(steps: list[str], freed: bool) -> None:
    """Once no callback can be due, owner and buffer are freed without the collector."""
    gc.collect()
    gc.disable()
    try:
        owner = Owner()
        for step in steps:
            if step == "end":
                owner.buffer.end()
            elif step == "fail":
                owner.buffer.fail(ValueError("broken"))
            elif step == "take":
                owner.buffer.take()
            elif step == "clear":
                owner.buffer.clear()
            else:
                owner.buffer.feed(step.encode())
        assert not owner.paused or not freed  # the pause was lifted before letting go
        gone = weakref.ref(owner)
        del owner
        assert (gone() is None) is freed
    finally:
        gc.enable()
