"""Checks of the values the wire config shares between its parts: length limits,
header names and values, hostnames, backend URLs and protocols.

Each check raises a :class:`~routing.model.ConfigError` naming the field by its path;
a value it quotes is clipped (:func:`routing.values.shown`). The readers of a rule
(:mod:`routing.validate`) and of each filter's payload (:mod:`routing.filters`) use
them, so a header name, say, is held to one rule wherever it appears.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any, Callable

from routing.model import BACKEND_PROTOCOLS, ConfigError
from routing.node import Node, string
from routing.values import clip, shown, split_backend_url

INT32_MAX = 2**31 - 1

# RFC 9110 token: what a header name (and a method) may consist of.
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
# Header values: visible ASCII/obs-text, spaces and tabs; never CR, LF or NUL, which
# would let a config split a header line on the wire.
FIELD_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*\Z")
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


def bounded(value: str, path: str, what: str) -> str:
    """``value`` if it is within the length limit of a ``what`` (:data:`MAX_LENGTHS`)."""
    limit = MAX_LENGTHS[what]
    if len(value) > limit:
        raise ConfigError(path, f"{what} is {len(value)} characters long, more than the "
                                f"limit of {limit}")
    return value


def bounded_string(node: Node, key: str, what: str) -> str:
    """The string at ``key`` of ``node`` (absent: ``""``), within the length limit of
    a ``what`` (a key of :data:`MAX_LENGTHS`)."""
    return bounded(node.string(key), node.at(key), what)


def bounded_strings(what: str) -> Callable[[Any, str], str]:
    """A list element reader: a string within the length limit of a ``what``."""
    return lambda value, path: bounded(string(value, path), path, what)


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


def hostname(value: str, path: str, *, wildcard: bool) -> str:
    """``value`` (at ``path``) if it is a hostname (:func:`hostname_problem`)."""
    problem = hostname_problem(value, wildcard=wildcard)
    if problem is not None:
        raise ConfigError(path, f"invalid hostname {shown(value)}: {problem}")
    return value


def precise_hostname(node: Node) -> str:
    """A redirect's or rewrite's ``hostname`` (absent: ``""``): no wildcard."""
    text = node.string("hostname")
    return hostname(text, node.at("hostname"), wildcard=False) if text else text


def header_name(name: str, path: str) -> str:
    """``name`` (at ``path``) if it is a field name (RFC 9110 §5.1) within its limit."""
    if not TOKEN.match(bounded(name, path, "header name")):
        raise ConfigError(path, f"invalid header name {shown(name)}")
    return name


def header_value(node: Node) -> str:
    """The header value at ``value`` of ``node``: within its limit, no control
    characters."""
    text = bounded_string(node, "value", "header value")
    if not FIELD_VALUE.match(text):
        raise ConfigError(node.at("value"), "header value must not contain control characters")
    return text


def protocol(node: Node) -> str:
    """A backend's or mirror's ``protocol``: ``""`` (HTTP/1.1) or ``h2c``."""
    text = node.string("protocol")
    if text not in BACKEND_PROTOCOLS:
        raise ConfigError(node.at("protocol"),
                          f'unknown protocol "{clip(text)}" ("" or "h2c")')
    return text


def backend_url(node: Node, key: str) -> str:
    """A backend's or mirror's URL at ``key`` (:func:`routing.values.split_backend_url`)."""
    url = node.string(key)
    if not url:
        raise ConfigError(node.at(key), "URL must not be empty")
    try:
        split_backend_url(url)
    except ValueError as exc:
        raise ConfigError(node.at(key), str(exc)) from None
    return url
