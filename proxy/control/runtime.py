"""What ``tunnelgate serve`` runs: the composition root of the runtime.

:class:`Runtime` is built from :class:`~proxy.control.settings.Settings` and knows every
package: the config API and readiness, a data plane (a
:class:`~proxy.control.dataplane.DataPlane` in this process or, with ``--workers N``
(N > 1), a :class:`~proxy.control.workers.WorkerPool` of processes that each run one),
the admin listener, and cloudflared (supervised, or a sidecar's readiness and metrics).
:func:`serve` runs it: applies the start config, opens the listeners, drains on
SIGTERM and re-reads ``--config`` on SIGHUP.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass
from typing import Any, Callable, Coroutine

import uvloop

from proxy.control import native, signals
from proxy.control.admin import AdminApi, ConfigRejected, Publish, Readiness
from proxy.control.builds import Builds
from proxy.control.configfile import (
    ConfigFileError, ConfigReloader, describe_error)
from proxy.control.dataplane import NO_CONFIG, DataPlane, listen
from proxy.control.debug import LiveState
from proxy.control.settings import Address, Settings, SettingsError, cloudflared_missing
from proxy.control.workerprocess import WorkerEntry, WorkerLink, serve_worker
from proxy.control.workers import WorkerError, WorkerPool
from proxy.entrances.listener import EntranceSettings
from proxy.exchange.handler import Handler
from proxy.exchange.snapshot import Snapshot, SnapshotHolder
from proxy.observability.logs import configure_logging
from proxy.observability.metrics import Metrics
from proxy.observability.processes import WorkerProcesses
from routing.decide import EntranceScope
from routing.model import CLUSTER, CLUSTER_ENTRANCES, CLUSTER_TLS, TUNNEL, Config
from tunnel.cloudflared import CloudflaredSupervisor
from tunnel.metrics import TunnelMetrics
from tunnel.readiness import ReadyProbe, check_url, wait_gone

log = logging.getLogger("tunnelgate")

# After cloudflared is gone, requests still in flight (the cluster entrance's, or ones
# cloudflared handed over at the last moment) get at least this long to finish. A drain
# therefore takes at most grace + KILL_MARGIN + FINISH_MARGIN seconds (README).
FINISH_MARGIN = 5.0


@dataclass
class Listening:
    """Where the running server actually listens (ports resolved when 0 was asked)."""

    admin: Address
    cluster: Address | None = None
    tunnel: Address | None = None
    tls: Address | None = None  # the cluster entrance over TLS


class Runtime:
    """Everything ``serve`` runs, built from :class:`Settings` (the composition root):
    the config API, readiness, cloudflared supervision and a data plane — in this process
    (:class:`DataPlane`) or, with ``--workers N``, in worker processes
    (:class:`proxy.control.workers.WorkerPool`). ``worker_entry`` is what each worker process
    runs (tests substitute their own)."""

    def __init__(self, settings: Settings, *, worker_entry: WorkerEntry | None = None) -> None:
        self.settings = settings
        self.supervisor, self.tunnel_state = _tunnel_state(settings)
        self.plane: DataPlane | WorkerPool
        publish: Publish | None = None
        if settings.workers > 1:
            self.plane = WorkerPool(settings, worker_entry or worker_main)
            holder = SnapshotHolder(NO_CONFIG)  # records what the workers serve
            metrics = Metrics(multiprocess_dir=self.plane.metrics_dir)
            metrics.add_collector(WorkerProcesses(self.plane.processes))
            publish = self.plane.publish
            builds = Builds()
            live = LiveState(holder, None, EntranceScope(settings.cluster_scope),
                             builds=builds, entrances=_entrances(settings))
        else:
            self.plane = DataPlane(settings)
            holder, metrics = self.plane.holder, self.plane.metrics
            builds = self.plane.builds
            live = LiveState(holder, self.plane.pools, self.plane.scope, builds=builds,
                             entrances=_entrances(settings))
        self.readiness = Readiness(holder, self.tunnel_state)
        tunnel_metrics = _tunnel_metrics(settings, self.supervisor, self.tunnel_state)
        if tunnel_metrics is not None:
            metrics.add_exposition(tunnel_metrics.exposition)
        metrics.describe_build(native.version(), native.build())
        self.admin = AdminApi(holder, metrics, settings, self.readiness, builds=builds,
                              on_swap=self._on_swap, publish=publish, live=live)
        self.admin_server: asyncio.AbstractServer | None = None

    @property
    def in_flight(self) -> Handler:
        """The counted Handler the entrances call (single-process mode only)."""
        assert isinstance(self.plane, DataPlane), "requests are served by the workers"
        return self.plane.in_flight

    async def _on_swap(self, snapshot: Snapshot) -> None:
        self.plane.swapped(snapshot)
        # gRPC needs the http2 edge transport: QUIC drops trailers.
        if (self.supervisor is not None and snapshot.config.has_grpc_route
                and self.supervisor.protocol != "http2"):
            await self.supervisor.set_protocol("http2")

    async def start(self) -> Listening:
        """Open the entrances (here or in every worker), then the admin listener, then
        start cloudflared: ``/readyz`` cannot answer before requests can be served."""
        cluster, tunnel = await self.plane.open()
        admin_settings = EntranceSettings(name="admin", header_timeout=10.0,
                                          body_timeout=60.0, send_timeout=60.0)
        self.admin_server, admin = await listen(self.admin, admin_settings,
                                                 self.settings.admin)
        listening = Listening(admin=admin, cluster=cluster, tunnel=tunnel,
                              tls=self.plane.tls_address)
        if self.supervisor is not None:
            try:
                await self.supervisor.start()
            except OSError as exc:
                raise cloudflared_missing(exc) from None
        elif self.tunnel_state is not None:
            self.tunnel_state.start()
        for name, address in (("admin", listening.admin), (CLUSTER, listening.cluster),
                              (TUNNEL, listening.tunnel), (CLUSTER_TLS, listening.tls)):
            if address is not None:
                log.info("listening", extra={"listener": name, "address": str(address),
                                             "workers": self.settings.workers})
        return listening

    async def drain(self) -> bool:
        """Drain: not ready, stop accepting, let in-flight requests finish
        within the grace period, stop cloudflared. True if everything finished in time.

        The tunnel entrance keeps accepting until cloudflared is gone or the requests
        drain: only cloudflared reaches it, and while it drains it still sends requests
        the edge accepted before it unregistered. cloudflared waits its whole
        ``--grace-period`` (ours) before it exits, so a supervised one is killed only
        ``KILL_MARGIN`` s after that, and a sidecar container's is waited for while
        its ``/ready`` or metrics endpoint still answers (within our grace period).
        Whatever is still in flight then gets at least ``FINISH_MARGIN`` s more.
        """
        self.readiness.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.grace_period
        log.info("draining", extra={"grace_s": self.settings.grace_period})
        for name in CLUSTER_ENTRANCES:
            self.plane.stop_accepting(name)
        if self.supervisor is not None:
            await self.supervisor.stop()
        elif (sidecar_url := self.settings.cloudflared_ready_url
              or self.settings.cloudflared_metrics_url) is not None:
            await wait_gone(sidecar_url, deadline - loop.time())
        remaining = max(FINISH_MARGIN, deadline - loop.time())
        return await self.plane.finish(remaining)

    async def close(self) -> None:
        if self.admin_server is not None:
            self.admin_server.close()
        await self.plane.close()
        if self.supervisor is None and self.tunnel_state is not None:
            await self.tunnel_state.stop()

    def kill_children(self) -> None:
        """Second signal: no drain, but never leave cloudflared or workers orphaned."""
        self.plane.kill_children()
        for pid in self.supervisor.pids if self.supervisor is not None else []:
            try:
                os.killpg(pid, signal.SIGKILL)  # each runs in its own session
            except ProcessLookupError:
                pass


def _entrances(settings: Settings) -> tuple[str, ...]:
    """The entrances ``settings`` open, the tunnel's first."""
    return tuple(name for name, address in (("tunnel", settings.tunnel_listen),
                                            ("cluster", settings.listen))
                 if address is not None)


def worker_main(settings: Settings, link: WorkerLink) -> int:
    """One worker process of ``serve --workers N`` (spawned by :mod:`proxy.control.workers`)."""
    configure_logging(settings.log_level, settings.log_format)
    return run(_work(settings, link))


async def _work(settings: Settings, link: WorkerLink) -> int:
    return await serve_worker(DataPlane(settings), link, settings.grace_period)


def _tunnel_state(
        settings: Settings) -> tuple[CloudflaredSupervisor | None, ReadyProbe | None]:
    """(supervisor, readiness source) for the tunnel part of readiness.

    Supervised cloudflared ⇒ its /ready; sidecar with ``--cloudflared-ready-url`` ⇒ that
    URL; otherwise nothing to wait for (standalone, or a sidecar we cannot observe).
    """
    if settings.tunnel_token:
        supervisor = CloudflaredSupervisor(
            settings.cloudflared_bin, settings.tunnel_token,
            protocol=settings.tunnel_protocol, grace_period=settings.grace_period)
        return supervisor, supervisor.probe
    if settings.cloudflared_ready_url:
        return None, ReadyProbe(settings.cloudflared_ready_url)
    if settings.tunnel_mode:
        log.warning("tunnel entrance without a tunnel token or --cloudflared-ready-url: "
                    "readiness does not wait for the edge connection")
    return None, None


def _tunnel_metrics(settings: Settings, supervisor: CloudflaredSupervisor | None,
                    probe: ReadyProbe | None) -> TunnelMetrics | None:
    """cloudflared's part of ``/metrics``: a supervised child's endpoint, or the
    sidecar's ``--cloudflared-metrics-url``; None when there is no cloudflared to show.
    Raises ValueError for an unusable URL."""
    if supervisor is not None:
        return TunnelMetrics(supervisor=supervisor, probe=probe,
                             metrics_url=lambda: supervisor.metrics_url)
    url = settings.cloudflared_metrics_url
    if url is None and probe is None:
        return None
    fixed = check_url(url, "metrics") if url is not None else None
    return TunnelMetrics(probe=probe, metrics_url=lambda: fixed)


async def serve(settings: Settings, *, config: Config | None = None,
                on_listening: Callable[[Listening], None] | None = None) -> int:
    """Run until SIGTERM/SIGINT, then drain; returns the exit status.

    ``config`` (or ``settings.config_file``) is applied before the listeners open. A
    second signal during the drain exits at once with status 1. SIGHUP (and, with
    ``--watch-config``, a change of the file) re-reads ``settings.config_file``.
    """
    try:
        runtime = Runtime(settings)
    except ValueError as exc:  # e.g. an unusable --cloudflared-ready-url
        log.error("cannot start", extra={"error": str(exc)})
        return 2
    reloader = _reloader(settings, runtime.admin)
    stop = _install_signal_handlers(runtime, reloader)  # before binding: no default action
    try:
        listening = await _start(runtime, reloader, config)
    except (SettingsError, ConfigRejected, WorkerError) as exc:
        log.error("cannot start", extra={"error": str(exc)})
        await runtime.close()
        return 1
    if on_listening is not None:
        on_listening(listening)
    if reloader is not None:
        reloader.start()
    await stop.wait()
    if reloader is not None:
        await reloader.stop()
    drained = await runtime.drain()
    await runtime.close()
    log.info("stopped", extra={"drained": drained})
    return 0


async def _start(runtime: Runtime, reloader: ConfigReloader | None,
                 config: Config | None) -> Listening:
    """Apply the start config (``config``, else ``--config``'s file), then open the
    listeners. The file's config is read here, not in :func:`serve`, whose frame lives
    as long as the process: held there, it outlived the first push that replaced it
    (10,000 routes: ~4 MB of rules that nothing served)."""
    source = "embedded" if config is not None else "file"
    if config is None and reloader is not None:
        config = _load_start_config(reloader)
    if config is not None:
        await runtime.admin.apply(config, source=source)
    return await runtime.start()


def _load_start_config(reloader: ConfigReloader) -> Config:
    """``--config`` read at start; an unreadable or invalid file is a
    :class:`SettingsError` that names the file (and the line, for YAML)."""
    try:
        return reloader.load()
    except (ConfigFileError, OSError) as exc:
        raise SettingsError("--config", describe_error(reloader.path, exc), 1) from None


def _reloader(settings: Settings, admin: AdminApi) -> ConfigReloader | None:
    if settings.config_file is None:
        return None
    source = settings.config_file

    async def push(config: Config) -> bool:
        return await admin.push(config, source)

    return ConfigReloader(source, dict(settings.backends), push,
                          refused=admin.file_unusable, watch=settings.watch_config)


def _install_signal_handlers(runtime: Runtime,
                             reloader: ConfigReloader | None = None) -> asyncio.Event:
    """Wire :data:`proxy.control.signals.SERVE_SIGNALS`; the returned event is set by the first
    stop signal (the drain begins), a second one exits at once."""
    stop = asyncio.Event()

    def on_hangup(signum: signal.Signals) -> None:
        # Daemons re-read their configuration on SIGHUP; its default action (exit)
        # would take the pod's data plane down for a typo-free "reload".
        runtime.plane.reload_certificates(signum.name)
        if reloader is not None:
            reloader.request(signum.name)
        elif runtime.settings.tls is None:
            log.warning("SIGHUP ignored: no --config file to re-read")

    def on_stop(signum: signal.Signals) -> None:
        if stop.is_set():
            log.warning("second signal: exiting without drain", extra={"signal": signum.name})
            runtime.kill_children()
            os._exit(1)
        log.info("signal received", extra={"signal": signum.name})
        stop.set()

    signals.install(asyncio.get_running_loop(), signals.SERVE_SIGNALS,
                    {signals.STOP: on_stop, signals.RELOAD: on_hangup})
    return stop


def run(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop (the hot path is tuned for it)."""
    return uvloop.run(main)
