"""``serve --workers N``: one supervisor process and N worker processes.

The supervisor owns the config API (unchanged: :class:`proxy.control.admin.AdminApi`
with its ``publish`` hook set to :meth:`WorkerPool.publish`), readiness, cloudflared and
``/metrics``. The workers serve the entrances; each runs the same data plane as a single
process (``proxy.control.dataplane.DataPlane``), handed to
:func:`proxy.control.workerprocess.serve_worker` (the worker's side of all below).

- **Ports.** Every worker binds each TCP entrance with SO_REUSEPORT, so the kernel
  spreads connections over them; the supervisor holds each port, bound but never
  listening, and a unix-socket entrance once for all (:mod:`proxy.control.heldports`).
- **Processes.** ``multiprocessing`` with the "spawn" start method: a fresh interpreter,
  so nothing of the supervisor's loop, threads or sockets leaks into a worker. A worker
  dies with the supervisor: PR_SET_PDEATHSIG sends it SIGTERM, and EOF on its channel
  does the same; either way it drains as on a forwarded stop, then exits.
- **Channel.** One socketpair per worker, framed JSON headers and an optional body (the
  wire config, compiled by the worker in a thread): :mod:`proxy.control.channel`.
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
import dataclasses
import functools
import logging
import multiprocessing
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess

from proxy.control.channel import Channel, Header, encode_config
from proxy.control.heldports import hold_all
from proxy.control.settings import Address, Settings
from proxy.control.workerprocess import WorkerEntry, WorkerLink, child_main
from proxy.exchange.snapshot import Snapshot
from proxy.observability.metrics import worker_exited
from proxy.observability.processes import WorkerProcess
from routing.model import Config

log = logging.getLogger("tunnelgate.workers")

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
SECRET_ENV = ("PROXY_AUTH_TOKEN", "TUNNEL_TOKEN")  # resolved into Settings already
START_TIMEOUT = 30.0  # initial start: a worker imports the whole runtime, then compiles
ACK_TIMEOUT = 30.0    # a prepare compiles the table (~1 s for 10k rules)
EXIT_MARGIN = 5.0     # past the grace period, a worker that has not exited is killed
BACKOFF_FIRST, BACKOFF_MAX = 0.2, 10.0  # restart delay, doubling per quick crash
STABLE_AFTER = 30.0   # a worker that ran this long starts the backoff over


class WorkerError(Exception):
    """Workers could not start, or could not take a config."""



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

    async def read(self, channel: Channel, listening: asyncio.Future[None]) -> None:
        """Route the answers of the worker behind ``channel``; at EOF, fail whatever
        still waits on it."""
        try:
            while True:
                header, _ = await channel.receive()
                op = header.get("op")
                if op == "listening" and not listening.done():
                    listening.set_result(None)
                elif op == "failed" and not listening.done():
                    listening.set_exception(WorkerError(
                        f"worker {self.index} failed to start: {header.get('error')}"))
                elif op == "ack" and (ack := self.acks.pop(header.get("seq", -1), None)):
                    if not ack.done():
                        ack.set_result(header)
        except EOFError:
            pass
        finally:
            self.gone(channel, listening)

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
        held, self._tunnel_sock = hold_all(self.settings, self._sockets)
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
            target=child_main, args=(self.entry, self._worker_settings, link),
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
        asyncio.create_task(slot.read(channel, listening))
        channel.send({"op": "start"}, self._config)
        if self._stopping:  # the drain began while it was spawning: it never served
            _kill(process)

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
