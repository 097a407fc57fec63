"""Header arithmetic of forwarding: hop-by-hop cleanup and the X-Forwarded-* set.

Pure functions over ``list[tuple[bytes, bytes]]`` header lists, applied by the Handler
between the routing decision and the upstream call.
"""

from __future__ import annotations

from typing import Final

from proxy.request import Headers
from proxy.wire.framing import accepts_trailers, transfer_codings

# RFC 9110 §7.6.1 connection-specific fields plus the legacy ones a reverse proxy must
# not forward (the Go ReverseProxy list). Content-Length is dropped
# too: the upstream side re-frames the body itself from Body.length.
_HOP_BY_HOP_REQUEST: Final = frozenset({
    b"connection", b"proxy-connection", b"keep-alive", b"proxy-authenticate",
    b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade",
    b"content-length", b"host",
})
# Content-Length stays on responses: the entrance honours it as the body length.
_HOP_BY_HOP_RESPONSE: Final = frozenset({
    b"connection", b"proxy-connection", b"keep-alive", b"proxy-authenticate",
    b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade",
})
_HOP_BY_HOP_UPGRADE_RESPONSE: Final = _HOP_BY_HOP_RESPONSE - {b"upgrade"}
# A Connection value that is one of these nominates nothing beyond the fixed sets
# (``keep-alive`` and ``close`` are nearly all real traffic): no second pass needed.
_QUIET_REQUEST: Final = _HOP_BY_HOP_REQUEST | {b"close"}
_QUIET_RESPONSE: Final = _HOP_BY_HOP_RESPONSE | {b"close"}

# The X-Forwarded-Proto field of the common schemes, made once: a lookup of a string
# whose hash is kept, where encoding it would make a new bytes object and a new pair per
# request.
_PROTO_FIELDS: Final = {scheme: (b"X-Forwarded-Proto", scheme.encode("ascii"))
                        for scheme in ("http", "https")}

# Request headers replaced by this proxy's own X-Forwarded-* values.
_DROP_REQUEST: Final = _HOP_BY_HOP_REQUEST | {b"x-forwarded-proto", b"x-forwarded-host"}


def _length_mask(names: frozenset[bytes]) -> int:
    mask = 0
    for name in names:
        mask |= 1 << len(name)
    return mask


# The lengths of the names the passes below act on, as bit masks: a name of another
# length is kept without being lowered (most fields, per request and per response),
# and testing a bit is two machine instructions where a set lookup hashes.
_REQUEST_LENGTHS: Final = _length_mask(_DROP_REQUEST | {b"x-forwarded-for"})
_RESPONSE_LENGTHS: Final = _length_mask(_HOP_BY_HOP_RESPONSE)


def connection_tokens(headers: Headers) -> frozenset[bytes]:
    """Lower-cased tokens of every ``Connection`` header line (RFC 9110 §7.6.1)."""
    tokens: set[bytes] = set()
    for name, value in headers:
        if len(name) == 10 and name.lower() == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return frozenset(tokens)


def _nominated(headers: Headers, hop_by_hop: frozenset[bytes]) -> frozenset[bytes]:
    """Names a ``Connection`` header nominates beyond the fixed hop-by-hop set.

    Usually empty (``keep-alive``, ``close``, ``upgrade``), so the caller's single pass
    is all the work; only an unusual nomination costs a second filtering pass.
    """
    tokens = connection_tokens(headers)
    return tokens - hop_by_hop if tokens else tokens


def upstream_request_headers(
    headers: Headers,
    host: bytes,
    original_host: bytes,
    client_ip: str | None,
    scheme: str,
    upgrade: str | None,
) -> Headers:
    """The header list sent upstream for a client request.

    - ``Host`` first: the client's Host (spec MUST forward it unmodified) or the
      URLRewrite hostname the caller passes instead. ``X-Forwarded-Host`` always
      carries ``original_host``, the Host the client asked for.
    - Hop-by-hop fields and the fields named in ``Connection`` are removed, ``TE``
      among them (RFC 9110 §10.1.4: it describes one hop). A client's TE that lists
      ``trailers`` is sent on as ``TE: trailers`` alone: this hop takes trailers too
      (they are relayed to that client), gRPC needs it, and it is the one value
      HTTP/2 allows; it is named in ``Connection`` as RFC 9110 §7.6.1 asks of a
      sender of TE (an HTTP/2 backend's connection drops that field). The upgrade
      pair stays when the request is a protocol switch.
    - The ``X-Forwarded-*`` fields last (:func:`_append_forwarded`).
    """
    out: Headers = [(b"Host", host)]
    xff: bytes | None = None
    te_trailers = False
    nominating = False
    for pair in headers:
        name = pair[0]
        if not (_REQUEST_LENGTHS >> len(name)) & 1:
            out.append(pair)  # the pair itself: no new tuple per kept field
            continue
        if name == b"Host" or name == b"Content-Length":
            continue  # (common spellings, not lowered: Host set above, the length re-framed)
        value = pair[1]
        lname = name.lower()
        if lname in _DROP_REQUEST:
            if lname == b"te":
                te_trailers = te_trailers or accepts_trailers(value)
            elif lname == b"connection" and value.strip().lower() not in _QUIET_REQUEST:
                nominating = True  # names a field beyond the fixed set (rare)
            continue
        if lname == b"x-forwarded-for":
            xff = value if xff is None else xff + b", " + value
            continue
        out.append(pair)
    if nominating:
        extra = _nominated(headers, _HOP_BY_HOP_REQUEST)
        if extra:
            out = [(n, v) for n, v in out if n.lower() not in extra]
    if te_trailers or upgrade is not None:
        _append_hop_by_hop(out, te_trailers, upgrade is not None, headers)
    _append_forwarded(out, xff, client_ip, scheme, original_host)
    return out


def _append_hop_by_hop(out: Headers, te_trailers: bool, upgrade: bool,
                       headers: Headers) -> None:
    """This hop's own fields: ``TE: trailers``, the upgrade pair, and the
    ``Connection`` field naming them (RFC 9110 §7.6.1)."""
    if te_trailers:
        out.append((b"TE", b"trailers"))
    if upgrade:
        out.append((b"Connection", b"TE, Upgrade" if te_trailers else b"Upgrade"))
        out.append((b"Upgrade", _upgrade_value(headers)))
    else:
        out.append((b"Connection", b"TE"))


def _append_forwarded(out: Headers, xff: bytes | None, client_ip: str | None,
                      scheme: str, original_host: bytes) -> None:
    """``X-Forwarded-For`` (``xff``: the client's own, joined) gains the client address
    the entrance vouches for; ``X-Forwarded-Proto`` and ``X-Forwarded-Host`` are set
    from what this proxy saw, replacing client-sent values (backends must not trust
    forged ones)."""
    if client_ip is not None:
        ip = client_ip.encode("ascii")
        xff = ip if xff is None else xff + b", " + ip
    if xff is not None:
        out.append((b"X-Forwarded-For", xff))
    proto = _PROTO_FIELDS.get(scheme)
    out.append(proto if proto is not None
               else (b"X-Forwarded-Proto", scheme.encode("ascii")))
    out.append((b"X-Forwarded-Host", original_host))


def _upgrade_value(headers: Headers) -> bytes:
    for name, value in headers:
        if name.lower() == b"upgrade":
            return value
    return b"websocket"


def downstream_response_headers(headers: Headers, keep_upgrade: bool = False) -> Headers:
    """The backend's response headers minus hop-by-hop fields.

    ``keep_upgrade`` keeps ``Upgrade`` for a 101 answer; the entrance writes its own
    ``Connection`` header. A ``Transfer-Encoding`` is kept only for the codings other
    than ``chunked`` (e.g. ``gzip``), which the body still carries as relayed: the
    entrance frames the body itself and must announce them.
    """
    dropped = _HOP_BY_HOP_UPGRADE_RESPONSE if keep_upgrade else _HOP_BY_HOP_RESPONSE
    out: Headers = []
    nominating = False
    for pair in headers:
        name = pair[0]
        if not (_RESPONSE_LENGTHS >> len(name)) & 1:
            out.append(pair)
            continue
        value = pair[1]
        if value == b"keep-alive" and name == b"Connection":
            continue  # (nearly every backend's): dropped, and it nominates nothing
        lname = name.lower()
        if lname in dropped:
            if lname == b"connection" and value.strip().lower() not in _QUIET_RESPONSE:
                nominating = True
            elif lname == b"transfer-encoding":
                codings = transfer_codings(value)[0]
                if codings:
                    out.append((name, codings))
            continue
        out.append(pair)
    if nominating:
        extra = _nominated(headers, _HOP_BY_HOP_RESPONSE)
        if extra:
            out = [(n, v) for n, v in out if n.lower() not in extra]
    return out


def upstream_target(base_path: str, base_query: str, path: str, query: str,
                    empty_query: bool = False) -> str:
    """The request-target sent upstream (origin form): the client's, as it came,
    unless a filter rewrote the path or the backend URL adds to it.

    A backend URL may carry a base path and query (ExternalBackends,
    BackendRef.url; split once by :func:`routing.values.backend_base`): the base path
    is prepended with exactly one ``/`` between them and base query parameters the
    request lacks are appended. ``empty_query``: the client's target ended in a bare
    ``?``, which stays (RFC 3986 §6.2.3: ``/p?`` and ``/p`` are different URIs).
    """
    if base_path:
        path = base_path + (path if path.startswith("/") else "/" + path)
    elif not path:
        path = "/"
    if base_query:
        query = _merge_query(query, base_query)
    if query:
        return f"{path}?{query}"
    return path + "?" if empty_query else path


def _merge_query(query: str, base_query: str) -> str:
    present = {pair.split("=", 1)[0] for pair in query.split("&") if pair}
    extra = [pair for pair in base_query.split("&")
             if pair and pair.split("=", 1)[0] not in present]
    return "&".join(([query] if query else []) + extra)
