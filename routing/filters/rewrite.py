"""URLRewrite: the path and the Host sent upstream are rewritten."""

from __future__ import annotations

from typing import Any, Final

from routing.fields import precise_hostname
from routing.filters.kind import FilterKind, same_shape
from routing.filters.paths import GATEWAY_KEYS, read_path_modifier, replace_prefix
from routing.gateway_refs import RouteScope
from routing.model import ConfigError, PathModifier, Rewrite
from routing.node import Node


def read(value: Any, path: str) -> Rewrite:
    node = Node(value, path, frozenset(("hostname", "path")))
    hostname = precise_hostname(node)
    return Rewrite(hostname=hostname or None, path=node.child("path", _read_path))


def _read_path(value: Any, path: str) -> PathModifier:
    node = Node(value, path, frozenset(("type", "replaceFullPath", "replacePrefixMatch")))
    return read_path_modifier(node, GATEWAY_KEYS)


def wire(r: Rewrite) -> dict:
    out: dict[str, Any] = {}
    if r.hostname:
        out["hostname"] = r.hostname
    if r.path is not None:
        out["path"] = {"type": r.path.type, GATEWAY_KEYS[r.path.type]: r.path.value}
    return out


def from_yaml(value: Any, path: str, route: RouteScope) -> dict:
    """URLRewrite, whose wire shape is Gateway API's (:func:`read` checks it): only
    the CRD's rule that a path modifier holds the value its type names is checked here,
    since the wire lets a missing value default to an empty one."""
    payload = same_shape(value, path, route)
    modifier = payload.get("path")
    if isinstance(modifier, dict):
        kind = modifier.get("type")
        key = GATEWAY_KEYS.get(kind) if isinstance(kind, str) else None
        if key is not None and modifier.get(key) is None:
            raise ConfigError(f"{path}.path.{key}", "required field is missing")
    return payload


def rewrite_path(path: str, matched_prefix: str, modifier: PathModifier) -> str:
    """The upstream path after a URLRewrite path modifier.

    ReplaceFullPath ⇒ the value (``/`` if empty). ReplacePrefixMatch ⇒
    :func:`~routing.filters.paths.replace_prefix`; without a matched prefix (Exact/regex
    match) the path is left unchanged. Query strings are not part of ``path`` and stay
    untouched.
    """
    if modifier.type == "ReplaceFullPath":
        return modifier.value or "/"
    if not matched_prefix:
        return path
    return replace_prefix(path, matched_prefix, modifier.value)


def rewrite_host(rewrite: Rewrite, host: str) -> str:
    """The Host sent upstream: the rewrite's hostname, else the original Host unchanged."""
    return rewrite.hostname or host


KIND: Final = FilterKind("URLRewrite", "urlRewrite", "url_rewrite", read, wire,
                         request=True, response=False, from_yaml=from_yaml,
                         path_modifier=True)
