"""Every upstream pool of the process, one per backend key, created on first use.

Pools outlive config snapshots so keep-alive connections survive pushes;
:meth:`Pools.retain` closes the pools no backend of a new config uses any more.
``protocol == "h2c"`` backends get the HTTP/2 pool, every other one the HTTP/1.1 pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from proxy.upstream.base import (
    DIAL_TIMEOUT, IDLE_TIMEOUT, MAX_IDLE, RESPONSE_HEADER_TIMEOUT, PoolKey, pool_key)
from proxy.upstream.h2c import H2Pool
from proxy.upstream.outlier import Outliers
from proxy.upstream.pool import Pool
from proxy.upstream.readbuffer import ReadBuffer
from proxy.wire.framing import HeadLimits
from routing.model import BackendTLS
from routing.rebuild import Target, rule_targets
from routing.values import split_backend_url

if TYPE_CHECKING:
    from routing.model import Backend, Config


_POOL_TYPES: dict[str, type[Pool]] = {"": Pool, "h2c": H2Pool}


class Pools:
    """Every upstream pool of the process, keyed by backend."""

    def __init__(self, *, dial_timeout: float = DIAL_TIMEOUT, max_idle: int = MAX_IDLE,
                 idle_timeout: float = IDLE_TIMEOUT,
                 head_limits: HeadLimits = HeadLimits(), max_connections: int = 0,
                 outliers: Outliers | None = None,
                 head_timeout: float | None = RESPONSE_HEADER_TIMEOUT) -> None:
        self.dial_timeout = dial_timeout
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self.head_limits = head_limits
        self.max_connections = max_connections  # per pool; 0 = no limit (see Pool)
        # Passive outlier detection, per endpoint and shared by every route, as the
        # pools are (proxy.upstream.outlier).
        self.outliers = outliers if outliers is not None else Outliers()
        self.head_timeout = head_timeout  # without a route timeout; None: none (Pool)
        # Reads come one at a time on the event loop: every connection reads to one
        # buffer (see ReadBuffer).
        self.reads = ReadBuffer()
        self._pools: dict[PoolKey, Pool] = {}
        # Backend object -> pool, by identity: hashing a Backend (filters and all) on
        # every request would cost more than the lookup. The entry holds the backend,
        # so its id cannot be reused while cached; cleared on every retain.
        self._by_backend: dict[int, tuple[Backend, Pool]] = {}
        # The last entry found: consecutive requests mostly go to the same backend, and
        # an identity test is cheaper than boxing an id and a dict lookup.
        self._last: tuple[Backend, Pool] | None = None

    def get(self, backend: "Backend") -> Pool:
        """The pool for ``backend``, created on first use."""
        entry = self._last
        if entry is not None and entry[0] is backend:
            return entry[1]
        entry = self._by_backend.get(id(backend))
        if entry is not None and entry[0] is backend:
            self._last = entry
            return entry[1]
        key = pool_key(backend)
        pool = self._pools.get(key)
        if pool is None:
            pool_type = _POOL_TYPES[key.protocol]
            pool = self._pools[key] = pool_type(
                key, dial_timeout=self.dial_timeout, max_idle=self.max_idle,
                idle_timeout=self.idle_timeout, max_connections=self.max_connections)
            pool.head_limits = self.head_limits
            pool.head_timeout = self.head_timeout
            pool.reads = self.reads
        if len(self._by_backend) > 4096:
            self._by_backend.clear()
        entry = self._last = (backend, pool)
        self._by_backend[id(backend)] = entry
        return pool

    def peek(self, backend: "Backend") -> Pool | None:
        """The pool ``backend`` uses if it exists (never creates one)."""
        try:
            return self._pools.get(pool_key(backend))
        except ValueError:
            return None

    def retain(self, keys: Iterable[PoolKey]) -> None:
        """Close and drop every pool whose key is not in ``keys`` (after a config push:
        the :func:`config_pool_keys` of the new config)."""
        keep = set(keys)
        for key in [key for key in self._pools if key not in keep]:
            self._pools.pop(key).close()
        self._by_backend.clear()
        self._last = None

    def close(self) -> None:
        """Close everything (shutdown)."""
        self.retain(())
        self.outliers.close()


def config_pool_keys(config: "Config") -> frozenset[PoolKey]:
    """The pools the backends and mirrors of ``config`` use."""
    return pool_keys({t for rule in config.rules for t in rule_targets(rule)})


def pool_keys(targets: Iterable[Target]) -> frozenset[PoolKey]:
    """The pools for these distinct targets (a compile keeps them counted, so a push
    does not walk 10,000 rules for them: ~15 ms, measured). Computed off the event
    loop; each target's URL is split once."""
    keys = set()
    for url, protocol, tls in targets:
        try:
            address = split_backend_url(url)
        except ValueError:
            continue
        keys.add(PoolKey(address.scheme, address.host, address.port, protocol, tls))
    return frozenset(keys)
