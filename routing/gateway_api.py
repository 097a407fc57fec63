"""Gateway API ``HTTPRoute`` YAML → the wire config, then validated.

Lets ``tunnelgate serve --config routes.yaml`` and offline tools run without a
controller. The conversion follows what a Gateway API controller pushing this wire
format does, with the Gateway API defaults filled in:

- routes in Gateway API tie-break order, each route's rules flattened in list order:
  the oldest ``metadata.creationTimestamp`` first, then ``{namespace}/{name}`` in
  alphabetical order; routes without a timestamp come after all that have one, by
  name (as if created now, the newest); routes equal in both keep file order. The
  wire's rule order is the last tie-break of precedence, so it carries this one;
- a rule without ``matches`` and a match without ``path`` mean ``PathPrefix /``; a path
  without ``type`` is ``PathPrefix``; header/query matches default to ``Exact``;
- ``backendRefs`` of kind Service become
  ``http://NAME.NAMESPACE.svc.cluster.local:PORT`` (``https`` on port 443) unless the
  caller maps ``"NAME.NAMESPACE"`` to a URL; ``weight`` defaults to 1 (the wire has no
  such default: an absent wire weight is 0); refs of any other kind stay in the pool answering 500;
- a Gateway API filter this data plane cannot apply (``ExtensionRef``,
  ``ExternalAuth``) turns its rule — or its backend, for a backend filter — into a 500:
  skipping it could skip a security control (fail closed, ``unavailableStatus``); a
  filter type Gateway API does not define is an error, as on the wire;
- a ``RequestMirror`` whose target is not a Service is dropped, as the spec asks for
  an unresolvable mirror ref (a copy is never worth failing real traffic);
- Service refs are checked against the file's own ``Service`` and ``ReferenceGrant``
  documents when it has any (:mod:`routing.refs`: a missing Service, an unlisted port
  or an ungranted cross-namespace ref answers 500, as an invalid ref must); a file
  with neither keeps every ref, cross-namespace ones included. The ``appProtocol`` of
  the Service port a ref names is honoured: ``kubernetes.io/h2c`` makes the backend
  (or mirror) ``"protocol": "h2c"``, ``kubernetes.io/ws`` sets ``"websocket": true``;
- ``timeouts.request`` / ``backendRequest`` become ``request`` / ``backend``; a zero
  duration (``0s``) means "no timeout" and is left out (GEP-1742, GEP-2257);
- when the file has the ``Gateway`` documents a route's ``parentRefs`` name, the
  listeners it attaches to (by ``sectionName``/``port``) give its rules an
  ``entrances`` list: ``HTTP`` → ``tunnel``, ``cluster``; ``HTTPS`` → ``cluster-tls``
  (:mod:`routing.listeners`).

Documents of other kinds are skipped (so a whole ``kubectl get -o yaml`` dump or a
manifest bundle can be fed in); ``List``/``HTTPRouteList`` documents are read item by
item. Anything the API server would reject is a :class:`~routing.config.ConfigError`
whose path names the document and field, e.g.
``documents[2].spec.rules[0].backendRefs[1].port: ...``; :func:`locate` finds its line
and route in the text. Gateway API list limits (MaxItems) are enforced, which also
bounds the work a YAML alias bomb can cause, and so are the CRD's rules on filter lists
(of a rule or a backendRef: no filter type but ``RequestMirror``, ``ExtensionRef`` and
``ExternalAuth`` twice, never ``RequestRedirect`` with ``URLRewrite``) and on
``ReplacePrefixMatch`` (the rule must have exactly one match, a ``PathPrefix``).

What the conversion skipped, dropped or turned into an error status is not an error;
:func:`convert` reports each as a :class:`Note` (``tunnelgate check`` prints them).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from types import MappingProxyType
from typing import Any, Callable

import yaml

from routing.config import parse_config
from routing.listeners import Gateways, read_gateways, route_entrances
from routing.model import Config, ConfigError
from routing.refs import ClusterView, read_view
from routing.traffic_policy import KIND as TRAFFIC_POLICY_KIND, read_retry_constraints
from routing.values import parse_duration

API_VERSION = "gateway.networking.k8s.io/v1"
CLUSTER_DOMAIN = "cluster.local"
# Status for refs and filters that cannot be served: the request is fine, the
# configuration cannot be served (RFC 9110 §15.6.1), as Gateway API asks for invalid refs.
UNSUPPORTED_STATUS = 500
# Never dialed (unavailableStatus answers first); ".invalid" is reserved (RFC 2606).
UNRESOLVED_URL = "http://unresolved.invalid"

_ROOT_PATH = MappingProxyType({"type": "PathPrefix", "value": "/"})
# GEP-2257 duration subset accepted by HTTPRoute timeouts.
_GEP_2257 = re.compile(r"([0-9]{1,5}(h|m|s|ms)){1,4}\Z")
# Service names and namespaces are RFC 1123 labels; anything else must never reach a
# URL (a name like "evil.example:80/x#" would redirect the backend off-cluster).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
# metav1.Time: an RFC 3339 date-time, which always carries a UTC offset.
_RFC_3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}"
                       r"(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})\Z")
# The time a route without a creationTimestamp sorts at (after every real one).
_UNCREATED = datetime.max.replace(tzinfo=timezone.utc)

# Gateway API MaxItems limits (apis/v1/httproute_types.go).
_MAX_HOSTNAMES = _MAX_RULES = _MAX_FILTERS = _MAX_BACKENDS = _MAX_VALUE_MATCHES = 16
_MAX_MATCHES = 64
_MAX_MATCHES_PER_ROUTE = 128
_MAX_WEIGHT = 1_000_000

_ROUTE_KEYS = frozenset(("apiVersion", "kind", "metadata", "spec", "status"))
_SPEC_KEYS = frozenset(("parentRefs", "hostnames", "rules", "useDefaultGateways"))
# Accepted and not acted on (reported as notes): this data plane has no session affinity.
_DROPPED_RULE_KEYS = MappingProxyType({
    "sessionPersistence": "ignored: tunnelgate has no session affinity"})
_RULE_KEYS = frozenset(("name", "matches", "filters", "backendRefs", "timeouts",
                        "retry", *_DROPPED_RULE_KEYS))
_REF_KEYS = frozenset(("group", "kind", "name", "namespace", "port"))
_BACKEND_KEYS = _REF_KEYS | {"weight", "filters"}
# Gateway API filter type → its payload key; types without a converter below are
# valid but cannot be applied here (their rule or backend fails closed).
_PAYLOAD_KEYS = MappingProxyType({
    "RequestHeaderModifier": "requestHeaderModifier",
    "ResponseHeaderModifier": "responseHeaderModifier",
    "RequestRedirect": "requestRedirect",
    "URLRewrite": "urlRewrite",
    "RequestMirror": "requestMirror",
    "CORS": "cors",
    "ExtensionRef": "extensionRef",
    "ExternalAuth": "externalAuth",
})
_FILTER_KEYS = frozenset(("type", *_PAYLOAD_KEYS.values()))
_PATH_MODIFIER_KEYS = MappingProxyType({"ReplaceFullPath": "replaceFullPath",
                                        "ReplacePrefixMatch": "replacePrefixMatch"})
# The CRD's CEL rules on a rule's and a backendRef's filters: these types at most once
# each (RequestMirror, ExtensionRef and ExternalAuth may repeat), and a redirect never
# together with a rewrite.
_SINGLE_FILTERS = frozenset(("RequestHeaderModifier", "ResponseHeaderModifier",
                             "RequestRedirect", "URLRewrite", "CORS"))
_EXCLUSIVE_FILTERS = MappingProxyType({"RequestRedirect": "URLRewrite",
                                       "URLRewrite": "RequestRedirect"})
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


@dataclass(frozen=True, slots=True)
class Conversion:
    """The result of :func:`convert`.

    ``rule_paths[i]`` is the YAML rule that wire rule ``i`` was made from (e.g.
    ``documents[0].spec.rules[1]``); ``unused_backends`` the ``backends`` keys no
    Service reference asked for.
    """

    wire: dict
    config: Config
    notes: tuple[Note, ...]
    rule_paths: tuple[str, ...]
    unused_backends: tuple[str, ...]


def convert(text: str, backends: dict[str, str] | None = None,
            version: int = 1) -> Conversion:
    """Convert HTTPRoute YAML (one or many documents) and validate it as a wire config.

    ``backends`` maps ``"NAME.NAMESPACE"`` of a Service to the URL to use instead of
    its cluster DNS name. Raises :class:`ConfigError` naming the document and field.
    """
    return _validated(text, backends or {}, version)


def httproutes_to_config(text: str, backends: dict[str, str] | None = None,
                         version: int = 1) -> Config:
    """The validated :class:`Config` of :func:`convert`."""
    return convert(text, backends, version).config


def httproutes_to_wire(text: str, backends: dict[str, str] | None = None,
                       version: int = 1) -> dict:
    """The validated wire JSON object of :func:`convert`."""
    return convert(text, backends, version).wire


def locate(text: str, path: str) -> tuple[int | None, str | None]:
    """(line, route) of the YAML field ``path`` (``documents[i]....``): the line of the
    deepest part of the path found in ``text`` and the ``NAMESPACE/NAME`` of the
    HTTPRoute on the way, each ``None`` if not found. For text that is not YAML at
    all, the line of the syntax error."""
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        return (mark.line + 1 if mark is not None else None), None
    except yaml.YAMLError:
        return None, None
    steps = _PATH_STEP.findall(path)
    if len(steps) < 2 or steps[0] != ("documents", "") or not steps[1][1]:
        return None, None
    index = int(steps[1][1])
    if index >= len(documents) or documents[index] is None:
        return None, None
    node: yaml.Node = documents[index]
    line, route = node.start_mark.line + 1, _route_name(node)
    for key, position in steps[2:]:
        found = _step(node, key, position)
        if found is None:
            break
        key_line, node = found
        line, route = key_line, _route_name(node) or route
    return line, route


_PATH_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _step(node: yaml.Node, key: str, position: str) -> tuple[int, yaml.Node] | None:
    """The child of ``node`` at a mapping ``key`` or list ``position``, with the line
    that names it."""
    if key and isinstance(node, yaml.MappingNode):
        for name, value in node.value:
            if isinstance(name, yaml.ScalarNode) and name.value == key:
                return name.start_mark.line + 1, value
    if position and isinstance(node, yaml.SequenceNode) and int(position) < len(node.value):
        child = node.value[int(position)]
        return child.start_mark.line + 1, child
    return None


def _route_name(node: yaml.Node) -> str | None:
    """``NAMESPACE/NAME`` if ``node`` is an HTTPRoute object, else ``None``."""
    if not isinstance(node, yaml.MappingNode):
        return None
    fields = {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}
    kind = fields.get("kind")
    if not isinstance(kind, yaml.ScalarNode) or kind.value != "HTTPRoute":
        return None
    meta = fields.get("metadata")
    names = {k.value: v.value for k, v in getattr(meta, "value", ())
             if isinstance(meta, yaml.MappingNode) and isinstance(k, yaml.ScalarNode)
             and isinstance(v, yaml.ScalarNode)}
    return f"{names.get('namespace') or 'default'}/{names.get('name', '?')}"


# --------------------------------------------------------------------------- reading


@dataclass(slots=True)
class _Context:
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
class _Route:
    """What every part of one HTTPRoute needs to know while it is converted."""

    namespace: str
    context: _Context


@dataclass(slots=True)
class _Origin:
    """Where one wire rule came from, to name YAML fields in validation errors."""

    spec: str
    rule: str
    filters: list[int] = field(default_factory=list)  # source index per wire filter
    backend_filters: list[list[int]] = field(default_factory=list)


# (creationTimestamp, "{namespace}/{name}"): see _precedence.
_Precedence = tuple[datetime, str]


@dataclass(frozen=True, slots=True)
class _Converted:
    """One HTTPRoute's wire rules, in list order, with where each came from and the key
    that orders the route among the others."""

    precedence: _Precedence
    rules: list[dict]
    origins: list[_Origin]


class _Obj:
    """A YAML mapping being read, with its path; unknown keys are rejected."""

    __slots__ = ("data", "path")

    def __init__(self, value: Any, path: str, keys: frozenset[str]) -> None:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {_type_name(value)}")
        for key in value:
            if key not in keys:
                raise ConfigError(_join(path, str(key)), "unknown field")
        self.data = value
        self.path = path

    def at(self, key: str) -> str:
        return _join(self.path, key)

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def text(self, key: str, default: str = "") -> str:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(self.at(key), f"expected a string, got {_type_name(value)}")
        return value

    def required(self, key: str) -> Any:
        value = self.data.get(key)
        if value is None:
            raise ConfigError(self.at(key), "required field is missing")
        return value

    def integer(self, key: str, low: int, high: int, default: int) -> int:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.at(key), f"expected an integer, got {_type_name(value)}")
        if not low <= value <= high:
            raise ConfigError(self.at(key), f"{value} is out of range {low}..{high}")
        return value

    def items(self, key: str, max_items: int) -> list[tuple[Any, str]]:
        """The list under ``key`` (absent = empty) as (value, path) pairs."""
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise ConfigError(self.at(key), f"expected a list, got {_type_name(value)}")
        if len(value) > max_items:
            raise ConfigError(self.at(key), f"{len(value)} entries, at most {max_items}")
        return [(item, f"{self.at(key)}[{i}]") for i, item in enumerate(value)]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "list", dict: "mapping"}.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------- documents


def _validated(text: str, backends: dict[str, str], version: int) -> Conversion:
    routes: list[_Converted] = []
    docs = _load(text)
    context = _Context(backends, read_view(docs), read_retry_constraints(docs),
                       read_gateways(docs))
    for index, doc in enumerate(docs):
        _document(doc, f"documents[{index}]", context, routes)
    routes.sort(key=lambda route: route.precedence)  # stable: ties keep file order
    rules = [rule for route in routes for rule in route.rules]
    origins = [origin for route in routes for origin in route.origins]
    wire = {"version": version, "rules": rules}
    try:
        config = parse_config(wire)
    except ConfigError as err:
        raise ConfigError(_source_path(err.path, origins), err.message) from None
    return Conversion(wire, config, tuple(context.notes),
                      tuple(origin.rule for origin in origins),
                      tuple(sorted(set(backends) - context.used)))


def _load(text: str) -> list[Any]:
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ConfigError("", f"invalid YAML: {_one_line(exc)}") from None


def _one_line(exc: yaml.YAMLError) -> str:
    """PyYAML's problem text without its multi-line excerpt of the input."""
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    if problem:
        return f"{context} {problem}" if context else str(problem)
    return " ".join(str(exc).split())


def _document(doc: Any, path: str, context: _Context, routes: list[_Converted]) -> None:
    """Convert one document if it is an HTTPRoute (or a list of them); skip others."""
    if doc is None:  # an empty document, e.g. a trailing "---"
        return
    if not isinstance(doc, dict):
        raise ConfigError(path, f"expected a Kubernetes object, got {_type_name(doc)}")
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(_join(path, "kind"), "missing kind")
    if kind in ("List", "HTTPRouteList"):
        if kind == "HTTPRouteList":
            _check_api_version(doc, path)
        items = _Obj(doc, path, frozenset(("apiVersion", "kind", "metadata", "items")))
        for item, item_path in items.items("items", 2**31):
            _document(item, item_path, context, routes)
        return
    if kind.lower() == "httproute" and kind != "HTTPRoute":
        raise ConfigError(_join(path, "kind"), f'unknown kind "{kind}" (did you mean HTTPRoute?)')
    if kind == "HTTPRoute":
        _check_api_version(doc, path)
        routes.append(_route(_Obj(doc, path, _ROUTE_KEYS), context))
    elif kind not in ("Service", "ReferenceGrant", "Gateway", TRAFFIC_POLICY_KIND):
        # (read apart: read_view, read_gateways, read_retry_constraints)
        hint = " (did you mean HTTPRoute?)" if kind.lower().startswith("httproute") else ""
        context.note(_join(path, "kind"),
                     f'skipped: kind "{kind}" is not an HTTPRoute{hint}')


def _check_api_version(doc: dict, path: str) -> None:
    api_version = doc.get("apiVersion")
    if api_version != API_VERSION:
        raise ConfigError(_join(path, "apiVersion"),
                          f"{doc['kind']} must be {API_VERSION}, got {api_version!r}")


def _route(doc: _Obj, context: _Context) -> _Converted:
    namespace, precedence = _metadata(doc)
    converted = _Converted(precedence, [], [])
    spec = _Obj(doc.required("spec"), doc.at("spec"), _SPEC_KEYS)
    hostnames = [value for value, _ in spec.items("hostnames", _MAX_HOSTNAMES)]
    route_rules = spec.items("rules", _MAX_RULES)
    if spec.get("rules") is None:  # Gateway API default: one rule, PathPrefix "/"
        route_rules = [({}, spec.at("rules[0]"))]
    elif not route_rules:
        raise ConfigError(spec.at("rules"), "at least one rule is required")
    route = _Route(namespace, context)
    # Gateway listeners of the file (routing.listeners): HTTPS ones → cluster-tls.
    entrances = route_entrances(spec.get("parentRefs"), namespace, context.gateways,
                                spec.at("parentRefs"), context.note)
    total = 0
    for value, path in route_rules:
        wire, origin = _rule(_Obj(value, path, _RULE_KEYS), route, spec.path)
        total += len(wire["matches"])
        if total > _MAX_MATCHES_PER_ROUTE:
            raise ConfigError(spec.at("rules"),
                              f"more than {_MAX_MATCHES_PER_ROUTE} matches in one route")
        if hostnames:
            wire = {"hostnames": hostnames, **wire}
        if entrances is not None:
            wire["entrances"] = list(entrances)
        converted.rules.append(wire)
        converted.origins.append(origin)
    return converted


def _metadata(doc: _Obj) -> tuple[str, _Precedence]:
    """The namespace of an HTTPRoute and its :func:`_precedence` key."""
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ConfigError(doc.at("metadata"), f"expected a mapping, got {_type_name(metadata)}")
    namespace = metadata.get("namespace") or "default"
    if not isinstance(namespace, str) or not _DNS_LABEL.match(namespace):
        raise ConfigError(_join(doc.at("metadata"), "namespace"),
                          f"invalid namespace {namespace!r}")
    created = _timestamp(metadata.get("creationTimestamp"),
                         _join(doc.at("metadata"), "creationTimestamp"))
    name = metadata.get("name")
    return namespace, _precedence(created, f"{namespace}/{'' if name is None else name}")


def _precedence(created: datetime | None, route: str) -> _Precedence:
    """The key that orders routes whose matches tie, smallest first (Gateway API,
    HTTPRouteRule matches): the oldest creationTimestamp, then ``{namespace}/{name}``
    alphabetically (as one string, so ``a-b/x`` comes before ``a/x``).

    A route without a creationTimestamp sorts after every route that has one, as if
    it were the newest, and among such routes by name alone: the API server stamps
    every object it creates, so an unstamped route is one not created yet, and
    creating it now would make it younger than any that exists.
    """
    return created or _UNCREATED, route


def _timestamp(value: Any, path: str) -> datetime | None:
    """An RFC 3339 time, given as a string or as the datetime YAML already made of one
    (``None`` for none)."""
    if value is None:  # absent, or "creationTimestamp: null" as kubectl dry runs print
        return None
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value
    if isinstance(value, str) and _RFC_3339.match(value):
        try:
            return datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
        except ValueError:
            pass  # a field out of range, e.g. month 13
    shown = value.isoformat() if isinstance(value, date) else value
    raise ConfigError(path, f"invalid timestamp {shown!r}: expected an RFC 3339 time with "
                            "a UTC offset, e.g. 2024-01-01T00:00:00Z")


# --------------------------------------------------------------------------- rules


def _rule(rule: _Obj, route: _Route, spec_path: str) -> tuple[dict, _Origin]:
    origin = _Origin(spec=spec_path, rule=rule.path)
    matches = [_match(_Obj(v, p, frozenset(("path", "headers", "queryParams", "method"))))
               for v, p in rule.items("matches", _MAX_MATCHES)]
    filters, origin.filters, supported = _filters(rule, route)
    backends = []
    for value, path in rule.items("backendRefs", _MAX_BACKENDS):
        backend, sources = _backend(_Obj(value, path, _BACKEND_KEYS), route)
        backends.append(backend)
        origin.backend_filters.append(sources)
    _check_prefix_replacements(rule, matches)
    _check_redirect_alone(rule)
    # A rule without backends goes on the wire as null, the way Go encodes a nil slice.
    wire: dict[str, Any] = {"matches": matches or [{"path": dict(_ROOT_PATH)}],
                            "backends": backends or None}
    if filters:
        wire["filters"] = filters
    if rule.get("timeouts") is not None:
        wire["timeouts"] = _timeouts(_Obj(rule.get("timeouts"), rule.at("timeouts"),
                                          frozenset(("request", "backendRequest"))))
    if rule.get("retry") is not None:
        wire["retry"] = _retry(_Obj(rule.get("retry"), rule.at("retry"),
                                    frozenset(("codes", "attempts", "backoff"))))
    if not supported:
        wire["unavailableStatus"] = UNSUPPORTED_STATUS
    for key, message in _DROPPED_RULE_KEYS.items():
        if rule.get(key) is not None:
            route.context.note(rule.at(key), message)
    return wire, origin


def _check_prefix_replacements(rule: _Obj, matches: list[dict]) -> None:
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
    owners += [(value.get("filters"), _join(path, "filters"))
               for value, path in rule.items("backendRefs", _MAX_BACKENDS)]
    for filters, path in owners:
        for index, value in enumerate(filters or ()):
            if value["type"] not in ("RequestRedirect", "URLRewrite"):
                continue
            key = _PAYLOAD_KEYS[value["type"]]
            modifier = value[key].get("path")  # (both payloads are mappings by now)
            if isinstance(modifier, dict) and modifier.get("type") == "ReplacePrefixMatch":
                raise ConfigError(f"{path}[{index}].{key}.path.type",
                                  "ReplacePrefixMatch needs the rule to have exactly one "
                                  f"match, a PathPrefix; {problem}")


def _check_redirect_alone(rule: _Obj) -> None:
    """Reject a rule-level ``RequestRedirect`` in a rule with backendRefs, as the CRD's
    CEL rule on HTTPRouteRule does: the redirect is the rule's whole answer, so its
    backends could never be reached. (Filters are checked by then: each is a mapping
    with a known type.)"""
    if not rule.get("backendRefs"):
        return
    for index, value in enumerate(rule.get("filters") or ()):
        if value["type"] == "RequestRedirect":
            raise ConfigError(f"{rule.at('filters')}[{index}].type",
                              "RequestRedirect filter must not be used together with "
                              "backendRefs")


def _match(match: _Obj) -> dict:
    wire: dict[str, Any] = {"path": _path_match(match)}
    for key in ("headers", "queryParams"):
        values = [_value_match(_Obj(v, p, frozenset(("type", "name", "value"))))
                  for v, p in match.items(key, _MAX_VALUE_MATCHES)]
        if values:
            wire[key] = values
    if match.get("method") is not None:
        wire["method"] = match.get("method")
    return wire


def _path_match(match: _Obj) -> dict:
    if match.get("path") is None:
        return dict(_ROOT_PATH)
    node = _Obj(match.get("path"), match.at("path"), frozenset(("type", "value")))
    kind, value = node.text("type", "PathPrefix"), node.text("value", "/")
    if kind in ("Exact", "PathPrefix") and not value.startswith("/"):
        raise ConfigError(node.at("value"), f"path {value!r} must start with '/'")
    return {"type": kind, "value": value}


def _value_match(node: _Obj) -> dict:
    """A header or query match; types and names are checked by ``parse_config``."""
    return {"type": node.text("type", "Exact"), "name": node.required("name"),
            "value": node.required("value")}


def _timeouts(node: _Obj) -> dict:
    """GEP-2257 strings → wire ``request`` / ``backend``; zero durations are left out."""
    seconds: dict[str, float] = {}
    wire: dict[str, str] = {}
    for key, wire_key in (("request", "request"), ("backendRequest", "backend")):
        text = node.text(key)
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


def _retry(node: _Obj) -> dict:
    """GEP-1731 ``retry`` → the wire's (the same fields; ``backoff`` a GEP-2257
    duration). The values are checked by the wire validation."""
    wire = {key: node.get(key) for key in ("codes", "attempts") if node.get(key) is not None}
    backoff = node.text("backoff")
    if backoff:
        if not _GEP_2257.match(backoff):
            raise ConfigError(node.at("backoff"), f"invalid duration {backoff!r} (GEP-2257)")
        wire["backoff"] = backoff
    return wire


# --------------------------------------------------------------------------- backends


def _backend(node: _Obj, route: _Route) -> tuple[dict, list[int]]:
    weight = node.integer("weight", 0, _MAX_WEIGHT, 1)  # Gateway API default weight
    url, problem, protocol = _resolve(node, route)
    filters, sources, supported = _filters(node, route)
    wire: dict[str, Any] = {"url": url or UNRESOLVED_URL, "weight": weight, **protocol}
    constraint = route.context.retry_constraints.get(
        f"{node.text('name')}.{node.text('namespace') or route.namespace}")
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


def _ref_kind(ref: _Obj) -> str:
    """``kind "Bucket" (group "example.io")`` — for notes about a non-Service ref."""
    group = ref.text("group")
    return f'kind "{ref.text("kind", "Service")}"' + (f' (group "{group}")' if group else "")


def _resolve(ref: _Obj, route: _Route
             ) -> tuple[str | None, str | None, MappingProxyType[str, Any]]:
    """(URL, problem, protocol) of a reference: the URL of a Service (None for a kind
    this data plane cannot dial), why the reference is invalid (None if it is not: see
    :mod:`routing.refs` for what the file's Services and ReferenceGrants decide), and
    the wire fields the ``appProtocol`` of the Service port in the file asks for
    (:data:`_APP_PROTOCOLS`; none for an invalid reference)."""
    name = ref.text("name")
    if not name:
        raise ConfigError(ref.at("name"), "required field is missing")
    if ref.text("group") not in ("", "core") or ref.text("kind", "Service") != "Service":
        return None, f"{_ref_kind(ref)} is not a Service", _NO_FIELDS
    namespace = ref.text("namespace") or route.namespace
    for key, value in (("name", name), ("namespace", namespace)):
        if not _DNS_LABEL.match(value):
            raise ConfigError(ref.at(key), f"invalid Service {key} {value!r}")
    if ref.get("port") is None:
        raise ConfigError(ref.at("port"), "a Service reference needs a port")
    port = ref.integer("port", 1, 65535, 0)
    url = _service_url(name, namespace, port, route.context)
    view = route.context.view
    if view is None:
        return url, None, _NO_FIELDS
    problem = view.problem(route.namespace, namespace, name, port)
    if problem is not None:
        return url, problem, _NO_FIELDS
    return url, None, _APP_PROTOCOLS.get(view.app_protocol(namespace, name, port), _NO_FIELDS)


def _service_url(name: str, namespace: str, port: int, context: _Context) -> str:
    """Where Service ``namespace/name`` is dialed: the caller's mapping, else its
    cluster DNS name."""
    mapped = context.backends.get(f"{name}.{namespace}")
    if mapped is not None:
        context.used.add(f"{name}.{namespace}")
        return mapped
    scheme = "https" if port == 443 else "http"
    return f"{scheme}://{name}.{namespace}.svc.{CLUSTER_DOMAIN}:{port}"


# --------------------------------------------------------------------------- filters


def _filters(owner: _Obj, route: _Route) -> tuple[list[dict], list[int], bool]:
    """Convert ``owner.filters``: (wire filters, their source indices, all supported?)."""
    wire: list[dict] = []
    sources: list[int] = []
    supported = True
    seen: dict[str, int] = {}  # filter type → the index it first appears at
    is_backend = owner.path.rpartition(".")[2].startswith("backendRefs")
    for index, (value, path) in enumerate(owner.items("filters", _MAX_FILTERS)):
        kind, key = _filter_type(value, path)
        _check_combination(kind, seen, _join(path, "type"), is_backend)
        seen.setdefault(kind, index)
        node = _Obj(value, path, _FILTER_KEYS)
        for other in _PAYLOAD_KEYS.values():
            if other != key and node.get(other) is not None:
                raise ConfigError(node.at(other), f'not allowed with filter type "{kind}"')
        convert = _CONVERTERS.get(kind)
        if convert is None:
            what = "this backend" if is_backend else "the rule"
            route.context.note(node.at("type"), f'filter type "{kind}" is not supported: '
                                                f"{what} answers {UNSUPPORTED_STATUS}")
            supported = False
            continue
        payload = convert(node.required(key), node.at(key), route)
        if payload is not None:
            wire.append({"type": kind, key: payload})
            sources.append(index)
    return wire, sources, supported


def _check_combination(kind: str, seen: dict[str, int], path: str, is_backend: bool) -> None:
    """Reject a filter of type ``kind`` at ``path`` that the CRD forbids after the
    types ``seen`` before it in the same list (type → its first index)."""
    if kind in _SINGLE_FILTERS and kind in seen:
        raise ConfigError(path, f"{kind} filter cannot be repeated "
                                f"(filters[{seen[kind]}] is one already)")
    other = _EXCLUSIVE_FILTERS.get(kind)
    if other in seen:
        owner = "backendRef" if is_backend else "rule"
        raise ConfigError(path, f"RequestRedirect and URLRewrite cannot be combined in one "
                                f"{owner} (filters[{seen[other]}] is a {other})")


def _filter_type(value: Any, path: str) -> tuple[str, str]:
    """A filter's type and payload key, read before its other keys are checked: for a
    mistyped type, the error must name the type, not the payload key it leaves
    unexplained."""
    if not isinstance(value, dict):
        raise ConfigError(path, f"expected a mapping, got {_type_name(value)}")
    kind = value.get("type")
    if kind is None or kind == "":
        raise ConfigError(_join(path, "type"), "required field is missing")
    if not isinstance(kind, str):
        raise ConfigError(_join(path, "type"), f"expected a string, got {_type_name(kind)}")
    key = _PAYLOAD_KEYS.get(kind)
    if key is None:
        raise ConfigError(_join(path, "type"), _unknown_filter(kind))
    return kind, key


def _unknown_filter(kind: str) -> str:
    """The message for a filter type Gateway API does not define, with a suggestion."""
    close = difflib.get_close_matches(kind, _PAYLOAD_KEYS, n=1)
    return f'unknown filter type "{kind}"' + (f' (did you mean "{close[0]}"?)' if close else "")


def _as_is(value: Any, path: str, route: _Route) -> dict:
    """Payloads whose wire shape equals the Gateway API shape (header modifiers, CORS,
    URLRewrite); ``parse_config`` checks their fields."""
    if not isinstance(value, dict):
        raise ConfigError(path, f"expected a mapping, got {_type_name(value)}")
    return dict(value)


def _redirect(value: Any, path: str, route: _Route) -> dict:
    node = _Obj(value, path, frozenset(("scheme", "hostname", "path", "port", "statusCode")))
    wire = {key: node.get(key) for key in ("scheme", "hostname", "port", "statusCode")
            if node.get(key) is not None}
    if node.get("path") is not None:
        wire["path"] = _redirect_path(_Obj(node.get("path"), node.at("path"),
                                           frozenset(("type", *_PATH_MODIFIER_KEYS.values()))))
    return wire


def _redirect_path(node: _Obj) -> dict:
    """Redirect paths carry their value under ``value`` on the wire (rewrite paths keep
    the Gateway API keys)."""
    kind = node.text("type")
    key = _PATH_MODIFIER_KEYS.get(kind)
    if key is None:
        raise ConfigError(node.at("type"), f'unknown path modifier type "{kind}"')
    for other in _PATH_MODIFIER_KEYS.values():
        if other != key and node.get(other) is not None:
            raise ConfigError(node.at(other), f'not used by path modifier type "{kind}"')
    node.required(key)  # (the CRD: the value its type names must be there)
    return {"type": kind, "value": node.text(key)}


def _rewrite(value: Any, path: str, route: _Route) -> dict:
    """URLRewrite, whose wire shape is Gateway API's (``parse_config`` checks it): only
    the CRD's rule that a path modifier holds the value its type names is checked here,
    since the wire lets a missing value default to an empty one."""
    payload = _as_is(value, path, route)
    modifier = payload.get("path")
    if isinstance(modifier, dict):
        kind = modifier.get("type")
        key = _PATH_MODIFIER_KEYS.get(kind) if isinstance(kind, str) else None
        if key is not None and modifier.get(key) is None:
            raise ConfigError(f"{path}.path.{key}", "required field is missing")
    return payload


def _mirror(value: Any, path: str, route: _Route) -> dict | None:
    node = _Obj(value, path, frozenset(("backendRef", "percent", "fraction")))
    if node.get("percent") is not None and node.get("fraction") is not None:
        raise ConfigError(node.at("fraction"), "only one of percent and fraction may be set")
    ref = _Obj(node.required("backendRef"), node.at("backendRef"), _REF_KEYS)
    url, problem, protocol = _resolve(ref, route)
    if problem is not None:
        route.context.note(ref.path, f"{problem}: the mirror is dropped")
        return None
    wire = {"backendUrl": url, "percent": _mirror_percent(node)}
    if "protocol" in protocol:  # (a mirror has no websocket flag: it never upgrades)
        wire["protocol"] = protocol["protocol"]
    return wire


def _mirror_percent(node: _Obj) -> int:
    """``percent``, or ``fraction`` as numerator*100/denominator clamped to 0..100."""
    if node.get("fraction") is None:
        return node.integer("percent", 0, 100, 100)
    fraction = _Obj(node.get("fraction"), node.at("fraction"),
                    frozenset(("numerator", "denominator")))
    if fraction.get("numerator") is None:
        raise ConfigError(fraction.at("numerator"), "required field is missing")
    numerator = fraction.integer("numerator", 0, 2**31 - 1, 0)
    denominator = fraction.integer("denominator", 1, 2**31 - 1, 100)
    return max(0, min(100, numerator * 100 // denominator))


_Converter = Callable[[Any, str, _Route], "dict | None"]
_CONVERTERS: MappingProxyType[str, _Converter] = MappingProxyType({
    "RequestHeaderModifier": _as_is,
    "ResponseHeaderModifier": _as_is,
    "RequestRedirect": _redirect,
    "URLRewrite": _rewrite,
    "RequestMirror": _mirror,
    "CORS": _as_is,
})


# --------------------------------------------------------------------------- errors

_WIRE_RULE = re.compile(r"rules\[(\d+)\]\.?")
_WIRE_FILTER = re.compile(r"filters\[(\d+)\]")
_WIRE_BACKEND = re.compile(r"backends\[(\d+)\](?:\.filters\[(\d+)\])?")
# Wire field → the HTTPRoute field it was made from, where the names differ.
_RENAMED_TAILS = ((".requestMirror.backendUrl", ".requestMirror.backendRef"),
                  (".requestRedirect.path.value", ".requestRedirect.path"))


def _source_path(wire_path: str, origins: list[_Origin]) -> str:
    """Map a ``parse_config`` error path (``rules[3]....``) back to the YAML field."""
    rule = _WIRE_RULE.match(wire_path)
    if rule is None:
        return wire_path
    origin = origins[int(rule.group(1))]
    rest = wire_path[rule.end():]
    if rest.startswith("hostnames"):
        return _join(origin.spec, rest)
    if (found := _WIRE_FILTER.match(rest)) is not None:
        rest = f"filters[{origin.filters[int(found.group(1))]}]" + rest[found.end():]
    elif (found := _WIRE_BACKEND.match(rest)) is not None:
        index = int(found.group(1))
        head = f"backendRefs[{index}]"
        if found.group(2) is not None:
            head += f".filters[{origin.backend_filters[index][int(found.group(2))]}]"
        tail = rest[found.end():]
        rest = head + ("" if tail == ".url" else tail)
    for wire_tail, source_tail in _RENAMED_TAILS:
        if rest.endswith(wire_tail):
            rest = rest[: -len(wire_tail)] + source_tail
    return _join(origin.rule, rest)
