"""Forwarding header arithmetic as plain input/output tables."""

from __future__ import annotations

import pytest

from proxy.exchange.forwarding import (
    downstream_response_headers, upstream_request_headers, upstream_target)
from routing.config import parse_config
from routing.table import Table
from routing.values import backend_base


def _forward(headers, *, host=b"app.example.com", client_ip="10.0.0.7", scheme="http",
             upgrade=None):
    return upstream_request_headers(headers, host, b"app.example.com", client_ip,
                                    scheme, upgrade)


def _names(headers):
    return [name.lower() for name, _ in headers]


@pytest.mark.parametrize("name", [
    b"Connection", b"Proxy-Connection", b"Keep-Alive", b"Proxy-Authenticate",
    b"Proxy-Authorization", b"TE", b"Trailer", b"Transfer-Encoding", b"Upgrade",
    b"Content-Length",
])
def test_hop_by_hop_request_headers_are_removed(name):
    out = _forward([(name, b"x"), (b"Accept", b"*/*")])
    assert name.lower() not in _names(out)
    assert (b"Accept", b"*/*") in out


def test_headers_named_in_connection_are_removed():
    out = _forward([(b"Connection", b"close, X-Secret"), (b"X-Secret", b"1"),
                    (b"X-Kept", b"2")])
    assert b"x-secret" not in _names(out)
    assert (b"X-Kept", b"2") in out


@pytest.mark.parametrize("te, sent", [
    (b"trailers", [(b"TE", b"trailers")]),
    (b"trailers, deflate", [(b"TE", b"trailers")]),  # only the one value goes on
    (b"deflate;q=0.5, Trailers", [(b"TE", b"trailers")]),
    (b"deflate", []),
    (b"gzip, chunked", []),
])
def test_te_is_hop_by_hop_but_trailers_is_sent_on(te, sent):
    # RFC 9110 §10.1.4: TE describes one hop, so the client's value is not forwarded;
    # "trailers" is re-added (as the Go ReverseProxy does), for HTTP/1.1 and h2c
    # backends alike: this hop relays trailers to a client that announced them.
    out = _forward([(b"TE", te), (b"Accept", b"*/*")])
    assert [pair for pair in out if pair[0].lower() == b"te"] == sent


@pytest.mark.parametrize(("value", "relayed"), [
    (b"chunked", None),  # the entrance frames the body itself
    (b"gzip, chunked", b"gzip"),  # the body as relayed is still gzip-coded
    (b"gzip", b"gzip"),  # close-delimited and coded (RFC 9112 §6.3 rule 4)
])
def test_response_transfer_codings_other_than_chunked_are_kept(value, relayed):
    out = downstream_response_headers([(b"Transfer-Encoding", value), (b"X", b"1")])
    expected = [(b"X", b"1")] if relayed is None else [(b"Transfer-Encoding", relayed),
                                                      (b"X", b"1")]
    assert out == expected


def test_host_is_first_and_client_host_is_not_duplicated():
    out = _forward([(b"Host", b"evil.example"), (b"Accept", b"*/*")], host=b"assets.internal")
    assert out[0] == (b"Host", b"assets.internal")
    assert _names(out).count(b"host") == 1


@pytest.mark.parametrize("incoming,client_ip,expected", [
    ([], "10.0.0.7", b"10.0.0.7"),
    ([(b"X-Forwarded-For", b"1.2.3.4")], "10.0.0.7", b"1.2.3.4, 10.0.0.7"),
    ([(b"X-Forwarded-For", b"1.1.1.1"), (b"X-Forwarded-For", b"2.2.2.2")], "10.0.0.7",
     b"1.1.1.1, 2.2.2.2, 10.0.0.7"),
    ([(b"X-Forwarded-For", b"1.2.3.4")], None, b"1.2.3.4"),
])
def test_x_forwarded_for_appends_the_vouched_client(incoming, client_ip, expected):
    out = _forward(incoming, client_ip=client_ip)
    assert [v for n, v in out if n.lower() == b"x-forwarded-for"] == [expected]


def test_forwarded_proto_and_host_replace_client_values():
    out = _forward([(b"X-Forwarded-Proto", b"https"), (b"X-Forwarded-Host", b"evil")],
                   scheme="http", host=b"rewritten.internal")
    assert [v for n, v in out if n.lower() == b"x-forwarded-proto"] == [b"http"]
    assert [v for n, v in out if n.lower() == b"x-forwarded-host"] == [b"app.example.com"]


def test_upgrade_pair_is_kept_for_a_protocol_switch():
    out = _forward([(b"Connection", b"Upgrade"), (b"Upgrade", b"websocket"),
                    (b"Sec-WebSocket-Key", b"k")], upgrade="websocket")
    assert (b"Connection", b"Upgrade") in out and (b"Upgrade", b"websocket") in out
    assert (b"Sec-WebSocket-Key", b"k") in out


@pytest.mark.parametrize("headers,keep_upgrade,expected", [
    ([(b"Connection", b"keep-alive"), (b"Keep-Alive", b"timeout=5"), (b"X-A", b"1")],
     False, [(b"X-A", b"1")]),
    ([(b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"3")], False,
     [(b"Content-Length", b"3")]),
    ([(b"Connection", b"X-B"), (b"X-B", b"2"), (b"Set-Cookie", b"a=1")], False,
     [(b"Set-Cookie", b"a=1")]),
    ([(b"Upgrade", b"websocket"), (b"Sec-WebSocket-Accept", b"x")], True,
     [(b"Upgrade", b"websocket"), (b"Sec-WebSocket-Accept", b"x")]),
])
def test_response_hop_by_hop_cleanup(headers, keep_upgrade, expected):
    assert downstream_response_headers(headers, keep_upgrade) == expected


@pytest.mark.parametrize("url,path,query,expected", [
    ("http://svc.ns.svc.cluster.local:80", "/a/b", "", "/a/b"),
    ("http://svc:80", "/a", "x=1", "/a?x=1"),
    ("http://svc:80", "", "", "/"),
    ("https://api.example.com/base", "/v1/x", "", "/base/v1/x"),
    ("https://api.example.com/base/", "/v1/x", "", "/base/v1/x"),
    ("https://api.example.com/base?key=k&x=9", "/v1", "x=1", "/base/v1?x=1&key=k"),
])
def test_upstream_target_with_external_base(url, path, query, expected):
    assert upstream_target(*backend_base(url), path, query) == expected


def test_a_compiled_backend_carries_its_urls_base() -> None:
    table = Table.compile(parse_config({"version": 1, "rules": [{"backends": [
        {"url": "https://api.example.com/base/?key=k", "weight": 1},
        {"url": "http://svc:80", "weight": 1}]}]}))
    first, second = table.rules[0].backends
    assert (first.base_path, first.base_query) == ("/base", "key=k")
    assert (second.base_path, second.base_query) == ("", "")
