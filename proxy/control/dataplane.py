"""What serves requests in one process: :class:`DataPlane`, the entrances bound to the
Handler.

``serve`` runs one in its own process with ``--workers 1``; with ``--workers N`` each
worker process runs one (:func:`proxy.control.runtime.worker_main`) and the supervisor
none. It builds the snapshot holder, upstream pools, metrics, access log and tracing,
the counted Handler and the entrances (cluster, its TLS twin, tunnel) with the trust
rules each may believe (:func:`proxy.entrances.policy.cluster_prepare`,
:func:`tunnel.sidecar.prepare`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl

from proxy.control.binding import every_interface_socket, is_every_interface
from proxy.control.builds import Builds
from proxy.control.certificates import CertificateMetrics, CertificateReloader
from proxy.control.settings import Address, Settings, cannot_listen
from proxy.entrances.listener import EntranceServer, EntranceSettings, serve_entrance
from proxy.entrances.policy import cluster_prepare
from proxy.exchange.handler import Handler
from proxy.exchange.shedding import LoadShedder
from proxy.exchange.snapshot import Snapshot, SnapshotHolder
from proxy.observability import tracing
from proxy.observability.accesslog import AccessLog
from proxy.observability.metrics import Metrics
from proxy.request import Handle
from proxy.upstream.registry import Pools
from routing.decide import EntranceScope
from routing.model import CLUSTER, CLUSTER_TLS, TUNNEL, Config
from routing.table import Table
from tunnel import sidecar

log = logging.getLogger("tunnelgate")

# What a holder serves before the first config is applied.
NO_CONFIG = Snapshot(0, Config(0, (), False), Table.empty())


def _bound(server: EntranceServer, address: Address) -> Address:
    """``address`` with the port the kernel picked when 0 was asked."""
    if address.path is not None or not server.sockets:
        return address
    return Address(host=address.host, port=server.sockets[0].getsockname()[1])


async def listen(handle: Handle, entrance_settings: EntranceSettings, address: Address,
                 *, reuse_port: bool = False, sock: socket.socket | None = None,
                 tls: ssl.SSLContext | None = None) -> tuple[EntranceServer, Address]:
    """Serve ``handle`` on ``address`` (or on ``sock``, already listening); the server
    and the address bound. Raises :class:`~proxy.control.settings.SettingsError`
    naming the listener's setting when the address cannot be bound."""
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


class DataPlane:
    """What serves requests: the snapshot holder, upstream pools, metrics, the Handler
    (counted in flight) and the cluster and tunnel entrances (module doc)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.scope = EntranceScope(settings.cluster_scope)
        self.holder = SnapshotHolder(NO_CONFIG, self.scope.default_entrances)
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
            self.servers[CLUSTER], cluster = await listen(
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
            self.servers[TUNNEL], tunnel = await listen(
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
        self.servers[CLUSTER_TLS], self.tls_address = await listen(
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
