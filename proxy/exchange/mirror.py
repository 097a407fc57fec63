"""RequestMirror: a fire-and-forget copy of the request to a shadow backend.

Gateway API RequestMirror: the copy is taken *at that point of the filter chain* (earlier rewrites
and header edits apply, later ones don't); its Host is the mirror's host:port; the body
is buffered up to 1 MiB, beyond which mirroring is skipped for that request while the
primary request goes on with the bytes already read; the mirror's answer is ignored and
can never affect the primary response. Delivery: 5 s per attempt, up to 3 attempts on
transport errors only, 100 ms × (attempt − 1) apart.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from proxy.exchange.forwarding import upstream_request_headers, upstream_target
from proxy.request import Body, BodyError, BytesBody, Headers
from proxy.upstream.base import UpstreamError
from proxy.upstream.registry import Pools
from routing.model import Backend, Mirror
from routing.values import backend_base

if TYPE_CHECKING:
    from proxy.exchange.steps import Exchange

log = logging.getLogger("tunnelgate.mirror")

MAX_BODY: Final = 1 << 20
ATTEMPTS: Final = 3
ATTEMPT_TIMEOUT: Final = 5.0
MAX_BACKENDS: Final = 1024  # mirrors remembered (Mirrors.backend) before the memo starts over


class PrefixedBody:
    """A body whose first bytes were already read (mirror skipped past the cap)."""

    def __init__(self, head: bytes, rest: Body) -> None:
        self._head = head
        self._rest = rest
        self.length = rest.length

    async def read(self) -> bytes:
        if self._head:
            head, self._head = self._head, b""
            return head
        return await self._rest.read()


def sampled(percent: int, rand: float) -> bool:
    """Sampling: ≥100 always, ≤0 never, else a draw below ``percent`` in 100."""
    if percent >= 100:
        return True
    return percent > 0 and int(rand * 100) < percent


class Mirrors:
    """The mirror copies of one Handler: the pools they go through, the copies in
    flight, and a backend per mirror.

    The copies are detached tasks; the set holds them (the loop keeps only weak
    references, so an unheld task can be collected mid-flight). A mirror's
    :class:`Backend` is made once and reused, so ``Pools.get`` finds it by identity
    instead of parsing its URL on every copy.
    """

    def __init__(self, pools: Pools) -> None:
        self.pools = pools
        self.in_flight: set[asyncio.Task[None]] = set()
        self._backends: dict[Mirror, Backend] = {}

    async def send(self, ex: "Exchange", mirror: Mirror) -> None:
        """Start the mirror copy of ``ex`` as it stands now, if sampled."""
        if not sampled(mirror.percent, random.random()):
            return
        body = await buffer_body(ex, MAX_BODY)
        if body is None:
            return
        backend = self.backend(mirror)
        # The copy's Host is the mirror URL's authority as written (host:port).
        host = urlsplit(mirror.backend_url).netloc
        request = ex.request
        headers = upstream_request_headers(
            ex.headers, host.encode("latin-1"), request.host.encode("latin-1"),
            request.client_ip, request.scheme, None)
        target = upstream_target(*backend_base(mirror.backend_url), ex.path, ex.query,
                                 request.empty_query)
        task = asyncio.get_running_loop().create_task(
            _deliver(self.pools, backend, request.method, target, headers, body))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    def backend(self, mirror: Mirror) -> Backend:
        """The backend the copies of ``mirror`` go to (the same object every time, as
        long as at most MAX_BACKENDS mirrors are in use)."""
        backend = self._backends.get(mirror)
        if backend is None:
            backend = Backend(url=mirror.backend_url, weight=1, protocol=mirror.protocol,
                              tls=mirror.tls)
            if len(self._backends) >= MAX_BACKENDS:
                self._backends.clear()
            self._backends[mirror] = backend
        return backend


async def buffer_body(ex: "Exchange", limit: int) -> bytes | None:
    """Read the request body whole and keep it as ``ex.body`` (a mirror copy, a retry's
    replay); None past ``limit`` bytes, when ``ex.body`` still gives every byte to the
    one request that streams it."""
    source = ex.body
    if source.length == 0:
        return b""
    if source.length is not None and source.length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= limit:
            chunk = await source.read()
            if not chunk:
                data = b"".join(chunks)
                ex.body = BytesBody(data, declare_length=source.length is not None)
                return data
            chunks.append(chunk)
            size += len(chunk)
    except BodyError:
        return None
    ex.body = PrefixedBody(b"".join(chunks), source)
    return None


async def _deliver(pools: Pools, backend: Backend, method: str, target: str,
                   headers: Headers, body: bytes) -> None:
    pool = pools.get(backend)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            async with asyncio.timeout(ATTEMPT_TIMEOUT):
                response = await pool.send(method, target, headers, BytesBody(body),
                                           head_timeout=ATTEMPT_TIMEOUT)
                while await response.read():
                    pass
            return
        except (UpstreamError, TimeoutError) as exc:
            log.debug("mirror attempt %d to %s failed: %s", attempt, backend.url, exc)
            if attempt < ATTEMPTS:
                await asyncio.sleep(0.1 * attempt)
