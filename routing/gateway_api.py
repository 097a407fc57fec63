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

import re
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

import yaml

from routing.config import parse_config
from routing.filterkinds import KINDS
from routing.gateway_refs import DNS_LABEL, Context, Note, RouteScope
from routing.gateway_rules import Origin, convert_rule
from routing.listeners import read_gateways, route_entrances
from routing.model import Config, ConfigError
from routing.node import YAML, Node, join, yaml_type
from routing.refs import read_view
from routing.traffic_policy import KIND as TRAFFIC_POLICY_KIND, read_retry_constraints

API_VERSION = "gateway.networking.k8s.io/v1"
# metav1.Time: an RFC 3339 date-time, which always carries a UTC offset.
_RFC_3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}"
                       r"(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})\Z")
# The time a route without a creationTimestamp sorts at (after every real one).
_UNCREATED = datetime.max.replace(tzinfo=timezone.utc)

# Gateway API MaxItems limits (apis/v1/httproute_types.go).
_MAX_HOSTNAMES = _MAX_RULES = 16
_MAX_MATCHES_PER_ROUTE = 128

_ROUTE_KEYS = frozenset(("apiVersion", "kind", "metadata", "spec", "status"))
_SPEC_KEYS = frozenset(("parentRefs", "hostnames", "rules", "useDefaultGateways"))


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


# (creationTimestamp, "{namespace}/{name}"): see _precedence.
_Precedence = tuple[datetime, str]


@dataclass(frozen=True, slots=True)
class _Converted:
    """One HTTPRoute's wire rules, in list order, with where each came from and the key
    that orders the route among the others."""

    precedence: _Precedence
    rules: list[dict]
    origins: list[Origin]


# --------------------------------------------------------------------------- documents


def _validated(text: str, backends: dict[str, str], version: int) -> Conversion:
    routes: list[_Converted] = []
    docs = _load(text)
    context = Context(backends, read_view(docs), read_retry_constraints(docs),
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


def _document(doc: Any, path: str, context: Context, routes: list[_Converted]) -> None:
    """Convert one document if it is an HTTPRoute (or a list of them); skip others."""
    if doc is None:  # an empty document, e.g. a trailing "---"
        return
    if not isinstance(doc, dict):
        raise ConfigError(path, f"expected a Kubernetes object, got {yaml_type(doc)}")
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(join(path, "kind"), "missing kind")
    if kind in ("List", "HTTPRouteList"):
        if kind == "HTTPRouteList":
            _check_api_version(doc, path)
        items = Node(doc, path, frozenset(("apiVersion", "kind", "metadata", "items")), YAML)
        for item, item_path in items.entries("items", 2**31):
            _document(item, item_path, context, routes)
        return
    if kind.lower() == "httproute" and kind != "HTTPRoute":
        raise ConfigError(join(path, "kind"), f'unknown kind "{kind}" (did you mean HTTPRoute?)')
    if kind == "HTTPRoute":
        _check_api_version(doc, path)
        routes.append(_route(Node(doc, path, _ROUTE_KEYS, YAML), context))
    elif kind not in ("Service", "ReferenceGrant", "Gateway", TRAFFIC_POLICY_KIND):
        # (read apart: read_view, read_gateways, read_retry_constraints)
        hint = " (did you mean HTTPRoute?)" if kind.lower().startswith("httproute") else ""
        context.note(join(path, "kind"),
                     f'skipped: kind "{kind}" is not an HTTPRoute{hint}')


def _check_api_version(doc: dict, path: str) -> None:
    api_version = doc.get("apiVersion")
    if api_version != API_VERSION:
        raise ConfigError(join(path, "apiVersion"),
                          f"{doc['kind']} must be {API_VERSION}, got {api_version!r}")


def _route(doc: Node, context: Context) -> _Converted:
    namespace, precedence = _metadata(doc)
    converted = _Converted(precedence, [], [])
    spec = doc.node("spec", _SPEC_KEYS)
    hostnames = [value for value, _ in spec.entries("hostnames", _MAX_HOSTNAMES)]
    route_rules = spec.entries("rules", _MAX_RULES)
    if spec.get("rules") is None:  # Gateway API default: one rule, PathPrefix "/"
        route_rules = [({}, spec.at("rules[0]"))]
    elif not route_rules:
        raise ConfigError(spec.at("rules"), "at least one rule is required")
    route = RouteScope(namespace, context)
    # Gateway listeners of the file (routing.listeners): HTTPS ones → cluster-tls.
    entrances = route_entrances(spec.get("parentRefs"), namespace, context.gateways,
                                spec.at("parentRefs"), context.note)
    total = 0
    for value, path in route_rules:
        wire, origin = convert_rule(value, path, route, spec.path)
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


def _metadata(doc: Node) -> tuple[str, _Precedence]:
    """The namespace of an HTTPRoute and its :func:`_precedence` key."""
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ConfigError(doc.at("metadata"), f"expected a mapping, got {yaml_type(metadata)}")
    namespace = metadata.get("namespace") or "default"
    if not isinstance(namespace, str) or not DNS_LABEL.match(namespace):
        raise ConfigError(join(doc.at("metadata"), "namespace"),
                          f"invalid namespace {namespace!r}")
    created = _timestamp(metadata.get("creationTimestamp"),
                         join(doc.at("metadata"), "creationTimestamp"))
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


# --------------------------------------------------------------------------- errors

_WIRE_RULE = re.compile(r"rules\[(\d+)\]\.?")
_WIRE_FILTER = re.compile(r"filters\[(\d+)\]")
_WIRE_BACKEND = re.compile(r"backends\[(\d+)\](?:\.filters\[(\d+)\])?")
# Wire field → the HTTPRoute field it was made from, where a filter's names differ.
_RENAMED_TAILS = tuple((f".{kind.key}{wire}", f".{kind.key}{source}")
                       for kind in KINDS.values() for wire, source in kind.renamed)


def _source_path(wire_path: str, origins: list[Origin]) -> str:
    """Map a ``parse_config`` error path (``rules[3]....``) back to the YAML field."""
    rule = _WIRE_RULE.match(wire_path)
    if rule is None:
        return wire_path
    origin = origins[int(rule.group(1))]
    rest = wire_path[rule.end():]
    if rest.startswith("hostnames"):
        return join(origin.spec, rest)
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
    return join(origin.rule, rest)
