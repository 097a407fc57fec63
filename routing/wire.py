"""A config back to the wire JSON the controller would have sent (the inverse of
:func:`routing.config.parse_config`), with the controller's omitempty rules."""

from __future__ import annotations

import base64
from types import MappingProxyType
from typing import Any, Callable, Final

from routing.model import (
    FILTER_PAYLOADS, Backend, BackendTLS, Config, Cors, Filter, HeaderModifier, Mirror,
    Redirect, Retry, RetryConstraint, Rewrite, Rule, RouteMatch, ValueMatch,
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
    key, field = FILTER_PAYLOADS[f.type]
    return {"type": f.type, key: _PAYLOAD_WIRE[f.type](getattr(f, field))}


def _header_modifier_wire(mod: HeaderModifier) -> dict:
    out: dict[str, Any] = {}
    for key, pairs in (("set", mod.set), ("add", mod.add)):
        if pairs:
            out[key] = [{"name": n, "value": v} for n, v in pairs]
    if mod.remove:
        out["remove"] = list(mod.remove)
    return out


def _redirect_wire(r: Redirect) -> dict:
    out: dict[str, Any] = {}
    for key, value in (("scheme", r.scheme), ("hostname", r.hostname), ("port", r.port),
                       ("statusCode", r.status_code)):
        if value:
            out[key] = value
    if r.path is not None:
        out["path"] = {"type": r.path.type, "value": r.path.value}
    return out


def _rewrite_wire(r: Rewrite) -> dict:
    out: dict[str, Any] = {}
    if r.hostname:
        out["hostname"] = r.hostname
    if r.path is not None:
        key = "replaceFullPath" if r.path.type == "ReplaceFullPath" else "replacePrefixMatch"
        out["path"] = {"type": r.path.type, key: r.path.value}
    return out


def _mirror_wire(m: Mirror) -> dict:
    out: dict[str, Any] = {"backendUrl": m.backend_url, "percent": m.percent}
    if m.tls is not None:
        out["tls"] = _tls_wire(m.tls)
    if m.protocol:
        out["protocol"] = m.protocol
    return out


def _cors_wire(c: Cors) -> dict:
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


# The wire form of each filter type's payload, by type (the inverse of
# routing.validate's payload readers).
_PAYLOAD_WIRE: Final[MappingProxyType[str, Callable[[Any], dict]]] = MappingProxyType({
    "RequestHeaderModifier": _header_modifier_wire,
    "ResponseHeaderModifier": _header_modifier_wire,
    "RequestRedirect": _redirect_wire,
    "URLRewrite": _rewrite_wire,
    "RequestMirror": _mirror_wire,
    "CORS": _cors_wire,
})


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
    if b.retry_constraint is not None:
        out["retryConstraint"] = constraint_wire(b.retry_constraint)
    return out
