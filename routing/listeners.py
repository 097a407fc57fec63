"""Gateway listeners → the entrances an HTTPRoute is served on.

A YAML file may carry the ``Gateway`` documents its HTTPRoutes attach to. Then each
route's ``parentRefs`` say which listeners it attaches to — those of the named Gateway
selected by ``sectionName`` (the listener's name) and ``port`` when given, all of them
otherwise — and the listeners' ``protocol`` says where it is served:

- ``HTTP`` → the cleartext entrances, ``tunnel`` and ``cluster``;
- ``HTTPS`` → ``cluster-tls``, the cluster entrance over TLS (``--listen-tls``);
- any other protocol (``TLS``, ``TCP``, ``UDP``) carries no HTTPRoute: nothing.

A route attached to both kinds of listener is served everywhere (no ``entrances``
list). A route whose references all name Gateways that are not in the file keeps the
old meaning (every entrance): nothing in the file says otherwise. A reference to a
Gateway of the file whose ``sectionName``/``port`` selects no listener attaches to
nothing, as a controller would leave it unaccepted (the caller notes it).

Listener ``hostname`` intersection and ``allowedRoutes`` are not applied: the route's
own ``hostnames`` decide, as on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from routing.model import CLUSTER, CLUSTER_TLS, ENTRANCES, TUNNEL, ConfigError

GATEWAY_GROUP = "gateway.networking.k8s.io"
_GATEWAY_VERSIONS = frozenset((f"{GATEWAY_GROUP}/v1", f"{GATEWAY_GROUP}/v1beta1"))
# Listener protocol → the entrances that serve it.
PROTOCOL_ENTRANCES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "HTTP": (TUNNEL, CLUSTER),
    "HTTPS": (CLUSTER_TLS,),
})


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    port: int | None
    protocol: str


Gateways = dict[str, tuple[Listener, ...]]  # "NAMESPACE/NAME" → its listeners


def read_gateways(docs: list[Any]) -> Gateways:
    """The listeners of every ``Gateway`` document (lists are looked into)."""
    gateways: Gateways = {}
    for doc in _objects(docs):
        if doc.get("kind") != "Gateway" or doc.get("apiVersion") not in _GATEWAY_VERSIONS:
            continue
        metadata = doc.get("metadata") or {}
        spec = doc.get("spec") or {}
        if not isinstance(metadata, dict) or not isinstance(spec, dict):
            continue
        key = f"{metadata.get('namespace') or 'default'}/{metadata.get('name')}"
        gateways[key] = tuple(
            Listener(str(item.get("name")), _port(item.get("port")),
                     str(item.get("protocol", "")))
            for item in spec.get("listeners") or () if isinstance(item, dict))
    return gateways


def _objects(docs: list[Any]) -> list[dict]:
    found = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") in ("List", "GatewayList"):
            found += _objects(list(doc.get("items") or ()))
        elif isinstance(doc, dict):
            found.append(doc)
    return found


def _port(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def route_entrances(parent_refs: Any, namespace: str, gateways: Gateways, path: str,
                    note: Callable[[str, str], None]) -> tuple[str, ...] | None:
    """The ``entrances`` of a route with these ``parentRefs`` (in ``namespace``), or
    None for every entrance. ``note(path, message)`` hears of a reference that
    attaches to no listener. Raises :class:`ConfigError` for a malformed reference."""
    if not gateways or not parent_refs:
        return None
    if not isinstance(parent_refs, list):
        raise ConfigError(path, "expected a list")
    served: set[str] = set()
    known = False
    for index, ref in enumerate(parent_refs):
        at = f"{path}[{index}]"
        listeners = _attached(ref, namespace, gateways, at)
        if listeners is None:
            continue  # a Gateway this file does not describe
        known = True
        if not listeners:
            note(at, "selects no listener of its Gateway in the file: not attached")
        for listener in listeners:
            served.update(PROTOCOL_ENTRANCES.get(listener.protocol, ()))
    if not known or served == set(ENTRANCES):
        return None
    return tuple(entrance for entrance in ENTRANCES if entrance in served)


def _attached(ref: Any, namespace: str, gateways: Gateways,
              path: str) -> tuple[Listener, ...] | None:
    """The listeners ``ref`` attaches to; None when its Gateway is not in the file."""
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
        raise ConfigError(path, "a parentRef needs a name")
    if ref.get("group", GATEWAY_GROUP) != GATEWAY_GROUP or ref.get("kind", "Gateway") != "Gateway":
        return None  # e.g. a Service (GAMMA): not a listener of ours
    key = f"{ref.get('namespace') or namespace}/{ref['name']}"
    listeners = gateways.get(key)
    if listeners is None:
        return None
    section, port = ref.get("sectionName"), ref.get("port")
    return tuple(listener for listener in listeners
                 if (section is None or listener.name == section)
                 and (port is None or listener.port == port))
