"""What a filter module defines: its :class:`FilterKind`, the entry the registry
(:data:`routing.filterkinds.KINDS`) lists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from routing.gateway_refs import RouteScope
from routing.model import ConfigError
from routing.node import yaml_type


def as_is(payload: Any) -> object:
    """The compiled form of a payload the request path reads as it is."""
    return payload


def same_shape(value: Any, path: str, route: RouteScope) -> dict:
    """The wire payload of an HTTPRoute payload whose wire shape is Gateway API's: a
    copy (:attr:`FilterKind.read` checks its fields)."""
    if not isinstance(value, dict):
        raise ConfigError(path, f"expected a mapping, got {yaml_type(value)}")
    return dict(value)


@dataclass(frozen=True, slots=True)
class FilterKind:
    """One filter type: how its payload is read, written, translated from an HTTPRoute
    and compiled, and the phases it runs in. What it does to an exchange at request and
    response time is ``proxy.exchange.steps.STEPS[type]``, on the arithmetic of its
    module."""

    type: str  # the filter's type on the wire and in an HTTPRoute
    key: str  # the key of its payload object, on the wire and in an HTTPRoute
    field: str  # the routing.model.Filter attribute that holds the validated payload
    read: Callable[[Any, str], Any]  # decoded wire payload at a path → validated payload
    wire: Callable[[Any], dict]  # validated payload → its wire form (read's inverse)
    request: bool  # runs while the request is prepared (may answer it: redirect, preflight)
    response: bool  # runs on the backend's response headers
    compile: Callable[[Any], object] = as_is  # validated payload → what the request path runs
    # HTTPRoute payload → wire payload (None: the filter is dropped, with a note), and
    # the wire fields (under the payload) whose HTTPRoute field is named otherwise.
    from_yaml: Callable[[Any, str, RouteScope], dict | None] = same_shape
    renamed: tuple[tuple[str, str], ...] = ()
    # The CRD's rules on a filter list (of a rule or a backendRef): a type at most once
    # unless repeatable; never together with the type it excludes; a filter that answers
    # the request itself never in a rule with backendRefs; a payload "path" that is a
    # path modifier replacing a prefix needs the rule's one match to be a PathPrefix.
    repeatable: bool = False
    excludes: str = ""
    answers: bool = False
    path_modifier: bool = False
    # Its request step reads the whole request body first (a mirror's copy carries it),
    # so a chain holding it runs in a task (proxy.exchange.steps.run_waiting_filters).
    waits: bool = False
