"""A config back to the wire JSON the controller would have sent (the inverse of
:func:`routing.config.parse_config`), with the controller's omitempty rules; each
filter's payload by its registry entry (:mod:`routing.filterkinds`)."""

from __future__ import annotations

from typing import Any

from routing.backend_tls import tls_wire
from routing.filterkinds import KINDS, payload
from routing.model import (
    Backend, Config, Filter, Retry, RetryConstraint, Rule, RouteMatch, ValueMatch,
)
from routing.values import format_duration


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
    if rule.retry is not None:
        out["retry"] = _retry_wire(rule.retry)
    return out


def _retry_wire(retry: Retry) -> dict:
    out: dict[str, Any] = {"attempts": retry.attempts,
                           "backoff": format_duration(retry.backoff)}
    if retry.codes:
        out["codes"] = list(retry.codes)
    return out


def constraint_wire(c: RetryConstraint) -> dict:
    """A retry budget in wire form (also what an XBackendTrafficPolicy becomes)."""
    return {"budget": {"percent": c.percent, "interval": format_duration(c.interval)},
            "minRetryRate": {"count": c.min_retries,
                             "interval": format_duration(c.min_retry_interval)}}


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
    kind = KINDS[f.type]
    return {"type": f.type, kind.key: kind.wire(payload(f))}


def _backend_wire(b: Backend) -> dict:
    out: dict[str, Any] = {"url": b.url, "weight": b.weight}
    if b.protocol:
        out["protocol"] = b.protocol
    if b.tls is not None:
        out["tls"] = tls_wire(b.tls)
    if b.filters:
        out["filters"] = [_filter_wire(f) for f in b.filters]
    if b.websocket:
        out["websocket"] = True
    if b.unavailable_status:
        out["unavailableStatus"] = b.unavailable_status
    if b.retry_constraint is not None:
        out["retryConstraint"] = constraint_wire(b.retry_constraint)
    return out
