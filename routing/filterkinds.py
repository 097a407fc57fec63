"""The filter registry: one entry per Gateway API filter type the table compiles.

An entry says in which phases its filter runs and what the request path runs it with,
compiled once per config instead of once per request (a header modifier's
:class:`~routing.filters.HeaderEdit`, a CORS filter's :class:`~routing.cors.CorsPolicy`,
otherwise the validated payload itself). The table splits each filter list into its
request-phase and response-phase chains from here (:func:`split_filters`); what a step
does to an exchange at request and at response time is the proxy's registry
(``proxy.exchange.steps.STEPS``), keyed by the same type names. The payload's wire
key and model field are :data:`routing.model.FILTER_PAYLOADS`'.

A new filter type: its payload in :mod:`routing.model`, its reader in
:mod:`routing.validate`, one line here, one step in ``proxy.exchange.steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Final

from routing.cors import CorsPolicy
from routing.filters import HeaderEdit
from routing.model import FILTER_PAYLOADS, Filter


def _as_is(payload: Any) -> object:
    return payload


@dataclass(frozen=True, slots=True)
class FilterKind:
    """What the table knows of one filter type: its phases and its compiled form."""

    request: bool  # runs while the request is prepared (may answer it: redirect, preflight)
    response: bool  # runs on the backend's response headers
    compile: Callable[[Any], object]  # the validated payload → what the request path runs


# CORS belongs to both phases: it answers preflights in the request phase and adds the
# Access-Control-* headers to actual responses; both phases share its one policy.
KINDS: Final = MappingProxyType({
    "RequestHeaderModifier": FilterKind(True, False, HeaderEdit),
    "ResponseHeaderModifier": FilterKind(False, True, HeaderEdit),
    "RequestRedirect": FilterKind(True, False, _as_is),
    "URLRewrite": FilterKind(True, False, _as_is),
    "RequestMirror": FilterKind(True, False, _as_is),
    "CORS": FilterKind(True, True, CorsPolicy),
})


class CompiledFilter:
    """A validated ``filter`` as the request path runs it: its ``type`` and its
    ``compiled`` form (:attr:`FilterKind.compile` of its payload)."""

    __slots__ = ("filter", "type", "compiled")

    def __init__(self, filter: Filter, compiled: object) -> None:
        self.filter = filter
        self.type = filter.type
        self.compiled = compiled

    def __repr__(self) -> str:
        return f"<CompiledFilter {self.type}>"


Chain = tuple[CompiledFilter, ...]


def compile_filter(f: Filter) -> CompiledFilter:
    """``f`` compiled by its registry entry."""
    payload = getattr(f, FILTER_PAYLOADS[f.type][1])
    return CompiledFilter(f, KINDS[f.type].compile(payload))


def split_filters(filters: tuple[Filter, ...]) -> tuple[Chain, Chain]:
    """(request-phase, response-phase) chains of ``filters``, each in list order; a
    filter of both phases is compiled once and is in both."""
    compiled = [compile_filter(f) for f in filters]
    return (tuple(c for c in compiled if KINDS[c.type].request),
            tuple(c for c in compiled if KINDS[c.type].response))

