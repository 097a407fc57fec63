"""Validation of a decoded wire config, field by field.

Every check the Go data plane makes, and every one this data plane needs before it can
serve a config as intended: unknown keys, wrong JSON types, unparseable backend URLs,
regular expressions RE2 rejects or that exceed the limits of :mod:`routing.regex`,
header names/values that would let a config inject header lines, out-of-range status
codes, and the length limits (``maxLength``) of the Gateway API fields a value comes
from (:data:`routing.fields.MAX_LENGTHS`). Every error is a
:class:`~routing.model.ConfigError` naming the offending field by its JSON path, e.g.
``rules[3].matches[0].path.type: unknown path match type "Foo"``; a value it quotes is
clipped (:func:`routing.values.shown`), so a megabyte pushed is never echoed whole.

This module reads a rule: its matches, backends, timeouts and retry policy. Objects
are read through :class:`routing.node.Node`, single values are checked by
:mod:`routing.fields`, and each filter's payload by its type's registry entry
(:mod:`routing.filterkinds`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator

import re2

from routing.backend_tls import read_tls
from routing.fields import (
    INT32_MAX, TOKEN, backend_url, bounded_string, header_name, hostname, protocol,
)
from routing.filterkinds import KINDS, PAYLOAD_KEYS, conflict
from routing.model import (
    ENTRANCES, PATH_MATCH_TYPES, VALUE_MATCH_TYPES, Backend, ConfigError, Filter, PathMatch,
    Retry, RetryConstraint, RouteMatch, Rule, Timeouts, ValueMatch,
)
from routing.node import Node, join, json_type, string
from routing.regex import MAX_PROGRAM_SIZE, compile_regex, program_size
from routing.values import clip, parse_duration, shown


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


_RULE_KEYS = frozenset(("hostnames", "matches", "filters", "backends", "timeouts",
                        "unavailableStatus", "entrances", "retry"))


def read_rule(value: Any, path: str) -> Rule:
    """The validated rule ``value`` (decoded JSON) at field path ``path``."""
    node = Node(value, path, _RULE_KEYS)
    hostnames = read_hostnames(node.get("hostnames"), path)
    filters = node.items("filters", _filter)
    pair = conflict({f.type for f in filters})
    if pair is not None:
        raise ConfigError(node.at("filters"),
                          f"{pair[0]} and {pair[1]} cannot be combined in one rule")
    entrances = None
    if node.get("entrances") is not None:
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
    return hostname(string(value, path), path, wildcard=True)


def _entrance(value: Any, path: str) -> str:
    name = string(value, path)
    if name not in ENTRANCES:
        raise ConfigError(path, f"unknown entrance {shown(name)} (expected one of "
                                f"{ENTRANCES})")
    return name


def _match(value: Any, path: str) -> RouteMatch:
    node = Node(value, path, frozenset(("path", "headers", "queryParams", "method")))
    method = node.string("method")
    if method and not TOKEN.match(method):
        raise ConfigError(node.at("method"), f"invalid method {shown(method)}")
    return RouteMatch(
        path=node.child("path", _path_match),
        headers=node.items("headers", _header_match),
        query_params=node.items("queryParams", _value_match),
        method=method or None,
    )


def _path_match(value: Any, path: str) -> PathMatch:
    node = Node(value, path, frozenset(("type", "value")))
    kind, text = node.string("type"), bounded_string(node, "value", "path")
    if kind not in PATH_MATCH_TYPES:
        raise ConfigError(node.at("type"), f'unknown path match type "{clip(kind)}"')
    if not text:
        raise ConfigError(node.at("value"), "path value must not be empty")
    return PathMatch(kind, text)  # a regex is compiled by read_rule, with its budget


def _value_match(value: Any, path: str, kind_of: str = "query parameter") -> ValueMatch:
    """A header or (``kind_of``) query parameter match, lengths within their limits."""
    node = Node(value, path, frozenset(("type", "name", "value")))
    kind, name = node.string("type"), bounded_string(node, "name", f"{kind_of} name")
    text = bounded_string(node, "value", f"{kind_of} value")
    if kind not in VALUE_MATCH_TYPES:
        raise ConfigError(node.at("type"), f'unknown match type "{clip(kind)}"')
    if not name:
        raise ConfigError(node.at("name"), "name must not be empty")
    return ValueMatch(kind, name, text)


def _header_match(value: Any, path: str) -> ValueMatch:
    """A header match; its name is a field name (RFC 9110 §5.1), which Gateway API's
    HTTPHeaderName also requires: any other name could never match."""
    match = _value_match(value, path, "header")
    header_name(match.name, join(path, "name"))
    return match


def _filter(value: Any, path: str) -> Filter:
    node = Node(value, path, _FILTER_KEYS)
    name = node.string("type")
    kind = KINDS.get(name)
    if kind is None:
        raise ConfigError(node.at("type"), f'unknown filter type "{clip(name)}"')
    for other in PAYLOAD_KEYS:
        if other != kind.key and node.get(other) is not None:
            raise ConfigError(node.at(other), f'unexpected payload for filter type "{name}"')
    payload = node.child(kind.key, kind.read)
    if payload is None:
        raise ConfigError(node.at(kind.key),
                          f'filter type "{name}" needs its "{kind.key}" object')
    return Filter(name, **{kind.field: payload})


_FILTER_KEYS = frozenset(("type", *PAYLOAD_KEYS))
_BACKEND_KEYS = frozenset(("url", "weight", "protocol", "tls", "filters", "websocket",
                           "unavailableStatus", "retryConstraint"))


def _backend(value: Any, path: str) -> Backend:
    node = Node(value, path, _BACKEND_KEYS)
    return Backend(
        url=backend_url(node, "url"),
        weight=node.integer("weight", 0, INT32_MAX),  # absent ⇒ 0, never 1 (wire rule)
        protocol=protocol(node),
        tls=node.child("tls", read_tls),
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
    if node.get("attempts") is not None:
        attempts = node.integer("attempts", 1, MAX_RETRY_ATTEMPTS)
    backoff = default.backoff
    if node.get("backoff") is not None:
        backoff = _duration(node, "backoff") or 0.0
    return Retry(codes=codes, attempts=attempts, backoff=backoff)


def _retry_code(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"expected an integer, got {json_type(value)}")
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
        if budget.get("percent") is not None:
            percent = budget.integer("percent", 0, 100)
        interval = _interval(budget, default.interval, 1.0, 3600.0)
    count, rate_interval = default.min_retries, default.min_retry_interval
    if rate is not None:
        if rate.get("count") is not None:
            count = rate.integer("count", 0, INT32_MAX)
        rate_interval = _interval(rate, default.min_retry_interval, 1.0, 3600.0)
    return RetryConstraint(percent=percent, interval=interval, min_retries=count,
                           min_retry_interval=rate_interval)


def _interval(node: Node, default: float, low: float, high: float) -> float:
    """A GEP-3388 ``interval`` (1s to 1h), or ``default`` when absent."""
    if node.get("interval") is None:
        return default
    seconds = _duration(node, "interval") or 0.0
    if not low <= seconds <= high:
        raise ConfigError(node.at("interval"), f"{node.data['interval']!r} is out of "
                                               "range 1s..1h (GEP-3388)")
    return seconds
