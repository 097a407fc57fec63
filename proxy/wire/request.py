"""Request-head rules llhttp leaves open (sans-IO): the version and method served,
Host presence/uniqueness/syntax, transfer codings, the request-target forms.

:func:`validate_head` turns what the parser collected into a :class:`RequestHead` or
raises :class:`Rejection`; the entrance only applies the answer.
"""

from __future__ import annotations

from typing import Final

from proxy.request import Header, Headers
from proxy.wire.framing import coding_list, content_length, named


class Rejection(Exception):
    """Raised from parser callbacks: answer ``status`` and close the connection."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


METHODS: Final = {m.encode(): m for m in (
    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE")}
# Host = uri-host [":" port] (RFC 9110 §7.2): reg-name/IPv4 characters, IP-literal
# brackets, the port colon. Deleting the allowed bytes must leave nothing.
_HOST_CHARS: Final = (b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
               b"-._~!$&'()*+,;=:[]%")
# Every byte a host may hold maps to itself, every other one to NUL (a NUL maps to
# itself, and is not allowed either): a host is valid when its translation holds no NUL.
_HOST_TABLE: Final = bytes(b if b in _HOST_CHARS else 0 for b in range(256))
_NUL: Final = 0
_COLON: Final = 0x3A  # ":"
# tchar (RFC 9110 §5.6.2), the bytes a method (and a field name) is made of.
TCHAR: Final = (b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                b"!#$%&'*+-.^_`|~")
_LONGEST_METHOD: Final = 32  # a longer first word is not taken for a method
_HASH: Final = 0x23  # "#"
_QUESTION: Final = 0x3F  # "?"


def valid_host(host: bytes) -> bool:
    """Host's characters, and after its colon (outside an IP literal's brackets, one
    colon at most) a port of digits only."""
    if _NUL in host.translate(_HOST_TABLE):
        return False
    if _COLON not in host:
        return True
    if host[:1] == b"[":  # an IP literal: "]" ends it, then nothing or ":" port
        end = host.find(b"]")
        if end < 0:
            return False
        return _port(host[end + 1:])
    at = host.index(b":")
    return at > 0 and _port(host[at:])


def _port(rest: bytes) -> bool:
    """What follows the host: nothing, or ":" and digits (RFC 3986: port = *DIGIT)."""
    return not rest or (rest[:1] == b":" and (len(rest) == 1 or rest[1:].isdigit()))


def asks_close(headers: Headers) -> bool:
    """A ``Connection`` field lists ``close`` (RFC 9112 §9.6: the connection then closes
    after the response, whatever else it lists)."""
    for name, value in headers:
        if len(name) == 10 and named(name, b"Connection", b"connection"):
            if b"close" in (token.strip().lower() for token in value.split(b",")):
                return True
    return False


def names_a_method(data: bytes) -> bool:
    """``data`` (a request's first bytes) begins with a token and a space: a method,
    if not one llhttp knows (RFC 9110 §9.1: any token is), rather than garbage."""
    space = data.find(b" ", 0, _LONGEST_METHOD + 1)
    return space > 0 and not data[:space].translate(None, TCHAR)


def check_line_start(start: bytes) -> None:
    """``start``, the first bytes of a request, may begin with empty lines (RFC 9112
    §2.2: a server ignores at least one), each a CRLF (or a lone LF, which §2.2 lets a
    recipient take for one); a bare CR there is invalid, not skipped (llhttp skips it):
    raises :class:`Rejection` (400)."""
    lead = len(start) - len(start.lstrip(b"\r\n"))
    if lead and 13 in start[:lead].replace(b"\r\n", b""):
        raise Rejection(400, "a bare CR before the request line")


def request_line_end(start: bytes) -> int:
    """Where the request line that ``start`` (the first bytes of a request) begins
    with ends: the index of its LF, after any empty lines before it; -1 while that
    line is not all there."""
    return start.find(b"\n", len(start) - len(start.lstrip(b"\r\n")))


def lacks_version(start: bytes) -> bool:
    """Whether ``start`` holds a whole request line that names no HTTP version after
    its target: HTTP/0.9's ``GET /``. llhttp then waits for more of a head that such a
    client never sends (it waits for the answer); the entrance answers 400 at once."""
    end = request_line_end(start)
    if end < 0:
        return False
    begin = len(start) - len(start.lstrip(b"\r\n"))
    return start[begin:end].rstrip(b"\r").count(b" ") < 2


def check_transfer_coding(te: bytes, has_length: bool, version: str) -> None:
    """RFC 9112 §6.1/§6.3: a request with Transfer-Encoding must end in exactly one
    ``chunked`` (else 400), may not also carry Content-Length (400, smuggling), may not
    be HTTP/1.0 (400); other codings before chunked are not implemented (501). The
    list is read as :func:`~proxy.wire.framing.coding_list` reads it."""
    if has_length:
        raise Rejection(400, "both Content-Length and Transfer-Encoding")
    if version == "1.0":
        raise Rejection(400, "Transfer-Encoding in an HTTP/1.0 request")
    codings = coding_list(te)
    if not codings or codings[-1] != b"chunked" or codings.count(b"chunked") != 1:
        raise Rejection(400, "chunked must be the final transfer coding, once")
    if len(codings) > 1:
        raise Rejection(501, "transfer codings other than chunked are not implemented")


class RequestHead:
    """A request head that passed :func:`validate_head`, as the entrance needs it (the
    first event of each request :class:`proxy.wire.server.ServerConnection` reads).

    ``host`` is the authority of an absolute-form target if there is one, else the
    Host header ("" when an HTTP/1.0 request has neither); ``chunked`` says the body is
    chunked, else ``length`` bytes follow (0: no body); ``upgrade`` is the lowered
    Upgrade token asked for (None without one); ``expect_continue`` says an HTTP/1.1
    client waits for ``100 Continue`` before sending its body (the entrance sends it
    once the body is wanted; an HTTP/1.0 client's expectation is ignored, RFC 9110
    §10.1.1; either way the field is this hop's and goes no further: a backend asked
    again would answer a 100 nobody waits for); ``connection`` says a
    Connection (or Proxy-Connection) field was sent (without one, an HTTP/1.1
    connection persists); ``empty_query`` says the target ended in a ``?`` with no
    query after it (``query`` is "" as without one: see :class:`proxy.request.Request`).
    ``version`` and ``headers`` are the request's; the connection core settles
    ``keep_alive`` (the connection persists after the answer, RFC 9112 §9.3) and
    ``switch`` (the Upgrade is to be relayed: see :func:`relayable_upgrade`).
    """

    __slots__ = ("method", "path", "query", "host", "chunked", "length", "upgrade",
                 "expect_continue", "connection", "empty_query", "version", "headers",
                 "keep_alive", "switch")

    def __init__(self, method: str, path: str, query: str, host: str, chunked: bool,
                 length: int, upgrade: str | None, expect_continue: bool,
                 connection: bool, empty_query: bool = False, version: str = "1.1",
                 headers: Headers | None = None) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.host = host
        self.chunked = chunked
        self.length = length
        self.upgrade = upgrade
        self.expect_continue = expect_continue
        self.connection = connection
        self.empty_query = empty_query
        self.version = version
        self.headers: Headers = [] if headers is None else headers
        self.keep_alive = True
        self.switch = False


def served_method(version: str, raw_method: bytes) -> str:
    """The method of a request in an HTTP version served here; raises
    :class:`Rejection` for another version (505), for none (400: llhttp reads a request
    line without one as HTTP/0.9, and :func:`lacks_version` refuses it so when the line
    arrives in pieces) or for CONNECT (501 rather than 405, which would owe an Allow
    list)."""
    if version != "1.1" and version != "1.0":
        if version == "0.9":
            raise Rejection(400, "no HTTP version on the request line")
        raise Rejection(505, f"HTTP/{version} not supported")
    method = METHODS.get(raw_method) or raw_method.decode("ascii")
    if method == "CONNECT":
        raise Rejection(501, "CONNECT is not served")
    return method


class KnownHost:
    """The last host one connection's requests named, checked and decoded.

    A keep-alive connection names the same host request after request: one equal to
    the last is neither checked nor decoded again. ``raw`` is always a valid host (it
    passed :func:`valid_host`), ``text`` its decoding.
    """

    __slots__ = ("raw", "text")

    def __init__(self) -> None:
        self.raw = b""
        self.text = ""

    def decode(self, host: bytes | None) -> str:
        """``host`` (valid: checked by the caller, or equal to ``raw``) as text,
        remembered; "" for None."""
        if host is None:
            return ""
        if host != self.raw:
            self.raw, self.text = host, host.decode("latin-1")
        return self.text


def check_host(host: bytes | None, count: int, version: str, known: KnownHost) -> None:
    """RFC 9112 §3.2: one valid Host field (required in HTTP/1.1); with two, the proxy
    and the backend might each pick a different one. ``host`` is the last of
    ``count``; raises :class:`Rejection` (400). ``known`` is a host already found
    valid."""
    if count > 1:
        raise Rejection(400, "more than one Host header")
    if host is None:
        if version == "1.1":
            raise Rejection(400, "missing Host header")
    elif host != known.raw and not valid_host(host):
        raise Rejection(400, "invalid Host header")


def validate_head(version: str, raw_method: bytes, url: bytes, headers: Headers,
                  known: KnownHost) -> RequestHead:
    """Check a parsed request head (llhttp already enforced the syntax it knows:
    digits and uniqueness of Content-Length, CL together with TE, bare CR/LF, ...) and
    extract its framing; raises :class:`Rejection` with the status to answer. An
    ``Expect: 100-continue`` field is taken out of ``headers`` (see
    :attr:`RequestHead.expect_continue`).

    One pass over ``headers``, comparing lengths before lowering a name: this runs
    for every request. ``known`` is the connection's last host (it learns this one).
    """
    method = served_method(version, raw_method)
    host = None
    hosts = 0
    te = None
    length = 0
    has_length = False
    upgrade = None
    met: Header | None = None  # an Expect: 100-continue field
    connection = False
    for name, value in headers:
        n = len(name)
        if n == 4:
            if named(name, b"Host", b"host"):
                hosts += 1
                host = value
        elif n == 17:
            if named(name, b"Transfer-Encoding", b"transfer-encoding"):
                te = value if te is None else te + b"," + value
        elif n == 14:
            if named(name, b"Content-Length", b"content-length"):
                length = content_length(value)  # llhttp checked digits and uniqueness
                has_length = True
        elif n == 7:
            if named(name, b"Upgrade", b"upgrade"):
                upgrade = value
        elif n == 6:
            if name.lower() == b"expect" and value.lower() == b"100-continue":
                met = (name, value)
        elif n == 10 or n == 16:  # llhttp reads Proxy-Connection as Connection too
            connection = connection or named(name, b"Connection", b"connection") \
                or named(name, b"Proxy-Connection", b"proxy-connection")
    check_host(host, hosts, version, known)
    if met is not None:
        headers.remove(met)  # met here, not forwarded
    if te is not None:
        check_transfer_coding(te, has_length, version)
    path, query, authority = split_target(url, method)
    if authority is not None:
        host = authority  # RFC 9112 §3.2.2: the target's authority replaces Host
    return RequestHead(
        method, path, query, known.decode(host), te is not None, length,
        upgrade.strip().lower().decode("latin-1") if upgrade else None,
        met is not None and version == "1.1", connection,
        not query and url[len(url) - 1] == _QUESTION, version, headers)


def relayable_upgrade(upgrade: str) -> bool:
    """Whether a switch to the lower-cased Upgrade list ``upgrade`` is relayed.

    Not one naming ``h2c``: HTTP/2 over cleartext by Upgrade is deprecated (RFC 9113
    §3.1), and a switched connection is a byte stream past every rule of this proxy,
    so a client could speak HTTP/2 to the backend with requests no route admitted
    ("h2c smuggling"). The request is served as a plain one instead (RFC 9110 §7.8
    lets a server ignore Upgrade); its Upgrade field is hop-by-hop and goes no further.
    """
    return "h2c" not in (token.strip() for token in upgrade.split(","))


def split_target(url: bytes, method: str) -> tuple[str, str, bytes | None]:
    """A request target as (path, query, the authority of an absolute-form target or
    None); raises :class:`Rejection` (400) for a target the proxy does not serve.

    Origin form (``/p?q``) and absolute form (``http://a/p?q``, RFC 9112 §3.2.2) are
    served; asterisk form only for OPTIONS (RFC 9112 §3.2.4); authority form is
    CONNECT's, refused before this. A fragment is dropped: it is never part of a
    target (RFC 9112 §3.2), and a client that sends one must not reach another path.
    """
    authority = None
    if url[:1] != b"/":
        if url == b"*":
            if method != "OPTIONS":
                raise Rejection(400, "asterisk-form target outside OPTIONS")
            return "*", "", None
        lowered = url[:8].lower()
        if lowered.startswith(b"http://"):
            rest = url[7:]
        elif lowered.startswith(b"https://"):
            rest = url[8:]
        else:
            raise Rejection(400, "invalid request target")
        end = len(rest)
        for sep in (b"/", b"?", b"#"):
            at = rest.find(sep)
            if 0 <= at < end:
                end = at
        authority, url = rest[:end], rest[end:]
        # userinfo (``user@host``) is deprecated and a classic way to disguise a host
        if not authority or b"@" in authority or not valid_host(authority):
            raise Rejection(400, "invalid authority in request target")
        if url[:1] != b"/":
            url = b"/" + url
    if _HASH in url:
        url = url[:url.find(b"#")]
    if _QUESTION not in url:
        return url.decode("latin-1"), "", authority
    query_at = url.find(b"?")
    return (url[:query_at].decode("latin-1"), url[query_at + 1:].decode("latin-1"),
            authority)
