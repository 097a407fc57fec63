"""RequestRedirect: the request is answered with a redirect (Gateway API's port rules),
never forwarded."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Final

from routing.filters.kind import FilterKind
from routing.filters.paths import GATEWAY_KEYS, read_path_modifier, replace_prefix
from routing.fields import precise_hostname
from routing.gateway_refs import RouteScope
from routing.model import DEFAULT_PORTS, REDIRECT_STATUSES, ConfigError, PathModifier, Redirect
from routing.node import YAML, Node
from routing.values import clip

_KEYS = frozenset(("scheme", "hostname", "port", "statusCode", "path"))
# The wire's redirect path holds its value under "value", whatever its type.
_WIRE_PATH_KEYS: Final = MappingProxyType({"ReplaceFullPath": "value",
                                           "ReplacePrefixMatch": "value"})


def read(value: Any, path: str) -> Redirect:
    node = Node(value, path, _KEYS)
    scheme = node.string("scheme")
    if scheme and scheme not in DEFAULT_PORTS:
        raise ConfigError(node.at("scheme"),
                          f'unknown scheme "{clip(scheme)}" (http or https)')
    hostname = precise_hostname(node)
    status = node.integer("statusCode", 0, 599)
    if status and status not in REDIRECT_STATUSES:
        raise ConfigError(node.at("statusCode"),
                          f"redirect status {status} is not one of {REDIRECT_STATUSES}")
    return Redirect(
        scheme=scheme or None,
        hostname=hostname or None,
        port=node.integer("port", 0, 65535) or None,
        status_code=status or 302,
        path=node.child("path", _read_path),
    )


def _read_path(value: Any, path: str) -> PathModifier:
    return read_path_modifier(Node(value, path, frozenset(("type", "value"))),
                              _WIRE_PATH_KEYS)


def wire(r: Redirect) -> dict:
    out: dict[str, Any] = {}
    for key, value in (("scheme", r.scheme), ("hostname", r.hostname), ("port", r.port),
                       ("statusCode", r.status_code)):
        if value:
            out[key] = value
    if r.path is not None:
        out["path"] = {"type": r.path.type, "value": r.path.value}
    return out


def from_yaml(value: Any, path: str, route: RouteScope) -> dict:
    node = Node(value, path, _KEYS, YAML)
    out = {key: node.get(key) for key in ("scheme", "hostname", "port", "statusCode")
           if node.get(key) is not None}
    if node.get("path") is not None:
        out["path"] = _path_from_yaml(
            node.node("path", frozenset(("type", "replaceFullPath", "replacePrefixMatch"))))
    return out


def _path_from_yaml(node: Node) -> dict:
    """Redirect paths carry their value under ``value`` on the wire (rewrite paths keep
    the Gateway API keys)."""
    kind = node.string("type")
    key = GATEWAY_KEYS.get(kind)
    if key is None:
        raise ConfigError(node.at("type"), f'unknown path modifier type "{kind}"')
    for other in GATEWAY_KEYS.values():
        if other != key and node.get(other) is not None:
            raise ConfigError(node.at(other), f'not used by path modifier type "{kind}"')
    node.required(key)  # (the CRD: the value its type names must be there)
    return {"type": kind, "value": node.string(key)}


def split_host_port(host: str) -> tuple[str, int | None]:
    """``host[:port]`` → (host, port); IPv6 stays bracketed; a bad port counts as none."""
    if host.startswith("["):
        end = host.find("]")
        if end != -1:
            rest = host[end + 1:]
            port = rest[1:] if rest.startswith(":") else ""
            return host[:end + 1], int(port) if port.isdigit() else None
        return host, None
    if ":" in host and host.count(":") == 1:
        name, port = host.split(":")
        return name, int(port) if port.isdigit() else None
    return host, None


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def redirect_location(redirect: Redirect, scheme: str, host: str, path: str, query: str,
                      matched_prefix: str) -> str:
    """The ``Location`` of a RequestRedirect (Gateway API's port rules).

    - scheme: ``redirect.scheme``, else the request's scheme.
    - host: ``redirect.hostname``, else the request Host without its port.
    - port: ``redirect.port`` if set; else none when ``redirect.scheme`` is set (its
      well-known port); else the port of the request Host (the listener port the client
      dialed). Never printed when it is the default port of the resulting scheme.
    - path: unchanged without a path modifier; ReplaceFullPath ⇒ the value;
      ReplacePrefixMatch ⇒ :func:`~routing.filters.paths.replace_prefix` with the
      matched prefix, or the value itself when the winning match had no prefix.
    - query: the raw request query, preserved.
    """
    out_scheme = redirect.scheme or scheme
    request_name, request_port = split_host_port(host)
    name = _bracket(redirect.hostname) if redirect.hostname else request_name
    if redirect.port is not None:
        port: int | None = redirect.port
    elif redirect.scheme:
        port = None
    else:
        port = request_port
    if port is not None and port != DEFAULT_PORTS.get(out_scheme):
        name = f"{name}:{port}"
    modifier = redirect.path
    if modifier is None:
        out_path = path
    elif modifier.type == "ReplaceFullPath":
        out_path = modifier.value or "/"
    elif matched_prefix:
        out_path = replace_prefix(path, matched_prefix, modifier.value)
    else:
        out_path = modifier.value or "/"
    location = f"{out_scheme}://{name}{out_path}"
    return f"{location}?{query}" if query else location


# The redirect is the request's whole answer: a rewrite beside it could never apply.
KIND: Final = FilterKind("RequestRedirect", "requestRedirect", "request_redirect", read,
                         wire, request=True, response=False, from_yaml=from_yaml,
                         renamed=((".path.value", ".path"),), excludes="URLRewrite",
                         answers=True, path_modifier=True)
