"""CORS (GEP-1767): the filter's payload, and its decisions as pure functions.

A :class:`CorsPolicy` is a ``Cors`` payload with its origin patterns parsed once. The
Handler asks :func:`is_preflight` in the request phase and, for a preflight, answers
``PREFLIGHT_STATUS`` with :func:`preflight_headers` without calling the backend (GEP-1767:
a path with a CORS filter must not pass preflights upstream; response filters do not
run on it). For every other request it merges :func:`response_headers` into the
backend's response (:func:`with_response_headers`). Both accept a plain ``Cors`` payload or a precompiled :class:`CorsPolicy`
(``CompiledRule.cors``).

Decisions, checked against the Gateway API conformance tests ``HTTPRouteCORS`` and
``CORSAllowCredentialsBehavior``:

- Origins match per scheme, host and port, with default-port equivalence (``:80`` for
  http, ``:443`` for https). A pattern host starting with ``*`` matches greedily to the
  left (``https://*.bar.com`` matches ``https://a.b.bar.com``, never ``https://bar.com``);
  a host of only ``*`` matches every host of that scheme and port; the pattern ``*``
  matches every origin. An empty ``allowOrigins`` also admits every origin (the GEP's
  ``allowCredentials`` example and the credentials conformance route configure no
  origins and expect the Origin echoed). Malformed configured patterns never match.
- ``Origin: null``, an empty Origin and anything that is not ``scheme://host[:port]`` are
  never allowed, not even by ``*``: echoing ``null`` would hand sandboxed documents the
  same access as the configured origins.
- The allowed Origin is always echoed, never ``*`` (allowed by the GEP for
  uncredentialed requests and required for credentialed ones), with ``Vary: Origin``.
- ``allowMethods``/``allowHeaders`` of ``*`` echo ``Access-Control-Request-Method`` /
  ``-Headers`` (omitted when the request did not send them), so no ``*`` is ever needed.
- ``Access-Control-Allow-Credentials: true`` appears only when ``allowCredentials`` is
  on. A credentialed actual request (Cookie or Authorization) on a route without
  ``allowCredentials`` still gets the echoed Origin but no Allow-Credentials, so the
  browser withholds the response (conformance expects exactly these two facts).
- ``exposeHeaders: ["*"]`` is sent as ``*`` unless credentials are involved; then the
  names of the actual response's headers are listed instead.
- Preflight status is **200**: the conformance suite accepts 200 in every version
  (some versions accept only 200), 204 only in some.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Sequence

from routing.fields import INT32_MAX, bounded_strings
from routing.filters.kind import FilterKind
from routing.matchers import Headers, first_value
from routing.model import DEFAULT_PORTS, ConfigError, Cors
from routing.node import Node

PREFLIGHT_STATUS: Final = 200
DEFAULT_MAX_AGE: Final = 5  # GEP-1767 default for Access-Control-Max-Age

ALLOW_ORIGIN: Final = b"Access-Control-Allow-Origin"
ALLOW_CREDENTIALS: Final = b"Access-Control-Allow-Credentials"
ALLOW_METHODS: Final = b"Access-Control-Allow-Methods"
ALLOW_HEADERS: Final = b"Access-Control-Allow-Headers"
EXPOSE_HEADERS: Final = b"Access-Control-Expose-Headers"
MAX_AGE: Final = b"Access-Control-Max-Age"
_CORS_RESPONSE_NAMES: Final = frozenset(n.lower() for n in (
    ALLOW_ORIGIN, ALLOW_CREDENTIALS, ALLOW_METHODS, ALLOW_HEADERS, EXPOSE_HEADERS, MAX_AGE))
_PREFLIGHT_VARY = (b"Origin", b"Access-Control-Request-Method",
                   b"Access-Control-Request-Headers")
# What the policy sets on an actual request, in place of the backend's own.
_REPLACED: Final = frozenset(n.lower() for n in (
    ALLOW_ORIGIN, ALLOW_CREDENTIALS, EXPOSE_HEADERS))


@dataclass(frozen=True, slots=True)
class Origin:
    """A serialized origin taken apart; ``port`` defaulted for http/https."""

    scheme: str
    host: str
    port: int | None


def parse_origin(text: str) -> Origin | None:
    """``scheme://host[:port]`` → :class:`Origin`; ``None`` for ``null``/malformed."""
    scheme, sep, rest = text.partition("://")
    if not sep or not scheme or not rest or any(c in rest for c in "/?#@ \t"):
        return None
    host, port_text = rest, ""
    if rest.startswith("["):
        end = rest.find("]")
        if end == -1:
            return None
        host, tail = rest[:end + 1], rest[end + 1:]
        if tail and not tail.startswith(":"):
            return None
        port_text = tail[1:]
    elif ":" in rest:
        host, port_text = rest.rsplit(":", 1)
    scheme = scheme.lower()
    port: int | None = DEFAULT_PORTS.get(scheme)
    if port_text or rest.endswith(":"):
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
    if not host:
        return None
    return Origin(scheme, host.lower(), port)


def _host_matches(pattern: str, host: str) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("*"):
        suffix = pattern[1:]
        return host.endswith(suffix) and len(host) > len(suffix)
    return pattern == host


class CorsPolicy:
    """A ``Cors`` payload ready to answer requests (origin patterns parsed once)."""

    __slots__ = ("cors", "any_origin", "patterns", "max_age")

    def __init__(self, cors: Cors) -> None:
        self.cors = cors
        self.any_origin = not cors.allow_origins or "*" in cors.allow_origins
        self.patterns = tuple(p for p in map(parse_origin, cors.allow_origins) if p)
        self.max_age = cors.max_age or DEFAULT_MAX_AGE

    def allows(self, origin: str) -> bool:
        """Whether the request's ``Origin`` value is allowed by this policy."""
        parsed = parse_origin(origin)
        if parsed is None:
            return False
        if self.any_origin:
            return True
        return any(p.scheme == parsed.scheme and p.port == parsed.port
                   and _host_matches(p.host, parsed.host) for p in self.patterns)


def _join(values: tuple[str, ...]) -> bytes:
    return ", ".join(values).encode()


def policy_of(cors: Cors | CorsPolicy) -> CorsPolicy:
    """``cors`` as a policy (compiled now if it is a plain ``Cors`` payload)."""
    return cors if isinstance(cors, CorsPolicy) else CorsPolicy(cors)


def is_preflight(method: str, headers: Headers) -> bool:
    """OPTIONS carrying ``Access-Control-Request-Method`` (the CORS preflight, Fetch standard)."""
    return (method == "OPTIONS"
            and first_value(headers, b"access-control-request-method") is not None)


def is_credentialed(headers: Headers) -> bool:
    """A request carrying credentials the gateway can see (cookies or Authorization)."""
    return any(name.lower() in (b"cookie", b"authorization") for name, _ in headers)


def _allowed_origin(policy: CorsPolicy, headers: Headers) -> bytes | None:
    origin = first_value(headers, b"origin")
    if origin is None or not policy.allows(origin.decode("latin-1")):
        return None
    return origin


def _origin_headers(policy: CorsPolicy, headers: Headers,
                    vary: bytes) -> tuple[Headers, bool]:
    """The part every CORS answer shares: ``Vary`` always; for an allowed Origin also
    the echoed Origin and Allow-Credentials (when on). The flag says it was allowed."""
    out: Headers = [(b"Vary", vary)]
    origin = _allowed_origin(policy, headers)
    if origin is None:
        return out, False
    out.append((ALLOW_ORIGIN, origin))
    if policy.cors.allow_credentials:
        out.append((ALLOW_CREDENTIALS, b"true"))
    return out, True


def preflight_headers(cors: Cors | CorsPolicy, headers: Headers) -> Headers:
    """Headers of the preflight answer (status :data:`PREFLIGHT_STATUS`, empty body).

    A disallowed or missing Origin gets no ``Access-Control-*`` headers at all.
    """
    policy = policy_of(cors)
    out, allowed = _origin_headers(policy, headers, b", ".join(_PREFLIGHT_VARY))
    if not allowed:
        return out
    spec = policy.cors
    _allow(out, ALLOW_METHODS, spec.allow_methods, headers, b"access-control-request-method")
    _allow(out, ALLOW_HEADERS, spec.allow_headers, headers, b"access-control-request-headers")
    if "*" in spec.expose_headers:
        if not spec.allow_credentials:
            out.append((EXPOSE_HEADERS, b"*"))
    elif spec.expose_headers:
        out.append((EXPOSE_HEADERS, _join(spec.expose_headers)))
    out.append((MAX_AGE, str(policy.max_age).encode()))
    return out


def _allow(out: Headers, field: bytes, configured: tuple[str, ...], headers: Headers,
           requested: bytes) -> None:
    """Append Allow-Methods or Allow-Headers (``field``) to a preflight answer: the
    ``configured`` list, or for ``*`` what the preflight's ``requested`` header asked
    for (nothing when it asked for nothing)."""
    if "*" in configured:
        echoed = first_value(headers, requested)
        if echoed:
            out.append((field, echoed))
    elif configured:
        out.append((field, _join(configured)))


def with_response_headers(headers: Headers, added: Headers) -> Headers:
    """``headers`` (a response's) with ``added`` (:func:`response_headers`' output):
    a field the policy sets replaces the backend's own, since a browser fails the
    check when Allow-Origin has two values; ``Vary`` is a list and only gains one."""
    names = {name.lower() for name, _ in added} & _REPLACED
    if names:
        headers = [pair for pair in headers if pair[0].lower() not in names]
    return headers + added


def response_headers(cors: Cors | CorsPolicy, request_headers: Headers,
                     backend_headers: Sequence[tuple[bytes, ...]] = ()) -> Headers:
    """Headers to add to the response of an actual (non-preflight) request.

    Always ``Vary: Origin`` (the answer depends on it); for an allowed Origin also the
    echoed Origin, Allow-Credentials (when on) and Expose-Headers. ``backend_headers``
    (the response's own headers) are only consulted to spell out ``exposeHeaders: *``
    for a credentialed exchange, where ``*`` is not allowed.
    """
    policy = policy_of(cors)
    out, allowed = _origin_headers(policy, request_headers, b"Origin")
    if not allowed:
        return out
    spec = policy.cors
    if "*" in spec.expose_headers:
        if spec.allow_credentials or is_credentialed(request_headers):
            names = dict.fromkeys(n.decode("latin-1") for n, _ in backend_headers
                                  if n.lower() not in _CORS_RESPONSE_NAMES)
            if names:
                out.append((EXPOSE_HEADERS, _join(tuple(names))))
        else:
            out.append((EXPOSE_HEADERS, b"*"))
    elif spec.expose_headers:
        out.append((EXPOSE_HEADERS, _join(spec.expose_headers)))
    return out


def read(value: Any, path: str) -> Cors:
    node = Node(value, path, frozenset(("allowOrigins", "allowCredentials", "allowMethods",
                                         "allowHeaders", "exposeHeaders", "maxAge")))
    max_age = node.integer("maxAge", -INT32_MAX - 1, INT32_MAX)
    if max_age < 0:
        raise ConfigError(node.at("maxAge"), f"CORS maxAge {max_age} must be >= 0")
    return Cors(
        allow_origins=node.items("allowOrigins", bounded_strings("CORS origin")),
        allow_credentials=node.boolean("allowCredentials"),
        allow_methods=node.strings("allowMethods"),
        allow_headers=node.items("allowHeaders", bounded_strings("header name")),
        expose_headers=node.items("exposeHeaders", bounded_strings("header name")),
        max_age=max_age,
    )


def wire(c: Cors) -> dict:
    out: dict[str, Any] = {}
    for key, values in (("allowOrigins", c.allow_origins), ("allowMethods", c.allow_methods),
                        ("allowHeaders", c.allow_headers),
                        ("exposeHeaders", c.expose_headers)):
        if values:
            out[key] = list(values)
    if c.allow_credentials:
        out["allowCredentials"] = True
    if c.max_age:
        out["maxAge"] = c.max_age
    return out


# Both phases: it answers preflights in the request phase and adds the
# Access-Control-* headers to actual responses; both share its one compiled policy.
KIND: Final = FilterKind("CORS", "cors", "cors", read, wire, request=True, response=True,
                         compile=CorsPolicy)
