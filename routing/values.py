"""Value syntaxes of the wire config that the proxy reads too: backend URLs and Go
durations, and how a value is shown in a message. Pure functions; the parsers raise
``ValueError`` for text they cannot accept."""

from __future__ import annotations

import re
from types import MappingProxyType
from urllib.parse import urlsplit

from routing.model import DEFAULT_PORTS, BackendAddress

INT64_MAX = 2**63 - 1
MAX_VALUE_CHARS = 512  # per value shown in a log line or an error message


def clip(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``text``, or its first ``limit`` characters and how many were left out: a log
    line or an error message carries a value's beginning and its size, never a whole
    pushed megabyte."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def shown(value: str) -> str:
    """``value`` quoted (``repr``) for an error message, clipped (:func:`clip`)."""
    return clip(repr(value))


def split_backend_url(url: str) -> BackendAddress:
    """Take ``http(s)://host[:port][/base][?query]`` apart; ports default to 80/443.

    Raises ``ValueError`` when the URL is not http/https with a host and a valid port.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"backend URL {shown(url)} must be http:// or https://")
    if parts.username is not None or parts.fragment:
        raise ValueError(f"backend URL {shown(url)} must not carry credentials or a "
                         "fragment")
    host = parts.hostname
    if not host:
        raise ValueError(f"backend URL {shown(url)} has no host")
    port = parts.port  # raises ValueError for a non-numeric or out-of-range port
    if port == 0:
        raise ValueError(f"backend URL {shown(url)} has port 0")
    return BackendAddress(scheme, host, port or DEFAULT_PORTS[scheme], parts.path,
                          parts.query)


def backend_base(url: str) -> tuple[str, str]:
    """A backend URL's base path (without a trailing ``/``) and base query, which
    every request's target is joined with; ``("", "")`` for a URL that cannot be split
    (such a backend is never dialed: its pool refuses it)."""
    try:
        address = split_backend_url(url)
    except ValueError:
        return "", ""
    return address.base_path.rstrip("/"), address.base_query


_DURATION_UNITS_NS = MappingProxyType({
    "ns": 1, "us": 1_000, "\u00b5s": 1_000, "\u03bcs": 1_000, "ms": 1_000_000,
    "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000,
})
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
        raise ValueError(f"invalid duration {shown(text)}")
    total_ns = 0
    pos = 0
    while pos < len(rest):
        group = _DURATION_GROUP.match(rest, pos)
        if group is None or not (group.group(1) or group.group(2)):
            raise ValueError(f"invalid duration {shown(text)}")
        whole, fraction, unit = group.group(1), group.group(2) or "", group.group(3)
        scale = _DURATION_UNITS_NS[unit]
        total_ns += int(whole or "0") * scale
        if fraction:
            total_ns += int(fraction) * scale // 10 ** len(fraction)
        if total_ns > INT64_MAX:
            raise ValueError(f"invalid duration {shown(text)}: overflow")
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

