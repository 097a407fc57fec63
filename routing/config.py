"""The wire config the controller pushes (docs/config.md), parsed and validated.

``parse_config`` turns the JSON the Go controller emits into frozen dataclasses and
rejects anything the data plane could not serve as intended: every check the Go data plane makes, plus
unknown keys, wrong JSON types, unparseable backend URLs, bad regular expressions (RE2,
compiled here so a bad regex is a 400, not a 500), header names/values
that would let a config inject header lines, and out-of-range status codes.
``to_wire`` is the inverse, emitting what the controller would have sent.

Every error is a :class:`ConfigError` naming the offending field by its JSON path, e.g.
``rules[3].matches[0].path.type: unknown path match type "Foo"``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar
from urllib.parse import urlsplit

import re2

T = TypeVar("T")

PATH_MATCH_TYPES = ("Exact", "PathPrefix", "RegularExpression")
VALUE_MATCH_TYPES = ("Exact", "RegularExpression")
PATH_MODIFIER_TYPES = ("ReplaceFullPath", "ReplacePrefixMatch")
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
BACKEND_PROTOCOLS = ("", "h2c")
ENTRANCES = ("tunnel", "cluster")
DEFAULT_PORTS = {"http": 80, "https": 443}

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

# RFC 9110 token: what a header name (and a method) may consist of.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
# Header values: visible ASCII/obs-text, spaces and tabs; never CR, LF or NUL, which
# would let a config split a header line on the wire.
_FIELD_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*\Z")
# Gateway API Hostname / PreciseHostname (RFC 1123, optional leading "*." label),
# accepted case-insensitively because hosts are case-folded anyway.
_HOST_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_HOSTNAME = re.compile(rf"(\*\.)?{_HOST_LABEL}(\.{_HOST_LABEL})*\Z", re.IGNORECASE)
_PRECISE_HOSTNAME = re.compile(rf"{_HOST_LABEL}(\.{_HOST_LABEL})*\Z", re.IGNORECASE)


class ConfigError(ValueError):
    """A config that cannot be accepted; ``path`` names the field (``""`` = the root).

    ``kind`` is ``"json"`` when the bytes were not JSON at all and ``"invalid"`` when
    they were JSON but not a valid config (the config API maps both to 400).
    """

    def __init__(self, path: str, message: str, kind: str = "invalid") -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message
        self.kind = kind


# --------------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class PathMatch:
    type: str  # Exact | PathPrefix | RegularExpression
    value: str


@dataclass(frozen=True, slots=True)
class ValueMatch:
    """A header or query-parameter match."""

    type: str  # Exact | RegularExpression
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class RouteMatch:
    path: PathMatch | None = None
    headers: tuple[ValueMatch, ...] = ()
    query_params: tuple[ValueMatch, ...] = ()
    method: str | None = None


@dataclass(frozen=True, slots=True)
class HeaderModifier:
    set: tuple[tuple[str, str], ...] = ()
    add: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PathModifier:
    """ReplaceFullPath / ReplacePrefixMatch, whichever wire spelling it came in."""

    type: str
    value: str


@dataclass(frozen=True, slots=True)
class Redirect:
    scheme: str | None = None
    hostname: str | None = None
    port: int | None = None
    status_code: int = 302
    path: PathModifier | None = None


@dataclass(frozen=True, slots=True)
class Rewrite:
    hostname: str | None = None
    path: PathModifier | None = None


@dataclass(frozen=True, slots=True)
class BackendTLS:
    ca_bundle: str = ""
    server_name: str = ""
    subject_alt_names: tuple[str, ...] = ()
    subject_alt_name_uris: tuple[str, ...] = ()
    client_cert_pem: bytes = b""
    client_key_pem: bytes = b""


@dataclass(frozen=True, slots=True)
class Mirror:
    backend_url: str
    percent: int = 100
    tls: BackendTLS | None = None
    protocol: str = ""


@dataclass(frozen=True, slots=True)
class Cors:
    allow_origins: tuple[str, ...] = ()
    allow_credentials: bool = False
    allow_methods: tuple[str, ...] = ()
    allow_headers: tuple[str, ...] = ()
    expose_headers: tuple[str, ...] = ()
    max_age: int = 0  # 0 = unset; the answer then carries the GEP-1767 default 5


@dataclass(frozen=True, slots=True)
class Filter:
    """One filter; exactly the payload named by ``type`` is set."""

    type: str
    request_header_modifier: HeaderModifier | None = None
    response_header_modifier: HeaderModifier | None = None
    request_redirect: Redirect | None = None
    url_rewrite: Rewrite | None = None
    request_mirror: Mirror | None = None
    cors: Cors | None = None


@dataclass(frozen=True, slots=True)
class Backend:
    url: str
    weight: int = 0
    protocol: str = ""
    tls: BackendTLS | None = None
    filters: tuple[Filter, ...] = ()
    websocket: bool = False
    unavailable_status: int = 0


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds; ``None`` = unset or zero (no deadline)."""

    request: float | None = None
    backend: float | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    hostnames: tuple[str, ...] = ()
    matches: tuple[RouteMatch, ...] = ()
    filters: tuple[Filter, ...] = ()
    backends: tuple[Backend, ...] = ()
    timeouts: Timeouts | None = None
    unavailable_status: int = 0
    entrances: tuple[str, ...] | None = None  # additive extension; None = every entrance


@dataclass(frozen=True, slots=True)
class Config:
    version: int = 0
    rules: tuple[Rule, ...] = ()
    has_grpc_route: bool = False


@dataclass(frozen=True, slots=True)
class BackendAddress:
    """A backend URL taken apart: where to dial and what to prepend (ExternalBackends)."""

    scheme: str
    host: str
    port: int
    base_path: str
    base_query: str


# --------------------------------------------------------------------------- helpers


def compile_regex(pattern: str) -> Any:
    """Compile with RE2 (linear time; no backtracking blow-up from a tenant's route).

    Raises ``re2.error`` for patterns RE2 rejects (look-around, back-references, ...).
    """
    options = re2.Options()
    options.log_errors = False  # the error is reported through ConfigError instead
    return re2.compile(pattern, options)


def split_backend_url(url: str) -> BackendAddress:
    """Take ``http(s)://host[:port][/base][?query]`` apart; ports default to 80/443.

    Raises ``ValueError`` when the URL is not http/https with a host and a valid port.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"backend URL {url!r} must be http:// or https://")
    if parts.username is not None or parts.fragment:
        raise ValueError(f"backend URL {url!r} must not carry credentials or a fragment")
    host = parts.hostname
    if not host:
        raise ValueError(f"backend URL {url!r} has no host")
    port = parts.port  # raises ValueError for a non-numeric or out-of-range port
    if port == 0:
        raise ValueError(f"backend URL {url!r} has port 0")
    return BackendAddress(scheme, host, port or DEFAULT_PORTS[scheme], parts.path,
                          parts.query)


_DURATION_UNITS_NS = {
    "ns": 1, "us": 1_000, "\u00b5s": 1_000, "\u03bcs": 1_000, "ms": 1_000_000,
    "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000,
}
_DURATION_GROUP = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse a Go duration (``time.ParseDuration`` rules) into seconds.

    Optional sign, then one or more ``<number>[.<fraction>]<unit>`` groups with units
    ns, us, µs (U+00B5), μs (U+03BC), ms, s, m, h; a bare ``0`` is allowed. Exact integer
    nanosecond arithmetic as in Go, including its int64 overflow check. Raises
    ``ValueError`` on anything else.
    """
    rest = text
    negative = rest[:1] == "-"
    if rest[:1] in ("-", "+"):
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f"invalid duration {text!r}")
    total_ns = 0
    pos = 0
    while pos < len(rest):
        group = _DURATION_GROUP.match(rest, pos)
        if group is None or not (group.group(1) or group.group(2)):
            raise ValueError(f"invalid duration {text!r}")
        whole, fraction, unit = group.group(1), group.group(2) or "", group.group(3)
        scale = _DURATION_UNITS_NS[unit]
        total_ns += int(whole or "0") * scale
        if fraction:
            total_ns += int(fraction) * scale // 10 ** len(fraction)
        if total_ns > _INT64_MAX:
            raise ValueError(f"invalid duration {text!r}: overflow")
        pos = group.end()
    return (-total_ns if negative else total_ns) / 1e9


def format_duration(seconds: float) -> str:
    """Format seconds the way Go's ``Duration.String`` does (``1m30s``, ``500ms``, ``0s``)."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000_000_000:
        for unit, scale in (("ms", 1_000_000), ("\u00b5s", 1_000), ("ns", 1)):
            if ns >= scale:
                return sign + _decimal(ns, scale) + unit
    hours, ns = divmod(ns, 3_600_000_000_000)
    minutes, ns = divmod(ns, 60_000_000_000)
    text = _decimal(ns, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m" + text
    if hours:
        text = f"{hours}h" + text
    return sign + text


def _decimal(value: int, scale: int) -> str:
    whole, frac = divmod(value, scale)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(len(str(scale)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


# --------------------------------------------------------------------------- reading


class _Node:
    """A JSON object being read, with its path for error messages."""

    __slots__ = ("data", "path")

    def __init__(self, value: Any, path: str, keys: frozenset[str]) -> None:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected an object, got {_json_type(value)}")
        for key in value:
            if key not in keys:
                raise ConfigError(_join(path, key), "unknown field")
        self.data = value
        self.path = path

    def at(self, key: str) -> str:
        return _join(self.path, key)

    def string(self, key: str) -> str:
        value = self.data.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise ConfigError(self.at(key), f"expected a string, got {_json_type(value)}")
        return value

    def integer(self, key: str, low: int, high: int) -> int:
        value = self.data.get(key)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.at(key),
                              f"expected an integer, got {_json_type(value)}")
        if not low <= value <= high:
            raise ConfigError(self.at(key), f"{value} is out of range {low}..{high}")
        return value

    def boolean(self, key: str) -> bool:
        value = self.data.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise ConfigError(self.at(key), f"expected a boolean, got {_json_type(value)}")
        return value

    def items(self, key: str, read: Callable[[Any, str], T]) -> tuple[T, ...]:
        """Read a list (``null``/absent = empty) element by element."""
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise ConfigError(self.at(key), f"expected an array, got {_json_type(value)}")
        return tuple(read(item, f"{self.at(key)}[{i}]") for i, item in enumerate(value))

    def strings(self, key: str) -> tuple[str, ...]:
        return self.items(key, _string)

    def child(self, key: str, read: Callable[[Any, str], T]) -> T | None:
        value = self.data.get(key)
        return None if value is None else read(value, self.at(key))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(path, f"expected a string, got {_json_type(value)}")
    return value


def _status(node: _Node, key: str) -> int:
    """``unavailableStatus``: 0 (off) or a real HTTP status."""
    status = node.integer(key, 0, 599)
    if 0 < status < 100:
        raise ConfigError(node.at(key), f"status {status} is not 0 or 100..599")
    return status


def _regex(pattern: str, path: str) -> None:
    try:
        compile_regex(pattern)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise ConfigError(path, f"invalid regular expression {pattern!r}: {detail}") from None


def _hostname(value: str, path: str, *, wildcard: bool) -> str:
    pattern = _HOSTNAME if wildcard else _PRECISE_HOSTNAME
    if not pattern.match(value):
        raise ConfigError(path, f"invalid hostname {value!r}")
    return value


# --------------------------------------------------------------------------- parsing


Pause = Callable[[], None]
"""Called every :data:`PAUSE_EVERY` steps of a long parse or compile. A caller that
builds in a worker thread passes one that lets the event-loop thread take the GIL:
compiled code never gives it up by itself, and a 10,000-rule config would otherwise
hold it for tens of milliseconds at a time (requests wait that long)."""

PAUSE_EVERY = 128


def parse_config(data: object, pause: Pause | None = None) -> Config:
    """Decode and validate a wire config (JSON text or bytes, or the decoded value);
    raise :class:`ConfigError` if unacceptable. ``pause``: see :data:`Pause`."""
    global _recent_rules, _recent_texts
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError("", f"invalid JSON: {exc}", "json") from None
    decoded = isinstance(data, str)
    texts: list[str] | None = None
    known = _recent_texts
    if isinstance(data, str):
        try:
            if pause is None:
                data = _loads(data)
            else:
                data, texts = _loads_in_steps(data, pause, known)
        except ValueError as exc:
            raise ConfigError("", f"invalid JSON: {exc}", "json") from None
    node = _Node(data, "", frozenset(("version", "rules", "hasGrpcRoute")))
    recent: dict[str, Rule] = {}
    seen = 0
    by_text: dict[str, Rule] | None = None

    def rule(value: Any, path: str) -> Rule:
        nonlocal seen, by_text
        seen += 1
        if pause is not None and seen % PAUSE_EVERY == 0:
            pause()
        if isinstance(value, _Unchanged):
            return known[value.index][1]
        if texts is not None and known:
            if by_text is None:  # a rule moved or changed: find the moved ones by text
                by_text = dict(known)
            moved = by_text.get(texts[seen - 1])
            if moved is not None:
                return moved
        return _known_rule(value, path, recent)

    config = Config(
        version=node.integer("version", 0, _INT64_MAX),
        rules=node.items("rules", rule),
        has_grpc_route=node.boolean("hasGrpcRoute"),
    )
    _recent_rules = recent
    if texts is not None and len(texts) == len(config.rules):
        _recent_texts = tuple(zip(texts, config.rules))
    if pause is not None and decoded and isinstance(data, dict):
        _release_rules(data, pause)  # ours to take apart: decoded here
    return config


def _release_rules(data: dict[str, Any], pause: Pause) -> None:
    """Free the decoded rules in steps (freeing 10,000 of them at once, on return, is
    ~5 ms in one go)."""
    rules = data.get("rules")
    if isinstance(rules, list):
        while len(rules) > PAUSE_EVERY:
            del rules[-PAUSE_EVERY:]
            pause()


# The valid rules of the most recent parse, keyed by their JSON text. Pushes repeat most
# rules unchanged; validating one again costs far more than encoding it, and handing
# back the same (immutable) Rule lets Table.compile reuse its compiled form as well.
# Only the last parse's rules are kept (bounded by one config).
_recent_rules: dict[str, Rule] = {}

# The rules of the most recent stepwise parse (a pushed config), in order, each with its
# JSON text exactly as it was sent. A controller re-sends most rules byte for byte at
# the same index; such a rule is recognised by comparing text, without decoding it.
_recent_texts: tuple[tuple[str, Rule], ...] = ()


class _Unchanged:
    """Stands in the decoded ``rules`` list for rule ``index`` of the last push,
    re-sent byte for byte (see :data:`_recent_texts`)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _known_rule(value: Any, path: str, recent: dict[str, Rule]) -> Rule:
    try:
        key = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return _rule(value, path)  # not plain JSON data: validation will say why
    rule = _recent_rules.get(key) or recent.get(key)
    if rule is None:
        rule = _rule(value, path)
    recent[key] = rule
    return rule


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_JSON_SPACE = " \t\n\r"


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


def _loads_in_steps(text: str, pause: Pause,
                    known: Sequence[tuple[str, Rule]] = ()) -> tuple[Any, list[str] | None]:
    """``json.loads`` of a config, one top-level member and one ``rules`` element at a
    time with ``pause()`` between every :data:`PAUSE_EVERY` rules (one ``json.loads`` of
    1 MiB is a single ~25 ms call). Same result and same errors: anything this scanner
    does not expect is handed to ``json.loads`` whole, which says what is wrong.

    Also returns the JSON text of each rule (None if there is no ``rules`` array or
    ``json.loads`` had to decide). Rule ``i`` whose text is ``known[i]``'s, byte for
    byte, is not decoded: it stands as ``_Unchanged(i)`` in the result."""
    texts: list[str] = []
    try:
        return _object_in_steps(text, pause, known, texts)
    except (ValueError, IndexError):
        return _loads(text), None


def _object_in_steps(text: str, pause: Pause, known: Sequence[tuple[str, Rule]],
                     texts: list[str]) -> tuple[Any, list[str] | None]:
    at = _skip_space(text, 0)
    if text[at] != "{":
        return _loads(text), None  # not an object: validation rejects it, whatever it is
    result: dict[str, Any] = {}
    at = _skip_space(text, at + 1)
    if text[at] == "}":
        at += 1
    else:
        while True:
            if text[at] != '"':
                raise ValueError("member name expected")
            key, at = _DECODER.raw_decode(text, at)
            at = _skip_space(text, at)
            if text[at] != ":":
                raise ValueError("':' expected")
            at = _skip_space(text, at + 1)
            if key == "rules" and text[at] == "[":
                texts.clear()  # a repeated "rules" member: the last one wins
                result[key], at = _rules_in_steps(text, at, pause, known, texts)
            else:
                result[key], at = _DECODER.raw_decode(text, at)  # last duplicate wins
            at = _skip_space(text, at)
            if text[at] == "}":
                at += 1
                break
            if text[at] != ",":
                raise ValueError("',' or '}' expected")
            at = _skip_space(text, at + 1)
    if _skip_space(text, at) != len(text):
        raise ValueError("extra data")
    return result, (texts if isinstance(result.get("rules"), list) else None)


def _rules_in_steps(text: str, at: int, pause: Pause, known: Sequence[tuple[str, Rule]],
                    texts: list[str]) -> tuple[list[Any], int]:
    items: list[Any] = []
    at = _skip_space(text, at + 1)
    if text[at] == "]":
        return items, at + 1
    while True:
        index = len(items)
        start = at
        same = index < len(known) and text.startswith(known[index][0], at)
        if same:
            # A JSON value is self-delimiting: the known text is the whole element
            # exactly when a separator follows it.
            after = _skip_space(text, at + len(known[index][0]))
            same = after < len(text) and text[after] in ",]"
        if same:
            items.append(_Unchanged(index))
            at += len(known[index][0])
        else:
            item, at = _DECODER.raw_decode(text, at)
            items.append(item)
        texts.append(text[start:at])
        if len(items) % PAUSE_EVERY == 0:
            pause()
        at = _skip_space(text, at)
        if text[at] == "]":
            return items, at + 1
        if text[at] != ",":
            raise ValueError("',' or ']' expected")
        at = _skip_space(text, at + 1)


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in _JSON_SPACE:
        at += 1
    return at


_RULE_KEYS = frozenset(("hostnames", "matches", "filters", "backends", "timeouts",
                        "unavailableStatus", "entrances"))


def _rule(value: Any, path: str) -> Rule:
    node = _Node(value, path, _RULE_KEYS)
    hostnames = node.items("hostnames",
                           lambda v, p: _hostname(_string(v, p), p, wildcard=True))
    filters = node.items("filters", _filter)
    types = {f.type for f in filters}
    if "RequestRedirect" in types and "URLRewrite" in types:
        raise ConfigError(node.at("filters"),
                          "RequestRedirect and URLRewrite cannot be combined in one rule")
    entrances = None
    if node.data.get("entrances") is not None:
        entrances = node.items("entrances", _entrance)
    return Rule(
        hostnames=hostnames,
        matches=node.items("matches", _match),
        filters=filters,
        backends=node.items("backends", _backend),
        timeouts=node.child("timeouts", _timeouts),
        unavailable_status=_status(node, "unavailableStatus"),
        entrances=entrances,
    )


def _entrance(value: Any, path: str) -> str:
    name = _string(value, path)
    if name not in ENTRANCES:
        raise ConfigError(path, f"unknown entrance {name!r} (expected one of {ENTRANCES})")
    return name


def _match(value: Any, path: str) -> RouteMatch:
    node = _Node(value, path, frozenset(("path", "headers", "queryParams", "method")))
    method = node.string("method")
    if method and not _TOKEN.match(method):
        raise ConfigError(node.at("method"), f"invalid method {method!r}")
    return RouteMatch(
        path=node.child("path", _path_match),
        headers=node.items("headers", _value_match),
        query_params=node.items("queryParams", _value_match),
        method=method or None,
    )


def _path_match(value: Any, path: str) -> PathMatch:
    node = _Node(value, path, frozenset(("type", "value")))
    kind, text = node.string("type"), node.string("value")
    if kind not in PATH_MATCH_TYPES:
        raise ConfigError(node.at("type"), f'unknown path match type "{kind}"')
    if not text:
        raise ConfigError(node.at("value"), "path value must not be empty")
    if kind == "RegularExpression":
        _regex(text, node.at("value"))
    return PathMatch(kind, text)


def _value_match(value: Any, path: str) -> ValueMatch:
    node = _Node(value, path, frozenset(("type", "name", "value")))
    kind, name, text = node.string("type"), node.string("name"), node.string("value")
    if kind not in VALUE_MATCH_TYPES:
        raise ConfigError(node.at("type"), f'unknown match type "{kind}"')
    if not name:
        raise ConfigError(node.at("name"), "name must not be empty")
    if kind == "RegularExpression":
        _regex(text, node.at("value"))
    return ValueMatch(kind, name, text)


_FILTER_PAYLOADS: dict[str, tuple[str, str, Callable[[Any, str], Any]]] = {}


def _filter(value: Any, path: str) -> Filter:
    node = _Node(value, path, _FILTER_KEYS)
    kind = node.string("type")
    if kind not in _FILTER_PAYLOADS:
        raise ConfigError(node.at("type"), f'unknown filter type "{kind}"')
    key, field, read = _FILTER_PAYLOADS[kind]
    for other, _, _ in _FILTER_PAYLOADS.values():
        if other != key and node.data.get(other) is not None:
            raise ConfigError(node.at(other), f'unexpected payload for filter type "{kind}"')
    payload = node.child(key, read)
    if payload is None:
        raise ConfigError(node.at(key), f'filter type "{kind}" needs its "{key}" object')
    return Filter(kind, **{field: payload})


def _header_pair(value: Any, path: str) -> tuple[str, str]:
    node = _Node(value, path, frozenset(("name", "value")))
    return _header_name(node.string("name"), node.at("name")), _header_value(node)


def _header_name(name: str, path: str) -> str:
    if not _TOKEN.match(name):
        raise ConfigError(path, f"invalid header name {name!r}")
    return name


def _header_value(node: _Node) -> str:
    text = node.string("value")
    if not _FIELD_VALUE.match(text):
        raise ConfigError(node.at("value"), "header value must not contain control characters")
    return text


def _header_modifier(value: Any, path: str) -> HeaderModifier:
    node = _Node(value, path, frozenset(("set", "add", "remove")))
    return HeaderModifier(
        set=node.items("set", _header_pair),
        add=node.items("add", _header_pair),
        remove=node.items("remove", lambda v, p: _header_name(_string(v, p), p)),
    )


def _path_modifier(node: _Node, value_keys: dict[str, str]) -> PathModifier:
    """Read a path modifier whose value key depends on its type (redirect and rewrite paths differ)."""
    kind = node.string("type")
    if kind not in PATH_MODIFIER_TYPES:
        raise ConfigError(node.at("type"), f'unknown path modifier type "{kind}"')
    key = value_keys[kind]
    for other in set(value_keys.values()) - {key}:
        if node.data.get(other):
            raise ConfigError(node.at(other), f'not used by path modifier type "{kind}"')
    text = node.string(key)
    if text and not text.startswith("/"):
        raise ConfigError(node.at(key), f"path {text!r} must start with '/'")
    if not _FIELD_VALUE.match(text):
        raise ConfigError(node.at(key), "path must not contain control characters")
    return PathModifier(kind, text)


def _redirect_path(value: Any, path: str) -> PathModifier:
    node = _Node(value, path, frozenset(("type", "value")))
    return _path_modifier(node, {"ReplaceFullPath": "value", "ReplacePrefixMatch": "value"})


def _rewrite_path(value: Any, path: str) -> PathModifier:
    node = _Node(value, path, frozenset(("type", "replaceFullPath", "replacePrefixMatch")))
    return _path_modifier(node, {"ReplaceFullPath": "replaceFullPath",
                                 "ReplacePrefixMatch": "replacePrefixMatch"})


def _redirect(value: Any, path: str) -> Redirect:
    node = _Node(value, path,
                 frozenset(("scheme", "hostname", "port", "statusCode", "path")))
    scheme = node.string("scheme")
    if scheme and scheme not in DEFAULT_PORTS:
        raise ConfigError(node.at("scheme"), f'unknown scheme "{scheme}" (http or https)')
    hostname = node.string("hostname")
    if hostname:
        _hostname(hostname, node.at("hostname"), wildcard=False)
    status = node.integer("statusCode", 0, 599)
    if status and status not in REDIRECT_STATUSES:
        raise ConfigError(node.at("statusCode"),
                          f"redirect status {status} is not one of {REDIRECT_STATUSES}")
    return Redirect(
        scheme=scheme or None,
        hostname=hostname or None,
        port=node.integer("port", 0, 65535) or None,
        status_code=status or 302,
        path=node.child("path", _redirect_path),
    )


def _rewrite(value: Any, path: str) -> Rewrite:
    node = _Node(value, path, frozenset(("hostname", "path")))
    hostname = node.string("hostname")
    if hostname:
        _hostname(hostname, node.at("hostname"), wildcard=False)
    return Rewrite(hostname=hostname or None, path=node.child("path", _rewrite_path))


def _protocol(node: _Node) -> str:
    protocol = node.string("protocol")
    if protocol not in BACKEND_PROTOCOLS:
        raise ConfigError(node.at("protocol"), f'unknown protocol "{protocol}" ("" or "h2c")')
    return protocol


def _url(node: _Node, key: str) -> str:
    url = node.string(key)
    if not url:
        raise ConfigError(node.at(key), "URL must not be empty")
    try:
        split_backend_url(url)
    except ValueError as exc:
        raise ConfigError(node.at(key), str(exc)) from None
    return url


def _mirror(value: Any, path: str) -> Mirror:
    node = _Node(value, path, frozenset(("backendUrl", "percent", "tls", "protocol")))
    percent = 100
    if node.data.get("percent") is not None:
        percent = node.integer("percent", -_INT32_MAX - 1, _INT32_MAX)
        if not 0 <= percent <= 100:
            raise ConfigError(node.at("percent"), f"mirror percent {percent} is not 0..100")
    return Mirror(
        backend_url=_url(node, "backendUrl"),
        percent=percent,
        tls=node.child("tls", _tls),
        protocol=_protocol(node),
    )


def _cors(value: Any, path: str) -> Cors:
    node = _Node(value, path, frozenset(("allowOrigins", "allowCredentials", "allowMethods",
                                         "allowHeaders", "exposeHeaders", "maxAge")))
    max_age = node.integer("maxAge", -_INT32_MAX - 1, _INT32_MAX)
    if max_age < 0:
        raise ConfigError(node.at("maxAge"), f"CORS maxAge {max_age} must be >= 0")
    return Cors(
        allow_origins=node.strings("allowOrigins"),
        allow_credentials=node.boolean("allowCredentials"),
        allow_methods=node.strings("allowMethods"),
        allow_headers=node.strings("allowHeaders"),
        expose_headers=node.strings("exposeHeaders"),
        max_age=max_age,
    )


_FILTER_PAYLOADS.update({
    "RequestHeaderModifier": ("requestHeaderModifier", "request_header_modifier",
                              _header_modifier),
    "ResponseHeaderModifier": ("responseHeaderModifier", "response_header_modifier",
                               _header_modifier),
    "RequestRedirect": ("requestRedirect", "request_redirect", _redirect),
    "URLRewrite": ("urlRewrite", "url_rewrite", _rewrite),
    "RequestMirror": ("requestMirror", "request_mirror", _mirror),
    "CORS": ("cors", "cors", _cors),
})
_FILTER_KEYS = frozenset(["type", *(key for key, _, _ in _FILTER_PAYLOADS.values())])


def _base64(node: _Node, key: str) -> bytes:
    """Go ``[]byte`` fields travel as standard base64 (Go's JSON encoding)."""
    text = node.string(key)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(node.at(key), "expected standard base64") from None


def _tls(value: Any, path: str) -> BackendTLS:
    node = _Node(value, path, frozenset(("caBundle", "serverName", "subjectAltNames",
                                         "subjectAltNameUris", "clientCertPem",
                                         "clientKeyPem")))
    return BackendTLS(
        ca_bundle=node.string("caBundle"),
        server_name=node.string("serverName"),
        subject_alt_names=node.strings("subjectAltNames"),
        subject_alt_name_uris=node.strings("subjectAltNameUris"),
        client_cert_pem=_base64(node, "clientCertPem"),
        client_key_pem=_base64(node, "clientKeyPem"),
    )


_BACKEND_KEYS = frozenset(("url", "weight", "protocol", "tls", "filters", "websocket",
                           "unavailableStatus"))


def _backend(value: Any, path: str) -> Backend:
    node = _Node(value, path, _BACKEND_KEYS)
    return Backend(
        url=_url(node, "url"),
        weight=node.integer("weight", 0, _INT32_MAX),  # absent ⇒ 0, never 1 (wire rule)
        protocol=_protocol(node),
        tls=node.child("tls", _tls),
        filters=node.items("filters", _filter),
        websocket=node.boolean("websocket"),
        unavailable_status=_status(node, "unavailableStatus"),
    )


def _timeouts(value: Any, path: str) -> Timeouts:
    node = _Node(value, path, frozenset(("request", "backend")))
    return Timeouts(request=_duration(node, "request"), backend=_duration(node, "backend"))


def _duration(node: _Node, key: str) -> float | None:
    text = node.string(key)
    if not text:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ConfigError(node.at(key), str(exc)) from None
    if seconds < 0:
        raise ConfigError(node.at(key), f"negative duration {text!r}")
    return seconds or None  # 0 disables the timeout (GEP-1742)


# --------------------------------------------------------------------------- to_wire


def to_wire(config: Config) -> dict:
    """The wire JSON object for ``config``, with the controller's omitempty rules."""
    out: dict[str, Any] = {"version": config.version}
    if config.has_grpc_route:
        out["hasGrpcRoute"] = True
    out["rules"] = [_rule_wire(rule) for rule in config.rules] or None
    return out


def _rule_wire(rule: Rule) -> dict:
    out: dict[str, Any] = {}
    if rule.hostnames:
        out["hostnames"] = list(rule.hostnames)
    if rule.matches:
        out["matches"] = [_match_wire(m) for m in rule.matches]
    if rule.filters:
        out["filters"] = [_filter_wire(f) for f in rule.filters]
    out["backends"] = [_backend_wire(b) for b in rule.backends] or None
    if rule.timeouts is not None:
        out["timeouts"] = {
            key: format_duration(value)
            for key, value in (("request", rule.timeouts.request),
                               ("backend", rule.timeouts.backend))
            if value
        }
    if rule.unavailable_status:
        out["unavailableStatus"] = rule.unavailable_status
    if rule.entrances is not None:
        out["entrances"] = list(rule.entrances)
    return out


def _match_wire(match: RouteMatch) -> dict:
    out: dict[str, Any] = {}
    if match.path is not None:
        out["path"] = {"type": match.path.type, "value": match.path.value}
    if match.headers:
        out["headers"] = [_value_match_wire(v) for v in match.headers]
    if match.query_params:
        out["queryParams"] = [_value_match_wire(v) for v in match.query_params]
    if match.method:
        out["method"] = match.method
    return out


def _value_match_wire(match: ValueMatch) -> dict:
    return {"type": match.type, "name": match.name, "value": match.value}


def _filter_wire(f: Filter) -> dict:
    key = _FILTER_PAYLOADS[f.type][0]
    if f.type in ("RequestHeaderModifier", "ResponseHeaderModifier"):
        mod = f.request_header_modifier or f.response_header_modifier
        assert mod is not None
        payload = _header_modifier_wire(mod)
    elif f.type == "RequestRedirect":
        payload = _redirect_wire(f.request_redirect)
    elif f.type == "URLRewrite":
        payload = _rewrite_wire(f.url_rewrite)
    elif f.type == "RequestMirror":
        payload = _mirror_wire(f.request_mirror)
    else:
        payload = _cors_wire(f.cors)
    return {"type": f.type, key: payload}


def _header_modifier_wire(mod: HeaderModifier) -> dict:
    out: dict[str, Any] = {}
    for key, pairs in (("set", mod.set), ("add", mod.add)):
        if pairs:
            out[key] = [{"name": n, "value": v} for n, v in pairs]
    if mod.remove:
        out["remove"] = list(mod.remove)
    return out


def _redirect_wire(r: Redirect | None) -> dict:
    assert r is not None
    out: dict[str, Any] = {}
    for key, value in (("scheme", r.scheme), ("hostname", r.hostname), ("port", r.port),
                       ("statusCode", r.status_code)):
        if value:
            out[key] = value
    if r.path is not None:
        out["path"] = {"type": r.path.type, "value": r.path.value}
    return out


def _rewrite_wire(r: Rewrite | None) -> dict:
    assert r is not None
    out: dict[str, Any] = {}
    if r.hostname:
        out["hostname"] = r.hostname
    if r.path is not None:
        key = "replaceFullPath" if r.path.type == "ReplaceFullPath" else "replacePrefixMatch"
        out["path"] = {"type": r.path.type, key: r.path.value}
    return out


def _mirror_wire(m: Mirror | None) -> dict:
    assert m is not None
    out: dict[str, Any] = {"backendUrl": m.backend_url, "percent": m.percent}
    if m.tls is not None:
        out["tls"] = _tls_wire(m.tls)
    if m.protocol:
        out["protocol"] = m.protocol
    return out


def _cors_wire(c: Cors | None) -> dict:
    assert c is not None
    out: dict[str, Any] = {}
    for key, values in (("allowOrigins", c.allow_origins), ("allowMethods", c.allow_methods),
                        ("allowHeaders", c.allow_headers),
                        ("exposeHeaders", c.expose_headers)):
        if values:
            out[key] = list(values)
    if c.allow_credentials:
        out["allowCredentials"] = True
    if c.max_age:
        out["maxAge"] = c.max_age
    return out


def _tls_wire(t: BackendTLS) -> dict:
    out: dict[str, Any] = {}
    for key, value in (("caBundle", t.ca_bundle), ("serverName", t.server_name)):
        if value:
            out[key] = value
    for key, values in (("subjectAltNames", t.subject_alt_names),
                        ("subjectAltNameUris", t.subject_alt_name_uris)):
        if values:
            out[key] = list(values)
    for key, data in (("clientCertPem", t.client_cert_pem), ("clientKeyPem", t.client_key_pem)):
        if data:
            out[key] = base64.b64encode(data).decode("ascii")
    return out


def _backend_wire(b: Backend) -> dict:
    out: dict[str, Any] = {"url": b.url, "weight": b.weight}
    if b.protocol:
        out["protocol"] = b.protocol
    if b.tls is not None:
        out["tls"] = _tls_wire(b.tls)
    if b.filters:
        out["filters"] = [_filter_wire(f) for f in b.filters]
    if b.websocket:
        out["websocket"] = True
    if b.unavailable_status:
        out["unavailableStatus"] = b.unavailable_status
    return out
