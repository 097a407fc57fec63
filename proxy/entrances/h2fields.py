"""An HTTP/2 request's header block, checked and taken apart in one pass (sans-IO).

The h2 library can check header blocks itself, with a chain of generators that visits
every byte of every field in Python; the entrance turns that off and checks here
instead, with the same rules (RFC 9113 §8.2 and §8.3) at C speed (``bytes.translate``
and ``in``), while it reads the fields it needs anyway. A block that breaks a rule is
malformed: :class:`~proxy.wire.request.Rejection` (400) on that stream alone (RFC 9113
§8.1.1 lets a server answer before it resets; the connection goes on).

The h2 library still checks, on every block, what needs its state: the stream's
order of frames, and a body against its ``content-length`` (RFC 9113 §8.1.1; a
mismatch ends the connection, so no request can carry bytes past its declared length
to an HTTP/1.1 backend).
"""

from __future__ import annotations

from typing import Final

from proxy.request import Headers
from proxy.wire.request import Rejection

# RFC 9113 §8.2.1: a name is visible ASCII (0x21-0x7e) minus upper case; a colon only
# opens a pseudo-header. Deleting the allowed characters leaves the illegal ones.
_NAME_CHARS: Final = bytes(c for c in range(0x21, 0x7F)
                           if not 0x41 <= c <= 0x5A and c != 0x3A)
# RFC 9113 §8.2.2: connection-specific fields make a request malformed.
_CONNECTION_SPECIFIC: Final = frozenset({b"connection", b"proxy-connection", b"keep-alive",
                                         b"transfer-encoding", b"upgrade"})
_PSEUDO: Final = frozenset({b":method", b":scheme", b":authority", b":path"})


class RequestHead:
    """What a request's header block says: the pseudo-headers, the regular fields (in
    order, cookies joined into one field as HTTP/1.1 has it, RFC 9113 §8.2.3), the
    Host field and the declared length if any."""

    __slots__ = ("method", "scheme", "authority", "path", "headers", "host", "length")

    def __init__(self) -> None:
        self.method = b""
        self.scheme = b""
        self.authority = b""
        self.path = b""
        self.headers: Headers = []
        self.host: bytes | None = None
        self.length: int | None = None


def read_head(fields: list[tuple[bytes, bytes]], max_headers: int) -> RequestHead:
    """Check and read a request header block; raises Rejection (400, or 431 past
    ``max_headers`` regular fields)."""
    head = RequestHead()
    headers = head.headers
    cookies: list[bytes] = []
    regular = False
    for name, value in fields:
        if name[:1] == b":":
            if regular or name not in _PSEUDO or _bad_value(value):
                raise Rejection(400, f"misplaced or malformed pseudo-header {name!r}")
            _pseudo(head, name, value)
            continue
        regular = True
        _check(name, value)
        if name == b"cookie":
            cookies.append(value)
            continue
        if name == b"host":
            head.host = value
        elif name == b"content-length":
            if head.length is not None or not value.isdigit():
                raise Rejection(400, "invalid content-length")
            head.length = int(value)
        headers.append((name, value))
    if cookies:
        headers.append((b"cookie", b"; ".join(cookies)))
    _complete(head)
    if len(headers) > max_headers:
        raise Rejection(431, f"more than {max_headers} header fields")
    return head


def read_trailers(fields: list[tuple[bytes, bytes]]) -> Headers:
    """A request's trailer block, checked as its header block (no pseudo-headers)."""
    trailers: Headers = []
    for name, value in fields:
        _check(name, value)
        trailers.append((name, value))
    return trailers


def _check(name: bytes, value: bytes) -> None:
    """RFC 9113 §8.2.1 and §8.2.2 for a regular field; raises Rejection (400)."""
    if not name or name.translate(None, _NAME_CHARS) or _bad_value(value):
        raise Rejection(400, f"malformed field {name!r}")
    if name in _CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
        raise Rejection(400, f"connection-specific field {name!r}")


def _bad_value(value: bytes) -> bool:
    """No NUL, CR or LF anywhere, no space or tab at either end (RFC 9113 §8.2.1)."""
    return bool(value) and (b"\r" in value or b"\n" in value or b"\x00" in value
                            or value[0] in b" \t" or value[-1] in b" \t")


def _pseudo(head: RequestHead, name: bytes, value: bytes) -> None:
    """One pseudo-header, each at most once (RFC 9113 §8.3)."""
    if name == b":method":
        seen, head.method = head.method, value
    elif name == b":path":
        seen, head.path = head.path, value
    elif name == b":authority":
        seen, head.authority = head.authority, value
    else:
        seen, head.scheme = head.scheme, value
    if seen:
        raise Rejection(400, f"repeated pseudo-header {name!r}")


def _complete(head: RequestHead) -> None:
    """RFC 9113 §8.3.1: :method, :scheme and a non-empty :path are required (CONNECT,
    which has none, is not served); a Host field must name what :authority names."""
    if head.method == b"CONNECT":
        raise Rejection(501, "CONNECT is not served")  # (as on HTTP/1.1)
    if not head.method or not head.scheme or not head.path:
        raise Rejection(400, "missing :method, :scheme or :path")
    if head.host is not None and head.authority and head.host != head.authority:
        raise Rejection(400, "Host differs from :authority")
