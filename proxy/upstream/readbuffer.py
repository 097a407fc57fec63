"""Where backend responses are read to: one store, read into in place, reused from
read to read while nothing holds a part of it.

An upstream connection is a buffered protocol: the event loop reads the socket straight
into the store :meth:`ReadBuffer.take` gives it, where a plain protocol would get a
fresh ``bytes`` copy of every read. A large response body then reaches the client
transport as memoryviews of the store: no copy of it in user space at all.

Reuse is what makes that cheap (the same memory, warm in the cache, read after read),
and what needs care: a read must never overwrite bytes a transport still has to send.
The rule is the store's own, not a convention: a ``bytearray`` cannot be resized while
any view of it is alive, so a store whose resize is refused is still held (a client
transport that could not write a piece at once keeps it queued, or whoever kept a
piece past the read), and the next read goes to another store. One that is let go
serves again. Reads come one at a time on one event loop, so one ``ReadBuffer`` serves
every connection of a :class:`~proxy.upstream.registry.Pools`.

What bounds the memory: the connection copies a small piece rather than lend it (a few
bytes must not keep a whole store), a transport with bytes queued gets copies
(:class:`~proxy.flow.control.GuardedOutput`), so a client that stops reading holds one
store at most; and at most ``SPARES`` held stores are remembered for reuse, a held store
beyond them is dropped and freed by its last holder.
"""

from __future__ import annotations

from typing import Final

from proxy.wire.scan import SOLE_VIEW

# As much as the event loop reads at once into its own buffer for a plain protocol:
# a large body takes as many reads either way.
READ_SIZE: Final = 256 * 1024
# A piece smaller than this is copied out of the store rather than lent.
LEND_MIN: Final = 16 * 1024
SPARES: Final = 4  # held stores remembered, for reuse once they are let go


class ReadBuffer:
    """The store reads land in; see the module docstring.

    ``view`` is the view of the store the last :meth:`take` gave out: the reader
    slices the bytes read from it. ``lent`` is set when a part of a read left the
    reader (a body piece passed on as a view of the store): the next :meth:`take`
    then checks whether the store is still held.
    """

    __slots__ = ("size", "store", "view", "lent", "_held")

    def __init__(self, size: int = READ_SIZE) -> None:
        self.size = size
        self.store = bytearray()  # allocated by the first take (most pools never read)
        self.view = memoryview(self.store)
        self.lent = False
        self._held: list[bytearray] = []

    def take(self) -> memoryview:
        """A view of a store no one else holds, for the next read."""
        if self.lent or not self.store:
            self.lent = False
            # (asked in C first where that is built, proxy.wire.scan.sole_view)
            if not (self.store and SOLE_VIEW(self.view)):
                self._settle()
        return self.view

    def _settle(self) -> None:
        """Keep the store if nothing holds a part of it, else switch to one that is
        free (a spare let go, or a new one)."""
        try:
            self.view.release()
        except BufferError:
            pass  # still exported by a read in progress: the store counts as held
        store = self.store
        if not store or held(store):
            if store and len(self._held) < SPARES:
                self._held.append(store)
            store = self.store = self._free_store()
        self.view = memoryview(store)

    def _free_store(self) -> bytearray:
        spares = self._held
        for i, store in enumerate(spares):
            if not held(store):
                del spares[i]
                return store
        store = bytearray(self.size)
        held(store)  # its first resize moves it (see held): done here, before any read
        return store


def held(store: bytearray) -> bool:
    """Whether any view of ``store`` is alive: Python refuses to resize a
    ``bytearray`` while one is. Growing it by a byte (then shrinking it back) moves no
    memory once it was resized once: a new ``bytearray`` has no spare byte, and the
    first growth reallocates it with room to spare."""
    try:
        store.append(0)
    except BufferError:
        return True
    del store[-1]
    return False
