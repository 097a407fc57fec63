"""One cloudflared child process: how it is started, where its output goes, how it ends.

:class:`CloudflaredCommand` is what runs: ``cloudflared tunnel --no-autoupdate --metrics
ADDR --grace-period D [--protocol P] EXTRA… run``, with the tunnel token in the child's
environment (``TUNNEL_TOKEN``), so that it never shows in ``ps``. Every :class:`Child`
it starts relays its output line by line and is stopped with SIGTERM, then SIGKILL once
its grace ran out. When a child starts, and when it stops, is for
:class:`tunnel.cloudflared.CloudflaredSupervisor` to decide.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

# The supervisor's logger: what a child does is part of the supervisor's story.
log = logging.getLogger("tunnelgate.cloudflared")

_LINE_LIMIT = 64 * 1024  # bytes: a longer output line is dropped, not buffered


def go_duration(seconds: float) -> str:
    """``seconds`` as a Go duration flag value (whole milliseconds)."""
    return f"{round(seconds * 1000)}ms"


@dataclass(slots=True)
class Child:
    """One cloudflared process, the relays of its output and its metrics address."""

    proc: asyncio.subprocess.Process
    metrics_addr: str
    protocol: str
    relays: list[asyncio.Task[None]]
    started_at: float
    registered: bool = False  # its /ready said 200 at least once

    @property
    def running(self) -> bool:
        """The process has not exited (or its exit was not collected yet)."""
        return self.proc.returncode is None

    def uptime(self) -> float:
        """Seconds since it was started."""
        return asyncio.get_running_loop().time() - self.started_at

    async def terminate(self, grace: float) -> None:
        """SIGTERM, and SIGKILL if it still runs ``grace`` seconds later; returns once
        it exited."""
        proc = self.proc
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

    async def retire(self, grace: float) -> None:
        """Stop it for good (:meth:`terminate`; SIGKILL at once when ``grace`` is 0)
        and :meth:`finish` it."""
        if grace > 0:
            await self.terminate(grace)
        elif self.running:
            self.proc.kill()
            await self.proc.wait()
        await self.finish(expected=True)

    async def finish(self, *, expected: bool) -> None:
        """Collect the relays of the exited process and log its end (a warning unless
        we asked it to stop)."""
        # The pipes close when the child exits, unless something it spawned holds them.
        if self.relays:
            _, pending = await asyncio.wait(self.relays, timeout=1.0)
            for task in pending:
                task.cancel()
        self.relays = []
        log.log(logging.INFO if expected else logging.WARNING,
                "cloudflared (pid %d) exited with status %s after %.1f s",
                self.proc.pid, self.proc.returncode, self.uptime())

    async def kill(self) -> None:
        """Never leave an orphan: SIGKILL it if it still runs and stop relaying."""
        if self.running:
            self.proc.kill()
            await self.proc.wait()
        for task in self.relays:
            task.cancel()


class CloudflaredCommand:
    """How to start a cloudflared child (see the module doc); ``path`` is the executable.

    ``grace_period`` becomes its ``--grace-period``, ``extra_args`` are further
    ``tunnel``-level flags placed before ``run``, and every line it prints goes to
    ``on_log``. The token lives only in the child's environment, never in an attribute
    a repr or a log line would show.
    """

    __slots__ = ("path", "grace_period", "on_log", "_extra_args", "_env")

    def __init__(self, path: str, token: str, *, env: Mapping[str, str],
                 extra_args: Sequence[str], grace_period: float,
                 on_log: Callable[[str], None]) -> None:
        self.path = path
        self.grace_period = grace_period
        self.on_log = on_log
        self._extra_args = tuple(extra_args)
        self._env = {**env, "TUNNEL_TOKEN": token}

    def argv(self, metrics_addr: str, protocol: str) -> list[str]:
        """The command line of a child that serves its metrics and ``/ready`` at
        ``metrics_addr`` and talks ``protocol`` to the edge (``auto``: its choice)."""
        args = [self.path, "tunnel", "--no-autoupdate", "--metrics", metrics_addr,
                "--grace-period", go_duration(self.grace_period)]
        if protocol != "auto":
            args += ["--protocol", protocol]
        return args + [*self._extra_args, "run"]

    async def start(self, metrics_addr: str, protocol: str) -> Child:
        """Start a child (:meth:`argv`); raises ``OSError`` when it cannot run."""
        argv = self.argv(metrics_addr, protocol)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=self._env, limit=_LINE_LIMIT,
            # Own session: a Ctrl-C on our terminal must not reach cloudflared before we
            # decide to drain it (the supervisor sends SIGTERM itself).
            start_new_session=True)
        assert proc.stdout is not None and proc.stderr is not None
        relays = [asyncio.ensure_future(self._relay(proc.stdout)),
                  asyncio.ensure_future(self._relay(proc.stderr))]
        log.info("started cloudflared (pid %d): %s", proc.pid, " ".join(argv))
        return Child(proc, metrics_addr, protocol, relays,
                     asyncio.get_running_loop().time())

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
