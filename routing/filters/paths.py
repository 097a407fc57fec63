"""The path modifier that RequestRedirect and URLRewrite share (``ReplaceFullPath``,
``ReplacePrefixMatch``): its reader and the prefix replacement."""

from __future__ import annotations

from types import MappingProxyType
from typing import Final, Mapping
from urllib.parse import quote, unquote

from routing.fields import FIELD_VALUE, bounded_string
from routing.model import PATH_MODIFIER_TYPES, PATH_SAFE, ConfigError, PathModifier
from routing.node import Node
from routing.values import clip, shown

# Gateway API's key of each modifier type's value (a rewrite's on the wire too; the
# wire's redirect puts either under "value").
GATEWAY_KEYS: Final = MappingProxyType({"ReplaceFullPath": "replaceFullPath",
                                        "ReplacePrefixMatch": "replacePrefixMatch"})


def read_path_modifier(node: Node, value_keys: Mapping[str, str]) -> PathModifier:
    """A path modifier whose value key depends on its type (``value_keys``: redirect
    and rewrite paths differ)."""
    kind = node.string("type")
    if kind not in PATH_MODIFIER_TYPES:
        raise ConfigError(node.at("type"), f'unknown path modifier type "{clip(kind)}"')
    key = value_keys[kind]
    for other in set(value_keys.values()) - {key}:
        if node.get(other):
            raise ConfigError(node.at(other), f'not used by path modifier type "{kind}"')
    text = bounded_string(node, key, "path")
    if text and not text.startswith("/"):
        raise ConfigError(node.at(key), f"path {shown(text)} must start with '/'")
    if not FIELD_VALUE.match(text):
        raise ConfigError(node.at(key), "path must not contain control characters")
    # The value goes on a request line or into a Location: what a path may not hold
    # (a space, a tab, "?", "#", non-ASCII...) is percent-encoded (UTF-8), as a URL
    # library would; "%XX" escapes already there stay as they are.
    return PathModifier(kind, quote(text, safe=PATH_SAFE + "%"))


def replace_prefix(path: str, matched_prefix: str, replacement: str) -> str:
    """ReplacePrefixMatch joined element-wise, satisfying every row of Gateway API's table.

    Drop every trailing ``/`` from the matched prefix (``/`` becomes empty), take the
    request path after it (empty or starting with ``/``), append that to the
    replacement minus its trailing ``/``; an empty result is ``/``. This satisfies
    every row of the spec table: ``/foo/`` with prefix ``/foo`` and replacement
    ``/xyz`` gives ``/xyz/``; prefix ``/`` and ``/xyz`` on ``/foo`` gives ``/xyz/foo``.

    ``path`` is the raw (percent-encoded) path while ``matched_prefix`` is in decoded
    form, as it was matched; when the raw path does not start with it literally (the
    prefix was percent-encoded on the wire), the suffix is taken from the decoded path
    and re-encoded.
    """
    stem = matched_prefix.rstrip("/")
    if path.startswith(stem):
        suffix = path[len(stem):]
    else:
        suffix = quote(unquote(path)[len(stem):], safe=PATH_SAFE)
    return replacement.rstrip("/") + suffix or "/"
