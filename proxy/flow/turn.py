"""Work put off to the end of the event loop's turn, with one loop callback per turn.

The connections defer two steps of an exchange: a client request without a body whose
head was read is started, and a backend answer that ended is finished, after the turn's
other reads.
The requests read in one turn then go to their backends together, and the answers to
their clients together: each socket wakes its peer once per batch instead of once per
message (most of what a small request costs is the kernel's wake-ups). One loop
callback runs the whole batch. Measured against starting each request at once
(``EntranceSettings.batch_requests`` off; paired A/B, benchmarks/RESULTS.md, "Fast
paths", 2026-12-07; two runs): 1.04-1.06x / 1.11-1.12x the requests per second of
a 13 B / 64 KiB GET.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

log = logging.getLogger("tunnelgate.flow")


class Deferred:
    """What a :class:`TurnEnd` runs."""

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

    __slots__ = ("_batch",)

    def __init__(self) -> None:
        self._batch: _Batch | None = None

    def add(self, item: Deferred, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._batch
        if batch is None or batch.loop is not loop:
            batch = self._batch = _Batch(loop)
        due = batch.due
        if not due:
            loop.call_soon(batch.run)
        due.append(item)


class _Batch:
    """The steps due at the end of one loop's turn (two lists take turns: the one run,
    the one filled meanwhile)."""

    __slots__ = ("loop", "due", "run", "_spare")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.due: list[Deferred] = []
        self._spare: list[Deferred] = []
        self.run: Callable[[], None] = self._run

    def _run(self) -> None:
        due = self.due
        # Steps added from here on are the next turn's batch.
        self.due, self._spare = self._spare, due
        try:
            for item in due:
                try:
                    item.run_deferred()
                except Exception:
                    log.exception("deferred step failed")
        finally:
            due.clear()
