"""What a worker process of ``serve --workers N`` runs: :func:`child_main` (the spawned
target: its name, its tie to the supervisor) and :func:`serve_worker`, which serves one
data plane and follows the supervisor's channel (start, two-phase pushes, stops,
finish). The supervisor's side and the protocol are :mod:`proxy.control.workers`'.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Callable, Protocol

import setproctitle

from proxy.control import allocator, signals
from proxy.control.builds import Builds
from proxy.control.channel import Channel, Header
from proxy.control.settings import Settings
from proxy.exchange.snapshot import Snapshot, SnapshotHolder
from routing.model import CLUSTER_ENTRANCES
from routing.pause import Pause

log = logging.getLogger("tunnelgate.workers")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass
class WorkerLink:
    """What a worker process is given: its slot, its end of the channel, the shared
    unix-socket entrance (if any) and who its supervisor is."""

    index: int
    channel: socket.socket
    tunnel_sock: socket.socket | None
    supervisor_pid: int


WorkerEntry = Callable[[Settings, WorkerLink], int]


class ServedPlane(Protocol):
    """What :func:`serve_worker` drives: ``proxy.control.dataplane.DataPlane``."""

    holder: SnapshotHolder
    builds: Builds  # the worker process's one

    async def open(self, *, reuse_port: bool = False,
                   tunnel_sock: socket.socket | None = None) -> object: ...

    def swapped(self, snapshot: Snapshot) -> None: ...

    def stop_accepting(self, name: str) -> None: ...

    def reload_certificates(self, reason: str) -> None: ...

    async def finish(self, grace: float) -> bool: ...

    async def close(self) -> None: ...


def child_main(entry: WorkerEntry, settings: Settings, link: WorkerLink) -> None:
    """The spawned process's target: name it, tie its life to the supervisor, then run
    ``entry``."""
    # Keep /proc/<pid>/environ readable: by default setproctitle grows the title into
    # the environment's memory. The spawn command line is long enough for this title.
    os.environ["SPT_NOENV"] = "1"
    setproctitle.setproctitle(f"tunnelgate worker {link.index}")
    setproctitle.setthreadtitle(f"tunnelgate-w{link.index}")  # the kernel's 15 chars
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed; relying on channel EOF",
                    extra={"errno": ctypes.get_errno()})
    if os.getppid() != link.supervisor_pid:  # it died before prctl took effect
        sys.exit(1)
    # Ctrl-C in a terminal reaches the whole process group: the supervisor handles it
    # and forwards the drain, so a worker must not start one of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a reload is the supervisor's to do
    allocator.tune()
    sys.exit(entry(settings, link))


async def serve_worker(plane: ServedPlane, link: WorkerLink, grace: float) -> int:
    """Run one worker until the supervisor says ``finish`` (or is gone, or SIGTERM).

    Applies the start config before listening, so a restarted worker never serves an
    older table. ``grace`` is the drain window when no ``finish`` says otherwise.
    Returns the exit status.
    """
    _tag_logs(link.index)
    channel = await Channel.open(link.channel)
    inbox: asyncio.Queue[tuple[Header, bytes]] = asyncio.Queue()
    finish: Header = {"op": "finish", "grace": grace}
    signals.install(asyncio.get_running_loop(), signals.WORKER_SIGNALS,
                    {signals.STOP: lambda _: inbox.put_nowait((finish, b""))})
    reader = asyncio.create_task(_read_into(channel, inbox, finish))
    try:
        if not await _start(plane, link, channel, inbox):
            return 1
        grace = await _follow(plane, channel, inbox)
        for name in CLUSTER_ENTRANCES:
            plane.stop_accepting(name)
        await plane.finish(grace)
        return 0
    finally:
        reader.cancel()
        await plane.close()
        channel.close()


async def _read_into(channel: Channel, inbox: asyncio.Queue[tuple[Header, bytes]],
                     finish: Header) -> None:
    """Feed frames to ``inbox``; a lost supervisor becomes a ``finish``."""
    while True:
        try:
            inbox.put_nowait(await channel.receive())
        except EOFError:
            log.warning("supervisor channel closed: draining")
            inbox.put_nowait((finish, b""))
            return


async def _start(plane: ServedPlane, link: WorkerLink, channel: Channel,
                 inbox: asyncio.Queue[tuple[Header, bytes]]) -> bool:
    header, body = await inbox.get()
    if header.get("op") != "start":  # finish before start: nothing to serve
        return False
    try:
        if body:
            snapshot = await plane.builds.run(_build, plane.holder, body)
            plane.holder.swap(snapshot)
            plane.swapped(snapshot)
        await plane.open(reuse_port=True, tunnel_sock=link.tunnel_sock)
    except Exception as exc:  # bind or compile failure: the supervisor decides
        log.exception("worker could not start")
        channel.send({"op": "failed", "error": f"{type(exc).__name__}: {exc}"})
        return False
    channel.send({"op": "listening", "pid": os.getpid()})
    return True


async def _follow(plane: ServedPlane, channel: Channel,
                  inbox: asyncio.Queue[tuple[Header, bytes]]) -> float:
    """Apply pushes and stops until ``finish``; returns its grace period."""
    prepared: tuple[int, Snapshot] | None = None
    while True:
        header, body = await inbox.get()
        op = header.get("op")
        if op == "prepare":
            prepared = None
            try:
                prepared = (header["seq"],
                            await plane.builds.run(_build, plane.holder, body))
            except Exception as exc:
                log.exception("config prepare failed")
                channel.send({"op": "ack", "seq": header["seq"], "ok": False,
                              "error": f"{type(exc).__name__}: {exc}"})
            else:
                channel.send({"op": "ack", "seq": header["seq"], "ok": True})
        elif op == "commit":
            ready = prepared if prepared is not None and prepared[0] == header["seq"] else None
            prepared = None
            ok = ready is not None
            if ready is not None:
                await _commit(plane, ready[1])
                ready = None
            plane.builds.settle()
            channel.send({"op": "ack", "seq": header["seq"], "ok": ok})
        elif op == "abort":
            prepared = None
            plane.builds.settle()
        elif op == "stop":
            plane.stop_accepting(header["entrance"])
        elif op == "reload-tls":
            plane.reload_certificates(str(header.get("reason", "supervisor")))
        elif op == "finish":
            return float(header["grace"])


async def _commit(plane: ServedPlane, snapshot: Snapshot) -> None:
    """Make a prepared snapshot current; the replaced one is released before this
    returns, and no local of the caller keeps it alive (see ``Builds.settle``)."""
    replaced = plane.holder.swap(snapshot)
    plane.swapped(snapshot)
    if replaced is not None:
        await plane.builds.run(replaced.release)  # see AdminApi._make_current
    log.debug("config committed", extra={"version": snapshot.version})


def _build(holder: SnapshotHolder, body: bytes, pause: Pause) -> Snapshot:
    """Parse and compile a pushed config (in a thread; pure CPU work)."""
    return holder.build(holder.parse(body, pause), pause)


def _tag_logs(index: int) -> None:
    """Add ``worker=<index>`` to every log line of this process."""

    def tag(record: logging.LogRecord) -> bool:
        record.worker = index
        return True

    for handler in logging.getLogger().handlers:
        handler.addFilter(tag)
