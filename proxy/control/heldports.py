"""The entrances' addresses the ``--workers`` supervisor holds for its workers.

Every worker binds each TCP entrance with SO_REUSEPORT, so the kernel spreads
connections over them. The supervisor holds a bound but never listening SO_REUSEPORT
socket on each of those ports: it resolves port 0, reports a busy port at start-up and
keeps the port while workers restart; a socket that does not listen gets no
connections. A unix socket cannot be shared that way, so the supervisor binds a
unix-socket entrance once and every worker accepts on that same socket.
"""

from __future__ import annotations

import dataclasses
import os
import socket

from proxy.control.binding import every_interface_socket, is_every_interface
from proxy.control.settings import Address, Settings, cannot_listen


def hold_all(settings: Settings, sockets: list[socket.socket]
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
