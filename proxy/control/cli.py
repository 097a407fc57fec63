"""The ``tunnelgate`` command and the composition root of the runtime.

Subcommands: ``serve`` (run the proxy), ``check FILE`` (validate, print the compiled
table and warnings), ``explain FILE --host H --path P …`` (why a request goes where it
goes), ``convert FILE`` (HTTPRoute YAML → wire JSON), ``demo`` (two local backends and a
demo config) and ``cloudflared-config`` (a sidecar ingress section). The stable
contract is::

    tunnelgate serve --listen HOST:PORT --admin HOST:PORT [--config FILE] [--auth-token-file F]

This is the only module that knows every package: it builds the snapshot holder, pools,
metrics, access log, entrance policy and Handler, binds the entrances and the admin
listener, supervises cloudflared in tunnel mode, drains on SIGTERM and re-reads
``--config`` on SIGHUP.
With ``--workers N`` (N > 1) this process becomes the supervisor: it keeps the config
API, readiness and cloudflared, and N worker processes (:mod:`proxy.control.workers`) each run
the same :class:`DataPlane` a single process runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import socket
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Sequence

import uvloop

from proxy.control import allocator, demo, native, signals
from proxy.control.admin import AdminApi, ConfigRejected, Publish, Readiness
from proxy.control.binding import every_interface_socket, is_every_interface
from proxy.control.builds import Builds
from proxy.control.certificates import CertificateMetrics, CertificateReloader
from proxy.control.configfile import (
    ConfigFile, ConfigFileError, ConfigReloader, describe_error, read_config_file,
    read_config_text)
from proxy.control.debug import LiveState, parse_header
from proxy.control.settings import (
    LOG_LEVELS, Address, Settings, SettingsError, add_backend_argument,
    add_log_format_argument, add_serve_arguments, cannot_listen, cloudflared_missing,
    from_args, log_format, parse_backends)
from proxy.control.workers import (
    WorkerEntry, WorkerError, WorkerLink, WorkerPool, serve_worker)
from proxy.entrances.listener import EntranceServer, EntranceSettings, serve_entrance
from proxy.entrances.policy import cluster_prepare
from proxy.exchange.handler import Handler
from proxy.exchange.shedding import LoadShedder
from proxy.exchange.snapshot import Snapshot, SnapshotHolder
from proxy.observability import tracing
from proxy.observability.accesslog import AccessLog
from proxy.observability.logs import configure_logging
from proxy.observability.metrics import Metrics
from proxy.observability.processes import WorkerProcesses
from proxy.request import Handle
from proxy.upstream.registry import Pools
from routing.decide import SCOPES, EntranceScope, explain
from routing.model import CLUSTER, CLUSTER_ENTRANCES, CLUSTER_TLS, ENTRANCES, TUNNEL, Config
from routing.table import Table
from routing.wire import to_wire
from tunnel import sidecar
from tunnel.cloudflared import CloudflaredSupervisor
from tunnel.readiness import ReadyProbe, check_url, wait_gone
from tunnel.metrics import TunnelMetrics

log = logging.getLogger("tunnelgate")

# After cloudflared is gone, requests still in flight (the cluster entrance's, or ones
# cloudflared handed over at the last moment) get at least this long to finish. A drain
# therefore takes at most grace + KILL_MARGIN + FINISH_MARGIN seconds (README).
FINISH_MARGIN = 5.0

# --------------------------------------------------------------------------- serve


@dataclass
class Listening:
    """Where the running server actually listens (ports resolved when 0 was asked)."""

    admin: Address
    cluster: Address | None = None
    tunnel: Address | None = None
    tls: Address | None = None  # the cluster entrance over TLS


def _bound(server: EntranceServer, address: Address) -> Address:
    """``address`` with the port the kernel picked when 0 was asked."""
    if address.path is not None or not server.sockets:
        return address
    return Address(host=address.host, port=server.sockets[0].getsockname()[1])


async def _listen(handle: Handle, entrance_settings: EntranceSettings, address: Address,
                  *, reuse_port: bool = False, sock: socket.socket | None = None,
                  tls: ssl.SSLContext | None = None) -> tuple[EntranceServer, Address]:
    if sock is not None:  # a unix socket the supervisor bound for every worker
        return await serve_entrance(handle, entrance_settings, sock=sock), address
    try:
        return await _bind(handle, entrance_settings, address, reuse_port, tls)
    except OSError as exc:
        raise cannot_listen(entrance_settings.name, address, exc) from None


async def _bind(handle: Handle, entrance_settings: EntranceSettings, address: Address,
                reuse_port: bool, tls: ssl.SSLContext | None
                ) -> tuple[EntranceServer, Address]:
    if is_every_interface(address):  # dual-stack "::" (proxy.control.binding)
        sock = every_interface_socket(address.port or 0, reuse_port=reuse_port)
        try:
            server = await serve_entrance(handle, entrance_settings, sock=sock, tls=tls)
        except BaseException:
            sock.close()
            raise
        return server, _bound(server, address)
    server = await serve_entrance(handle, entrance_settings, host=address.host,
                                  port=address.port, path=address.path,
                                  reuse_port=reuse_port, tls=tls)
    return server, _bound(server, address)


_NO_CONFIG = Snapshot(0, Config(0, (), False), Table.empty())


class DataPlane:
    """What serves requests: the snapshot holder, upstream pools, metrics, the Handler
    (counted in flight) and the cluster and tunnel entrances.

    ``serve`` runs one in its own process with ``--workers 1``; with ``--workers N``
    each worker process runs one (:func:`worker_main`) and the supervisor none.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.scope = EntranceScope(settings.cluster_scope)
        self.holder = SnapshotHolder(_NO_CONFIG, self.scope.default_entrances)
        self.pools = Pools(head_limits=settings.response_head,
                           max_connections=settings.backend_max_connections,
                           outliers=settings.resilience.outliers(),
                           head_timeout=settings.response_header_timeout or None)
        self.metrics = Metrics()
        self.builds = Builds()  # this process's config builds (one per process)
        self.access_log = AccessLog(settings.access_log)
        self.tracing = tracing.from_settings(settings.tracing)
        # The Handler counts the requests inside it; drain waits on that count.
        self.in_flight = Handler(self.holder, self.pools, self.metrics,
                                 self.access_log, self.scope,
                                 upgrade_timeout=settings.ws_handshake_timeout,
                                 upgrade_dial_timeout=settings.ws_dial_timeout,
                                 tracing=self.tracing,
                                 shedder=settings.resilience.shedder(
                                     self.metrics.resilience))
        self.servers: dict[str, EntranceServer] = {}
        # --listen-tls: its certificates are read now, so that a bad one stops the
        # start (a ValueError, as an unusable flag).
        self.certificates = None if settings.tls is None else CertificateReloader(
            settings.tls, CertificateMetrics(self.metrics.registry))
        self.tls_address: Address | None = None

    def rejected(self, entrance: str, status: int, reason: str,
                 client_ip: str | None) -> None:
        """An entrance answered a request it could not parse: counted and logged."""
        self.metrics.request_rejected(entrance, status)
        self.access_log.rejected(entrance, status, reason, client_ip)

    async def open(self, *, reuse_port: bool = False, tunnel_sock: socket.socket | None = None
                   ) -> tuple[Address | None, Address | None]:
        """Listen on the configured entrances; the (cluster, tunnel) addresses bound.

        ``reuse_port``: share TCP ports with the other workers (SO_REUSEPORT);
        ``tunnel_sock``: serve the tunnel entrance on this already listening socket.
        """
        s = self.settings
        cluster = tunnel = None
        self.in_flight.shedder.start(asyncio.get_running_loop())
        if s.listen is not None:
            cluster_settings = EntranceSettings(
                name=CLUSTER, header_timeout=s.header_timeout,
                idle_timeout=s.idle_timeout, max_connections=s.max_connections,
                max_headers=s.max_header_count, h2_max_streams=s.h2_max_streams,
                h2_max_requests=s.h2_max_requests,
                proxy_protocol=s.cluster_proxy_protocol, prepare=cluster_prepare,
                allow=list(s.cluster_allow) or None, rejected=self.rejected,
                refused=self.metrics.connection_refused, shedder=self.read_shedder())
            self.servers[CLUSTER], cluster = await _listen(
                self.in_flight, cluster_settings, s.listen, reuse_port=reuse_port)
        if s.tls is not None and self.certificates is not None:
            await self._open_tls(s.tls.listen, reuse_port)
        if s.tunnel_listen is not None:
            tunnel_settings = EntranceSettings(
                name=TUNNEL, header_timeout=s.header_timeout,
                idle_timeout=s.idle_timeout, max_connections=s.max_connections,
                max_headers=s.max_header_count, h2_max_streams=s.h2_max_streams,
                h2_max_requests=s.h2_max_requests, prepare=sidecar.prepare,
                rejected=self.rejected, refused=self.metrics.connection_refused,
                shedder=self.read_shedder())
            self.servers[TUNNEL], tunnel = await _listen(
                self.in_flight, tunnel_settings, s.tunnel_listen, reuse_port=reuse_port,
                sock=tunnel_sock)
        return cluster, tunnel

    def read_shedder(self) -> LoadShedder | None:
        """The load shedder the entrances ask at a read, while shedding is on."""
        shedder = self.in_flight.shedder
        return shedder if shedder.active else None

    async def _open_tls(self, address: Address, reuse_port: bool) -> None:
        """The cluster entrance over TLS: the cluster entrance's settings and trust
        rules under its own name (routes may be scoped to it), with no PROXY header
        (it would have to come before the TLS handshake)."""
        s = self.settings
        assert self.certificates is not None
        tls_settings = EntranceSettings(
            name=CLUSTER_TLS, header_timeout=s.header_timeout,
            idle_timeout=s.idle_timeout, max_connections=s.max_connections,
            max_headers=s.max_header_count, h2_max_streams=s.h2_max_streams,
            h2_max_requests=s.h2_max_requests, prepare=cluster_prepare,
            allow=list(s.cluster_allow) or None, scheme="https", rejected=self.rejected,
            refused=self.metrics.connection_refused, shedder=self.read_shedder())
        self.servers[CLUSTER_TLS], self.tls_address = await _listen(
            self.in_flight, tls_settings, address, reuse_port=reuse_port,
            tls=self.certificates.store.listening)
        self.certificates.start()

    def reload_certificates(self, reason: str) -> None:
        """Re-read the TLS entrance's certificates (SIGHUP); nothing without one."""
        if self.certificates is not None:
            self.certificates.request(reason)

    def swapped(self, snapshot: Snapshot) -> None:
        """A config became current: let go of pools no backend uses any more."""
        self.pools.retain(snapshot.pool_keys)

    def stop_accepting(self, name: str) -> None:
        """Close entrance ``name``'s listener and drain its connections: idle keep-alive
        ones close now, busy ones after their response (``Connection: close``), so no
        client sends a request on a connection the exit would cut."""
        server = self.servers.pop(name, None)
        if server is not None:
            server.close()
            server.drain()

    async def finish(self, grace: float) -> bool:
        """Wait up to ``grace`` seconds for requests in flight, then stop accepting on the
        tunnel entrance too. True if every request finished in time."""
        drained = await self.in_flight.wait_idle(grace)
        self.stop_accepting(TUNNEL)
        if not drained:
            log.warning("grace period over with requests in flight",
                        extra={"in_flight": self.in_flight.count})
        return drained

    async def close(self) -> None:
        for name in list(self.servers):
            self.stop_accepting(name)
        self.in_flight.shedder.stop()
        if self.certificates is not None:
            await self.certificates.stop()
        self.pools.close()
        if self.tracing is not None:
            # Exports what the batch still holds (bounded by the exporter's timeout).
            await asyncio.to_thread(self.tracing.shutdown)

    def kill_children(self) -> None:
        """Nothing: requests are served in this process."""


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
            holder = SnapshotHolder(_NO_CONFIG)  # records what the workers serve
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
        self.admin_server, admin = await _listen(self.admin, admin_settings,
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
        source = "embedded" if config is not None else "file"
        if config is None and reloader is not None:
            config = _load_start_config(reloader)
        if config is not None:
            await runtime.admin.apply(config, source=source)
        listening = await runtime.start()
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


# --------------------------------------------------------------------------- commands


def _log_start() -> None:
    """The first log line: which version and build run (compiled or plain Python) and
    malloc tuning."""
    log.info("starting", extra={"version": native.version(), "build": native.describe(),
                                "malloc_tuned": allocator.tune()})


def version_line() -> str:
    """What ``tunnelgate --version`` and ``tunnelgate version`` print."""
    return f"tunnelgate {native.version()} ({native.build()} build: {native.describe()})"


def _cmd_version(args: argparse.Namespace) -> int:
    print(version_line())
    return 0


def _start_logging(args: argparse.Namespace) -> bool:
    """Log at ``--log-level`` in ``--log-format`` (``$PROXY_LOG_FORMAT``); False (said
    in the default format) if that format is unknown."""
    try:
        configure_logging(args.log_level, log_format(args.log_format, os.environ))
    except SettingsError as exc:
        configure_logging(args.log_level)
        log.error(str(exc))
        return False
    return True


def _cmd_serve(args: argparse.Namespace) -> int:
    if not _start_logging(args):
        return 2
    try:
        settings = from_args(args, os.environ)
    except SettingsError as exc:
        log.error(str(exc))
        return exc.exit_code
    _log_start()
    return run(serve(settings))


def _load_file(args: argparse.Namespace) -> ConfigFile | int:
    """The config file named by ``args.file`` (``-``: standard input) with ``--backend``
    applied, or the exit status after printing why it could not be read: 2 for a bad
    flag, 1 for a bad file."""
    try:
        backends = parse_backends(args.backend)
        if args.file == "-":
            return read_config_text(sys.stdin.read(), STDIN, backends)
        return read_config_file(args.file, backends)
    except SettingsError as exc:
        print(f"tunnelgate: {exc}", file=sys.stderr)
        return 2
    except (ConfigFileError, OSError) as exc:
        print(f"tunnelgate: {describe_error(args.file, exc)}", file=sys.stderr)
        return 1


STDIN = "<stdin>"  # how messages name a config read from standard input (``-``)


def _cmd_check(args: argparse.Namespace) -> int:
    loaded = _load_file(args)
    if isinstance(loaded, int):
        return loaded
    table = Table.compile(loaded.config)
    warnings = loaded.warnings(table)
    inside = f" ({loaded.embedded.describe()})" if loaded.embedded is not None else ""
    print(f"{loaded.path}: valid{inside}; version {loaded.config.version}")
    print("\n".join(table.describe()))
    for warning in warnings:
        print(warning, file=sys.stderr)
    if warnings and args.strict:
        print(f"tunnelgate: {loaded.path}: {len(warnings)} warning(s) and --strict",
              file=sys.stderr)
        return 1
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.admin is None):
        print("tunnelgate: explain needs either FILE or --admin URL", file=sys.stderr)
        return 2
    if args.admin is not None:
        return _explain_live(args)
    loaded = _load_file(args)
    if isinstance(loaded, int):
        return loaded
    try:
        headers: list[tuple[bytes, ...]] = [parse_header(h) for h in args.header]
    except ValueError as exc:
        print(f"tunnelgate: {exc}", file=sys.stderr)
        return 1
    scope = EntranceScope(args.cluster_scope or "all")
    entrance, via = _file_entrance(args.entrance, loaded.config, scope)
    table = Table.compile(loaded.config, scope.default_entrances)
    _, lines = explain(table, scope, args.method, args.host, args.path, args.query,
                       headers, entrance, random.random, via=via)
    print("\n".join(lines))
    return 0


def _file_entrance(asked: str | None, config: Config,
                   scope: EntranceScope) -> tuple[str, str | None]:
    """The entrance ``explain FILE`` evaluates and what its first line says of it. A
    file does not say how the proxy runs: without ``--entrance`` the answer is the
    same for every entrance unless a rule names some (or the cluster scope is
    ``scoped``, which keeps unnamed rules off the cluster entrances)."""
    if asked is not None:
        return asked, None
    if not scope.scoped and all(rule.entrances is None for rule in config.rules):
        return TUNNEL, "any entrance (no rule names entrances)"
    return TUNNEL, ("the tunnel entrance (the default; --entrance cluster for a "
                    "standalone proxy or in-cluster callers)")


def _cmd_convert(args: argparse.Namespace) -> int:
    loaded = _load_file(args)
    if isinstance(loaded, int):
        return loaded
    print(json.dumps(to_wire(loaded.config), indent=2))
    return 0


def _explain_live(args: argparse.Namespace) -> int:
    """``explain --admin URL``: the same lines, from the snapshot a running proxy serves
    (``GET /debug/explain`` with the config API token)."""
    if args.cluster_scope is not None:
        print("tunnelgate: explain --admin uses the running proxy's --cluster-scope",
              file=sys.stderr)
        return 2
    params = [("host", args.host), ("path", args.path), ("query", args.query),
              ("method", args.method)]
    if args.entrance is not None:  # else the proxy's own (see LiveState.explain)
        params.append(("entrance", args.entrance))
    params += [("header", h) for h in args.header]
    url = args.admin.rstrip("/") + "/debug/explain?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url)
    try:
        token = _admin_token(args.auth_token_file)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=10.0) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace").strip()
        print(f"tunnelgate: {args.admin}: {exc.code} {detail}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"tunnelgate: {args.admin}: {exc}", file=sys.stderr)
        return 1
    print("\n".join(answer["lines"]))
    return 0


def _admin_token(path: str | None) -> str | None:
    """The config API token: ``--auth-token-file``, else ``$PROXY_AUTH_TOKEN``."""
    if path is not None:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    return os.environ.get("PROXY_AUTH_TOKEN", "").strip() or None


def _cmd_demo(args: argparse.Namespace) -> int:
    if not _start_logging(args):
        return 2
    try:
        settings = demo.demo_settings(os.environ)
    except SettingsError as exc:
        log.error(str(exc))
        return exc.exit_code
    _log_start()
    return run(demo.main(serve, settings))


def _cmd_cloudflared_config(args: argparse.Namespace) -> int:
    try:
        print(sidecar.render_ingress(args.hostname, args.service or sidecar.DEFAULT_SERVICE),
              end="")
    except ValueError as exc:
        print(f"tunnelgate: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_cloudflared_config(
        commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """The ``cloudflared-config`` command and its flags."""
    ingress = commands.add_parser("cloudflared-config",
                                  help="print a cloudflared ingress for the sidecar")
    ingress.add_argument(
        "--hostname", action="append", default=[], metavar="HOST",
        help="a public hostname to route to the tunnel, listed in the output's comment "
             "(repeatable; RFC 1123, a wildcard only as a leading '*.', no port; "
             "cluster-local names such as NAME.NAMESPACE.svc.cluster.local are refused: "
             "never publish them)")
    ingress.add_argument("--service", metavar="URL",
                         help="where cloudflared sends traffic (default "
                              "http://127.0.0.1:8082)")
    ingress.set_defaults(run=_cmd_cloudflared_config)


def _add_explain(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """The ``explain`` command and its flags."""
    explain = commands.add_parser("explain", help="show how a request would be routed")
    explain.add_argument("file", nargs="?", help="wire JSON or HTTPRoute YAML")
    explain.add_argument("--admin", metavar="URL",
                         help="ask a running proxy's config API instead of reading FILE "
                              "(token: --auth-token-file or $PROXY_AUTH_TOKEN)")
    explain.add_argument("--auth-token-file", metavar="FILE",
                         help="config API bearer token for --admin")
    add_backend_argument(explain)
    explain.add_argument("--host", required=True)
    explain.add_argument("--path", required=True)
    explain.add_argument("--query", default="", help="raw query string, without '?'")
    explain.add_argument("--header", action="append", default=[], metavar="NAME:VALUE")
    explain.add_argument("--method", default="GET")
    explain.add_argument("--entrance", choices=ENTRANCES,
                         help="the entrance the request arrives by (default: with --admin, "
                              "the proxy's own, the tunnel's if it has one; with FILE, "
                              "any, unless a rule names entrances, then tunnel)")
    explain.add_argument("--cluster-scope", choices=SCOPES, default=None,
                         help="what the cluster entrance serves, as serve's flag (FILE "
                              "only; default all)")
    explain.set_defaults(run=_cmd_explain)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunnelgate",
        description="Gateway API data plane for Cloudflare Tunnel and in-cluster traffic.")
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print the version and build, then exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("version", help="print the version and build (compiled or "
                                        "plain)").set_defaults(run=_cmd_version)

    serve_cmd = commands.add_parser("serve", help="run the proxy")
    add_serve_arguments(serve_cmd)
    serve_cmd.set_defaults(run=_cmd_serve)

    check = commands.add_parser(
        "check", help="validate a config, print its table and warnings")
    check.add_argument("file", help="wire JSON or HTTPRoute YAML, or a ConfigMap manifest "
                                    "holding either; - reads standard input")
    check.add_argument("--strict", action="store_true", help="exit 1 if there are warnings")
    add_backend_argument(check)
    check.set_defaults(run=_cmd_check)

    _add_explain(commands)

    convert_cmd = commands.add_parser("convert", help="print the wire JSON of a config file")
    convert_cmd.add_argument("file", help="HTTPRoute YAML (or wire JSON, normalised)")
    add_backend_argument(convert_cmd)
    convert_cmd.set_defaults(run=_cmd_convert)

    demo_cmd = commands.add_parser("demo", help="run two demo backends behind the proxy")
    demo_cmd.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    add_log_format_argument(demo_cmd.add_argument)
    demo_cmd.set_defaults(run=_cmd_demo)

    _add_cloudflared_config(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status: int = args.run(args)
        sys.stdout.flush()  # here, so a closed pipe is caught below and not at exit
    except BrokenPipeError:
        # The reader went away (``tunnelgate check big.json | head``): that is its
        # choice, not an error worth a traceback. Point stdout at /dev/null so the
        # interpreter's final flush does not fail again, and exit as a process killed
        # by SIGPIPE would (128 + 13), like the shell tools this sits among.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE
    return status
