"""One HTTPRoute rule → wire rules: its matches, filters, backendRefs, timeouts and
retry, with Gateway API's defaults filled in and the CRD's rules on them checked
(:mod:`routing.gateway_api` has the whole list). Each filter's payload is translated
by its type's registry entry (:mod:`routing.filterkinds`)."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from routing.filterkinds import KINDS, PAYLOAD_KEYS, conflict
from routing.gateway_refs import REF_KEYS, UNSUPPORTED_STATUS, RouteScope, resolve
from routing.model import ConfigError
from routing.node import YAML, Node, join, yaml_type
from routing.values import parse_duration

# Never dialed (unavailableStatus answers first); ".invalid" is reserved (RFC 2606).
UNRESOLVED_URL = "http://unresolved.invalid"

ROOT_PATH = MappingProxyType({"type": "PathPrefix", "value": "/"})
# GEP-2257 duration subset accepted by HTTPRoute timeouts.
_GEP_2257 = re.compile(r"([0-9]{1,5}(h|m|s|ms)){1,4}\Z")

# Gateway API MaxItems limits (apis/v1/httproute_types.go).
_MAX_FILTERS = _MAX_BACKENDS = _MAX_VALUE_MATCHES = 16
_MAX_MATCHES = 64
_MAX_WEIGHT = 1_000_000

# Accepted and not acted on (reported as notes): this data plane has no session affinity.
_DROPPED_RULE_KEYS = MappingProxyType({
    "sessionPersistence": "ignored: tunnelgate has no session affinity"})
_RULE_KEYS = frozenset(("name", "matches", "filters", "backendRefs", "timeouts",
                        "retry", *_DROPPED_RULE_KEYS))
_BACKEND_KEYS = REF_KEYS | {"weight", "filters"}
# Gateway API filter types this data plane cannot apply, by payload key: valid, but
# their rule or backend fails closed (a skipped filter could be a security control).
_UNSUPPORTED = MappingProxyType({"ExtensionRef": "extensionRef",
                                 "ExternalAuth": "externalAuth"})
_FILTER_KEYS = frozenset(("type", *PAYLOAD_KEYS, *_UNSUPPORTED.values()))


@dataclass(slots=True)
class Origin:
    """Where one wire rule came from, to name YAML fields in validation errors."""

    spec: str
    rule: str
    filters: list[int] = field(default_factory=list)  # source index per wire filter
    backend_filters: list[list[int]] = field(default_factory=list)


def convert_rule(value: Any, path: str, route: RouteScope,
                 spec_path: str) -> tuple[dict, Origin]:
    """The wire rule of the HTTPRoute rule ``value`` at ``path`` (without hostnames and
    entrances, which are the route's) and where its parts came from."""
    rule = Node(value, path, _RULE_KEYS, YAML)
    origin = Origin(spec=spec_path, rule=rule.path)
    matches = [_match(Node(v, p, frozenset(("path", "headers", "queryParams", "method")),
                           YAML))
               for v, p in rule.entries("matches", _MAX_MATCHES)]
    filters, origin.filters, supported = _filters(rule, route)
    backends = []
    for value, path in rule.entries("backendRefs", _MAX_BACKENDS):
        backend, sources = _backend(Node(value, path, _BACKEND_KEYS, YAML), route)
        backends.append(backend)
        origin.backend_filters.append(sources)
    _check_prefix_replacements(rule, matches)
    _check_answer_alone(rule)
    # A rule without backends goes on the wire as null, the way Go encodes a nil slice.
    wire: dict[str, Any] = {"matches": matches or [{"path": dict(ROOT_PATH)}],
                            "backends": backends or None}
    if filters:
        wire["filters"] = filters
    if rule.get("timeouts") is not None:
        wire["timeouts"] = _timeouts(rule.node("timeouts",
                                               frozenset(("request", "backendRequest"))))
    if rule.get("retry") is not None:
        wire["retry"] = _retry(rule.node("retry", frozenset(("codes", "attempts", "backoff"))))
    if not supported:
        wire["unavailableStatus"] = UNSUPPORTED_STATUS
    for key, message in _DROPPED_RULE_KEYS.items():
        if rule.get(key) is not None:
            route.context.note(rule.at(key), message)
    return wire, origin


def _check_prefix_replacements(rule: Node, matches: list[dict]) -> None:
    """Reject a ``ReplacePrefixMatch`` path modifier (of a redirect or rewrite, of the
    rule or of a backendRef) unless the rule has exactly one match and it is a
    PathPrefix, as the CRD's CEL rules on HTTPRouteRule do. ``matches`` are the
    converted ones, defaults filled in; an absent ``matches`` defaults to one PathPrefix
    match, but an explicit empty list has none. (The CEL rules for backendRefs test
    ``exists_one``, so two backendRefs with such a filter slip past them: a quirk, not
    a permission; any one is rejected here.)"""
    if rule.get("matches") is None:
        return
    if len(matches) != 1:
        problem = f"the rule has {len(matches) or 'no'} matches"
    elif matches[0]["path"]["type"] != "PathPrefix":
        problem = f"its match is {matches[0]['path']['type']}"
    else:
        return
    owners = [(rule.get("filters"), rule.at("filters"))]
    owners += [(value.get("filters"), join(path, "filters"))
               for value, path in rule.entries("backendRefs", _MAX_BACKENDS)]
    for filters, path in owners:
        for index, value in enumerate(filters or ()):
            kind = KINDS.get(value["type"])
            if kind is None or not kind.path_modifier:
                continue
            modifier = value[kind.key].get("path")  # (payloads are mappings by now)
            if isinstance(modifier, dict) and modifier.get("type") == "ReplacePrefixMatch":
                raise ConfigError(f"{path}[{index}].{kind.key}.path.type",
                                  "ReplacePrefixMatch needs the rule to have exactly one "
                                  f"match, a PathPrefix; {problem}")


def _check_answer_alone(rule: Node) -> None:
    """Reject a rule-level filter that answers the request itself (a
    ``RequestRedirect``) in a rule with backendRefs, as the CRD's CEL rule on
    HTTPRouteRule does: the answer is the rule's whole answer, so its backends could
    never be reached. (Filters are checked by then: each is a mapping with a known
    type.)"""
    if not rule.get("backendRefs"):
        return
    for index, value in enumerate(rule.get("filters") or ()):
        kind = KINDS.get(value["type"])
        if kind is not None and kind.answers:
            raise ConfigError(f"{rule.at('filters')}[{index}].type",
                              f"{kind.type} filter must not be used together with "
                              "backendRefs")


def _match(match: Node) -> dict:
    wire: dict[str, Any] = {"path": _path_match(match)}
    for key in ("headers", "queryParams"):
        values = [_value_match(Node(v, p, frozenset(("type", "name", "value")), YAML))
                  for v, p in match.entries(key, _MAX_VALUE_MATCHES)]
        if values:
            wire[key] = values
    if match.get("method") is not None:
        wire["method"] = match.get("method")
    return wire


def _path_match(match: Node) -> dict:
    if match.get("path") is None:
        return dict(ROOT_PATH)
    node = match.node("path", frozenset(("type", "value")))
    kind = node.string("type", default="PathPrefix")
    value = node.string("value", default="/")
    if kind in ("Exact", "PathPrefix") and not value.startswith("/"):
        raise ConfigError(node.at("value"), f"path {value!r} must start with '/'")
    return {"type": kind, "value": value}


def _value_match(node: Node) -> dict:
    """A header or query match; types and names are checked by ``parse_config``."""
    return {"type": node.string("type", default="Exact"), "name": node.required("name"),
            "value": node.required("value")}


def _timeouts(node: Node) -> dict:
    """GEP-2257 strings → wire ``request`` / ``backend``; zero durations are left out."""
    seconds: dict[str, float] = {}
    wire: dict[str, str] = {}
    for key, wire_key in (("request", "request"), ("backendRequest", "backend")):
        text = node.string(key)
        if not text:
            continue
        if not _GEP_2257.match(text):
            raise ConfigError(node.at(key), f"invalid duration {text!r} (GEP-2257: up "
                                            "to four groups of 1-5 digits and h, m, s or ms)")
        seconds[key] = parse_duration(text)
        if seconds[key]:
            wire[wire_key] = text
    if seconds.get("request") and seconds.get("backendRequest", 0) > seconds["request"]:
        raise ConfigError(node.at("backendRequest"),
                          "backendRequest must not be longer than request (GEP-1742)")
    return wire


def _retry(node: Node) -> dict:
    """GEP-1731 ``retry`` → the wire's (the same fields; ``backoff`` a GEP-2257
    duration). The values are checked by the wire validation."""
    wire = {key: node.get(key) for key in ("codes", "attempts") if node.get(key) is not None}
    backoff = node.string("backoff")
    if backoff:
        if not _GEP_2257.match(backoff):
            raise ConfigError(node.at("backoff"), f"invalid duration {backoff!r} (GEP-2257)")
        wire["backoff"] = backoff
    return wire


def _backend(node: Node, route: RouteScope) -> tuple[dict, list[int]]:
    weight = node.integer("weight", 0, _MAX_WEIGHT, 1)  # Gateway API default weight
    url, problem, protocol = resolve(node, route)
    filters, sources, supported = _filters(node, route)
    wire: dict[str, Any] = {"url": url or UNRESOLVED_URL, "weight": weight, **protocol}
    constraint = route.context.retry_constraints.get(
        f"{node.string('name')}.{node.string('namespace') or route.namespace}")
    if url is not None and constraint is not None:
        wire["retryConstraint"] = constraint
    if filters:
        wire["filters"] = filters
    if problem is not None:
        route.context.note(node.path, f"{problem}: this backend answers "
                                      f"{UNSUPPORTED_STATUS}")
    if problem is not None or not supported:
        # It stays in the weighted pool, so exactly its share of the traffic gets the
        # error (Gateway API: requests to an invalid backendRef fail, the others don't).
        wire["unavailableStatus"] = UNSUPPORTED_STATUS
    return wire, sources


def _filters(owner: Node, route: RouteScope) -> tuple[list[dict], list[int], bool]:
    """Convert ``owner.filters``: (wire filters, their source indices, all supported?)."""
    wire: list[dict] = []
    sources: list[int] = []
    supported = True
    seen: dict[str, int] = {}  # filter type → the index it first appears at
    is_backend = owner.path.rpartition(".")[2].startswith("backendRefs")
    for index, (value, path) in enumerate(owner.entries("filters", _MAX_FILTERS)):
        name, key = _filter_type(value, path)
        _check_combination(name, seen, join(path, "type"), is_backend)
        seen.setdefault(name, index)
        node = Node(value, path, _FILTER_KEYS, YAML)
        for other in (*PAYLOAD_KEYS, *_UNSUPPORTED.values()):
            if other != key and node.get(other) is not None:
                raise ConfigError(node.at(other), f'not allowed with filter type "{name}"')
        kind = KINDS.get(name)
        if kind is None:
            what = "this backend" if is_backend else "the rule"
            route.context.note(node.at("type"), f'filter type "{name}" is not supported: '
                                                f"{what} answers {UNSUPPORTED_STATUS}")
            supported = False
            continue
        payload = kind.from_yaml(node.required(key), node.at(key), route)
        if payload is not None:
            wire.append({"type": name, key: payload})
            sources.append(index)
    return wire, sources, supported


def _check_combination(name: str, seen: dict[str, int], path: str, is_backend: bool) -> None:
    """Reject a filter of type ``name`` at ``path`` that the CRD forbids after the
    types ``seen`` before it in the same list (type → its first index)."""
    kind = KINDS.get(name)
    if kind is not None and not kind.repeatable and name in seen:
        raise ConfigError(path, f"{name} filter cannot be repeated "
                                f"(filters[{seen[name]}] is one already)")
    pair = conflict({name, *seen})
    if pair is not None:
        other = pair[1] if pair[0] == name else pair[0]
        owner = "backendRef" if is_backend else "rule"
        raise ConfigError(path, f"{pair[0]} and {pair[1]} cannot be combined in one "
                                f"{owner} (filters[{seen[other]}] is a {other})")


def _filter_type(value: Any, path: str) -> tuple[str, str]:
    """A filter's type and payload key, read before its other keys are checked: for a
    mistyped type, the error must name the type, not the payload key it leaves
    unexplained."""
    if not isinstance(value, dict):
        raise ConfigError(path, f"expected a mapping, got {yaml_type(value)}")
    name = value.get("type")
    if name is None or name == "":
        raise ConfigError(join(path, "type"), "required field is missing")
    if not isinstance(name, str):
        raise ConfigError(join(path, "type"), f"expected a string, got {yaml_type(name)}")
    kind = KINDS.get(name)
    key = kind.key if kind is not None else _UNSUPPORTED.get(name)
    if key is None:
        raise ConfigError(join(path, "type"), _unknown_filter(name))
    return name, key


def _unknown_filter(name: str) -> str:
    """The message for a filter type Gateway API does not define, with a suggestion."""
    close = difflib.get_close_matches(name, (*KINDS, *_UNSUPPORTED), n=1)
    return f'unknown filter type "{name}"' + (f' (did you mean "{close[0]}"?)' if close else "")
