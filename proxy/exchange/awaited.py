"""What waits after a protocol switch: the client's side of the 101, then the raw
bytes piped both ways until either side ends (:func:`switch`). Everything before it
is the one exchange's (:mod:`proxy.exchange.forward`)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from proxy.exchange.steps import Exchange
from proxy.exchange.websocket import pipe_upgrade
from proxy.request import ByteStream, Headers

if TYPE_CHECKING:
    from proxy.exchange.handler import Handler


async def switch(handler: "Handler", ex: Exchange, backend_stream: ByteStream,
                 headers: Headers) -> None:
    """A backend accepted a protocol switch: 101 to the client with ``headers``, then
    pipe raw bytes. The exchange is closed at the end, whatever happened (an exception
    is the entrance's to answer)."""
    try:
        try:
            client_stream = await ex.responder.upgrade(headers)
        except BaseException:
            # The client side could not switch (gone, or a writer that refuses the
            # hijack): the backend already did, so its connection must not linger.
            backend_stream.close()
            raise
        ex.status = 101
        metrics = handler.metrics
        metrics.upgrade_completed(ex.host_pattern, time.monotonic() - ex.started,
                                  ex.bytes_read)
        try:
            await pipe_upgrade(client_stream, backend_stream, handler.session_idle_timeout)
        finally:
            metrics.websocket_closed()
    except asyncio.CancelledError:
        ex.status = 0
        raise
    except Exception as exc:
        ex.error = exc  # the entrance answers it (500, or a cut connection)
    finally:
        ex.task = None
        handler.close(ex)
