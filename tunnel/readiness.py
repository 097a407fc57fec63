"""Whether a cloudflared is connected to the edge: its ``/ready`` endpoint, polled.

:class:`ReadyProbe` polls one ``/ready`` URL (sidecar mode, where cloudflared runs in
another container, and inside :class:`tunnel.cloudflared.CloudflaredSupervisor`).
:func:`http_get` is the small HTTP/1.1 client both use: cloudflared's metrics server is
the only thing it talks to, so it reads one bounded answer and closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Callable
from urllib.parse import urlsplit

import httptools

log = logging.getLogger("tunnelgate.cloudflared")

_BODY_LIMIT = 8 * 1024 * 1024  # a metrics page or /ready answer larger than this is refused


class _Answer:
    """httptools callbacks collecting one response; ``framed`` once its end is known."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.head_done = False
        self.delimited = False  # Content-Length or chunked: EOF alone does not end it
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.delimited = True

    def on_headers_complete(self) -> None:
        self.head_done = True

    def on_body(self, data: bytes) -> None:
        self.body += data
        if len(self.body) > _BODY_LIMIT:
            raise ValueError("response body too large")

    def on_message_complete(self) -> None:
        self.complete = True


async def http_get(url: str, timeout: float) -> tuple[int, bytes] | None:
    """``GET url`` over plain HTTP/1.1: (status, body), or ``None`` when no complete
    answer came within ``timeout`` seconds (refused, hung, malformed, too large)."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    answer = _Answer()
    parser = httptools.HttpResponseParser(answer)
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
            try:
                writer.write(f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                             "Connection: close\r\nUser-Agent: tunnelgate\r\n\r\n".encode())
                while not answer.complete:
                    data = await reader.read(65536)
                    if not data:
                        break
                    parser.feed_data(data)
            finally:
                writer.close()
    except (OSError, TimeoutError, ValueError, httptools.HttpParserError):
        return None
    if answer.complete or (answer.head_done and not answer.delimited):
        return parser.get_status_code(), bytes(answer.body)
    return None


async def wait_gone(url: str, timeout: float, interval: float = 0.25) -> bool:
    """Wait up to ``timeout`` s until nothing answers at ``url`` any more. A cloudflared
    in another container keeps its metrics server up while it drains and exits at the
    end of its grace period, so this is how long it may still hand us requests. True if
    it is gone (or never answered)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await http_get(url, min(1.0, max(0.1, deadline - loop.time()))) is not None:
        left = deadline - loop.time()
        if left <= 0:
            return False
        await asyncio.sleep(min(interval, left))
    return True


def ready_connections(body: bytes) -> int:
    """``readyConnections`` of a ``/ready`` answer (``{"status":200,"readyConnections":4,
    ...}``); 0 when absent or unreadable."""
    try:
        value = json.loads(body).get("readyConnections", 0)
    except (ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and value >= 0 else 0


class ReadyProbe:
    """Polls a cloudflared ``/ready`` URL: 200 means an edge connection is registered.

    ``on_change`` is called after ``ready`` flipped; with ``log_changes`` the flip is
    also logged here (a supervisor logs its own state instead).
    """

    def __init__(self, url: str, *, interval: float = 1.0, timeout: float = 2.0,
                 on_change: Callable[[], None] | None = None,
                 log_changes: bool = True) -> None:
        self.url = check_url(url, "ready")
        self.interval = interval
        self.timeout = timeout
        self.ready = False
        self.connections = 0
        self.ever_connected = False
        self.on_change = on_change
        self.log_changes = log_changes
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> bool:
        """Probe once and update ``ready`` / ``connections`` / ``ever_connected``."""
        url = self.url
        answer = await http_get(url, self.timeout)
        if url != self.url:  # retargeted meanwhile: this answer is about another child
            return self.ready
        ready = answer is not None and answer[0] == 200
        self.connections = ready_connections(answer[1]) if answer is not None else 0
        self._set(ready)
        return ready

    def retarget(self, url: str, ready: bool) -> None:
        """Probe ``url`` from now on (a replacement child), whose readiness is known."""
        self.url = check_url(url, "ready")
        self._set(ready)

    def mark_down(self) -> None:
        """The process behind the URL is gone: not ready until a probe says otherwise."""
        self.connections = 0
        self._set(False)

    def _set(self, ready: bool) -> None:
        changed = ready != self.ready
        self.ready = ready
        self.ever_connected = self.ever_connected or ready
        if changed:
            if self.log_changes:
                log.log(logging.INFO if ready else logging.WARNING,
                        "cloudflared %s (%s)", "connected to the edge" if ready
                        else "not connected to the edge", self.url)
            if self.on_change is not None:
                self.on_change()

    def start(self) -> None:
        """Begin polling every ``interval`` seconds (idempotent)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _poll(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.interval)


def check_url(url: str, what: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"cloudflared {what} URL must be http://host:port/path, not {url!r}")
    return url
