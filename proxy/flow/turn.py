"""Work put off to the end of the event loop's turn, with one loop callback per turn.

The connections defer two steps of every exchange: a client request whose head was read
is started, and a backend answer that ended is finished, after the turn's other reads.
The requests read in one turn then go to their backends together, and the answers to
their clients together: each socket wakes its peer once per batch instead of once per
message (measured: about a fifth of the CPU a small request costs, most of it the
kernel's wake-ups). A ``call_soon`` per step would cost a loop handle, a bound method
and an untyped call each; the batch costs one of each per turn, and a typed call per
step.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("tunnelgate.flow")


class Deferred:
    """What a :class:`TurnEnd` runs (a base class: the run is a compiled virtual call)."""

    __slots__ = ()

    def run_deferred(self) -> None:
        """The step put off to the end of the turn."""
        raise NotImplementedError


class TurnEnd:
    """Runs each added :class:`Deferred` once, at the end of the loop turn it was added
    in, in the order added; one that raises is logged and does not stop the others.

    A step added while the batch runs goes to the next turn. The batch is bound to the
    loop it was started on: an item added from another loop starts a batch of its own
    there (a shared owner may serve several loops one after another, as tests do)."""

    __slots__ = ("_due", "_loop")

    def __init__(self) -> None:
        self._due: list[Deferred] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, item: Deferred, loop: asyncio.AbstractEventLoop) -> None:
        due = self._due
        if due and loop is self._loop:
            due.append(item)
            return
        due = self._due = [item]
        self._loop = loop
        loop.call_soon(self._run, due)

    def _run(self, due: list[Deferred]) -> None:
        if due is self._due:
            self._due = []
        for item in due:
            try:
                item.run_deferred()
            except Exception:
                log.exception("deferred step failed")
