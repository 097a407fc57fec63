"""A Handler for a program that embeds tunnelgate: one call, the defaults of ``serve``.

An embedding program or a load-test harness hands requests to the Handler with no
sockets through :class:`tunnel.origin.Bridge`; what it needs first is a Handler composed
as ``tunnelgate serve`` composes one (:class:`proxy.control.runtime.Runtime`), with default
settings and a fixed config. README, *Embedding: the in-process bridge*, shows the whole
use in ten lines.
"""

from __future__ import annotations

from proxy.exchange.handler import Handler
from proxy.exchange.snapshot import Snapshot, SnapshotHolder
from proxy.observability.accesslog import AccessLog
from proxy.observability.metrics import Metrics
from proxy.observability.settings import AccessLogSettings
from proxy.upstream.registry import Pools
from routing.config import parse_config
from routing.decide import EntranceScope


def standalone_handler(config: object) -> Handler:
    """A Handler serving ``config`` (a wire config: JSON text or bytes, or the decoded
    value; ``routing.config.ConfigError`` if it is not acceptable), with every rule
    served on every entrance, no access log and its own metrics."""
    holder = SnapshotHolder(Snapshot.build(parse_config(config)))
    return Handler(holder, Pools(), Metrics(), AccessLog(AccessLogSettings()),
                   EntranceScope())
