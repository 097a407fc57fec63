"""Supervising a cloudflared child process and reading its readiness (REFERENCE §6.4, §7.6).

:class:`CloudflaredSupervisor` runs ``cloudflared tunnel … run`` as a child with the
tunnel token in its environment (``TUNNEL_TOKEN``, so it never shows in ``ps``), relays
its output line by line to our log, restarts it with full-jitter exponential backoff
when it exits, and polls its ``/ready`` endpoint. :class:`ReadyProbe` is the polling
part alone, for sidecar mode where cloudflared runs in another container.

Both expose ``ready`` (an edge connection is registered right now) and
``ever_connected``, the latch REFERENCE §2.1 calls "tunnel connected": true from the
first registration on, never reset.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import signal
import socket
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence
from urllib.parse import urlsplit

log = logging.getLogger("tunnelgate.cloudflared")

PROTOCOLS = ("auto", "http2", "quic")
_LINE_LIMIT = 64 * 1024
_LEVELS = {"DBG": logging.DEBUG, "INF": logging.INFO, "WRN": logging.WARNING,
           "ERR": logging.ERROR, "FTL": logging.CRITICAL}


class CloudflaredNotFound(FileNotFoundError):
    """The cloudflared executable does not exist or is not executable."""

    def __init__(self, binary: str, searched: str) -> None:
        super().__init__(f"cloudflared executable {binary!r} not found (searched {searched}); "
                         "install cloudflared or pass its path with --cloudflared-bin")
        self.binary = binary
        self.searched = searched


def resolve_binary(binary: str) -> str:
    """The path of an executable ``binary`` (a path, or a name looked up on ``PATH``)."""
    if os.sep in binary:
        if os.path.isfile(binary) and os.access(binary, os.X_OK):
            return binary
        raise CloudflaredNotFound(binary, binary)
    found = shutil.which(binary)
    if found is None:
        raise CloudflaredNotFound(binary, f"PATH={os.environ.get('PATH', '')}")
    return found


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def go_duration(seconds: float) -> str:
    """``seconds`` as a Go duration flag value (whole milliseconds)."""
    return f"{round(seconds * 1000)}ms"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Full-jitter exponential backoff: attempt ``n`` waits U(0, min(cap, initial·2ⁿ)).

    A child that stayed up ``reset_after`` seconds resets the attempt count, so an
    occasional crash restarts fast while a crash loop backs off to ``cap``.
    """

    initial: float = 1.0
    cap: float = 30.0
    reset_after: float = 60.0

    def delay(self, attempt: int, rand: float) -> float:
        return rand * min(self.cap, self.initial * 2 ** min(attempt, 32))


async def http_status(url: str, timeout: float) -> int | None:
    """Status code of ``GET url`` over plain HTTP/1.1, or ``None`` if there was none."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
            try:
                writer.write(f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                             "Connection: close\r\nUser-Agent: tunnelgate\r\n\r\n".encode())
                line = await reader.readline()
            finally:
                writer.close()
    except (OSError, TimeoutError, ValueError):
        return None
    fields = line.split(b" ", 2)
    if len(fields) >= 2 and fields[0].startswith(b"HTTP/1.") and fields[1].isdigit():
        return int(fields[1])
    return None


class ReadyProbe:
    """Polls a cloudflared ``/ready`` URL: 200 means an edge connection is registered."""

    def __init__(self, url: str, *, interval: float = 1.0, timeout: float = 2.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"cloudflared ready URL must be http://host:port/path, not {url!r}")
        self.url = url
        self.interval = interval
        self.timeout = timeout
        self.ready = False
        self.ever_connected = False
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> bool:
        """Probe once and update ``ready`` / ``ever_connected``."""
        ready = await http_status(self.url, self.timeout) == 200
        if ready != self.ready:
            log.log(logging.INFO if ready else logging.WARNING,
                    "cloudflared %s (%s)", "connected to the edge" if ready
                    else "not connected to the edge", self.url)
        self.ready = ready
        self.ever_connected = self.ever_connected or ready
        return ready

    def mark_down(self) -> None:
        """The process behind the URL is gone: not ready until a probe says otherwise."""
        self.ready = False

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


def log_line(line: str) -> None:
    """Default ``on_log``: our logger, prefixed, at the level cloudflared printed."""
    fields = line.split(" ", 2)
    level = _LEVELS.get(fields[1], logging.INFO) if len(fields) > 1 else logging.INFO
    log.log(level, "cloudflared: %s", line)


class CloudflaredSupervisor:
    """Runs and restarts ``cloudflared tunnel --no-autoupdate --metrics ADDR … run``.

    ``extra_args`` are further ``tunnel``-level flags, placed before ``run``.
    ``protocol`` (``auto``/``http2``/``quic``) becomes ``--protocol``; gRPC needs
    ``http2`` because QUIC drops trailers (§9 item 13). ``grace_period`` becomes
    cloudflared's ``--grace-period``: on SIGTERM it unregisters from the edge and lets
    in-flight requests finish that long (§6.4).
    """

    def __init__(
        self,
        binary: str,
        token: str,
        metrics_addr: str | None = None,
        extra_args: Sequence[str] = (),
        on_log: Callable[[str], None] = log_line,
        *,
        protocol: str = "auto",
        grace_period: float = 30.0,
        backoff: Backoff = Backoff(),
        poll_interval: float = 1.0,
        env: Mapping[str, str] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if not token:
            raise ValueError("a tunnel token is required to run cloudflared")
        _check_protocol(protocol)
        self.binary = binary
        self.metrics_addr = metrics_addr or f"127.0.0.1:{free_local_port()}"
        self.extra_args = tuple(extra_args)
        self.on_log = on_log
        self.protocol = protocol
        self.grace_period = grace_period
        self.backoff = backoff
        self.probe = ReadyProbe(f"http://{self.metrics_addr}/ready", interval=poll_interval)
        self.restarts = 0
        self._token = token
        self._env = dict(os.environ if env is None else env)
        self._rand = rand
        self._path = binary
        self._proc: asyncio.subprocess.Process | None = None
        self._relays: list[asyncio.Task[None]] = []
        self._started_at = 0.0
        self._attempt = 0
        self._grace = grace_period
        self._stopping = asyncio.Event()
        self._restart = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    def __repr__(self) -> str:  # never show the token
        return f"<CloudflaredSupervisor {self.binary} metrics={self.metrics_addr}>"

    @property
    def argv(self) -> list[str]:
        """The child's argv; the token travels in ``TUNNEL_TOKEN``, not here."""
        args = [self._path, "tunnel", "--no-autoupdate", "--metrics", self.metrics_addr,
                "--grace-period", go_duration(self.grace_period)]
        if self.protocol != "auto":
            args += ["--protocol", self.protocol]
        return args + [*self.extra_args, "run"]

    @property
    def ready(self) -> bool:
        """An edge connection is registered right now."""
        return self.probe.ready

    @property
    def ever_connected(self) -> bool:
        """Latched true on the first registration (REFERENCE §2.1 "tunnel connected")."""
        return self.probe.ever_connected

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def start(self) -> None:
        """Start the first child; raises :class:`CloudflaredNotFound` or ``OSError``."""
        if self._runner is not None:
            raise RuntimeError("cloudflared supervisor already started")
        self._path = resolve_binary(self.binary)
        await self._spawn()
        self._runner = asyncio.ensure_future(self._supervise())
        self.probe.start()

    async def set_protocol(self, protocol: str) -> None:
        """Run cloudflared with another edge protocol: the child restarts gracefully.

        The tunnel is down between the old child's drain and the new child's first
        registration; call this only when the protocol must change (gRPC appeared).
        """
        _check_protocol(protocol)
        if protocol != self.protocol:
            log.info("cloudflared: switching edge protocol %s -> %s", self.protocol, protocol)
            self.protocol = protocol
            self._restart.set()

    async def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM the child, SIGKILL it after ``grace`` seconds; returns its exit status.

        ``grace`` defaults to the child's own ``--grace-period`` plus 5 s, so its drain
        can finish.
        """
        self._grace = self.grace_period + 5.0 if grace is None else grace
        self._stopping.set()
        if self._runner is not None:
            await self._runner
        await self.probe.stop()
        return self._proc.returncode if self._proc is not None else None

    async def _spawn(self) -> None:
        env = {**self._env, "TUNNEL_TOKEN": self._token}
        proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, limit=_LINE_LIMIT,
            # Own session: a Ctrl-C on our terminal must not reach cloudflared before we
            # decide to drain it (stop() sends SIGTERM itself).
            start_new_session=True)
        self._proc = proc
        self._restart.clear()  # this child already runs with the current protocol
        self._started_at = asyncio.get_running_loop().time()
        assert proc.stdout is not None and proc.stderr is not None
        self._relays = [asyncio.ensure_future(self._relay(proc.stdout)),
                        asyncio.ensure_future(self._relay(proc.stderr))]
        log.info("started cloudflared (pid %d): %s", proc.pid, " ".join(self.argv))

    async def _relay(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # longer than the limit; asyncio already discarded it
                self.on_log(f"<line longer than {_LINE_LIMIT} bytes dropped>")
                continue
            if not line:
                return
            self.on_log(line.decode("utf-8", "replace").rstrip("\r\n"))

    async def _supervise(self) -> None:
        try:
            while True:
                uptime, restart_now = await self._watch_child()
                if self._stopping.is_set():
                    return
                if not restart_now:
                    if uptime >= self.backoff.reset_after:
                        self._attempt = 0
                    delay = self.backoff.delay(self._attempt, self._rand())
                    self._attempt += 1
                    log.warning("cloudflared will restart in %.2f s", delay)
                    if await self._stopped_within(delay):
                        return
                try:
                    await self._spawn()
                    self.restarts += 1
                except OSError as err:
                    log.error("cannot start cloudflared: %s", err)
                    self._proc = None
        finally:
            await self._kill_leftover()

    async def _watch_child(self) -> tuple[float, bool]:
        """Wait until the child exits, a stop, or a restart; returns (uptime, restart)."""
        proc = self._proc
        if proc is None:
            return 0.0, False
        restart_now = False
        exited = asyncio.ensure_future(proc.wait())
        wakers = [asyncio.ensure_future(e.wait()) for e in (self._stopping, self._restart)]
        try:
            await asyncio.wait([exited, *wakers], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waker in wakers:
                waker.cancel()
        if not exited.done():
            restart_now = self._restart.is_set() and not self._stopping.is_set()
            self._restart.clear()
            await self._terminate(proc, self._grace)
        self.probe.mark_down()
        await self._finish_relays()
        uptime = asyncio.get_running_loop().time() - self._started_at
        log.log(logging.INFO if self._stopping.is_set() or restart_now else logging.WARNING,
                "cloudflared (pid %d) exited with status %s after %.1f s",
                proc.pid, proc.returncode, uptime)
        return uptime, restart_now

    async def _terminate(self, proc: asyncio.subprocess.Process, grace: float) -> None:
        try:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), grace)
        except ProcessLookupError:
            pass
        except TimeoutError:
            log.warning("cloudflared (pid %d) still running %.1f s after SIGTERM; killing",
                        proc.pid, grace)
            proc.kill()
        await proc.wait()

    async def _finish_relays(self) -> None:
        # The pipes close when the child exits, unless something it spawned holds them.
        if self._relays:
            _, pending = await asyncio.wait(self._relays, timeout=1.0)
            for task in pending:
                task.cancel()
        self._relays = []

    async def _stopped_within(self, delay: float) -> bool:
        try:
            await asyncio.wait_for(self._stopping.wait(), delay)
            return True
        except TimeoutError:
            return False

    async def _kill_leftover(self) -> None:
        """On cancellation of the supervisor, never leave an orphan behind."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        for task in self._relays:
            task.cancel()


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"cloudflared protocol must be one of {', '.join(PROTOCOLS)}, "
                         f"not {protocol!r}")
