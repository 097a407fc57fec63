"""Whether a new client connection is taken: the connection limit, the allow list, and
the client address a PROXY protocol header reports; and whether a request read whole
is shed before it is parsed (load shedding, :func:`shed_at_read`).

The allow list is checked against the socket peer, never against the address a PROXY
header claims: that one is chosen by whoever connects.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from typing import TYPE_CHECKING, Final, Protocol

from proxy.entrances import proxyproto
from proxy.wire.server import State

if TYPE_CHECKING:
    from proxy.entrances.http1 import HTTP1Protocol
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


# -- load shedding at the read

# A field that could give the request a body, end or switch the connection, or wait
# for a 100 (looked for anywhere in the head, case-blind: a false match only sends the
# request the parsed way).
_NOT_AT_READ: Final = re.compile(
    rb"content-length|transfer-encoding|connection|upgrade|expect", re.IGNORECASE)
_HEAD_END: Final = b"\r\n\r\n"
_LINE_END: Final = b"\r\n"
_VERSION: Final = b" HTTP/1.1"


class ReadShedder(Protocol):
    """The load shedder as an entrance asks it at a read
    (:class:`proxy.exchange.shedding.LoadShedder`)."""

    def hold_time(self) -> float: ...

    def overloaded(self) -> bool: ...

    def shed_head(self, head: bytes, date_line: bytes) -> bytes | None: ...


def shed_at_read(conn: HTTP1Protocol, shedder: ReadShedder, data: bytes) -> bool:
    """Answer ``data`` with the shedder's 503 before it is parsed, if the proxy is
    over its limit and ``data`` is exactly one HTTP/1.1 ``GET`` head with no field that
    could give it a body or end the connection, read while the connection has nothing
    else under way; its connection is then kept and not read for the Retry-After
    (or somewhat longer: ``shedder.hold_time()``).
    False: parse it as any other read (the Handler may still shed it).

    Why at the read: the wait a shed answer adds is the rest of the loop turn it was
    read in, and every request read in a turn starts at its end (:mod:`proxy.flow.turn`).
    Nothing of the bytes is parsed; they are all consumed, so the next read starts a
    new message for llhttp, as after any bodyless request (RFC 9112 §6.3: without
    Content-Length or Transfer-Encoding a request has no body). A malformed head read
    whole gets the 503 instead of its 400; nothing of it went anywhere."""
    if (conn.core.state is not State.IDLE or not conn.serving(None) or conn.draining
            or not shedder.overloaded()):
        return False
    end = data.find(_HEAD_END)
    line = data.find(_LINE_END)
    if (end != len(data) - 4 or not data.startswith(b"GET ")
            or data[line - 9:line] != _VERSION or _NOT_AT_READ.search(data) is not None):
        return False
    answer = shedder.shed_head(data, conn.entrance.dates.line())
    if answer is None:
        return False
    conn.write(answer)
    conn.hold_reading(shedder.hold_time())
    conn.arm(conn.timer_kind)  # its idle (or first head's) wait starts again
    return True
