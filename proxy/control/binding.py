"""Every-interface TCP listeners, bound dual-stack.

``:8080`` (Go's spelling of "every interface") and ``[::]:8080`` get one socket on
``::`` with ``IPV6_V6ONLY`` off. It accepts IPv6 connections and IPv4 ones, which
arrive as IPv4-mapped addresses (``::ffff:10.0.0.5``; the entrances report them as
plain IPv4). An IPv6-primary cluster lists the pod's IPv6 address in its Endpoints, so
that is what the kubelet and Knative's prober dial; an IPv4 cluster dials the IPv4 one.

The event loop cannot be asked for this: given ``None`` it binds ``0.0.0.0`` plus a
v6-only ``::``, and given ``::`` a v6-only socket. On a kernel without IPv6 the socket
falls back to ``0.0.0.0``, as Go's listener does. Any other host (``0.0.0.0``,
``127.0.0.1``, ``[::1]``, a name) is left to the event loop.
"""

from __future__ import annotations

import errno
import socket

from proxy.control.settings import Address

# IPv6 unusable on this host (no kernel support, or no address to bind).
_NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT)


def is_every_interface(address: Address) -> bool:
    """True for a TCP address naming every interface (``:PORT`` or ``[::]:PORT``)."""
    return address.path is None and address.host in (None, "", "::")


def every_interface_socket(port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound (not yet listening) TCP socket on ``::`` dual-stack, or on ``0.0.0.0``
    when the host has no IPv6. Raises ``OSError`` when the port cannot be bound."""
    try:
        return _bound(socket.AF_INET6, "::", port, reuse_port)
    except OSError as exc:
        if exc.errno not in _NO_IPV6:
            raise
    return _bound(socket.AF_INET, "0.0.0.0", port, reuse_port)


def _bound(family: socket.AddressFamily, host: str, port: int,
           reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR as the event loop sets it: a restart may rebind at once while
        # old connections sit in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock
