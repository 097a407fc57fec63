"""The filter registry: one line per Gateway API filter type, naming the
:class:`~routing.filters.kind.FilterKind` its module (:mod:`routing.filters`) defines.

Everything that differs by filter type goes through here: the wire reader
(:mod:`routing.validate`) and writer (:mod:`routing.wire`), the HTTPRoute YAML
conversion (:mod:`routing.gateway_rules`), and the table, which compiles each filter
once per config and splits a filter list into its request-phase and response-phase
chains (:func:`split_filters`). What a filter does to an exchange is the proxy's half,
``proxy.exchange.steps.STEPS``, keyed by the same types (a test checks both name the
same ones).

A new filter type: its module in :mod:`routing.filters`, one line here, its payload's
dataclass and field on :class:`routing.model.Filter`, and its step in
``proxy.exchange.steps``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Collection, Final

from routing.filters import cors, headers, mirror, redirect, rewrite
from routing.filters.kind import FilterKind
from routing.model import Filter


def _by_type(*kinds: FilterKind) -> MappingProxyType[str, FilterKind]:
    return MappingProxyType({kind.type: kind for kind in kinds})


KINDS: Final = _by_type(
    headers.REQUEST,
    headers.RESPONSE,
    redirect.KIND,
    rewrite.KIND,
    mirror.KIND,
    cors.KIND,
)
# Every filter's payload key (a filter object holds its type's and no other).
PAYLOAD_KEYS: Final = tuple(kind.key for kind in KINDS.values())


def payload(f: Filter) -> object:
    """The validated payload of ``f`` (the one its type names)."""
    return getattr(f, KINDS[f.type].field)


def conflict(types: Collection[str]) -> tuple[str, str] | None:
    """(a, b) of two filter types among ``types`` that one filter list cannot hold
    together, ``a`` being the one that excludes ``b`` (:attr:`FilterKind.excludes`);
    ``None`` if there are none."""
    for kind in types:
        entry = KINDS.get(kind)
        if entry is not None and entry.excludes and entry.excludes in types:
            return kind, entry.excludes
    return None


class CompiledFilter:
    """A validated ``filter`` as the request path runs it: its ``type``, its
    ``compiled`` form (:attr:`FilterKind.compile` of its payload) and whether its step
    ``waits`` (:attr:`FilterKind.waits`, kept here so that a request asks no registry)."""

    __slots__ = ("filter", "type", "compiled", "waits")

    def __init__(self, filter: Filter, compiled: object) -> None:
        self.filter = filter
        # The registry's own string, not the parsed one: the request path finds the
        # type's step in a dict keyed by these very objects (proxy.exchange.steps.STEPS),
        # so each lookup matches by identity instead of comparing characters.
        kind = KINDS[filter.type]
        self.type = kind.type
        self.compiled = compiled
        self.waits = kind.waits

    def __repr__(self) -> str:
        return f"<CompiledFilter {self.type}>"


Chain = tuple[CompiledFilter, ...]


def compile_filter(f: Filter) -> CompiledFilter:
    """``f`` compiled by its registry entry."""
    return CompiledFilter(f, KINDS[f.type].compile(payload(f)))


def split_filters(filters: tuple[Filter, ...]) -> tuple[Chain, Chain]:
    """(request-phase, response-phase) chains of ``filters``, each in list order; a
    filter of both phases is compiled once and is in both."""
    compiled = [compile_filter(f) for f in filters]
    return (tuple(c for c in compiled if KINDS[c.type].request),
            tuple(c for c in compiled if KINDS[c.type].response))
