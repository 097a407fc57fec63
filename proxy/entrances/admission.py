"""Whether a new client connection is taken: the connection limit, the allow list, and
the client address a PROXY protocol header reports.

The allow list is checked against the socket peer, never against the address a PROXY
header claims: that one is chosen by whoever connects.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING

from proxy.entrances import proxyproto

if TYPE_CHECKING:
    from proxy.entrances.listener import Entrance, EntranceSettings

log = logging.getLogger("tunnelgate.http1")


def over_limit(entrance: Entrance) -> bool:
    """Whether ``entrance`` holds its most connections already (a new one is refused;
    those refused and still lingering do not count); a flood of refusals is logged as
    one line per interval."""
    settings = entrance.settings
    if len(entrance.connections) - entrance.refusing < settings.max_connections:
        return False
    refused = entrance.refusals.allow(entrance.loop.time())
    if refused is not None:
        log.warning("%s entrance: connection limit %d reached, refusing", settings.name,
                    settings.max_connections, extra={"refused_since_last": refused})
    return True


def peer_allowed(settings: EntranceSettings, client_ip: str | None) -> bool:
    """Whether the entrance's allow list (if any) admits the socket peer ``client_ip``."""
    allow = settings.allow
    if allow is None or client_ip is None:
        return True
    address = ipaddress.ip_address(client_ip)
    if any(address in network for network in allow):
        return True
    log.info("%s entrance: refused connection from %s", settings.name, client_ip)
    return False


def read_proxy_header(buf: bytearray, data: bytes,
                      settings: EntranceSettings) -> proxyproto.ProxyHeader | None:
    """Add ``data`` to ``buf`` and parse the PROXY header that must open the
    connection: the header once complete, None while more bytes are needed. Raises
    :class:`~proxy.entrances.proxyproto.ProxyHeaderError` (logged) for a bad one."""
    buf.extend(data)  # in place: the caller's buffer keeps what arrived
    try:
        return proxyproto.parse(buf)
    except proxyproto.ProxyHeaderError as exc:
        log.info("%s entrance: closing connection: %s", settings.name, exc)
        raise


def plain_ip(address: str) -> str:
    """IPv4-mapped IPv6 (``::ffff:a.b.c.d``) as plain IPv4; others unchanged."""
    if address.startswith("::ffff:") and "." in address:
        return address[7:]
    return address
