"""The body buffer every streamed body of the proxy goes through.

One producer (a protocol callback: ``data_received``, a parser's ``on_body``, an HTTP/2
DATA event) feeds bytes; one consumer reads them, usually from a coroutine. Between the
two sit a few chunks, their byte count, the end or failure of the message, and at most
one waiting reader.

Backpressure is the owner's business, so the buffer only says when to apply it: it
calls ``on_full`` once when the buffered bytes pass ``high_water`` and ``on_drained``
once the reader has taken them (or they were cleared). The owner plugs in whatever
holds the producer back: ``FlowControl.pause_reading(reason)`` / ``resume_reading``, an
HTTP/2 WINDOW_UPDATE for the bytes handed over (``high_water=0``: every read drains),
or the wake-up of a writer that awaits room.

Owners pass their own bound methods, which makes a reference cycle (owner → buffer →
callback → owner). The buffer breaks it itself: once the message is over (ended or
failed) and nothing it reported full is left to take, no callback can be due any more,
so it lets both go. A finished body is then freed by reference counting alone, with no
cyclic garbage for the collector (or for a ``gc.freeze``) to keep.

It is on the hot path: no allocation per chunk beyond the list slot, the only Future
is the one a reader awaits when nothing is there, and a single buffered chunk comes
out as it went in (no join, no copy). The class is final: owners compose it.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Generic, TypeVar

from proxy.request import Piece

Callback = Callable[[], None]
# What a buffer holds: ``bytes``, or pieces that may also be memoryviews of reads (a
# request body that passed llhttp by); what goes in comes out, joined only when taken
# whole from several pieces.
P = TypeVar("P", bytes, Piece)


def _nothing() -> None:
    """The default callback: no backpressure mechanism."""


class BodyBuffer(Generic[P]):
    """Chunks fed by one producer, taken by one reader; see the module docstring.

    States: open (bytes may come) → done (:meth:`end`: the reader drains what is
    buffered, then reads ``b""``) or failed (:meth:`fail`: the reader drains what is
    buffered, then gets the exception). Bytes fed after either are dropped: the message
    is over, or its reader is gone.
    """

    __slots__ = ("_chunks", "_buffered", "_high_water", "_full", "_done", "_error",
                 "_waiter", "_on_full", "_on_drained")

    def __init__(self, high_water: int, on_full: Callback = _nothing,
                 on_drained: Callback = _nothing, initial: bytes = b"") -> None:
        """``initial`` bytes (read before the owner took over) come out first."""
        self._chunks: list[P] = []
        self._buffered = 0
        self._high_water = high_water
        self._full = False  # on_full was called, on_drained not yet
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._on_full = on_full
        self._on_drained = on_drained
        if initial:
            self.feed(initial)

    @property
    def buffered(self) -> int:
        """Bytes fed and not yet taken."""
        return self._buffered

    @property
    def done(self) -> bool:
        """:meth:`end` was called: every byte of the message arrived (some may still be
        buffered)."""
        return self._done

    @property
    def error(self) -> BaseException | None:
        """What :meth:`fail` was given, if it was called."""
        return self._error

    # -- the producer's side

    def feed(self, data: P) -> None:
        """Queue ``data`` (kept as is, not copied); empty data and data after the end
        or a failure are dropped."""
        if not data or self._done or self._error is not None:
            return  # (a done or failed buffer may have let its callbacks go)
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > self._high_water and not self._full:
            self._full = True
            self._on_full()
        self._wake()

    def end(self) -> None:
        """The message is complete; a failed buffer stays failed."""
        if self._error is None:
            self._done = True
            if not self._full:
                self._release()
            self._wake()

    def fail(self, exc: BaseException) -> None:
        """The message cannot be completed; ignored once it ended or already failed
        (the first cause is the one reported)."""
        if not self._done and self._error is None:
            self._error = exc
            if not self._full:
                self._release()
            self._wake()

    # -- the reader's side

    def take(self) -> P | None:
        """Everything buffered, at once, or None when nothing is; never waits."""
        chunks = self.take_pieces()
        if not chunks:
            return None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def take_pieces(self) -> list[P]:
        """Everything buffered, in the pieces it was fed (not joined: for a writer
        that sends them with one ``writelines``); an empty list when nothing is."""
        chunks = self._chunks
        if not chunks:
            return []
        self._chunks = []
        self._buffered = 0
        if self._full:
            self._drained()
        return chunks

    async def read(self) -> P:
        """The buffered bytes, waiting for some if none are there; ``b""`` once the
        message ended and everything was read; raises what :meth:`fail` was given."""
        while True:
            data = self.take()
            if data is not None:
                return data
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    def clear(self) -> None:
        """Drop what is buffered (the reader does not want it); the state is kept."""
        self._chunks.clear()
        self._buffered = 0
        if self._full:
            self._drained()

    def _drained(self) -> None:
        self._full = False
        self._on_drained()
        if self._done or self._error is not None:
            self._release()

    def _release(self) -> None:
        """Forget the callbacks: the message is over and nothing reported is due."""
        self._on_full = _nothing
        self._on_drained = _nothing

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

