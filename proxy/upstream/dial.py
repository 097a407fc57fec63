"""Reaching a backend: TCP connect in resolver order, a pool's protocol opened on the
socket (over TLS with the peer checked, for the HTTP/1.1 and HTTP/2 pools alike), the
TLS client context of a pool (CA bundle, SAN lists, mTLS pair), and RFC 6125 name
matching."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import tempfile
from typing import Callable, TypeVar

from proxy.upstream.base import PoolKey, UpstreamError

log = logging.getLogger("tunnelgate.upstream")
P = TypeVar("P", bound=asyncio.BaseProtocol)



async def connect_tcp(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket (addresses tried in resolver order)."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error


async def dial_tcp(loop: asyncio.AbstractEventLoop, key: PoolKey,
                   timeout: float) -> socket.socket:
    """:func:`connect_tcp` to the pool's backend within ``timeout``; a failure is an
    :class:`UpstreamError` ``dial``."""
    try:
        async with asyncio.timeout(timeout):
            return await connect_tcp(loop, key.host, key.port)
    except (OSError, TimeoutError) as exc:
        raise unreachable(key, exc) from None


def unreachable(key: PoolKey, exc: Exception) -> UpstreamError:
    """The ``dial`` error of a connection that could not be made (``exc``)."""
    return UpstreamError("dial", f"cannot connect to {key.host}:{key.port}: "
                                 f"{exc or 'timed out'}")


async def open_over(loop: asyncio.AbstractEventLoop, key: PoolKey, tls: "TLSSetup | None",
                    factory: Callable[[], P], sock: socket.socket,
                    timeout: float) -> tuple[asyncio.Transport, P]:
    """The protocol ``factory`` makes, on the connected ``sock``: over TLS when ``tls``
    is set, the backend's certificate then checked against the pool's names. A failure
    is an :class:`UpstreamError` (``tls``, or ``dial`` on a plain socket), with the
    socket or transport closed."""
    where = f"{key.host}:{key.port}"
    try:
        async with asyncio.timeout(timeout):
            transport, protocol = await loop.create_connection(
                factory, sock=sock, ssl=tls.context if tls is not None else None,
                server_hostname=tls.server_name if tls is not None else None)
    except (OSError, TimeoutError, ssl.SSLError, ValueError) as exc:
        sock.close()
        if tls is None:
            raise unreachable(key, exc) from None
        raise UpstreamError("tls", f"TLS handshake with {where} failed: "
                                   f"{exc or 'timed out'}") from None
    if tls is not None:
        problem = tls.check_peer(transport.get_extra_info("peercert"))
        if problem is not None:
            transport.abort()
            raise UpstreamError("tls", f"{where}: {problem}")
    return transport, protocol  # type: ignore[return-value]  # a stream transport


class TLSSetup:
    """The TLS client context of one pool, built once."""

    def __init__(self, key: PoolKey) -> None:
        tls = key.tls
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if tls is not None and tls.ca_bundle:
            context.load_verify_locations(cadata=tls.ca_bundle)
        else:
            context.load_default_certs()  # no bundle: the system's trust roots
        self.dns_names = tuple(tls.subject_alt_names) if tls is not None else ()
        self.uris = tuple(tls.subject_alt_name_uris) if tls is not None else ()
        self.server_name = (tls.server_name if tls is not None and tls.server_name
                            else key.host)
        if self.dns_names or self.uris:
            # Chain still verified (verify_mode stays CERT_REQUIRED); the name check is
            # the SAN lists', done in check_peer after the handshake.
            context.check_hostname = False
        if tls is not None and tls.client_cert_pem and tls.client_key_pem:
            _load_client_pair(context, tls.client_cert_pem, tls.client_key_pem)
        self.context = context

    def check_peer(self, cert: dict | None) -> str | None:  # type: ignore[type-arg]
        """None if the leaf satisfies the SAN lists (or there are none), else why not."""
        if not self.dns_names and not self.uris:
            return None
        entries = (cert or {}).get("subjectAltName", ())
        dns = [value for kind, value in entries if kind == "DNS"]
        uris = {value for kind, value in entries if kind == "URI"}
        if any(uri in uris for uri in self.uris):
            return None
        if any(dns_matches(pattern, name) for name in self.dns_names for pattern in dns):
            return None
        return "certificate matches none of the expected subject alternative names"


def _load_client_pair(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Attach an mTLS client certificate; a bad pair is logged and left out (the
    handshake then fails closed if the backend requires one)."""
    with tempfile.TemporaryDirectory(prefix="tunnelgate-tls-") as directory:
        cert_path = os.path.join(directory, "cert.pem")
        key_path = os.path.join(directory, "key.pem")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        try:
            context.load_cert_chain(cert_path, key_path)
        except (ssl.SSLError, ValueError) as exc:
            log.warning("backend TLS client certificate/key unusable: %s", exc)


def dns_matches(pattern: str, name: str) -> bool:
    """RFC 6125 §6.4: a certificate DNS name (``*.`` only as the whole leftmost label,
    matching exactly one label) against an expected host name; case-insensitive."""
    pattern = pattern.lower().rstrip(".")
    name = name.lower().rstrip(".")
    if pattern == name:
        return True
    if not pattern.startswith("*.") or "*" in pattern[2:]:
        return False
    head, dot, rest = name.partition(".")
    return bool(head) and bool(dot) and rest == pattern[2:] and "." in rest


