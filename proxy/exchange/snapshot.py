"""The routing snapshot: one immutable (version, table) pair, swapped whole.

A push builds a new Snapshot off the request path and replaces one reference; a request
reads ``holder.current`` once and keeps that snapshot to its end (immutable
snapshots, swapped whole). Assigning an attribute is atomic under the GIL, so no lock
is needed for readers.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.upstream.base import PoolKey
from proxy.upstream.registry import config_pool_keys, pool_keys
from routing.config import parse_config
from routing.model import Config
from routing.pause import Pause
from routing.reuse import RuleReuse
from routing.table import Table


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A validated config, the table compiled from it, and the upstream pools it uses
    (so that pruning the others after the swap is a set difference on the loop)."""

    version: int
    config: Config
    table: Table
    pool_keys: frozenset[PoolKey] = frozenset()

    @classmethod
    def build(cls, config: Config, default_entrances: frozenset[str] | None = None,
              pause: Pause | None = None, reuse: RuleReuse | None = None) -> "Snapshot":
        """Compile ``config``; touches nothing outside the new snapshot (and ``reuse``).

        ``default_entrances``, ``pause``, ``reuse``: see
        :meth:`routing.table.Table.compile`.
        """
        table = Table.compile(config, default_entrances, pause, reuse)
        if reuse is not None and reuse.table is not None:
            return cls(config.version, config, table, pool_keys(reuse.table[3]))
        return cls(config.version, config, table, config_pool_keys(config))


class SnapshotHolder:
    """The single mutable reference to the current snapshot, and what the previous
    push's parse and compile left for the next one to reuse (:class:`RuleReuse`: a
    controller re-sends most rules unchanged)."""

    __slots__ = ("current", "loaded", "default_entrances", "reuse", "_lent")

    def __init__(self, initial: Snapshot,
                 default_entrances: frozenset[str] | None = None) -> None:
        self.current = initial
        self.loaded = False  # becomes True on the first accepted config
        self.default_entrances = default_entrances
        self.reuse = RuleReuse()
        # Tables a reader walks off the loop now, with their count of readers: such a
        # table is never released (taken apart) under them. (Keyed by the table, which
        # hashes by identity; a Snapshot would hash its whole config.)
        self._lent: dict[Table, int] = {}

    def parse(self, data: object, pause: Pause | None = None) -> Config:
        """:func:`routing.config.parse_config` of a pushed config, reusing the rules of
        the previous push. Pure CPU work, so callers may run it in a worker thread
        (``pause``: see :data:`routing.pause.Pause`)."""
        return parse_config(data, pause, self.reuse)

    def build(self, config: Config, pause: Pause | None = None) -> Snapshot:
        """Compile ``config`` the way this process serves it (entrance policy applied),
        reusing the compiled rules of the previous build. Pure CPU work, so callers may
        run it in a worker thread (``pause``: see :data:`routing.pause.Pause`).
        """
        return Snapshot.build(config, self.default_entrances, pause, self.reuse)

    def swap(self, snapshot: Snapshot) -> Table | None:
        """Make ``snapshot`` current for every request that starts from now on.

        Returns the replaced table when nothing can read it any more, for the caller to
        release in steps (:meth:`routing.table.Table.release`); lookups run whole on the
        loop, so only a reader :meth:`lend` lent it to can still hold it, and then
        None is returned: the table is freed whole when its last reader lets go."""
        replaced = self.current
        self.current = snapshot
        self.loaded = True
        table = replaced.table
        if table is snapshot.table or table in self._lent:
            return None
        return table

    def lend(self) -> Snapshot:
        """The current snapshot, for a reader that walks its table away from the loop
        (``/debug/routes`` in a worker thread): until :meth:`give_back`, a push never
        releases that table under it."""
        snapshot = self.current
        self._lent[snapshot.table] = self._lent.get(snapshot.table, 0) + 1
        return snapshot

    def give_back(self, snapshot: Snapshot) -> None:
        """The reader of a :meth:`lend` is done with ``snapshot``."""
        left = self._lent[snapshot.table] - 1
        if left:
            self._lent[snapshot.table] = left
        else:
            del self._lent[snapshot.table]
