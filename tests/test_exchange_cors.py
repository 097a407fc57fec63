"""The request path answers CORS from the policy compiled with the table, not from the
raw ``Cors`` payload (origin patterns are parsed once per config, not per request)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.exchange.steps import Exchange, run_request_filters
from proxy.request import EMPTY_BODY, Request
from routing.config import parse_config
from routing.filters.cors import ALLOW_ORIGIN, CorsPolicy
from routing.model import Cors, Filter
from routing.filterkinds import CompiledFilter
from routing.table import Table
from tunnel.origin import WriterResponder

CORS = {"type": "CORS", "cors": {"allowOrigins": ["https://app.example"]}}


class _Unused:
    """Where a responder the filter steps never call would write (they return a
    Shortcut instead)."""

    def write_resp_headers(self, status: int, headers: list) -> None:
        raise AssertionError("not expected")


def _exchange(method: str, origin: str) -> Exchange:
    headers = [(b"Origin", origin.encode()), (b"Access-Control-Request-Method", b"GET")]
    request = Request(method, "/", "", "h.test", headers, EMPTY_BODY, "cluster")
    return Exchange(request, WriterResponder(_Unused()))  # type: ignore[arg-type]


def test_each_cors_filter_is_compiled_once_and_shared_by_both_phases() -> None:
    backend = {"url": "http://127.0.0.1:9", "weight": 1, "filters": [CORS]}
    table = Table.compile(parse_config({"version": 1, "rules": [
        {"filters": [CORS], "backends": [backend]}]}))
    route = table.rules[0]
    chosen = route.backends[0]
    for request_chain, response_chain in ((route.request_filters, route.response_filters),
                                          (chosen.request_filters, chosen.response_filters)):
        (early,), (late,) = request_chain, response_chain
        assert isinstance(early.compiled, CorsPolicy) and early.compiled is late.compiled
        assert early.compiled.cors is early.filter.cors


def _disagreeing() -> CompiledFilter:
    """A CORS filter whose compiled policy allows another origin than its raw payload:
    whichever origin is allowed shows which of the two the request path used."""
    raw = Filter("CORS", cors=Cors(allow_origins=("https://raw.example",)))
    return CompiledFilter(raw, CorsPolicy(Cors(allow_origins=("https://compiled.example",))))


def test_the_response_phase_uses_the_compiled_policy() -> None:
    chain = (_disagreeing(),)
    for origin, allowed in (("https://compiled.example", True), ("https://raw.example", False)):
        ex = _exchange("GET", origin)
        ex.rule_filters = chain
        names = [name for name, _ in ex.response_headers([])]
        assert (ALLOW_ORIGIN in names) is allowed, origin


def test_a_preflight_is_answered_from_the_compiled_policy() -> None:
    chain = (_disagreeing(),)

    async def preflight(origin: str) -> list[bytes]:
        shortcut = run_request_filters(_exchange("OPTIONS", origin), chain)
        assert shortcut is not None
        return [name for name, _ in shortcut.headers]

    assert ALLOW_ORIGIN in asyncio.run(preflight("https://compiled.example"))
    assert ALLOW_ORIGIN not in asyncio.run(preflight("https://raw.example"))


BACKEND_CORS = [(b"Access-Control-Allow-Origin", b"*"), (b"Vary", b"Accept-Encoding"),
                (b"access-control-expose-headers", b"X-Backend"), (b"X-Kept", b"1")]


@pytest.mark.parametrize("policy, origin, expected", [
    # An allowed origin: the policy's Allow-Origin and Expose-Headers replace the
    # backend's (two Allow-Origin values fail the browser's check); Vary gains one.
    ({"allowOrigins": ["https://app.example"], "exposeHeaders": ["X-Mine"]},
     "https://app.example",
     [(b"Vary", b"Accept-Encoding"), (b"X-Kept", b"1"), (b"Vary", b"Origin"),
      (b"Access-Control-Allow-Origin", b"https://app.example"),
      (b"Access-Control-Expose-Headers", b"X-Mine")]),
    # The policy exposes nothing: the backend's Expose-Headers stays.
    ({"allowOrigins": ["https://app.example"], "allowCredentials": True},
     "https://app.example",
     [(b"Vary", b"Accept-Encoding"), (b"access-control-expose-headers", b"X-Backend"),
      (b"X-Kept", b"1"), (b"Vary", b"Origin"),
      (b"Access-Control-Allow-Origin", b"https://app.example"),
      (b"Access-Control-Allow-Credentials", b"true")]),
    # Not an allowed origin: the policy adds only Vary, the backend's answer stands.
    ({"allowOrigins": ["https://app.example"]}, "https://evil.example",
     BACKEND_CORS + [(b"Vary", b"Origin")]),
])
def test_the_policy_replaces_the_backends_own_cors_fields(policy, origin,
                                                           expected) -> None:
    rule = {"filters": [{"type": "CORS", "cors": policy}],
            "backends": [{"url": "http://127.0.0.1:9", "weight": 1}]}
    table = Table.compile(parse_config({"version": 1, "rules": [rule]}))
    ex = _exchange("GET", origin)
    ex.rule_filters = table.rules[0].response_filters
    assert ex.response_headers(list(BACKEND_CORS)) == expected
