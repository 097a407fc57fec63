"""Piping an upgraded connection (WebSocket after the 101) in both directions.

Once a backend answered 101 the proxy no longer parses anything: bytes are copied both
ways with backpressure (each write waits for the receiving side to drain) until either
side ends or the session stays idle longer than ``idle_timeout``; then both are closed.
Route timeouts cover only the handshake.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from proxy.request import ByteStream

DEFAULT_IDLE_TIMEOUT: Final = 3600.0


class _Activity:
    """Last time a byte moved in either direction."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = time.monotonic()


async def _copy(source: ByteStream, sink: ByteStream, activity: _Activity) -> None:
    while True:
        data = await source.read()
        if not data:
            return
        activity.last = time.monotonic()
        await sink.write(data)


async def _watch_idle(activity: _Activity, idle_timeout: float) -> None:
    while True:
        remaining = activity.last + idle_timeout - time.monotonic()
        if remaining <= 0:
            return
        await asyncio.sleep(remaining)


async def pipe_upgrade(client: ByteStream, backend: ByteStream,
                       idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> None:
    """Copy bytes both ways until one side closes, fails, or the session idles out."""
    activity = _Activity()
    tasks = [asyncio.ensure_future(_copy(client, backend, activity)),
             asyncio.ensure_future(_copy(backend, client, activity)),
             asyncio.ensure_future(_watch_idle(activity, idle_timeout))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        client.close()
        backend.close()
