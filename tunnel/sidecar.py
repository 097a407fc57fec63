"""The tunnel entrance's trust rules, and the cloudflared ingress that points at it.

Only cloudflared reaches the tunnel entrance (loopback or a unix socket),
so only there do the edge's headers mean anything:

- ``CF-Connecting-IP`` is the client address the edge vouches for; it becomes
  ``request.client_ip``.
- ``X-Forwarded-For`` is *replaced* by that address. The edge appends the client IP to
  whatever XFF the client sent (cloudflared #1426), so every entry but the last is
  attacker-controlled; the Handler appends ``client_ip`` to the incoming XFF, hence we
  drop the incoming one and the backend sees exactly the edge-vouched client
  . Without a valid ``CF-Connecting-IP`` nothing is vouched for and XFF is
  left as it came (the Handler then appends the socket peer, as any proxy would).
- ``CF-Visitor: {"scheme":"https"}`` is the scheme the client used at the edge; it
  becomes ``request.scheme`` (and so ``X-Forwarded-Proto``).

The cluster entrance does the opposite (``proxy.entrances.policy.cluster_prepare``).
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Final

import yaml

from proxy.request import Request
from routing.fields import hostname_problem
from routing.values import shown

log = logging.getLogger("tunnelgate.tunnel")

DEFAULT_SERVICE: Final = "http://127.0.0.1:8082"
UNIX_SERVICE: Final = "unix:/run/tunnelgate/origin.sock"

_CF_CONNECTING_IP: Final = b"cf-connecting-ip"
_CF_VISITOR: Final = b"cf-visitor"
_XFF: Final = b"x-forwarded-for"
_MAX_VISITOR: Final = 256  # the edge sends '{"scheme":"https"}'; anything long is not the edge
_SCHEMES: Final = frozenset({"http", "https"})


def prepare(request: Request) -> None:
    """``EntranceSettings.prepare`` hook of the tunnel entrance: apply the edge's word.

    Invalid values are ignored (logged at debug): the request keeps its socket peer
    and scheme.
    """
    client_ip = _connecting_ip(request.header(_CF_CONNECTING_IP))
    if client_ip is not None:
        request.client_ip = client_ip
        request.headers = [(n, v) for n, v in request.headers if n.lower() != _XFF]
    scheme = _visitor_scheme(request.header(_CF_VISITOR))
    if scheme is not None:
        request.scheme = scheme


def _connecting_ip(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        text = value.strip().decode("ascii")
        if "%" not in text:  # a zone id is local to a host; the edge never sends one
            return str(ipaddress.ip_address(text))
    except (UnicodeDecodeError, ValueError):
        pass
    log.debug("ignoring invalid CF-Connecting-IP %r", value[:64])
    return None


def _visitor_scheme(value: bytes | None) -> str | None:
    if value is None or len(value) > _MAX_VISITOR:
        return None
    try:
        visitor = json.loads(value)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        visitor = None
    scheme = visitor.get("scheme") if isinstance(visitor, dict) else None
    if not isinstance(scheme, str) or scheme not in _SCHEMES:
        log.debug("ignoring unusable CF-Visitor %r", value[:64])
        return None
    return scheme


def render_ingress(hostnames: list[str], service: str = DEFAULT_SERVICE) -> str:
    """The ``ingress:`` section of a cloudflared ``config.yml`` for the sidecar.

    Always a single catch-all rule pointing at ``service``: cloudflared's own hostname
    match is case-sensitive and keeps a trailing dot, so per-hostname rules would send
    ``APP.Example.COM`` or ``app.example.com.`` to a fallback instead of tunnelgate,
    whose table matches hosts case-insensitively with port and trailing dot stripped.
    With one catch-all no ``http_status:404`` fallback is needed either: tunnelgate
    answers unknown hosts itself. ``hostnames`` (lower-cased; RFC 1123 names as an
    HTTPRoute's, a wildcard only as a leading ``*.``, never a port, never a name only
    the cluster's DNS resolves) are checked and listed in a comment as
    the public hostnames to route to the tunnel. ``service`` is ``http(s)://host:port``
    or ``unix:``/``unix+tls:`` with an absolute socket path. Raises ``ValueError`` on
    anything else.

    With a remotely-managed tunnel (``--token``) the ingress lives in the dashboard
    instead; the same single rule applies there.
    """
    _check_service(service)
    names = [_check_hostname(h) for h in hostnames]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate hostname(s): {', '.join(duplicates)}")
    lines = ["# cloudflared ingress for the tunnelgate sidecar (tunnelgate cloudflared-config)",
             "# One catch-all rule: tunnelgate's table does the host matching (cloudflared's",
             "# is case-sensitive and keeps a trailing dot), and answers unknown hosts itself."]
    if names:
        lines.append("# Route these public hostnames to the tunnel (DNS / dashboard):")
        lines += [f"#   {name}" for name in names]
    body = yaml.safe_dump({"ingress": [{"service": service}]}, sort_keys=False)
    return "\n".join(lines) + "\n" + body


# Names only the cluster's DNS resolves (docs/knative.md: never publish them): a
# Service's ``NAME.NAMESPACE.svc[.cluster.local]`` and anything under the default
# cluster domain. A name of one label (``NAME``, ``localhost``) is in no public zone.
_CLUSTER_SUFFIXES = (".svc", ".svc.cluster.local", ".cluster.local")


def _check_hostname(hostname: str) -> str:
    name = hostname.strip().lower()
    bare = name[2:] if name.startswith("*.") else name
    problem: str | None
    if ":" in name:
        problem = "a port is not allowed"
    else:
        problem = hostname_problem(name, wildcard=True) or _cluster_local(bare)
    if problem:
        raise ValueError(f"ingress hostname {shown(hostname)}: {problem}")
    return name


def _cluster_local(name: str) -> str | None:
    """Why ``name`` (a valid hostname without its wildcard) cannot be a public
    hostname, or None."""
    if "." not in name:
        return ("a single label is no public name (publish a name in your domain, "
                "e.g. app.example.com)")
    if f".{name}".endswith(_CLUSTER_SUFFIXES):
        return ("a cluster-local name: publishing it would expose an in-cluster "
                "Service to the internet (docs/knative.md); publish the public name "
                "instead")
    return None


def _check_service(service: str) -> None:
    scheme, sep, rest = service.partition(":")
    if scheme in ("unix", "unix+tls") and rest.startswith("/") and len(rest) > 1:
        return
    if scheme in ("http", "https") and rest.startswith("//"):
        authority = rest[2:].split("/", 1)[0]
        if authority and not authority.startswith(":") and "@" not in authority:
            return
    raise ValueError(f"ingress service {service!r}: expected http(s)://host:port, "
                     "unix:/path or unix+tls:/path")
