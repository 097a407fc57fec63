"""Validation of a decoded wire config, field by field.

Every check the Go data plane makes, and every one this data plane needs before it can
serve a config as intended: unknown keys, wrong JSON types, unparseable backend URLs,
regular expressions RE2 rejects or that exceed the limits of :mod:`routing.regex`,
header names/values that would let a config inject header lines, out-of-range status
codes, and the length limits (``maxLength``) of the Gateway API fields a value comes
from (:data:`MAX_LENGTHS`). Every error is a
:class:`~routing.model.ConfigError` naming the offending field by its JSON path, e.g.
``rules[3].matches[0].path.type: unknown path match type "Foo"``; a value it quotes is
clipped (:func:`routing.values.shown`), so a megabyte pushed is never echoed whole.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import quote

import re2

from routing.model import (
    BACKEND_PROTOCOLS, DEFAULT_PORTS, ENTRANCES, FILTER_PAYLOADS, PATH_MATCH_TYPES,
    PATH_MODIFIER_TYPES, PATH_SAFE, REDIRECT_STATUSES, VALUE_MATCH_TYPES, Backend, BackendTLS,
    ConfigError, Cors, Filter, HeaderModifier, Mirror, PathMatch, PathModifier, Redirect,
    Retry, RetryConstraint, Rewrite, RouteMatch, Rule, Timeouts, ValueMatch,
)
from routing.regex import MAX_PROGRAM_SIZE, compile_regex, program_size
from routing.values import clip, parse_duration, shown, split_backend_url

T = TypeVar("T")

_INT32_MAX = 2**31 - 1

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

# Gateway API's CRD maxLength of each kind of value (apis/v1 shared_types.go,
# httproute_types.go, backendtlspolicy_types.go): Hostname and PreciseHostname 253 (a
# backend's TLS serverName and subjectAltNames too), HeaderName 256 (header and query
# parameter names, CORS header lists), HTTPHeader and HTTPHeaderMatch values 4096,
# HTTPPathMatch and HTTPPathModifier values and query parameter values 1024, CORS
# origins and AbsoluteURI (subjectAltNameUris) 253; RFC 1123 caps a hostname label at
# 63. An API server refuses an HTTPRoute over these; so does this validator, whatever
# the config came from.
MAX_HOSTNAME = 253
MAX_LABEL = 63
MAX_HEADER_NAME = 256
MAX_HEADER_VALUE = 4096
MAX_PATH = 1024
MAX_QUERY_VALUE = 1024
MAX_URI = 253
MAX_LENGTHS = MappingProxyType({
    "hostname": MAX_HOSTNAME, "header name": MAX_HEADER_NAME,
    "query parameter name": MAX_HEADER_NAME, "header value": MAX_HEADER_VALUE,
    "path": MAX_PATH, "query parameter value": MAX_QUERY_VALUE, "CORS origin": MAX_URI,
    "URI": MAX_URI,
})


class Node:
    """A JSON object being read, with its path for error messages."""

    __slots__ = ("data", "path")

    def __init__(self, value: Any, path: str, keys: frozenset[str]) -> None:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected an object, got {_json_type(value)}")
        for key in value:
            if key not in keys:
                raise ConfigError(_join(path, clip(str(key))), "unknown field")
        self.data = value
        self.path = path

    def at(self, key: str) -> str:
        return _join(self.path, key)

    def string(self, key: str, what: str = "") -> str:
        """The string at ``key`` (absent: ``""``); ``what`` names the kind of value
        whose length limit applies (a key of :data:`MAX_LENGTHS`)."""
        value = self.data.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise ConfigError(self.at(key), f"expected a string, got {_json_type(value)}")
        return bounded(value, self.at(key), what) if what else value

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


def bounded(value: str, path: str, what: str) -> str:
    """``value`` if it is within the length limit of a ``what`` (:data:`MAX_LENGTHS`)."""
    limit = MAX_LENGTHS[what]
    if len(value) > limit:
        raise ConfigError(path, f"{what} is {len(value)} characters long, more than the "
                                f"limit of {limit}")
    return value


def _bounded_strings(what: str) -> Callable[[Any, str], str]:
    """A list element reader: a string within the length limit of a ``what``."""
    return lambda value, path: bounded(_string(value, path), path, what)


def _status(node: Node, key: str) -> int:
    """``unavailableStatus``: 0 (off) or a real HTTP status."""
    status = node.integer(key, 0, 599)
    if 0 < status < 100:
        raise ConfigError(node.at(key), f"status {status} is not 0 or 100..599")
    return status


def _regex(pattern: str, path: str) -> int:
    """Compile ``pattern`` as the table will; its program size (the rule adds them up)."""
    try:
        compiled = compile_regex(pattern)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise ConfigError(path, f"invalid regular expression {shown(pattern)}: "
                                f"{detail}") from None
    size = program_size(compiled)
    if size > MAX_PROGRAM_SIZE:
        raise ConfigError(path, f"regular expression {shown(pattern)} compiles to {size} "
                          f"instructions, more than the limit of {MAX_PROGRAM_SIZE}")
    return size


def regex_fields(rule: Rule) -> Iterator[tuple[str, str]]:
    """(field path relative to the rule, pattern) of every regular expression in
    ``rule``, in document order."""
    for j, match in enumerate(rule.matches):
        if match.path is not None and match.path.type == "RegularExpression":
            yield f"matches[{j}].path.value", match.path.value
        for key, values in (("headers", match.headers), ("queryParams", match.query_params)):
            for k, value in enumerate(values):
                if value.type == "RegularExpression":
                    yield f"matches[{j}].{key}[{k}].value", value.value


def regex_sizes(rule: Rule, path: str) -> Iterator[tuple[str, int]]:
    """(field path, program size) of every regular expression in ``rule``, which is at
    ``path``; raises :class:`ConfigError` for one RE2 rejects or that is too large."""
    for field, pattern in regex_fields(rule):
        where = f"{path}.{field}"
        yield where, _regex(pattern, where)


def hostname_problem(value: str, *, wildcard: bool) -> str | None:
    """Why ``value`` is not a Gateway API Hostname (``wildcard``: a leading ``*.`` label
    is allowed) or PreciseHostname, or None if it is one: RFC 1123 labels (letters,
    digits, inner ``-``) of at most 63 characters, at most 253 in all."""
    if len(value) > MAX_HOSTNAME:
        return f"{len(value)} characters long, more than the limit of {MAX_HOSTNAME}"
    if not (_HOSTNAME if wildcard else _PRECISE_HOSTNAME).match(value):
        where = "; a wildcard only as a leading '*.'" if wildcard else ""
        return ("not an RFC 1123 name (dot-separated labels of letters, digits and "
                f"inner '-'{where})")
    label = max(value.split("."), key=len)
    if len(label) > MAX_LABEL:
        return (f"label {shown(label)} is {len(label)} characters long, more than the "
                f"limit of {MAX_LABEL}")
    return None


def _hostname(value: str, path: str, *, wildcard: bool) -> str:
    problem = hostname_problem(value, wildcard=wildcard)
    if problem is not None:
        raise ConfigError(path, f"invalid hostname {shown(value)}: {problem}")
    return value


_RULE_KEYS = frozenset(("hostnames", "matches", "filters", "backends", "timeouts",
                        "unavailableStatus", "entrances", "retry"))


def read_rule(value: Any, path: str) -> Rule:
    """The validated rule ``value`` (decoded JSON) at field path ``path``."""
    node = Node(value, path, _RULE_KEYS)
    hostnames = read_hostnames(node.data.get("hostnames"), path)
    filters = node.items("filters", _filter)
    types = {f.type for f in filters}
    if "RequestRedirect" in types and "URLRewrite" in types:
        raise ConfigError(node.at("filters"),
                          "RequestRedirect and URLRewrite cannot be combined in one rule")
    entrances = None
    if node.data.get("entrances") is not None:
        entrances = node.items("entrances", _entrance)
    rule = Rule(
        hostnames=hostnames,
        matches=node.items("matches", _match),
        filters=filters,
        backends=node.items("backends", _backend),
        timeouts=node.child("timeouts", _timeouts),
        unavailable_status=_status(node, "unavailableStatus"),
        entrances=entrances,
        retry=node.child("retry", read_retry),
    )
    size = sum(size for _, size in regex_sizes(rule, path))
    return replace(rule, regex_program_size=size) if size else rule


def read_hostnames(value: Any, path: str) -> tuple[str, ...]:
    """The ``hostnames`` (decoded JSON; ``None``: absent) of the rule at field path
    ``path``. No other field of a rule bears on them, nor they on another: a caller
    that validated the rest of an equal rule may validate these alone."""
    return Node({"hostnames": value}, path, _HOSTNAMES).items("hostnames", _rule_hostname)


_HOSTNAMES = frozenset(("hostnames",))


def _rule_hostname(value: Any, path: str) -> str:
    return _hostname(_string(value, path), path, wildcard=True)


def _entrance(value: Any, path: str) -> str:
    name = _string(value, path)
    if name not in ENTRANCES:
        raise ConfigError(path, f"unknown entrance {shown(name)} (expected one of "
                                f"{ENTRANCES})")
    return name


def _match(value: Any, path: str) -> RouteMatch:
    node = Node(value, path, frozenset(("path", "headers", "queryParams", "method")))
    method = node.string("method")
    if method and not _TOKEN.match(method):
        raise ConfigError(node.at("method"), f"invalid method {shown(method)}")
    return RouteMatch(
        path=node.child("path", _path_match),
        headers=node.items("headers", _header_match),
        query_params=node.items("queryParams", _value_match),
        method=method or None,
    )


def _path_match(value: Any, path: str) -> PathMatch:
    node = Node(value, path, frozenset(("type", "value")))
    kind, text = node.string("type"), node.string("value", "path")
    if kind not in PATH_MATCH_TYPES:
        raise ConfigError(node.at("type"), f'unknown path match type "{clip(kind)}"')
    if not text:
        raise ConfigError(node.at("value"), "path value must not be empty")
    return PathMatch(kind, text)  # a regex is compiled by read_rule, with its budget


def _value_match(value: Any, path: str, kind_of: str = "query parameter") -> ValueMatch:
    """A header or (``kind_of``) query parameter match, lengths within their limits."""
    node = Node(value, path, frozenset(("type", "name", "value")))
    kind, name = node.string("type"), node.string("name", f"{kind_of} name")
    text = node.string("value", f"{kind_of} value")
    if kind not in VALUE_MATCH_TYPES:
        raise ConfigError(node.at("type"), f'unknown match type "{clip(kind)}"')
    if not name:
        raise ConfigError(node.at("name"), "name must not be empty")
    return ValueMatch(kind, name, text)


def _header_match(value: Any, path: str) -> ValueMatch:
    """A header match; its name is a field name (RFC 9110 §5.1), which Gateway API's
    HTTPHeaderName also requires: any other name could never match."""
    match = _value_match(value, path, "header")
    _header_name(match.name, _join(path, "name"))
    return match


def _filter(value: Any, path: str) -> Filter:
    node = Node(value, path, _FILTER_KEYS)
    kind = node.string("type")
    if kind not in FILTER_PAYLOADS:
        raise ConfigError(node.at("type"), f'unknown filter type "{clip(kind)}"')
    key, field = FILTER_PAYLOADS[kind]
    for other, _ in FILTER_PAYLOADS.values():
        if other != key and node.data.get(other) is not None:
            raise ConfigError(node.at(other), f'unexpected payload for filter type "{kind}"')
    payload = node.child(key, _PAYLOAD_READERS[kind])
    if payload is None:
        raise ConfigError(node.at(key), f'filter type "{kind}" needs its "{key}" object')
    return Filter(kind, **{field: payload})


def _header_pair(value: Any, path: str) -> tuple[str, str]:
    node = Node(value, path, frozenset(("name", "value")))
    return _header_name(node.string("name"), node.at("name")), _header_value(node)


def _header_name(name: str, path: str) -> str:
    if not _TOKEN.match(bounded(name, path, "header name")):
        raise ConfigError(path, f"invalid header name {shown(name)}")
    return name


def _header_value(node: Node) -> str:
    text = node.string("value", "header value")
    if not _FIELD_VALUE.match(text):
        raise ConfigError(node.at("value"), "header value must not contain control characters")
    return text


def _header_modifier(value: Any, path: str) -> HeaderModifier:
    node = Node(value, path, frozenset(("set", "add", "remove")))
    return HeaderModifier(
        set=node.items("set", _header_pair),
        add=node.items("add", _header_pair),
        remove=node.items("remove", lambda v, p: _header_name(_string(v, p), p)),
    )


def _path_modifier(node: Node, value_keys: dict[str, str]) -> PathModifier:
    """Read a path modifier whose value key depends on its type (redirect and rewrite paths differ)."""
    kind = node.string("type")
    if kind not in PATH_MODIFIER_TYPES:
        raise ConfigError(node.at("type"), f'unknown path modifier type "{clip(kind)}"')
    key = value_keys[kind]
    for other in set(value_keys.values()) - {key}:
        if node.data.get(other):
            raise ConfigError(node.at(other), f'not used by path modifier type "{kind}"')
    text = node.string(key, "path")
    if text and not text.startswith("/"):
        raise ConfigError(node.at(key), f"path {shown(text)} must start with '/'")
    if not _FIELD_VALUE.match(text):
        raise ConfigError(node.at(key), "path must not contain control characters")
    # The value goes on a request line or into a Location: what a path may not hold
    # (a space, a tab, "?", "#", non-ASCII...) is percent-encoded (UTF-8), as a URL
    # library would; "%XX" escapes already there stay as they are.
    return PathModifier(kind, quote(text, safe=PATH_SAFE + "%"))


def _redirect_path(value: Any, path: str) -> PathModifier:
    node = Node(value, path, frozenset(("type", "value")))
    return _path_modifier(node, {"ReplaceFullPath": "value", "ReplacePrefixMatch": "value"})


def _rewrite_path(value: Any, path: str) -> PathModifier:
    node = Node(value, path, frozenset(("type", "replaceFullPath", "replacePrefixMatch")))
    return _path_modifier(node, {"ReplaceFullPath": "replaceFullPath",
                                 "ReplacePrefixMatch": "replacePrefixMatch"})


def _redirect(value: Any, path: str) -> Redirect:
    node = Node(value, path,
                 frozenset(("scheme", "hostname", "port", "statusCode", "path")))
    scheme = node.string("scheme")
    if scheme and scheme not in DEFAULT_PORTS:
        raise ConfigError(node.at("scheme"),
                          f'unknown scheme "{clip(scheme)}" (http or https)')
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
    node = Node(value, path, frozenset(("hostname", "path")))
    hostname = node.string("hostname")
    if hostname:
        _hostname(hostname, node.at("hostname"), wildcard=False)
    return Rewrite(hostname=hostname or None, path=node.child("path", _rewrite_path))


def _protocol(node: Node) -> str:
    protocol = node.string("protocol")
    if protocol not in BACKEND_PROTOCOLS:
        raise ConfigError(node.at("protocol"),
                          f'unknown protocol "{clip(protocol)}" ("" or "h2c")')
    return protocol


def _url(node: Node, key: str) -> str:
    url = node.string(key)
    if not url:
        raise ConfigError(node.at(key), "URL must not be empty")
    try:
        split_backend_url(url)
    except ValueError as exc:
        raise ConfigError(node.at(key), str(exc)) from None
    return url


def _mirror(value: Any, path: str) -> Mirror:
    node = Node(value, path, frozenset(("backendUrl", "percent", "tls", "protocol")))
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
    node = Node(value, path, frozenset(("allowOrigins", "allowCredentials", "allowMethods",
                                         "allowHeaders", "exposeHeaders", "maxAge")))
    max_age = node.integer("maxAge", -_INT32_MAX - 1, _INT32_MAX)
    if max_age < 0:
        raise ConfigError(node.at("maxAge"), f"CORS maxAge {max_age} must be >= 0")
    return Cors(
        allow_origins=node.items("allowOrigins", _bounded_strings("CORS origin")),
        allow_credentials=node.boolean("allowCredentials"),
        allow_methods=node.strings("allowMethods"),
        allow_headers=node.items("allowHeaders", _bounded_strings("header name")),
        expose_headers=node.items("exposeHeaders", _bounded_strings("header name")),
        max_age=max_age,
    )


_PAYLOAD_READERS: MappingProxyType[str, Callable[[Any, str], Any]] = MappingProxyType({
    "RequestHeaderModifier": _header_modifier,
    "ResponseHeaderModifier": _header_modifier,
    "RequestRedirect": _redirect,
    "URLRewrite": _rewrite,
    "RequestMirror": _mirror,
    "CORS": _cors,
})
_FILTER_KEYS = frozenset(["type", *(key for key, _ in FILTER_PAYLOADS.values())])


def _base64(node: Node, key: str) -> bytes:
    """Go ``[]byte`` fields travel as standard base64 (Go's JSON encoding)."""
    text = node.string(key)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(node.at(key), "expected standard base64") from None


def _tls(value: Any, path: str) -> BackendTLS:
    node = Node(value, path, frozenset(("caBundle", "serverName", "subjectAltNames",
                                         "subjectAltNameUris", "clientCertPem",
                                         "clientKeyPem")))
    return BackendTLS(
        ca_bundle=node.string("caBundle"),
        server_name=node.string("serverName", "hostname"),
        subject_alt_names=node.items("subjectAltNames", _bounded_strings("hostname")),
        subject_alt_name_uris=node.items("subjectAltNameUris", _bounded_strings("URI")),
        client_cert_pem=_base64(node, "clientCertPem"),
        client_key_pem=_base64(node, "clientKeyPem"),
    )


_BACKEND_KEYS = frozenset(("url", "weight", "protocol", "tls", "filters", "websocket",
                           "unavailableStatus", "retryConstraint"))


def _backend(value: Any, path: str) -> Backend:
    node = Node(value, path, _BACKEND_KEYS)
    return Backend(
        url=_url(node, "url"),
        weight=node.integer("weight", 0, _INT32_MAX),  # absent ⇒ 0, never 1 (wire rule)
        protocol=_protocol(node),
        tls=node.child("tls", _tls),
        filters=node.items("filters", _filter),
        websocket=node.boolean("websocket"),
        unavailable_status=_status(node, "unavailableStatus"),
        retry_constraint=node.child("retryConstraint", read_retry_constraint),
    )


def _timeouts(value: Any, path: str) -> Timeouts:
    node = Node(value, path, frozenset(("request", "backend")))
    return Timeouts(request=_duration(node, "request"), backend=_duration(node, "backend"))


def _duration(node: Node, key: str) -> float | None:
    text = node.string(key)
    if not text:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ConfigError(node.at(key), str(exc)) from None
    if seconds < 0:
        raise ConfigError(node.at(key), f"negative duration {shown(text)}")
    return seconds or None  # 0 disables the timeout (GEP-1742)



MAX_RETRY_ATTEMPTS = 100  # the timeouts and the budget bound retries; this bounds a typo


def read_retry(value: Any, path: str) -> Retry:
    """A rule's ``retry`` (GEP-1731): ``codes`` unique statuses 400–599, ``attempts``
    (retries, at least 1), ``backoff`` (the minimum wait before a retry)."""
    node = Node(value, path, frozenset(("codes", "attempts", "backoff")))
    codes = node.items("codes", _retry_code)
    for i, code in enumerate(codes):
        if code in codes[:i]:
            raise ConfigError(f"{node.at('codes')}[{i}]", f"status {code} is listed twice")
    default = Retry()
    attempts = default.attempts
    if node.data.get("attempts") is not None:
        attempts = node.integer("attempts", 1, MAX_RETRY_ATTEMPTS)
    backoff = default.backoff
    if node.data.get("backoff") is not None:
        backoff = _duration(node, "backoff") or 0.0
    return Retry(codes=codes, attempts=attempts, backoff=backoff)


def _retry_code(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"expected an integer, got {_json_type(value)}")
    if not 400 <= value <= 599:
        raise ConfigError(path, f"status {value} is out of range 400..599 (GEP-1731)")
    return value


def read_retry_constraint(value: Any, path: str) -> RetryConstraint:
    """A backend's ``retryConstraint`` (GEP-3388): ``budget{percent, interval}`` and
    ``minRetryRate{count, interval}``, each field defaulting to the GEP's value."""
    node = Node(value, path, frozenset(("budget", "minRetryRate")))
    default = RetryConstraint()
    budget = node.child("budget", lambda v, p: Node(v, p, frozenset(("percent", "interval"))))
    rate = node.child("minRetryRate", lambda v, p: Node(v, p, frozenset(("count", "interval"))))
    percent, interval = default.percent, default.interval
    if budget is not None:
        if budget.data.get("percent") is not None:
            percent = budget.integer("percent", 0, 100)
        interval = _interval(budget, default.interval, 1.0, 3600.0)
    count, rate_interval = default.min_retries, default.min_retry_interval
    if rate is not None:
        if rate.data.get("count") is not None:
            count = rate.integer("count", 0, _INT32_MAX)
        rate_interval = _interval(rate, default.min_retry_interval, 1.0, 3600.0)
    return RetryConstraint(percent=percent, interval=interval, min_retries=count,
                           min_retry_interval=rate_interval)


def _interval(node: Node, default: float, low: float, high: float) -> float:
    """A GEP-3388 ``interval`` (1s to 1h), or ``default`` when absent."""
    if node.data.get("interval") is None:
        return default
    seconds = _duration(node, "interval") or 0.0
    if not low <= seconds <= high:
        raise ConfigError(node.at("interval"), f"{node.data['interval']!r} is out of "
                                               "range 1s..1h (GEP-3388)")
    return seconds
