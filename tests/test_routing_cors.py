"""routing.cors: GEP-1767 decisions, asserting what the Gateway API conformance tests
HTTPRouteCORS and CORSAllowCredentialsBehavior expect (routes restated as Cors payloads).
"""

from __future__ import annotations

import pytest

from routing.config import parse_config
from routing.filters.cors import (
    DEFAULT_MAX_AGE,
    PREFLIGHT_STATUS,
    CorsPolicy,
    is_credentialed,
    is_preflight,
    parse_origin,
    preflight_headers,
    response_headers,
)
from routing.model import Cors
from routing.table import Table

Headers = list[tuple[bytes, bytes]]

# Conformance route "cors-multiple-origins-methods-headers" (path /cors-1).
CORS_1 = Cors(allow_origins=("https://www.foo.com", "https://*.bar.com"),
              allow_methods=("GET", "OPTIONS"), allow_headers=("x-header-1", "x-header-2"),
              expose_headers=("x-header-3", "x-header-4"), allow_credentials=True,
              max_age=3600)
# "cors-wildcard-methods" (/cors-2): allowMethods ["*"], no credentials.
CORS_2 = Cors(allow_origins=("https://www.foo.com",), allow_methods=("*",))
# Wildcard origin, methods and headers, with and without credentials.
WILDCARD_AUTH = Cors(allow_origins=("*",), allow_methods=("*",), allow_headers=("*",),
                     allow_credentials=True)
WILDCARD_UNAUTH = Cors(allow_origins=("*",), allow_methods=("*",), allow_headers=("*",))


def as_dict(headers: Headers) -> dict[str, str]:
    """Lower-cased names; a repeated name would be a bug here, so assert it is not."""
    names = [n.lower() for n, _ in headers]
    assert len(names) == len(set(names)), headers
    return {n.decode().lower(): v.decode() for n, v in headers}


def preflight(origin: str, method: str = "GET", request_headers: str | None = None) -> Headers:
    headers = [(b"Origin", origin.encode()), (b"access-control-request-method", method.encode())]
    if request_headers is not None:
        headers.append((b"access-control-request-headers", request_headers.encode()))
    return headers


def test_preflight_status_is_accepted_by_every_conformance_version() -> None:
    assert PREFLIGHT_STATUS == 200


@pytest.mark.parametrize("origin", ["https://www.foo.com", "https://www.bar.com",
                                    "https://xpto.www.bar.com"])
def test_conformance_cors_1_preflight_allowed(origin: str) -> None:
    got = as_dict(preflight_headers(CORS_1, preflight(origin, "GET", "x-header-1, x-header-2")))
    assert got["access-control-allow-origin"] == origin
    assert got["access-control-allow-methods"] == "GET, OPTIONS"
    assert got["access-control-allow-headers"] == "x-header-1, x-header-2"
    assert got["access-control-expose-headers"] == "x-header-3, x-header-4"
    assert got["access-control-max-age"] == "3600"
    assert got["access-control-allow-credentials"] == "true"


def test_conformance_cors_1_preflight_from_other_origin_has_no_cors_headers() -> None:
    got = as_dict(preflight_headers(CORS_1, preflight("https://foobar.com")))
    assert not any(name.startswith("access-control-") for name in got)


@pytest.mark.parametrize("origin", ["https://www.foo.com", "https://www.bar.com"])
def test_conformance_cors_1_simple_request_allowed(origin: str) -> None:
    got = as_dict(response_headers(CORS_1, [(b"Origin", origin.encode())]))
    assert got["access-control-allow-origin"] == origin
    assert got["vary"] == "Origin"


def test_conformance_cors_1_simple_request_other_origin() -> None:
    got = as_dict(response_headers(CORS_1, [(b"Origin", b"https://foobar.com")]))
    assert got == {"vary": "Origin"}


def test_conformance_cors_2_wildcard_methods_without_credentials() -> None:
    got = as_dict(preflight_headers(CORS_2, preflight("https://www.foo.com", "POST")))
    assert got["access-control-allow-origin"] == "https://www.foo.com"
    assert got["access-control-allow-methods"] in ("POST", "*")
    assert "access-control-allow-credentials" not in got


@pytest.mark.parametrize("origin", ["https://foobar.com", "https://foobar.com:12345"])
def test_conformance_wildcard_origin_preflight(origin: str) -> None:
    got = as_dict(preflight_headers(WILDCARD_UNAUTH, preflight(origin, "PUT")))
    assert got["access-control-allow-origin"] in (origin, "*")
    assert got["access-control-allow-methods"] == "PUT"
    assert "access-control-allow-credentials" not in got


@pytest.mark.parametrize("origin", ["https://foobar.com", "https://foobar.com:12345"])
def test_conformance_wildcard_origin_simple_request(origin: str) -> None:
    got = as_dict(response_headers(WILDCARD_UNAUTH, [(b"Origin", origin.encode())]))
    assert got["access-control-allow-origin"] in (origin, "*")
    assert "access-control-allow-credentials" not in got


def test_conformance_wildcards_with_credentials_echo_request_values() -> None:
    got = as_dict(preflight_headers(WILDCARD_AUTH, preflight(
        "https://other.foo.com", "PUT", "x-header-1, x-header-2")))
    assert got["access-control-allow-origin"] == "https://other.foo.com"
    assert got["access-control-allow-methods"] == "PUT"
    assert got["access-control-allow-headers"] == "x-header-1, x-header-2"
    assert got["access-control-allow-credentials"] == "true"
    assert "*" not in got.values()


def test_conformance_wildcards_unauth_path_hides_credentials() -> None:
    got = as_dict(preflight_headers(WILDCARD_UNAUTH, preflight(
        "https://other.foo.com", "PUT", "x-header-1, x-header-2")))
    assert got["access-control-allow-origin"] in ("https://other.foo.com", "*")
    assert got["access-control-allow-methods"] in ("PUT", "*")
    assert got["access-control-allow-headers"] in ("x-header-1, x-header-2", "*")
    assert "access-control-allow-credentials" not in got


@pytest.mark.parametrize(("cors", "credentials"), [(WILDCARD_AUTH, "true"),
                                                   (WILDCARD_UNAUTH, None)])
def test_conformance_credentialed_simple_request(cors: Cors, credentials: str | None) -> None:
    request = [(b"Origin", b"https://other.foo.com"), (b"Authorization", b"Bearer test")]
    got = as_dict(response_headers(cors, request))
    assert got["access-control-allow-origin"] == "https://other.foo.com"
    assert got.get("access-control-allow-credentials") == credentials


@pytest.mark.parametrize(("allow", "credentials"), [(False, None), (True, "true")])
def test_conformance_allow_credentials_behavior(allow: bool, credentials: str | None) -> None:
    # CORSAllowCredentialsBehavior: the routes configure no allowOrigins at all.
    request = [(b"Origin", b"https://app.example"), (b"Cookie", b"sid=abc123"),
               (b"Authorization", b"Bearer test")]
    got = as_dict(response_headers(Cors(allow_credentials=allow), request))
    assert got.get("access-control-allow-credentials") == credentials
    if allow:
        assert got["access-control-allow-origin"] == "https://app.example"


# ------------------------------------------------------------------ origin matching


@pytest.mark.parametrize(("text", "parsed"), [
    ("https://www.foo.com", ("https", "www.foo.com", 443)),
    ("HTTP://WWW.Foo.com:80", ("http", "www.foo.com", 80)),
    ("http://a:8080", ("http", "a", 8080)),
    ("http://[::1]:81", ("http", "[::1]", 81)),
    ("app://x", ("app", "x", None)),
])
def test_parse_origin(text: str, parsed: tuple) -> None:
    origin = parse_origin(text)
    assert origin is not None and (origin.scheme, origin.host, origin.port) == parsed


@pytest.mark.parametrize("text", ["null", "", "*", "www.foo.com", "https://", "https://a/b",
                                  "https://a:0", "https://a:x", "https://a:", "https://u@a",
                                  "https://[::1", "https://a b"])
def test_parse_origin_rejects(text: str) -> None:
    assert parse_origin(text) is None


@pytest.mark.parametrize(("patterns", "origin", "allowed"), [
    (("https://www.foo.com",), "https://www.foo.com", True),
    (("https://www.foo.com",), "https://www.foo.com:443", True),   # default port
    (("https://www.foo.com:443",), "https://www.foo.com", True),
    (("http://www.foo.com",), "http://www.foo.com:80", True),
    (("https://www.foo.com",), "https://www.foo.com:8443", False),
    (("https://www.foo.com",), "http://www.foo.com", False),       # scheme differs
    (("https://www.foo.com",), "https://WWW.FOO.COM", True),
    (("https://*.bar.com",), "https://a.bar.com", True),
    (("https://*.bar.com",), "https://a.b.bar.com", True),
    (("https://*.bar.com",), "https://bar.com", False),            # never the apex
    (("https://*.bar.com",), "https://evilbar.com", False),
    (("https://*.bar.com",), "http://a.bar.com", False),
    (("https://*",), "https://anything.example:443", True),
    (("https://*",), "https://anything.example:8443", False),
    (("*",), "https://foobar.com:12345", True),
    (("*",), "null", False),                                       # opaque origin
    (("*",), "", False),
    ((), "https://anything.example", True),                        # no list = any
    (("https://www.foo.com",), "null", False),
    (("not an origin",), "https://x.example", False),
])
def test_origin_matching(patterns: tuple, origin: str, allowed: bool) -> None:
    assert CorsPolicy(Cors(allow_origins=patterns)).allows(origin) is allowed


# ------------------------------------------------------------------ headers in detail


def test_preflight_defaults() -> None:
    got = as_dict(preflight_headers(Cors(allow_origins=("https://a.example",)),
                                    preflight("https://a.example")))
    assert got == {"vary": "Origin, Access-Control-Request-Method, "
                           "Access-Control-Request-Headers",
                   "access-control-allow-origin": "https://a.example",
                   "access-control-max-age": str(DEFAULT_MAX_AGE)}


def test_wildcard_headers_without_request_headers_are_omitted() -> None:
    got = as_dict(preflight_headers(WILDCARD_AUTH, preflight("https://a.example", "PUT")))
    assert "access-control-allow-headers" not in got


def test_preflight_expose_wildcard_only_without_credentials() -> None:
    unauth = Cors(expose_headers=("*",))
    auth = Cors(expose_headers=("*",), allow_credentials=True)
    assert as_dict(preflight_headers(unauth, preflight("https://a.x")))[
        "access-control-expose-headers"] == "*"
    assert "access-control-expose-headers" not in as_dict(
        preflight_headers(auth, preflight("https://a.x")))


def test_credentialed_expose_wildcard_lists_the_response_headers() -> None:
    cors = Cors(expose_headers=("*",), allow_credentials=True)
    backend = [(b"Content-Encoding", b"gzip"), (b"Kuma-Revision", b"1"),
               (b"Kuma-Revision", b"2"), (b"Access-Control-Allow-Origin", b"*")]
    got = as_dict(response_headers(cors, [(b"Origin", b"https://a.x"), (b"Cookie", b"a=1")],
                                   backend))
    assert got["access-control-expose-headers"] == "Content-Encoding, Kuma-Revision"
    uncredentialed = as_dict(response_headers(Cors(expose_headers=("*",)),
                                              [(b"Origin", b"https://a.x")], backend))
    assert uncredentialed["access-control-expose-headers"] == "*"


def test_missing_origin_gets_only_vary() -> None:
    assert response_headers(CORS_1, []) == [(b"Vary", b"Origin")]
    assert as_dict(preflight_headers(CORS_1, [(b"access-control-request-method", b"GET")])
                   ).keys() == {"vary"}


@pytest.mark.parametrize(("method", "headers", "expected"), [
    ("OPTIONS", [(b"Access-Control-Request-Method", b"PUT")], True),
    ("OPTIONS", [(b"access-control-request-method", b"")], True),
    ("OPTIONS", [(b"Origin", b"https://a.x")], False),
    ("GET", [(b"Access-Control-Request-Method", b"PUT")], False),
])
def test_is_preflight(method: str, headers: Headers, expected: bool) -> None:
    assert is_preflight(method, headers) is expected


@pytest.mark.parametrize(("headers", "expected"), [
    ([(b"Cookie", b"a=1")], True), ([(b"authorization", b"Basic x")], True),
    ([(b"Origin", b"https://a.x")], False), ([], False),
])
def test_is_credentialed(headers: Headers, expected: bool) -> None:
    assert is_credentialed(headers) is expected


def test_compiled_rule_carries_a_policy() -> None:
    table = Table.compile(parse_config({"rules": [{"filters": [
        {"type": "CORS", "cors": {"allowOrigins": ["https://*.example.com"], "maxAge": 600}}],
        "backends": [{"url": "http://b:80", "weight": 1}]}]}))
    policy = table.rules[0].request_filters[0].compiled
    assert isinstance(policy, CorsPolicy) and policy.max_age == 600
    assert policy.allows("https://app.example.com")
    got = as_dict(preflight_headers(policy, preflight("https://app.example.com")))
    assert got["access-control-max-age"] == "600"
