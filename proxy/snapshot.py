"""The routing snapshot: one immutable (version, table) pair, swapped whole.

A push builds a new Snapshot off the request path and replaces one reference; a request
reads ``holder.current`` once and keeps that snapshot to its end (DESIGN.md, "Immutable
snapshots, swapped whole"). Assigning an attribute is atomic under the GIL, so no lock
is needed for readers.
"""

from __future__ import annotations

from dataclasses import dataclass

from routing.config import Config
from routing.table import Table


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A validated config and the table compiled from it."""

    version: int
    config: Config
    table: Table

    @classmethod
    def build(cls, config: Config,
              default_entrances: frozenset[str] | None = None) -> "Snapshot":
        """Compile ``config``; touches nothing outside the new snapshot.

        ``default_entrances``: see :meth:`routing.table.Table.compile`.
        """
        return cls(config.version, config, Table.compile(config, default_entrances))


class SnapshotHolder:
    """The single mutable reference to the current snapshot."""

    __slots__ = ("current", "loaded", "default_entrances")

    def __init__(self, initial: Snapshot,
                 default_entrances: frozenset[str] | None = None) -> None:
        self.current = initial
        self.loaded = False  # becomes True on the first accepted config
        self.default_entrances = default_entrances

    def build(self, config: Config) -> Snapshot:
        """Compile ``config`` the way this process serves it (entrance policy applied).

        Pure CPU work with no shared state, so callers may run it in a worker thread.
        """
        return Snapshot.build(config, self.default_entrances)

    def swap(self, snapshot: Snapshot) -> None:
        """Make ``snapshot`` current for every request that starts from now on."""
        self.current = snapshot
        self.loaded = True
