"""The cluster objects an HTTPRoute's Service references are checked against.

A controller resolves every ``backendRef`` against the cluster: a Service that does
not exist, a port it does not expose, or a reference into another namespace that no
``ReferenceGrant`` there permits makes the reference invalid, and Gateway API asks
that requests sent to it fail with 500 while the route's other backends keep serving.
A YAML file fed to :mod:`routing.gateway_api` can carry the same objects (a manifest
bundle, a ``kubectl get -o yaml`` dump); when it does, :class:`ClusterView` holds what
they say and the conversion checks references as a controller would:

- a file with any ``Service`` or ``ReferenceGrant`` document is read as the cluster's
  state for namespaces: a cross-namespace reference needs a ``ReferenceGrant`` in the
  Service's namespace naming HTTPRoutes of the route's namespace (and the Service, or
  every Service);
- a file with any ``Service`` document is also read as the cluster's list of Services:
  a reference to one not in it, or to a port its ``spec.ports`` does not list, is
  invalid;
- the ``appProtocol`` of the Service port a reference names (matched by ``port``
  number) says how to speak to the backend (:meth:`ClusterView.app_protocol`).

A file with neither keeps every reference (existence and grants are invisible from it).
Only the fields these checks read are looked at; the API server validates the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

GATEWAY_GROUP = "gateway.networking.k8s.io"
_GRANT_VERSIONS = frozenset((f"{GATEWAY_GROUP}/v1beta1", f"{GATEWAY_GROUP}/v1"))


@dataclass(frozen=True, slots=True)
class Grant:
    """One ReferenceGrant: in ``namespace``, HTTPRoutes of ``from_namespaces`` may refer
    to the Services named in ``names`` (``None``: to every Service)."""

    namespace: str
    from_namespaces: frozenset[str]
    names: frozenset[str] | None

    def admits(self, route_namespace: str, namespace: str, name: str) -> bool:
        return (namespace == self.namespace and route_namespace in self.from_namespaces
                and (self.names is None or name in self.names))


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The Services (``"NAME.NAMESPACE"`` → their ports, each with its ``appProtocol``
    or ``""``; ``None`` when the file lists no Service, so existence is not checked)
    and ReferenceGrants of a file."""

    services: dict[str, dict[int, str]] | None
    grants: tuple[Grant, ...]

    def problem(self, route_namespace: str, namespace: str, name: str,
                port: int) -> str | None:
        """Why a reference from an HTTPRoute in ``route_namespace`` to Service
        ``namespace/name`` port ``port`` is invalid, or ``None`` if it is valid."""
        if namespace != route_namespace and not any(
                grant.admits(route_namespace, namespace, name) for grant in self.grants):
            return (f"no ReferenceGrant in namespace {namespace!r} lets HTTPRoutes of "
                    f"namespace {route_namespace!r} refer to Service {name!r}")
        if self.services is None:
            return None
        ports = self.services.get(f"{name}.{namespace}")
        if ports is None:
            return f"Service {namespace}/{name} is not in the file"
        if ports and port not in ports:
            return f"Service {namespace}/{name} has no port {port}"
        return None

    def app_protocol(self, namespace: str, name: str, port: int) -> str:
        """The ``appProtocol`` of port ``port`` of Service ``namespace/name`` (``""``
        when the file does not have that Service or port, or the port sets none)."""
        if self.services is None:
            return ""
        return self.services.get(f"{name}.{namespace}", {}).get(port, "")


def read_view(docs: list[Any]) -> ClusterView | None:
    """The view of the Service and ReferenceGrant documents among ``docs`` (``List``
    documents are read item by item); ``None`` if there is neither."""
    services: dict[str, dict[int, str]] = {}
    grants: list[Grant] = []
    seen_grant = False
    for doc in _objects(docs):
        kind = doc.get("kind")
        if kind == "Service" and doc.get("apiVersion") == "v1":
            name, namespace = _name(doc)
            if name:
                services[f"{name}.{namespace}"] = _ports(doc.get("spec"))
        elif kind == "ReferenceGrant" and doc.get("apiVersion") in _GRANT_VERSIONS:
            seen_grant = True
            grant = _grant(doc)
            if grant is not None:
                grants.append(grant)
    if not services and not seen_grant:
        return None
    return ClusterView(services or None, tuple(grants))


def _objects(docs: list[Any]) -> Iterator[dict]:
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            yield from _objects(doc["items"])
        else:
            yield doc


def _name(doc: dict) -> tuple[str, str]:
    """(name, namespace) of an object; the namespace defaults to ``default``."""
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict):
        return "", "default"
    name, namespace = metadata.get("name"), metadata.get("namespace") or "default"
    return (name if isinstance(name, str) else ""), str(namespace)


def _ports(spec: Any) -> dict[int, str]:
    """The ports a Service exposes, each with its ``appProtocol`` (``""``: none set);
    empty: none listed, so any port is taken."""
    ports = spec.get("ports") if isinstance(spec, dict) else None
    if not isinstance(ports, list):
        return {}
    found: dict[int, str] = {}
    for entry in ports:
        if isinstance(entry, dict) and isinstance(entry.get("port"), int):
            protocol = entry.get("appProtocol")
            found[entry["port"]] = protocol if isinstance(protocol, str) else ""
    return found


def _grant(doc: dict) -> Grant | None:
    """The part of a ReferenceGrant about HTTPRoutes referring to Services (None if
    it grants them nothing)."""
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return None
    sources = frozenset(
        str(entry.get("namespace")) for entry in _entries(spec.get("from"))
        if entry.get("group") == GATEWAY_GROUP and entry.get("kind") == "HTTPRoute")
    targets = [entry for entry in _entries(spec.get("to"))
               if entry.get("group", "") in ("", "core") and entry.get("kind") == "Service"]
    if not sources or not targets:
        return None
    names: frozenset[str] | None = frozenset(
        str(entry["name"]) for entry in targets if entry.get("name"))
    if any(not entry.get("name") for entry in targets):
        names = None  # an entry without a name grants every Service
    return Grant(_name(doc)[1], sources, names)


def _entries(value: Any) -> list[dict]:
    return [entry for entry in value if isinstance(entry, dict)] \
        if isinstance(value, list) else []
