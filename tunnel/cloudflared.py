"""Supervising a cloudflared child process and reading its readiness (its ``/ready`` endpoint).

:class:`CloudflaredSupervisor` runs ``cloudflared tunnel … run`` as a child with the
tunnel token in its environment (``TUNNEL_TOKEN``, so it never shows in ``ps``), relays
its output line by line to our log (the child itself: :mod:`tunnel.child`), restarts it
with full-jitter exponential backoff when it exits, and polls its ``/ready`` endpoint
with :class:`tunnel.readiness.ReadyProbe` (which sidecar mode, where cloudflared runs in
another container, uses alone).

Both expose ``ready`` (an edge connection is registered right now), ``connections``
(how many, from the ``readyConnections`` field of ``/ready``) and ``ever_connected``,
the "tunnel connected" latch of readiness: true from the first registration
on, never reset. The supervisor also keeps ``state`` (``starting``, ``connected``,
``reconnecting``, ``draining``, ``stopped``, logged once per change) and ``restarts``.

Two facts of the real cloudflared shape the drain and the protocol switch:

- After SIGTERM it unregisters and then waits its **whole** ``--grace-period``, even
  with nothing in flight, before it exits 0. The kill deadline is therefore that grace
  period plus :data:`KILL_MARGIN`, never the grace period itself.
- Without a registered connector the edge answers 530. Changing the edge protocol
  therefore starts the new child first (on a metrics port of its own), waits until its
  ``/ready`` says it is registered, and only then drains the old one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import socket
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from tunnel.child import Child, CloudflaredCommand
from tunnel.readiness import ReadyProbe, http_get

log = logging.getLogger("tunnelgate.cloudflared")

PROTOCOLS = ("auto", "http2", "quic")
STATES = ("starting", "connected", "reconnecting", "draining", "stopped")
# Seconds past cloudflared's own --grace-period before SIGKILL: it exits by itself at
# the end of its grace period, this only covers its shutdown work and a loaded machine.
KILL_MARGIN = 5.0
# How long a replacement child (protocol switch) may take to register with the edge.
SWITCH_TIMEOUT = 60.0
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



def log_line(line: str) -> None:
    """Default ``on_log``: our logger, prefixed, at the level cloudflared printed."""
    fields = line.split(" ", 2)
    level = _LEVELS.get(fields[1], logging.INFO) if len(fields) > 1 else logging.INFO
    log.log(level, "cloudflared: %s", line)


async def _set_within(event: asyncio.Event, delay: float) -> bool:
    """Whether ``event`` is set, or gets set within ``delay`` seconds (a sleep that a
    stop cuts short)."""
    try:
        await asyncio.wait_for(event.wait(), delay)
        return True
    except TimeoutError:
        return False


def _ready_url(metrics_addr: str) -> str:
    return f"http://{metrics_addr}/ready"


class _Handover:
    """The edge handed from a cloudflared child to its successor (a protocol switch).

    Without a registered connector the edge answers 530 (module doc), so the old child
    keeps serving until :meth:`registered` saw the successor's ``/ready`` say 200: it
    polls at ``probe``'s pace, for ``timeout`` seconds at most and never past a stop
    (``stopping``). Then :meth:`drain` lets the old child finish its requests in the
    background; ``on_drained`` is called as each such child has exited.
    """

    def __init__(self, probe: ReadyProbe, stopping: asyncio.Event, timeout: float,
                 on_drained: Callable[[], None]) -> None:
        self.probe = probe
        self.timeout = timeout
        self._stopping = stopping
        self._on_drained = on_drained
        self._draining: dict[asyncio.Task[None], Child] = {}

    @property
    def draining(self) -> list[Child]:
        """The old children still draining."""
        return list(self._draining.values())

    async def registered(self, child: Child) -> bool:
        """Poll ``child``'s /ready until 200; False if it exits, a stop, or a timeout."""
        url = _ready_url(child.metrics_addr)
        deadline = asyncio.get_running_loop().time() + self.timeout
        while asyncio.get_running_loop().time() < deadline:
            if self._stopping.is_set() or not child.running:
                return False
            answer = await http_get(url, self.probe.timeout)
            if answer is not None and answer[0] == 200:
                return True
            if await _set_within(self._stopping, self.probe.interval):
                return False
        return False

    def drain(self, child: Child, grace: float) -> None:
        """Retire ``child`` in the background (:meth:`tunnel.child.Child.retire`)."""
        task = asyncio.ensure_future(child.retire(grace))
        self._draining[task] = child
        task.add_done_callback(self._drained)

    async def wait(self) -> None:
        """Return once every child still draining has exited."""
        if self._draining:
            await asyncio.gather(*self._draining)

    def _drained(self, task: asyncio.Task[None]) -> None:
        self._draining.pop(task, None)
        self._on_drained()


class CloudflaredSupervisor:
    """Runs and restarts ``cloudflared tunnel --no-autoupdate --metrics ADDR … run``.

    ``extra_args`` are further ``tunnel``-level flags, placed before ``run``.
    ``protocol`` (``auto``/``http2``/``quic``) becomes ``--protocol``; gRPC needs
    ``http2`` because QUIC drops trailers. ``grace_period`` becomes
    cloudflared's ``--grace-period``: on SIGTERM it unregisters from the edge and lets
    in-flight requests finish that long, always that long (see the module doc), so it
    is killed only :data:`KILL_MARGIN` seconds after that.

    ``metrics_addr`` is the first child's ``--metrics``; a replacement started by
    :meth:`set_protocol` runs beside the old child and gets a free port of its own, so
    read ``metrics_addr`` / :attr:`metrics_url` for the current one.
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
        switch_timeout: float = SWITCH_TIMEOUT,
        env: Mapping[str, str] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if not token:
            raise ValueError("a tunnel token is required to run cloudflared")
        _check_protocol(protocol)
        self.binary = binary
        self.metrics_addr = metrics_addr or f"127.0.0.1:{free_local_port()}"
        self.command = CloudflaredCommand(
            binary, token, env=os.environ if env is None else env, extra_args=extra_args,
            grace_period=grace_period, on_log=on_log)
        self.protocol = protocol
        self.backoff = backoff
        self.probe = ReadyProbe(_ready_url(self.metrics_addr), interval=poll_interval,
                                on_change=self._refresh_state, log_changes=False)
        self.restarts = 0
        self.state = "stopped"
        self._rand = rand
        self._child: Child | None = None
        self._attempt = 0
        self._grace = grace_period + KILL_MARGIN
        self._stopping = asyncio.Event()
        self._switch = asyncio.Event()
        self._handover = _Handover(self.probe, self._stopping, switch_timeout,
                                   on_drained=self._refresh_state)
        self._runner: asyncio.Task[None] | None = None

    def __repr__(self) -> str:  # never show the token
        return f"<CloudflaredSupervisor {self.binary} metrics={self.metrics_addr}>"

    @property
    def argv(self) -> list[str]:
        """The current child's argv; the token travels in ``TUNNEL_TOKEN``, not here."""
        return self.command.argv(self.metrics_addr, self.protocol)

    @property
    def metrics_url(self) -> str:
        """The current child's Prometheus endpoint."""
        return f"http://{self.metrics_addr}/metrics"

    @property
    def ready(self) -> bool:
        """An edge connection is registered now, by a child still running."""
        return self.probe.ready and self.pid is not None

    @property
    def ever_connected(self) -> bool:
        """Latched true on the first registration ("tunnel connected")."""
        return self.probe.ever_connected

    @property
    def connections(self) -> int:
        """Edge connections the current child has registered (its ``/ready``)."""
        return self.probe.connections

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.proc.pid if child is not None and child.running else None

    @property
    def pids(self) -> list[int]:
        """Every child still running: the current one and any still draining after a
        protocol switch (a hard exit must not leave them behind)."""
        children = [*self._handover.draining, *([self._child] if self._child else [])]
        return [c.proc.pid for c in children if c.running]

    async def start(self) -> None:
        """Start the first child; raises :class:`CloudflaredNotFound` or ``OSError``."""
        if self._runner is not None:
            raise RuntimeError("cloudflared supervisor already started")
        self.command.path = resolve_binary(self.binary)
        self._child = await self.command.start(self.metrics_addr, self.protocol)
        self._refresh_state()
        self._runner = asyncio.ensure_future(self._supervise())
        self.probe.start()

    async def set_protocol(self, protocol: str) -> None:
        """Run cloudflared with another edge protocol, without a gap at the edge.

        Returns at once; the supervisor starts a child with the new protocol, waits up
        to ``switch_timeout`` for its ``/ready``, then drains the old child. A new child
        that never registers is stopped and ``protocol`` reverts (a later call retries).
        """
        _check_protocol(protocol)
        if protocol != self.protocol:
            log.info("cloudflared: switching edge protocol %s -> %s", self.protocol, protocol)
            self.protocol = protocol
            self._switch.set()

    async def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM the child, SIGKILL it after ``grace`` seconds; returns its exit status.

        ``grace`` defaults to the child's own ``--grace-period`` plus
        :data:`KILL_MARGIN`: the child exits by itself at the end of its grace period.
        """
        self._grace = self.command.grace_period + KILL_MARGIN if grace is None else grace
        self._stopping.set()
        self._refresh_state()
        if self._runner is not None:
            await self._runner
        await self._handover.wait()
        await self.probe.stop()
        self._refresh_state()
        return self._child.proc.returncode if self._child is not None else None

    # -- state

    def _refresh_state(self) -> None:
        """Derive ``state`` from what is known now; log each change once."""
        child = self._child
        if child is not None and self.probe.ready:
            child.registered = True
        alive = child is not None and child.running
        if self._stopping.is_set():
            state = "draining" if alive or self._handover.draining else "stopped"
        elif self._runner is None and child is None:
            state = "stopped"
        elif self.probe.ready:
            state = "connected"
        elif alive and child is not None and not child.registered and self.restarts == 0:
            state = "starting"
        else:
            state = "reconnecting"
        if state != self.state:
            level = logging.WARNING if state == "reconnecting" else logging.INFO
            log.log(level, "cloudflared state %s -> %s", self.state, state,
                    extra={"cloudflared_state": state, "edge_connections": self.connections})
            self.state = state

    # -- children

    async def _supervise(self) -> None:
        try:
            while True:
                uptime, switch = await self._watch_child()
                if self._stopping.is_set():
                    return
                if switch:
                    await self._replace()
                    continue
                if uptime >= self.backoff.reset_after:
                    self._attempt = 0
                delay = self.backoff.delay(self._attempt, self._rand())
                self._attempt += 1
                log.warning("cloudflared will restart in %.2f s", delay)
                if await _set_within(self._stopping, delay):
                    return
                try:
                    self._child = await self.command.start(self.metrics_addr, self.protocol)
                    self.restarts += 1
                except OSError as err:
                    log.error("cannot start cloudflared: %s", err)
                    self._child = None
                self._refresh_state()
        finally:
            await self._kill_leftover()

    async def _watch_child(self) -> tuple[float, bool]:
        """Wait until the child exits, a stop, or a switch; returns (uptime, switch).

        On a stop the child is drained here; on a switch it keeps running.
        """
        child = self._child
        if child is None:
            return 0.0, False
        exited = asyncio.ensure_future(child.proc.wait())
        wakers = [asyncio.ensure_future(e.wait()) for e in (self._stopping, self._switch)]
        try:
            await asyncio.wait([exited, *wakers], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waker in wakers:
                waker.cancel()
        if not exited.done():
            if not self._stopping.is_set():
                self._switch.clear()
                exited.cancel()
                return 0.0, True
            await child.terminate(self._grace)
        self.probe.mark_down()
        await child.finish(expected=self._stopping.is_set())
        self._refresh_state()
        return child.uptime(), False

    async def _replace(self) -> None:
        """Protocol switch: a new child beside the old one; the old one drains only
        once the new one is registered (module doc)."""
        old = self._child
        assert old is not None
        addr = f"127.0.0.1:{free_local_port()}"
        try:
            new = await self.command.start(addr, self.protocol)
        except OSError as err:
            log.error("cannot start cloudflared: %s", err)
            self.protocol = old.protocol
            return
        if await self._handover.registered(new):
            self._child, self.metrics_addr = new, addr
            new.registered = True
            self.restarts += 1
            self.probe.retarget(_ready_url(addr), True)
            log.info("cloudflared (pid %d) registered; draining pid %d",
                     new.proc.pid, old.proc.pid)
            self._handover.drain(old, self.command.grace_period + KILL_MARGIN)
        else:
            if not self._stopping.is_set():
                log.error("cloudflared (pid %d) did not register within %.0f s; keeping "
                          "pid %d", new.proc.pid, self._handover.timeout, old.proc.pid)
            self.protocol = old.protocol
            await new.retire(0.0)
        self._refresh_state()

    async def _kill_leftover(self) -> None:
        """On cancellation of the supervisor, never leave an orphan behind."""
        if self._child is not None:
            await self._child.kill()


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"cloudflared protocol must be one of {', '.join(PROTOCOLS)}, "
                         f"not {protocol!r}")
