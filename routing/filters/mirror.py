"""RequestMirror: a copy of (a share of) the requests goes to another backend, whose
answer is dropped (``proxy.exchange.mirror`` sends it)."""

from __future__ import annotations

from typing import Any, Final

from routing.backend_tls import read_tls, tls_wire
from routing.fields import INT32_MAX, backend_url, protocol
from routing.filters.kind import FilterKind
from routing.gateway_refs import REF_KEYS, RouteScope, resolve
from routing.model import ConfigError, Mirror
from routing.node import YAML, Node


def read(value: Any, path: str) -> Mirror:
    node = Node(value, path, frozenset(("backendUrl", "percent", "tls", "protocol")))
    percent = 100
    if node.get("percent") is not None:
        percent = node.integer("percent", -INT32_MAX - 1, INT32_MAX)
        if not 0 <= percent <= 100:
            raise ConfigError(node.at("percent"), f"mirror percent {percent} is not 0..100")
    return Mirror(
        backend_url=backend_url(node, "backendUrl"),
        percent=percent,
        tls=node.child("tls", read_tls),
        protocol=protocol(node),
    )


def wire(m: Mirror) -> dict:
    out: dict[str, Any] = {"backendUrl": m.backend_url, "percent": m.percent}
    if m.tls is not None:
        out["tls"] = tls_wire(m.tls)
    if m.protocol:
        out["protocol"] = m.protocol
    return out


def from_yaml(value: Any, path: str, route: RouteScope) -> dict | None:
    """The mirror's Service as a URL; ``None`` (dropped, with a note) when the ref is
    not a Service it can resolve, as the spec asks for an unresolvable mirror ref (a
    copy is never worth failing real traffic)."""
    node = Node(value, path, frozenset(("backendRef", "percent", "fraction")), YAML)
    if node.get("percent") is not None and node.get("fraction") is not None:
        raise ConfigError(node.at("fraction"), "only one of percent and fraction may be set")
    ref = node.node("backendRef", REF_KEYS)
    url, problem, fields = resolve(ref, route)
    if problem is not None:
        route.context.note(ref.path, f"{problem}: the mirror is dropped")
        return None
    out = {"backendUrl": url, "percent": _percent(node)}
    if "protocol" in fields:  # (a mirror has no websocket flag: it never upgrades)
        out["protocol"] = fields["protocol"]
    return out


def _percent(node: Node) -> int:
    """``percent``, or ``fraction`` as numerator*100/denominator clamped to 0..100."""
    if node.get("fraction") is None:
        return node.integer("percent", 0, 100, 100)
    fraction = node.node("fraction", frozenset(("numerator", "denominator")))
    if fraction.get("numerator") is None:
        raise ConfigError(fraction.at("numerator"), "required field is missing")
    numerator = fraction.integer("numerator", 0, INT32_MAX, 0)
    denominator = fraction.integer("denominator", 1, INT32_MAX, 100)
    return max(0, min(100, numerator * 100 // denominator))


# The copy is taken once the request body has been read: its step waits.
KIND: Final = FilterKind("RequestMirror", "requestMirror", "request_mirror", read, wire,
                         request=True, response=False, from_yaml=from_yaml,
                         renamed=((".backendUrl", ".backendRef"),), repeatable=True,
                         waits=True)
