"""``serve --workers N``: one supervisor process and N worker processes.

The supervisor owns the config API (unchanged: :class:`proxy.control.admin.AdminApi`
with its ``publish`` hook set to :meth:`WorkerPool.publish`), readiness, cloudflared and
``/metrics``. The workers serve the entrances; each runs the same data plane as a single
process (``proxy.control.cli.DataPlane``), handed to :func:`serve_worker`.

- **Ports.** Every worker binds each TCP entrance with SO_REUSEPORT, so the kernel
  spreads connections over them. The supervisor holds a bound but never listening
  SO_REUSEPORT socket on each of those ports: it resolves port 0, reports a busy port
  at start-up and keeps the port while workers restart; a socket that does not listen
  gets no connections. A unix socket cannot be shared that way, so the supervisor binds
  a unix-socket entrance once and every worker accepts on that same socket.
- **Processes.** ``multiprocessing`` with the "spawn" start method: a fresh interpreter,
  so nothing of the supervisor's loop, threads or sockets leaks into a worker. A worker
  dies with the supervisor: PR_SET_PDEATHSIG sends it SIGTERM, and EOF on its channel
  does the same; either way it drains as on a forwarded stop, then exits.
- **Channel.** One socketpair per worker. A frame is two big-endian u32 (header size,
  body size), a JSON header and an optional body: the wire config that
  the worker parses and compiles in a thread, so its loop keeps serving meanwhile.
- **Pushes are two-phase**, so a push that fails anywhere changes nothing anywhere, as in
  one process (a rejected push changes nothing): every worker *prepares*
  (parse + compile, snapshot kept aside) and acks, then every worker *commits* (swaps)
  and acks, or all *abort*. ``PUT /config`` answers 200 after the last commit ack. A
  worker that refuses, exits or stays silent during prepare fails the push (500): a
  config that crashes workers must never become the one restarted workers start with.
- **Restarts.** A worker that exits while the supervisor is not stopping is started
  again after a bounded backoff; it applies the latest committed config before it
  listens. Starts and pushes hold one lock, so a start never races a push. Restarts are
  counted per slot (:meth:`WorkerPool.processes`, ``tunnelgate_worker_restarts_total``).
- **Names.** A worker renames itself (``setproctitle``): ``ps`` shows
  ``tunnelgate worker <slot>`` instead of the interpreter's spawn command line, and
  ``ps -e``/``top`` (the 15-character kernel name) ``tunnelgate-w<slot>``.
- **Metrics.** prometheus-client multiprocess mode: the pool creates a fresh
  ``PROMETHEUS_MULTIPROC_DIR`` in the temp directory, exports it to the workers and
  removes it at exit (only a SIGKILLed supervisor leaves it behind); see
  :mod:`proxy.observability.metrics`. Writing each value to its mmap file costs a worker about 6 µs
  per request more than a single process's in-memory metrics.

Supervisor → worker: ``start`` (+ config or no body; answer ``listening`` or
``failed``), ``prepare`` (+ config; answer ``ack``), ``commit`` (answer ``ack``),
``abort``, ``stop`` (stop accepting on one entrance), ``reload-tls`` (re-read the TLS
entrance's certificates: SIGHUP reaches the supervisor only), ``finish`` (drain for
``grace`` seconds, then exit).
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import functools
import json
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Protocol

import setproctitle

from proxy.control import allocator, signals
from proxy.control.builds import Builds
from proxy.control.binding import every_interface_socket, is_every_interface
from proxy.control.settings import Address, Settings, cannot_listen
from proxy.exchange.snapshot import Snapshot, SnapshotHolder
from proxy.observability.metrics import worker_exited
from proxy.observability.processes import WorkerProcess
from routing.model import CLUSTER_ENTRANCES, Config
from routing.pause import Pause
from routing.wire import to_wire

log = logging.getLogger("tunnelgate.workers")

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
SECRET_ENV = ("PROXY_AUTH_TOKEN", "TUNNEL_TOKEN")  # resolved into Settings already
START_TIMEOUT = 30.0  # initial start: a worker imports the whole runtime, then compiles
ACK_TIMEOUT = 30.0    # a prepare compiles the table (~1 s for 10k rules)
EXIT_MARGIN = 5.0     # past the grace period, a worker that has not exited is killed
BACKOFF_FIRST, BACKOFF_MAX = 0.2, 10.0  # restart delay, doubling per quick crash
STABLE_AFTER = 30.0   # a worker that ran this long starts the backoff over
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_SIZES = struct.Struct(">II")
MAX_HEADER = 64 * 1024
MAX_BODY = 64 * 1024 * 1024  # a start-up YAML file can compile to more than 1 MiB of JSON

Header = dict[str, Any]


class WorkerError(Exception):
    """Workers could not start, or could not take a config."""


# --------------------------------------------------------------------------- channel


class Channel:
    """Framed messages over one end of a socketpair (see the module doc)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> "Channel":
        return cls(*await asyncio.open_unix_connection(sock=sock))

    def send(self, header: Header, body: bytes = b"") -> bool:
        """Queue one frame; False if the channel is already closed. No drain: frames are
        small except configs, and the peer reads continuously."""
        if self._writer.is_closing():
            return False
        head = json.dumps(header, separators=(",", ":")).encode()
        self._writer.writelines([_SIZES.pack(len(head), len(body)), head, body])
        return True

    async def receive(self) -> tuple[Header, bytes]:
        """The next frame; raises ``EOFError`` when the peer is gone or broke framing."""
        try:
            head_size, body_size = _SIZES.unpack(await self._reader.readexactly(_SIZES.size))
            if head_size > MAX_HEADER or body_size > MAX_BODY:
                raise EOFError(f"oversized frame ({head_size}+{body_size} bytes)")
            header = json.loads(await self._reader.readexactly(head_size))
            body = await self._reader.readexactly(body_size) if body_size else b""
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            raise EOFError(str(exc)) from None
        return header, body

    def close(self) -> None:
        self._writer.close()


def encode_config(config: Config) -> bytes:
    """The wire JSON a worker parses: the inverse of ``routing.config.parse_config``."""
    return json.dumps(to_wire(config), separators=(",", ":")).encode()


# --------------------------------------------------------------------------- worker side


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
    """What :func:`serve_worker` drives: ``proxy.control.cli.DataPlane``."""

    holder: SnapshotHolder
    builds: Builds  # the worker process's one

    async def open(self, *, reuse_port: bool = False,
                   tunnel_sock: socket.socket | None = None) -> object: ...

    def swapped(self, snapshot: Snapshot) -> None: ...

    def stop_accepting(self, name: str) -> None: ...

    def reload_certificates(self, reason: str) -> None: ...

    async def finish(self, grace: float) -> bool: ...

    async def close(self) -> None: ...


def _child_main(entry: WorkerEntry, settings: Settings, link: WorkerLink) -> None:
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


# --------------------------------------------------------------------------- supervisor side


@dataclass(eq=False)
class _Slot:
    """One worker position; its process is replaced when it dies."""

    index: int
    process: BaseProcess | None = None
    channel: Channel | None = None
    live: bool = False  # the channel is open and read: the worker can answer
    listening: asyncio.Future[None] | None = None
    acks: dict[int, asyncio.Future[Header]] = field(default_factory=dict)
    started_at: float = 0.0
    failures: int = 0
    restarts: int = 0  # workers started after the first, for the metric
    task: asyncio.Task[None] | None = None

    def backoff(self) -> float:
        """Delay before the next start: doubles per quick crash, bounded."""
        if time.monotonic() - self.started_at > STABLE_AFTER:
            self.failures = 0
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** self.failures)
        self.failures += 1
        return delay

    def gone(self, channel: Channel, listening: asyncio.Future[None]) -> None:
        """The worker behind ``channel`` is gone: fail whatever still waits on it. Called
        by whichever notices first, the channel's EOF or the process's exit."""
        gone = WorkerError(f"worker {self.index} exited")
        if not listening.done():
            listening.set_exception(gone)
        if self.channel is channel:
            self.live = False
            for ack in self.acks.values():
                if not ack.done():
                    ack.set_exception(gone)
            self.acks.clear()


class WorkerPool:
    """The supervisor's view of the workers: start, push fan-out, restarts, drain.

    ``entry`` runs in each spawned process (it must be a module-level function, it is
    pickled by name). The supervisor serves no requests itself.
    """

    def __init__(self, settings: Settings, entry: WorkerEntry) -> None:
        self.settings = settings
        self.entry = entry
        self.metrics_dir = tempfile.mkdtemp(prefix="tunnelgate-metrics-")
        self._context = multiprocessing.get_context("spawn")
        self._slots = [_Slot(index) for index in range(settings.workers)]
        self._lock = asyncio.Lock()  # one start or push at a time
        self._config = b""  # the last committed wire config; b"" = none yet
        self._seq = 0
        self._stopping = False
        self._sockets: list[socket.socket] = []
        self._tunnel_sock: socket.socket | None = None
        self._worker_settings = settings
        self.tls_address: Address | None = None  # resolved by open()

    # -- start

    async def open(self) -> tuple[Address | None, Address | None]:
        """Bind what the supervisor holds, start every worker and wait until each one
        listens; returns the (cluster, tunnel) addresses. Raises
        :class:`SettingsError` (naming the flag) for an address that cannot be bound,
        :class:`WorkerError` if a worker fails to start."""
        held, self._tunnel_sock = _hold_all(self.settings, self._sockets)
        # Workers get no secret, in settings or environment: they parse untrusted HTTP,
        # and only the supervisor talks to the config API's clients and cloudflared
        # (which got its own copy of the environment when the runtime was built).
        self._worker_settings = dataclasses.replace(held, auth_token=None, tunnel_token=None)
        self.tls_address = held.tls.listen if held.tls is not None else None
        cluster, tunnel = held.listen, held.tunnel_listen
        for name in SECRET_ENV:
            os.environ.pop(name, None)
        os.environ[METRICS_DIR_ENV] = self.metrics_dir  # read by prometheus-client at import
        async with self._lock:
            for slot in self._slots:
                await self._start(slot)
        for slot in self._slots:
            slot.task = asyncio.create_task(self._supervise(slot))
        waiting = [slot.listening for slot in self._slots if slot.listening is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*waiting), START_TIMEOUT)
        except asyncio.TimeoutError:
            raise WorkerError(f"workers did not listen within {START_TIMEOUT:.0f}s") from None
        return cluster, tunnel

    async def _start(self, slot: _Slot) -> None:
        """Spawn the slot's worker and send it the committed config (the caller holds
        the lock, so no push is half-way)."""
        ours, theirs = socket.socketpair()
        link = WorkerLink(slot.index, theirs, self._tunnel_sock, os.getpid())
        process = self._context.Process(
            target=_child_main, args=(self.entry, self._worker_settings, link),
            name=f"tunnelgate-worker-{slot.index}", daemon=True)
        try:
            process.start()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # else the channel never reports the worker's death
        slot.process, slot.started_at = process, time.monotonic()
        channel = slot.channel = await Channel.open(ours)
        slot.live = True
        listening = slot.listening = asyncio.get_running_loop().create_future()
        assert process.pid is not None  # started above
        listening.add_done_callback(functools.partial(_started, slot.index, process.pid))
        asyncio.create_task(self._read(slot, channel, listening))
        channel.send({"op": "start"}, self._config)
        if self._stopping:  # the drain began while it was spawning: it never served
            _kill(process)

    async def _read(self, slot: _Slot, channel: Channel,
                    listening: asyncio.Future[None]) -> None:
        """Route a worker's answers; at EOF, fail whatever still waits on it."""
        try:
            while True:
                header, _ = await channel.receive()
                op = header.get("op")
                if op == "listening" and not listening.done():
                    listening.set_result(None)
                elif op == "failed" and not listening.done():
                    listening.set_exception(WorkerError(
                        f"worker {slot.index} failed to start: {header.get('error')}"))
                elif op == "ack" and (ack := slot.acks.pop(header.get("seq", -1), None)):
                    if not ack.done():
                        ack.set_result(header)
        except EOFError:
            pass
        finally:
            slot.gone(channel, listening)

    async def _supervise(self, slot: _Slot) -> None:
        """Reap the slot's worker whenever it exits and start a new one after a backoff,
        until the pool stops."""
        while True:
            if slot.process is not None:
                process, pid = slot.process, slot.process.pid
                code = await _exited(process)
                self._forget(slot, process)
                if self._stopping:
                    log.info("worker exited", extra={"worker": slot.index, "pid": pid,
                                                     "exit_code": code})
                    return
                log.error("worker exited unexpectedly", extra={
                    "worker": slot.index, "pid": pid, "exit_code": code})
            delay = slot.backoff()
            log.info("restarting worker", extra={"worker": slot.index, "delay_s": delay})
            await asyncio.sleep(delay)
            async with self._lock:
                if self._stopping:
                    return
                try:
                    await self._start(slot)
                    slot.restarts += 1
                except OSError:
                    log.exception("cannot spawn a worker", extra={"worker": slot.index})

    def _forget(self, slot: _Slot, process: BaseProcess) -> None:
        """After ``process`` exited: drop its live gauges and its channel."""
        worker_exited(self.metrics_dir, process.pid or 0)
        if slot.channel is not None and slot.listening is not None:
            slot.gone(slot.channel, slot.listening)
            slot.channel.close()
        slot.process = slot.channel = None
        process.close()

    # -- pushes

    async def publish(self, config: Config, wire: bytes | None = None) -> None:
        """AdminApi's ``publish`` hook: two-phase fan-out to every live worker (module
        doc). Returns once every worker swapped; raises :class:`WorkerError`, with no
        worker changed, if any could not prepare.

        ``wire`` is the JSON ``config`` was parsed from (a ``PUT /config`` body): the
        workers get it as it is. Only a config without one (read from a file, YAML
        included) is encoded here, which for 10,000 rules costs ~0.2 s of CPU."""
        body = wire if wire is not None else await asyncio.to_thread(encode_config, config)
        async with self._lock:
            self._seq += 1
            seq = self._seq
            slots = [slot for slot in self._slots if slot.live]
            errors = await self._ask(slots, {"op": "prepare", "seq": seq}, body)
            if errors:
                for slot in slots:
                    if slot.channel is not None:
                        slot.channel.send({"op": "abort", "seq": seq})
                _log_failures(errors, "could not prepare the config")
                raise WorkerError("; ".join(f"worker {slot.index}: {error}"
                                            for slot, error in errors.items()))
            self._config = body  # from now on, a (re)started worker starts with it
            errors = await self._ask(slots, {"op": "commit", "seq": seq})
            # A worker that did not commit is gone or killed; it restarts with this config.
            _log_failures(errors, "did not commit the config")

    async def _ask(self, slots: list[_Slot], header: Header,
                   body: bytes = b"") -> dict[_Slot, str]:
        """Send ``header`` to each slot and wait for the acks; the failures by slot."""
        loop = asyncio.get_running_loop()
        waits: dict[_Slot, asyncio.Future[Header]] = {}
        errors: dict[_Slot, str] = {}
        for slot in slots:
            if not slot.live or slot.channel is None or not slot.channel.send(header, body):
                errors[slot] = "exited"
                continue
            waits[slot] = slot.acks[header["seq"]] = loop.create_future()
        results = await asyncio.gather(
            *(asyncio.wait_for(ack, ACK_TIMEOUT) for ack in waits.values()),
            return_exceptions=True)
        for slot, result in zip(waits, results):
            if isinstance(result, asyncio.TimeoutError):
                errors[slot] = f"no answer within {ACK_TIMEOUT:.0f}s: killed"
                if slot.process is not None:  # stuck: it restarts with the committed config
                    _kill(slot.process)
            elif isinstance(result, BaseException):
                errors[slot] = str(result)
            elif not result.get("ok"):
                errors[slot] = str(result.get("error", "refused"))
        return errors

    # -- stop

    def stop_accepting(self, name: str) -> None:
        """Drain begins: no more restarts; every worker closes entrance ``name``."""
        self._stopping = True
        for slot in self._slots:
            if slot.channel is not None:
                slot.channel.send({"op": "stop", "entrance": name})

    def reload_certificates(self, reason: str) -> None:
        """Every worker re-reads its TLS certificates (each also watches the files)."""
        for slot in self._slots:
            if slot.channel is not None:
                slot.channel.send({"op": "reload-tls", "reason": reason})

    async def finish(self, grace: float) -> bool:
        """Tell every worker to drain within ``grace`` and exit; wait for them (killing
        any still there ``EXIT_MARGIN`` later). True if all exited cleanly in time."""
        self._stopping = True
        for slot in self._slots:
            if slot.channel is not None:
                slot.channel.send({"op": "finish", "grace": grace})
        tasks = self._tasks_with_a_process()
        if not tasks:
            return True
        _, late = await asyncio.wait(tasks, timeout=grace + EXIT_MARGIN)
        if late:
            log.warning("workers still running after the grace period: killing them",
                        extra={"workers": len(late)})
            self.kill_children()
        return not late

    def _tasks_with_a_process(self) -> set[asyncio.Task[None]]:
        """Supervising tasks that still wait on a worker; the others (sleeping before a
        restart) are cancelled."""
        tasks = set()
        for slot in self._slots:
            if slot.task is None or slot.task.done():
                continue
            if slot.process is None:
                slot.task.cancel()
            else:
                tasks.add(slot.task)
        return tasks

    async def close(self) -> None:
        """Kill any worker left, reap them, release the ports and the metrics dir."""
        self._stopping = True
        self.kill_children()
        tasks = self._tasks_with_a_process()
        if tasks:
            await asyncio.wait(tasks, timeout=EXIT_MARGIN)
        for sock in [*self._sockets, *filter(None, [self._tunnel_sock])]:
            sock.close()
        if os.environ.get(METRICS_DIR_ENV) == self.metrics_dir:
            del os.environ[METRICS_DIR_ENV]

    def kill_children(self) -> None:
        """SIGKILL every worker and drop the metrics directory (second signal: the
        process exits right after, without cleanup; close)."""
        for slot in self._slots:
            if slot.process is not None:
                _kill(slot.process)
        shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def swapped(self, snapshot: Snapshot) -> None:
        """Nothing to do here: each worker prunes its own pools when it commits."""

    def processes(self) -> list[WorkerProcess]:
        """Each slot's worker now: its pid (None between a crash and the restart) and
        how often it was restarted."""
        return [WorkerProcess(slot.index, slot.process.pid if slot.process else None,
                              slot.restarts) for slot in self._slots]


def _log_failures(errors: dict[_Slot, str], what: str) -> None:
    for slot, error in errors.items():
        log.error(f"worker {what}", extra={"worker": slot.index, "error": error})


def _hold_all(settings: Settings, sockets: list[socket.socket]
              ) -> tuple[Settings, socket.socket | None]:
    """Bind every entrance of ``settings`` for the workers (:func:`_hold`): the
    settings with the addresses bound, and the tunnel's unix socket if it has one."""
    cluster, _ = _hold("cluster", settings.listen, sockets)
    tunnel, tunnel_sock = _hold("tunnel", settings.tunnel_listen, sockets)
    tls = settings.tls
    if tls is not None:
        tls = dataclasses.replace(tls, listen=_hold_tcp("cluster-tls", tls.listen, sockets))
    return dataclasses.replace(settings, listen=cluster, tunnel_listen=tunnel,
                               tls=tls), tunnel_sock


def _hold(listener: str, address: Address | None, sockets: list[socket.socket]
          ) -> tuple[Address | None, socket.socket | None]:
    """Bind ``listener``'s ``address`` for the workers (module doc): the address bound
    and, for the tunnel's unix socket, the listening socket every worker accepts on.
    Raises ``SettingsError`` naming the listener's flag if it cannot be bound."""
    if address is None:
        return None, None
    if listener == "tunnel" and address.path is not None:
        try:
            return address, _bind_unix(address.path)
        except OSError as exc:
            raise cannot_listen(listener, address, exc) from None
    return _hold_tcp(listener, address, sockets), None


def _hold_tcp(listener: str, address: Address, sockets: list[socket.socket]) -> Address:
    """:func:`_hold` for a TCP address: the address with its port resolved."""
    try:
        return _reserve(address, sockets)
    except OSError as exc:
        raise cannot_listen(listener, address, exc) from None


def _reserve(address: Address, sockets: list[socket.socket]) -> Address:
    """Bind (never listen) SO_REUSEPORT sockets on every address ``address`` names,
    as the workers' listeners will, and keep them in ``sockets``; returns ``address``
    with the port resolved."""
    port = address.port or 0
    if is_every_interface(address):  # one dual-stack socket, as each worker binds
        sock = every_interface_socket(port, reuse_port=True)
        sockets.append(sock)
        return Address(host=address.host, port=sock.getsockname()[1])
    infos = socket.getaddrinfo(address.host, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    for family, kind, proto, _, sockaddr in dict.fromkeys(infos):
        sock = socket.socket(family, kind, proto)
        sockets.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((sockaddr[0], port, *sockaddr[2:]))
        port = sock.getsockname()[1]  # port 0: every family shares the first pick
    return Address(host=address.host, port=port)


def _started(index: int, pid: int, listening: asyncio.Future[None]) -> None:
    """Log how a worker's start ended (and retrieve a failure nobody else awaits)."""
    if listening.cancelled():
        return
    error = listening.exception()
    if error is None:
        log.info("worker listening", extra={"worker": index, "pid": pid})
    else:
        log.error("worker did not start", extra={"worker": index, "pid": pid,
                                                 "error": str(error)})


def _bind_unix(path: str) -> socket.socket:
    """The unix-socket entrance, bound once for every worker: same rules as
    ``proxy.entrances.listener.serve_entrance`` (a stale socket file is replaced, mode 0660)."""
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o660)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


async def _exited(process: BaseProcess) -> int | None:
    """Wait (without a thread) until ``process`` exits; reap it; its exit code."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(process.sentinel, readable)
    try:
        await done
    finally:
        loop.remove_reader(process.sentinel)
    process.join()
    return process.exitcode


def _kill(process: BaseProcess) -> None:
    try:
        process.kill()
    except (ProcessLookupError, ValueError):  # already reaped / closed
        pass
