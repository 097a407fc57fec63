"""routing.config: the wire format (docs/config.md), its validation, to_wire."""

from __future__ import annotations

import base64
import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing.config import parse_config
from routing.model import (
    ConfigError, Cors, Mirror, PathModifier, Redirect, Rewrite, Timeouts)
from routing.values import format_duration, parse_duration, split_backend_url
from routing.wire import to_wire

# A full wire example.
EXAMPLE_JSON = r"""
{
  "version": 1767225600123,
  "hasGrpcRoute": true,
  "rules": [
    {"hostnames": ["app.example.com"],
     "matches": [{"path": {"type": "Exact", "value": "/api/v2/health"}, "method": "GET",
                  "headers": [{"type": "Exact", "name": "X-API-Version", "value": "2"}]}],
     "filters": [{"type": "ResponseHeaderModifier",
                  "responseHeaderModifier": {"add": [{"name": "X-Proxy", "value": "tunnel"}]}}],
     "backends": [
       {"url": "http://api-v2.prod.svc.cluster.local:8080", "weight": 80},
       {"url": "http://api-v2-canary.prod.svc.cluster.local:8080", "weight": 20,
        "filters": [{"type": "RequestHeaderModifier",
                     "requestHeaderModifier": {"set": [{"name": "X-Canary", "value": "1"}]}}]}],
     "timeouts": {"request": "10s", "backend": "2s"}},
    {"hostnames": ["*.example.com"],
     "matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
     "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https",
                  "hostname": "new.example.com", "statusCode": 301,
                  "path": {"type": "ReplacePrefixMatch", "value": "/new"}}}],
     "backends": null},
    {"hostnames": ["app.example.com"],
     "matches": [{"path": {"type": "PathPrefix", "value": "/static"},
                  "queryParams": [{"type": "RegularExpression", "name": "v", "value": "^[0-9]+$"}]}],
     "filters": [
       {"type": "URLRewrite", "urlRewrite": {"hostname": "assets.internal",
        "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/assets"}}},
       {"type": "RequestMirror", "requestMirror": {"backendUrl": "http://shadow.prod.svc.cluster.local:80", "percent": 10}},
       {"type": "CORS", "cors": {"allowOrigins": ["https://*.example.com"], "allowMethods": ["GET"],
                                 "allowHeaders": ["*"], "exposeHeaders": ["ETag"], "maxAge": 600}}],
     "backends": [{"url": "http://static.prod.svc.cluster.local:80", "weight": 1}]},
    {"hostnames": ["ws.example.com"],
     "backends": [{"url": "http://chat.prod.svc.cluster.local:9000", "weight": 1, "websocket": true}]},
    {"hostnames": ["grpc.example.com"],
     "matches": [{"path": {"type": "Exact", "value": "/helloworld.Greeter/SayHello"}}],
     "backends": [{"url": "http://greeter.prod.svc.cluster.local:50051", "weight": 1, "protocol": "h2c"}]},
    {"hostnames": ["secure.example.com"],
     "backends": [
       {"url": "https://vault.prod.svc.cluster.local:8443", "weight": 1,
        "tls": {"caBundle": "-----BEGIN CERTIFICATE-----\nMIIB...\n-----END CERTIFICATE-----\n",
                "serverName": "vault.prod.svc",
                "subjectAltNameUris": ["spiffe://cluster.local/ns/prod/sa/vault"]}},
       {"url": "http://gone.prod.svc.cluster.local:80", "weight": 1, "unavailableStatus": 500}]},
    {"hostnames": ["legacy.example.com"], "unavailableStatus": 500,
     "backends": [{"url": "http://legacy.prod.svc.cluster.local:80", "weight": 1}]}
  ]
}
"""


def example() -> dict:
    return json.loads(EXAMPLE_JSON)


def minimal(**rule: object) -> dict:
    """A config with one rule: the given fields over a minimal valid rule."""
    base: dict = {"backends": [{"url": "http://b.ns.svc:80", "weight": 1}]}
    base.update(rule)
    return {"version": 1, "rules": [base]}


# ------------------------------------------------------------------ the full example


def test_example_parses_into_the_model() -> None:
    config = parse_config(EXAMPLE_JSON.encode())
    assert config.version == 1767225600123 and config.has_grpc_route
    api, old, static, ws, grpc, secure, legacy = config.rules
    assert api.matches[0].method == "GET"
    assert api.matches[0].headers[0].name == "X-API-Version"
    assert [b.weight for b in api.backends] == [80, 20]
    assert api.backends[1].filters[0].request_header_modifier.set == (("X-Canary", "1"),)
    assert api.timeouts == Timeouts(request=10.0, backend=2.0)
    assert old.backends == ()
    assert old.filters[0].request_redirect == Redirect(
        scheme="https", hostname="new.example.com", port=None, status_code=301,
        path=PathModifier("ReplacePrefixMatch", "/new"))
    assert static.filters[0].url_rewrite == Rewrite(
        "assets.internal", PathModifier("ReplacePrefixMatch", "/assets"))
    assert static.filters[1].request_mirror == Mirror(
        "http://shadow.prod.svc.cluster.local:80", 10, None, "")
    assert static.filters[2].cors == Cors(("https://*.example.com",), False, ("GET",),
                                          ("*",), ("ETag",), 600)
    assert ws.matches == () and ws.backends[0].websocket
    assert grpc.backends[0].protocol == "h2c"
    assert secure.backends[0].tls.subject_alt_name_uris == (
        "spiffe://cluster.local/ns/prod/sa/vault",)
    assert secure.backends[1].unavailable_status == 500
    assert legacy.unavailable_status == 500
    assert all(rule.entrances is None for rule in config.rules)


@pytest.mark.parametrize("form", ["bytes", "str", "dict"])
def test_parse_accepts_bytes_str_and_dict(form: str) -> None:
    data = {"bytes": EXAMPLE_JSON.encode(), "str": EXAMPLE_JSON, "dict": example()}[form]
    assert parse_config(data) == parse_config(EXAMPLE_JSON)


def test_to_wire_round_trips_the_example() -> None:
    config = parse_config(EXAMPLE_JSON)
    wire = to_wire(config)
    assert parse_config(json.dumps(wire)) == config
    # Go's omitempty shape: redirect-only rule keeps "backends": null, no empty keys.
    assert wire["rules"][1]["backends"] is None
    assert "matches" not in wire["rules"][3]
    assert wire["rules"][2]["filters"][0]["urlRewrite"]["path"] == {
        "type": "ReplacePrefixMatch", "replacePrefixMatch": "/assets"}
    assert wire["rules"][0]["timeouts"] == {"request": "10s", "backend": "2s"}


# ------------------------------------------------------------------ Go wire quirks


def test_null_lists_and_absent_weight() -> None:
    config = parse_config({"version": 0, "rules": [
        {"hostnames": None, "matches": None, "filters": None, "backends": [
            {"url": "http://a:80"}]}]})
    rule = config.rules[0]
    assert rule.hostnames == () and rule.matches == () and rule.filters == ()
    assert rule.backends[0].weight == 0  # absent ⇒ 0, not Gateway API's 1


def test_null_rules_and_missing_version() -> None:
    config = parse_config(b'{"rules": null}')
    assert config.version == 0 and config.rules == () and not config.has_grpc_route


def test_empty_timeouts_object_means_no_deadlines() -> None:
    rule = parse_config(minimal(timeouts={})).rules[0]
    assert rule.timeouts == Timeouts(None, None)


def test_zero_duration_disables_timeout() -> None:
    rule = parse_config(minimal(timeouts={"request": "0s", "backend": "0"})).rules[0]
    assert rule.timeouts == Timeouts(None, None)


def test_client_cert_and_key_are_base64_decoded() -> None:
    cert, key = b"-----BEGIN CERTIFICATE-----\nX\n", b"-----BEGIN PRIVATE KEY-----\nY\n"
    config = parse_config(minimal(backends=[{"url": "https://b:443", "weight": 1, "tls": {
        "clientCertPem": base64.b64encode(cert).decode(),
        "clientKeyPem": base64.b64encode(key).decode()}}]))
    tls = config.rules[0].backends[0].tls
    assert (tls.client_cert_pem, tls.client_key_pem) == (cert, key)
    assert to_wire(config)["rules"][0]["backends"][0]["tls"]["clientCertPem"] == \
        base64.b64encode(cert).decode()


def test_redirect_uses_value_and_rewrite_uses_replace_keys() -> None:
    redirect = {"type": "RequestRedirect", "requestRedirect": {
        "path": {"type": "ReplaceFullPath", "value": "/full"}}}
    rewrite = {"type": "URLRewrite", "urlRewrite": {
        "path": {"type": "ReplaceFullPath", "replaceFullPath": "/full"}}}
    first = parse_config(minimal(filters=[redirect])).rules[0].filters[0]
    second = parse_config(minimal(filters=[rewrite])).rules[0].filters[0]
    assert first.request_redirect.path == second.url_rewrite.path == PathModifier(
        "ReplaceFullPath", "/full")
    assert first.request_redirect.status_code == 302  # default


@pytest.mark.parametrize("value, stored", [
    ("/a b", "/a%20b"),
    ("/x HTTP/1.0", "/x%20HTTP/1.0"),  # no second request line
    ("/a\tb", "/a%09b"),
    ("/caf\u00e9", "/caf%C3%A9"),  # UTF-8, as the client would send it
    ("/q?x#y", "/q%3Fx%23y"),  # a path: "?" and "#" would start a query, a fragment
    ("/kept%20as-is/:@!$&'()*+,;=-._~", "/kept%20as-is/:@!$&'()*+,;=-._~"),
])
@pytest.mark.parametrize("kind", ["ReplaceFullPath", "ReplacePrefixMatch"])
def test_path_modifier_values_are_stored_percent_encoded(kind: str, value: str,
                                                         stored: str) -> None:
    # The value goes on the upstream request line or into a Location header: what a
    # path may not hold is percent-encoded, escapes already there are kept.
    key = "replaceFullPath" if kind == "ReplaceFullPath" else "replacePrefixMatch"
    redirect = {"type": "RequestRedirect", "requestRedirect": {
        "path": {"type": kind, "value": value}}}
    rewrite = {"type": "URLRewrite", "urlRewrite": {"path": {"type": kind, key: value}}}
    for spec, field in ((redirect, "request_redirect"), (rewrite, "url_rewrite")):
        parsed = parse_config(minimal(filters=[spec])).rules[0].filters[0]
        assert getattr(parsed, field).path == PathModifier(kind, stored)


def test_entrances_extension() -> None:
    rule = parse_config(minimal(entrances=["cluster"])).rules[0]
    assert rule.entrances == ("cluster",)
    assert to_wire(parse_config(minimal(entrances=["tunnel", "cluster"])))["rules"][0][
        "entrances"] == ["tunnel", "cluster"]


def test_mirror_percent_absent_means_always() -> None:
    mirror = {"type": "RequestMirror", "requestMirror": {"backendUrl": "http://m:80"}}
    assert parse_config(minimal(filters=[mirror])).rules[0].filters[0].request_mirror.percent \
        == 100


@pytest.mark.parametrize(("url", "expected"), [
    ("http://svc.ns.svc.cluster.local:8080", ("http", "svc.ns.svc.cluster.local", 8080, "", "")),
    ("http://svc", ("http", "svc", 80, "", "")),
    ("https://svc", ("https", "svc", 443, "", "")),
    ("HTTPS://Svc:8443/base?k=v", ("https", "svc", 8443, "/base", "k=v")),
    ("http://[fd00::1]:81", ("http", "fd00::1", 81, "", "")),
])
def test_split_backend_url(url: str, expected: tuple) -> None:
    address = split_backend_url(url)
    assert (address.scheme, address.host, address.port, address.base_path,
            address.base_query) == expected


# ------------------------------------------------------------------ durations


@pytest.mark.parametrize(("text", "seconds"), [
    ("10s", 10.0), ("500ms", 0.5), ("1m30s", 90.0), ("1h0m0s", 3600.0), ("1.5s", 1.5),
    ("100\u00b5s", 0.0001), ("100\u03bcs", 0.0001), ("100us", 0.0001), ("0", 0.0),
    ("0s", 0.0), ("250ns", 2.5e-7), ("2h45m", 9900.0), (".5s", 0.5), ("1.s", 1.0),
    ("+3s", 3.0), ("-1.5h", -5400.0), ("1h1m1s1ms1us1ns", 3661.001001001),
])
def test_parse_duration_accepts_go_forms(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("text", ["", "1", "s", ".s", "-", "1x", "1h2", "1e3s", " 1s",
                                  "1s ", "1S", "3000000h"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=10**15))
def test_format_duration_round_trips_through_parse(ns: int) -> None:
    text = format_duration(ns / 1e9)
    assert round(parse_duration(text) * 1e9) == pytest.approx(ns, abs=1)


@pytest.mark.parametrize(("seconds", "text"), [
    (10, "10s"), (0.5, "500ms"), (90, "1m30s"), (3600, "1h0m0s"), (1.5, "1.5s"),
    (0.0001, "100\u00b5s"), (0, "0s"),
])
def test_format_duration_matches_go(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


# ------------------------------------------------------------------ validation errors

FILTER_OK = {"type": "RequestHeaderModifier", "requestHeaderModifier": {}}


def _rule_with(**fields: object) -> dict:
    return minimal(**fields)


def _match(**fields: object) -> dict:
    return minimal(matches=[{"path": {"type": "PathPrefix", "value": "/"}, **fields}])


INVALID = [
    # (config, expected str(ConfigError))
    ({"version": -1}, "version: -1 is out of range"),
    ({"version": "1"}, "version: expected an integer, got string"),
    ({"version": 1.5}, "version: expected an integer, got number"),
    ({"version": True}, "version: expected an integer, got boolean"),
    ({"version": 1, "extra": 1}, "extra: unknown field"),
    ({"version": 1, "rules": {}}, "rules: expected an array, got object"),
    ({"version": 1, "rules": [1]}, "rules[0]: expected an object, got number"),
    ({"version": 1, "hasGrpcRoute": "yes"}, "hasGrpcRoute: expected a boolean"),
    (minimal(hostname=["a"]), "rules[0].hostname: unknown field"),
    (minimal(hostnames=["a b"]), "rules[0].hostnames[0]: invalid hostname 'a b'"),
    (minimal(hostnames=["a.*.com"]), "rules[0].hostnames[0]: invalid hostname"),
    (minimal(hostnames=["a:80"]), "rules[0].hostnames[0]: invalid hostname"),
    (minimal(hostnames=[1]), "rules[0].hostnames[0]: expected a string, got number"),
    (minimal(matches=[{"path": {"type": "Foo", "value": "/"}}]),
     'rules[0].matches[0].path.type: unknown path match type "Foo"'),
    (minimal(matches=[{"path": {"type": "Exact", "value": ""}}]),
     "rules[0].matches[0].path.value: path value must not be empty"),
    (minimal(matches=[{"path": {"type": "Exact"}}]),
     "rules[0].matches[0].path.value: path value must not be empty"),
    (minimal(matches=[{"path": {"type": "RegularExpression", "value": "(unclosed"}}]),
     "rules[0].matches[0].path.value: invalid regular expression '(unclosed'"),
    (minimal(matches=[{"path": {"type": "RegularExpression", "value": "(?=look)ahead"}}]),
     "rules[0].matches[0].path.value: invalid regular expression"),
    (_match(headers=[{"type": "", "name": "X", "value": "1"}]),
     'rules[0].matches[0].headers[0].type: unknown match type ""'),
    (_match(headers=[{"type": "Exact", "name": "", "value": "1"}]),
     "rules[0].matches[0].headers[0].name: name must not be empty"),
    (_match(headers=[{"type": "Exact", "name": "X Bad:", "value": "1"}]),
     "rules[0].matches[0].headers[0].name: invalid header name 'X Bad:'"),
    (_match(headers=[{"type": "RegularExpression", "name": "X", "value": "a(b"}]),
     "rules[0].matches[0].headers[0].value: invalid regular expression"),
    (_match(queryParams=[{"type": "Prefix", "name": "q", "value": "1"}]),
     'rules[0].matches[0].queryParams[0].type: unknown match type "Prefix"'),
    (_match(queryParams=[{"type": "Exact", "value": "1"}]),
     "rules[0].matches[0].queryParams[0].name: name must not be empty"),
    (_match(queryParams=[{"type": "RegularExpression", "name": "q", "value": "[z-a]"}]),
     "rules[0].matches[0].queryParams[0].value: invalid regular expression"),
    (_match(method="GET POST"), "rules[0].matches[0].method: invalid method"),
    (_match(method=1), "rules[0].matches[0].method: expected a string, got number"),
    (_match(paths={}), "rules[0].matches[0].paths: unknown field"),
    (minimal(backends=[{"url": "", "weight": 1}]),
     "rules[0].backends[0].url: URL must not be empty"),
    (minimal(backends=[{"weight": 1}]), "rules[0].backends[0].url: URL must not be empty"),
    (minimal(backends=[{"url": "ftp://x", "weight": 1}]),
     "rules[0].backends[0].url: backend URL 'ftp://x' must be http:// or https://"),
    (minimal(backends=[{"url": "http://", "weight": 1}]),
     "rules[0].backends[0].url: backend URL 'http://' has no host"),
    (minimal(backends=[{"url": "http://x:99999", "weight": 1}]), "rules[0].backends[0].url: "),
    (minimal(backends=[{"url": "http://x:abc", "weight": 1}]), "rules[0].backends[0].url: "),
    (minimal(backends=[{"url": "svc.ns:80", "weight": 1}]), "rules[0].backends[0].url: "),
    (minimal(backends=[{"url": "http://a:80", "weight": -1}]),
     "rules[0].backends[0].weight: -1 is out of range"),
    (minimal(backends=[{"url": "http://a:80", "weight": 2**31}]),
     "rules[0].backends[0].weight: 2147483648 is out of range"),
    (minimal(backends=[{"url": "http://a:80", "weight": 1, "protocol": "h2"}]),
     'rules[0].backends[0].protocol: unknown protocol "h2"'),
    (minimal(backends=[{"url": "http://a:80", "weight": 1, "websocket": "true"}]),
     "rules[0].backends[0].websocket: expected a boolean"),
    (minimal(backends=[{"url": "http://a:80", "weight": 1, "unavailableStatus": 42}]),
     "rules[0].backends[0].unavailableStatus: status 42 is not 0 or 100..599"),
    (minimal(backends=[{"url": "http://a:80", "weight": 1, "filters": [{"type": "Nope"}]}]),
     'rules[0].backends[0].filters[0].type: unknown filter type "Nope"'),
    (minimal(backends=[{"url": "http://a:80", "weight": 1, "tls": {"clientKeyPem": "!!"}}]),
     "rules[0].backends[0].tls.clientKeyPem: expected standard base64"),
    (minimal(backends=[{"url": "http://a:80", "weight": 1, "tls": {"ca": "x"}}]),
     "rules[0].backends[0].tls.ca: unknown field"),
    (minimal(unavailableStatus=600), "rules[0].unavailableStatus: 600 is out of range"),
    (minimal(unavailableStatus=99), "rules[0].unavailableStatus: status 99 is not 0"),
    (minimal(entrances=["internet"]), "rules[0].entrances[0]: unknown entrance 'internet'"),
    (minimal(timeouts={"request": "10"}), "rules[0].timeouts.request: invalid duration '10'"),
    (minimal(timeouts={"backend": "-1s"}), "rules[0].timeouts.backend: negative duration"),
    (minimal(timeouts={"backendRequest": "1s"}), "rules[0].timeouts.backendRequest: unknown"),
    (minimal(filters=[{"type": "Foo"}]), 'rules[0].filters[0].type: unknown filter type "Foo"'),
    (minimal(filters=[{"type": "RequestHeaderModifier"}]),
     'rules[0].filters[0].requestHeaderModifier: filter type "RequestHeaderModifier" needs'),
    (minimal(filters=[{"type": "RequestHeaderModifier", "requestHeaderModifier": None}]),
     "rules[0].filters[0].requestHeaderModifier: filter type"),
    (minimal(filters=[{"type": "CORS", "cors": {}, "requestHeaderModifier": {}}]),
     'rules[0].filters[0].requestHeaderModifier: unexpected payload for filter type "CORS"'),
    (minimal(filters=[{"type": "RequestHeaderModifier",
                       "requestHeaderModifier": {"set": [{"name": "Bad Name", "value": "x"}]}}]),
     "rules[0].filters[0].requestHeaderModifier.set[0].name: invalid header name"),
    (minimal(filters=[{"type": "ResponseHeaderModifier",
                       "responseHeaderModifier": {"add": [{"name": "X", "value": "a\r\nB: c"}]}}]),
     "rules[0].filters[0].responseHeaderModifier.add[0].value: header value must not contain"),
    (minimal(filters=[{"type": "RequestHeaderModifier",
                       "requestHeaderModifier": {"remove": [""]}}]),
     "rules[0].filters[0].requestHeaderModifier.remove[0]: invalid header name"),
    (minimal(filters=[{"type": "RequestRedirect", "requestRedirect": {"statusCode": 200}}]),
     "rules[0].filters[0].requestRedirect.statusCode: redirect status 200 is not one of"),
    (minimal(filters=[{"type": "RequestRedirect", "requestRedirect": {"statusCode": 304}}]),
     "rules[0].filters[0].requestRedirect.statusCode: redirect status 304"),
    (minimal(filters=[{"type": "RequestRedirect", "requestRedirect": {"scheme": "ftp"}}]),
     'rules[0].filters[0].requestRedirect.scheme: unknown scheme "ftp"'),
    (minimal(filters=[{"type": "RequestRedirect", "requestRedirect": {"port": 70000}}]),
     "rules[0].filters[0].requestRedirect.port: 70000 is out of range"),
    (minimal(filters=[{"type": "RequestRedirect", "requestRedirect": {"hostname": "a/b"}}]),
     "rules[0].filters[0].requestRedirect.hostname: invalid hostname 'a/b'"),
    (minimal(filters=[{"type": "RequestRedirect", "requestRedirect": {
        "path": {"type": "ReplaceFullPath", "replaceFullPath": "/x"}}}]),
     "rules[0].filters[0].requestRedirect.path.replaceFullPath: unknown field"),
    (minimal(filters=[{"type": "RequestRedirect", "requestRedirect": {
        "path": {"type": "Prefix", "value": "/x"}}}]),
     'rules[0].filters[0].requestRedirect.path.type: unknown path modifier type "Prefix"'),
    (minimal(filters=[{"type": "URLRewrite", "urlRewrite": {
        "path": {"type": "ReplacePrefixMatch", "value": "/x"}}}]),
     "rules[0].filters[0].urlRewrite.path.value: unknown field"),
    (minimal(filters=[{"type": "URLRewrite", "urlRewrite": {
        "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "x"}}}]),
     "rules[0].filters[0].urlRewrite.path.replacePrefixMatch: path 'x' must start with '/'"),
    (minimal(filters=[{"type": "URLRewrite", "urlRewrite": {
        "path": {"type": "ReplacePrefixMatch", "replaceFullPath": "/a"}}}]),
     "rules[0].filters[0].urlRewrite.path.replaceFullPath: not used by path modifier type"),
    (minimal(filters=[{"type": "RequestRedirect", "requestRedirect": {}},
                      {"type": "URLRewrite", "urlRewrite": {}}]),
     "rules[0].filters: RequestRedirect and URLRewrite cannot be combined in one rule"),
    (minimal(filters=[{"type": "RequestMirror", "requestMirror": {
        "backendUrl": "http://m:80", "percent": 101}}]),
     "rules[0].filters[0].requestMirror.percent: mirror percent 101 is not 0..100"),
    (minimal(filters=[{"type": "RequestMirror", "requestMirror": {
        "backendUrl": "http://m:80", "percent": -1}}]),
     "rules[0].filters[0].requestMirror.percent: mirror percent -1 is not 0..100"),
    (minimal(filters=[{"type": "RequestMirror", "requestMirror": {"percent": 5}}]),
     "rules[0].filters[0].requestMirror.backendUrl: URL must not be empty"),
    (minimal(filters=[{"type": "RequestMirror", "requestMirror": {
        "backendUrl": "http://m:80", "protocol": "grpc"}}]),
     'rules[0].filters[0].requestMirror.protocol: unknown protocol "grpc"'),
    (minimal(filters=[{"type": "CORS", "cors": {"maxAge": -1}}]),
     "rules[0].filters[0].cors.maxAge: CORS maxAge -1 must be >= 0"),
    (minimal(filters=[{"type": "CORS", "cors": {"allowOrigins": "*"}}]),
     "rules[0].filters[0].cors.allowOrigins: expected an array, got string"),
    (minimal(filters=[{"type": "CORS", "cors": {"allowCredentials": 1}}]),
     "rules[0].filters[0].cors.allowCredentials: expected a boolean, got number"),
]


@pytest.mark.parametrize(("data", "message"), INVALID, ids=[m for _, m in INVALID])
def test_validation_errors_name_the_field(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps(data))
    assert str(caught.value).startswith(message)
    assert caught.value.kind == "invalid"
    assert str(caught.value).startswith(caught.value.path)


def test_error_deep_in_a_later_rule_names_its_index() -> None:
    data = example()
    data["rules"][3]["matches"] = [{"path": {"type": "Foo", "value": "/"}}]
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert str(caught.value) == 'rules[3].matches[0].path.type: unknown path match type "Foo"'
    assert caught.value.path == "rules[3].matches[0].path.type"


@pytest.mark.parametrize("raw", [b"{", b"", b"[1,", b'{"version": 1} trailing', b"\xff\xfe",
                                 b'{"version": NaN}', b'{"version": Infinity}'])
def test_bad_json_is_kind_json(raw: bytes) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert caught.value.kind == "json"
    assert str(caught.value).startswith("invalid JSON")


def test_top_level_must_be_an_object() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(b"[]")
    assert caught.value.kind == "invalid"
    assert str(caught.value) == "expected an object, got array"


def test_every_backend_filter_is_validated_like_rule_filters() -> None:
    data = example()
    bad = copy.deepcopy(data["rules"][0]["backends"][1])
    bad["filters"][0]["requestHeaderModifier"]["set"][0]["name"] = ""
    data["rules"][0]["backends"][1] = bad
    with pytest.raises(ConfigError, match=r"^rules\[0\]\.backends\[1\]\.filters\[0\]"):
        parse_config(data)



# ------------------------------------------------------------------ length limits

def _header_set(name: str = "X-A", value: str = "v") -> dict:
    return minimal(filters=[{"type": "RequestHeaderModifier", "requestHeaderModifier": {
        "set": [{"name": name, "value": value}]}}])


def _host(n: int) -> str:
    """A hostname of ``n`` characters, in labels of at most 63."""
    return (("a" * 62 + ".") * 5)[:n - 1] + "b"


def _label(n: int) -> str:
    return "a" * n + ".example.com"


# (field path, config made with a value of length n, Gateway API's maxLength)
LIMITS = [
    ("rules[0].hostnames[0]", lambda n: minimal(hostnames=[_host(n)]), 253),
    ("rules[0].hostnames[0]", lambda n: minimal(hostnames=[_label(n)]), 63),
    ("rules[0].filters[0].requestRedirect.hostname", lambda n: minimal(
        backends=[], filters=[{"type": "RequestRedirect",
                               "requestRedirect": {"hostname": _label(n)}}]), 63),
    ("rules[0].matches[0].path.value", lambda n: _match(path={
        "type": "PathPrefix", "value": "/" + "p" * (n - 1)}), 1024),
    ("rules[0].matches[0].headers[0].name", lambda n: _match(headers=[
        {"type": "Exact", "name": "h" * n, "value": "v"}]), 256),
    ("rules[0].matches[0].headers[0].value", lambda n: _match(headers=[
        {"type": "Exact", "name": "h", "value": "v" * n}]), 4096),
    ("rules[0].matches[0].queryParams[0].name", lambda n: _match(queryParams=[
        {"type": "Exact", "name": "q" * n, "value": "v"}]), 256),
    ("rules[0].matches[0].queryParams[0].value", lambda n: _match(queryParams=[
        {"type": "Exact", "name": "q", "value": "v" * n}]), 1024),
    ("rules[0].filters[0].requestHeaderModifier.set[0].name",
     lambda n: _header_set(name="h" * n), 256),
    ("rules[0].filters[0].requestHeaderModifier.set[0].value",
     lambda n: _header_set(value="v" * n), 4096),
    ("rules[0].filters[0].urlRewrite.path.replaceFullPath", lambda n: minimal(filters=[
        {"type": "URLRewrite", "urlRewrite": {"path": {
            "type": "ReplaceFullPath", "replaceFullPath": "/" + "p" * (n - 1)}}}]), 1024),
    ("rules[0].filters[0].cors.allowOrigins[0]", lambda n: minimal(filters=[
        {"type": "CORS", "cors": {"allowOrigins": ["https://" + "o" * (n - 8)]}}]), 253),
    ("rules[0].filters[0].cors.allowHeaders[0]", lambda n: minimal(filters=[
        {"type": "CORS", "cors": {"allowHeaders": ["h" * n]}}]), 256),
    ("rules[0].backends[0].tls.serverName", lambda n: minimal(backends=[
        {"url": "https://b:443", "weight": 1, "tls": {"serverName": _host(n)}}]), 253),
    ("rules[0].backends[0].tls.subjectAltNameUris[0]", lambda n: minimal(backends=[
        {"url": "https://b:443", "weight": 1,
         "tls": {"subjectAltNameUris": ["spiffe://" + "u" * (n - 9)]}}]), 253),
]


@pytest.mark.parametrize("field, make, limit", LIMITS,
                         ids=[f"{f}-{limit}" for f, _, limit in LIMITS])
def test_gateway_api_length_limits(field: str, make, limit: int) -> None:
    parse_config(json.dumps(make(limit)))  # at the limit: accepted
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps(make(limit + 1)))
    assert caught.value.path == field
    assert f"more than the limit of {limit}" in str(caught.value)


def test_an_echoed_value_is_clipped() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps(_match(method="G E T" * 100_000)))
    message = str(caught.value)
    assert message.startswith("rules[0].matches[0].method: invalid method 'G E TG E T")
    assert message.endswith("(499490 more characters)") and len(message) < 600
