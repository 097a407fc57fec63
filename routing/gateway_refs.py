"""What one HTTPRoute YAML conversion shares, and a ``backendRef`` resolved to a URL.

The conversion (:mod:`routing.gateway_api`) keeps its notes, the caller's
``backends`` mapping and what the file holds besides routes (Services and
ReferenceGrants, XBackendTrafficPolicies, Gateways) in one :class:`Context`; each
route's parts see it through a :class:`RouteScope`. :func:`resolve` turns a Service
reference (of a backendRef or a mirror) into the URL it is dialed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from routing.listeners import Gateways
from routing.model import ConfigError
from routing.node import Node
from routing.refs import ClusterView

CLUSTER_DOMAIN = "cluster.local"
# Status for refs and filters that cannot be served: the request is fine, the
# configuration cannot be served (RFC 9110 §15.6.1), as Gateway API asks for invalid refs.
UNSUPPORTED_STATUS = 500
# Service names and namespaces are RFC 1123 labels; anything else must never reach a
# URL (a name like "evil.example:80/x#" would redirect the backend off-cluster).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
REF_KEYS = frozenset(("group", "kind", "name", "namespace", "port"))
# Service port appProtocol (Kubernetes standard names, KEP-3726) → backend wire fields.
_APP_PROTOCOLS: MappingProxyType[str, MappingProxyType[str, Any]] = MappingProxyType({
    "kubernetes.io/h2c": MappingProxyType({"protocol": "h2c"}),  # HTTP/2, prior knowledge
    "kubernetes.io/ws": MappingProxyType({"websocket": True}),
})
_NO_FIELDS: MappingProxyType[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Note:
    """Something the conversion skipped, dropped or turned into an error status."""

    path: str     # the YAML field, e.g. documents[0].spec.rules[1].retry
    message: str


@dataclass(slots=True)
class Context:
    """What the whole conversion shares: the ``backends`` mapping, the keys of it that
    were used, the Services and ReferenceGrants of the file (None: it has none), and
    the notes so far."""

    backends: dict[str, str]
    view: ClusterView | None = None
    # "NAME.NAMESPACE" of a Service → the wire retryConstraint of its
    # XBackendTrafficPolicy (routing.traffic_policy).
    retry_constraints: dict[str, dict] = field(default_factory=dict)
    gateways: Gateways = field(default_factory=dict)  # Gateway documents: listeners
    used: set[str] = field(default_factory=set)
    notes: list[Note] = field(default_factory=list)

    def note(self, path: str, message: str) -> None:
        self.notes.append(Note(path, message))


@dataclass(frozen=True, slots=True)
class RouteScope:
    """What every part of one HTTPRoute needs to know while it is converted."""

    namespace: str
    context: Context


def ref_kind(ref: Node) -> str:
    """``kind "Bucket" (group "example.io")`` — for notes about a non-Service ref."""
    group = ref.string("group")
    return (f'kind "{ref.string("kind", default="Service")}"'
            + (f' (group "{group}")' if group else ""))


def resolve(ref: Node, route: RouteScope
            ) -> tuple[str | None, str | None, MappingProxyType[str, Any]]:
    """(URL, problem, protocol) of a reference: the URL of a Service (None for a kind
    this data plane cannot dial), why the reference is invalid (None if it is not: see
    :mod:`routing.refs` for what the file's Services and ReferenceGrants decide), and
    the wire fields the ``appProtocol`` of the Service port in the file asks for
    (:data:`_APP_PROTOCOLS`; none for an invalid reference)."""
    name = ref.string("name")
    if not name:
        raise ConfigError(ref.at("name"), "required field is missing")
    if (ref.string("group") not in ("", "core")
            or ref.string("kind", default="Service") != "Service"):
        return None, f"{ref_kind(ref)} is not a Service", _NO_FIELDS
    namespace = ref.string("namespace") or route.namespace
    for key, value in (("name", name), ("namespace", namespace)):
        if not DNS_LABEL.match(value):
            raise ConfigError(ref.at(key), f"invalid Service {key} {value!r}")
    if ref.get("port") is None:
        raise ConfigError(ref.at("port"), "a Service reference needs a port")
    port = ref.integer("port", 1, 65535)
    url = _service_url(name, namespace, port, route.context)
    view = route.context.view
    if view is None:
        return url, None, _NO_FIELDS
    problem = view.problem(route.namespace, namespace, name, port)
    if problem is not None:
        return url, problem, _NO_FIELDS
    return url, None, _APP_PROTOCOLS.get(view.app_protocol(namespace, name, port), _NO_FIELDS)


def _service_url(name: str, namespace: str, port: int, context: Context) -> str:
    """Where Service ``namespace/name`` is dialed: the caller's mapping, else its
    cluster DNS name."""
    mapped = context.backends.get(f"{name}.{namespace}")
    if mapped is not None:
        context.used.add(f"{name}.{namespace}")
        return mapped
    scheme = "https" if port == 443 else "http"
    return f"{scheme}://{name}.{namespace}.svc.{CLUSTER_DOMAIN}:{port}"
