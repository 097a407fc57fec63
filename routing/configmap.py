"""A routes file handed over as the Kubernetes ConfigMap manifest that carries it.

The sidecar set-up ships its HTTPRoute YAML inside a ConfigMap
(``deploy/sidecar/routes.yaml``, data key ``routes.yaml``); ``serve --config`` reads the
file the kubelet mounts from that key. Given the manifest itself, the converter would
skip the ConfigMap and find no routes at all, so :func:`unwrap` reads the data key the
mounted file would hold: the value of the one data key that is HTTPRoute YAML or wire
JSON. A manifest whose ConfigMaps hold none, or more than one, is an error naming them.
A file with HTTPRoute documents of its own is never unwrapped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from routing.model import ConfigError

# What a data value holding a config looks like: wire JSON, or YAML with an HTTPRoute
# (or HTTPRouteList) document. Only the choice of key rests on this; the value chosen
# is then converted and validated in full.
_ROUTE_KIND = re.compile(r"^\s*kind:\s*[\"']?HTTPRoute(List)?[\"']?\s*$", re.MULTILINE)
_OWN_ROUTES = frozenset(("HTTPRoute", "HTTPRouteList", "List"))


@dataclass(frozen=True, slots=True)
class Embedded:
    """The config text inside a ConfigMap manifest, and where it sits there."""

    text: str  # the data value: what the mounted file holds
    key: str  # its data key (the mounted file's name)
    configmap: str  # NAMESPACE/NAME
    key_line: int  # the manifest's line of the data key
    # The manifest's line of the value's first line: only a literal block scalar
    # (``key: |``) keeps the value's lines as they are (None otherwise).
    first_line: int | None

    def line(self, inner: int | None) -> int:
        """The manifest's line of line ``inner`` of :attr:`text` (None: the key's)."""
        if inner is None or self.first_line is None:
            return self.key_line
        return self.first_line + inner - 1

    def describe(self) -> str:
        return f"ConfigMap {self.configmap}, data key {self.key}"


def unwrap(text: str) -> Embedded | None:
    """The config inside ``text`` if ``text`` is a ConfigMap manifest (with no routes of
    its own), else None. Raises :class:`ConfigError` (path ``documents[i]...``) when its
    ConfigMaps hold no config, or more than one."""
    if "ConfigMap" not in text:  # cheap: most files are not manifests
        return None
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return None  # the converter reports it, with its line
    kinds = [_scalar(_field(doc, "kind")) for doc in documents]
    if any(kind in _OWN_ROUTES for kind in kinds) or "ConfigMap" not in kinds:
        return None
    configmaps = [(index, _name(doc)) for index, (doc, kind)
                  in enumerate(zip(documents, kinds)) if kind == "ConfigMap"]
    found = [(f"documents[{index}].data", embedded) for index, name in configmaps
             for embedded in _held(documents[index], name)]
    if len(found) == 1:
        return found[0][1]
    if not found:
        listed = ", ".join(name for _, name in configmaps)
        raise ConfigError(f"documents[{configmaps[0][0]}]",
                          f"ConfigMap {listed}: no data key holds HTTPRoute YAML or wire "
                          "JSON, so there are no routes to read; pass the routes file "
                          "itself")
    keys = "; ".join(embedded.describe() for _, embedded in found)
    raise ConfigError(found[1][0], f"more than one data key holds routes ({keys}); pass "
                      "the file serve reads, e.g. kubectl get configmap NAME "
                      "-o jsonpath='{.data.KEY}' | tunnelgate check -")


def _held(doc: yaml.Node, name: str) -> list[Embedded]:
    """The data values of ConfigMap ``doc`` that hold a config."""
    data = _field(doc, "data")
    if not isinstance(data, yaml.MappingNode):
        return []
    held = []
    for key, value in data.value:
        if not (isinstance(key, yaml.ScalarNode) and isinstance(value, yaml.ScalarNode)):
            continue
        if value.value.lstrip().startswith("{") or _ROUTE_KIND.search(value.value):
            first = value.start_mark.line + 2 if value.style == "|" else None
            held.append(Embedded(value.value, key.value, name, key.start_mark.line + 1,
                                 first))
    return held


def _field(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for name, value in node.value:
            if isinstance(name, yaml.ScalarNode) and name.value == key:
                return value
    return None


def _scalar(node: yaml.Node | None) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _name(doc: yaml.Node) -> str:
    meta = _field(doc, "metadata")
    namespace = _scalar(_field(meta, "namespace")) if meta is not None else None
    name = _scalar(_field(meta, "name")) if meta is not None else None
    return f"{namespace or 'default'}/{name or '?'}"
