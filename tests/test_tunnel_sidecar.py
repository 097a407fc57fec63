"""Tunnel-entrance trust rules and the cloudflared ingress rendering."""

from __future__ import annotations

import pytest
import yaml

from proxy.request import EMPTY_BODY, Request
from tunnel.sidecar import DEFAULT_SERVICE, UNIX_SERVICE, prepare, render_ingress

PEER = "127.0.0.1"


def request(*headers: tuple[bytes, bytes]) -> Request:
    return Request("GET", "/", "", "app.example.com", list(headers), EMPTY_BODY,
                   "tunnel", client_ip=PEER)


def test_cf_connecting_ip_becomes_the_client_and_replaces_xff() -> None:
    r = request((b"X-Forwarded-For", b"6.6.6.6"), (b"CF-Connecting-IP", b" 203.0.113.7 "),
                (b"x-forwarded-for", b"203.0.113.7"), (b"Accept", b"*/*"))
    prepare(r)
    assert r.client_ip == "203.0.113.7"
    assert r.headers == [(b"CF-Connecting-IP", b" 203.0.113.7 "), (b"Accept", b"*/*")]


def test_ipv6_is_normalised() -> None:
    r = request((b"cf-connecting-ip", b"2001:DB8:0:0::1"))
    prepare(r)
    assert r.client_ip == "2001:db8::1"


@pytest.mark.parametrize("value", [
    b"", b"not-an-ip", b"203.0.113.7, 1.2.3.4", b"256.1.1.1", b"fe80::1%eth0",
    b"\xff\xfe", b"203.0.113.7:443"])
def test_invalid_cf_connecting_ip_is_ignored(value: bytes) -> None:
    r = request((b"CF-Connecting-IP", value), (b"X-Forwarded-For", b"9.9.9.9"))
    prepare(r)
    assert r.client_ip == PEER
    assert r.header(b"x-forwarded-for") == b"9.9.9.9"


def test_no_edge_headers_changes_nothing() -> None:
    r = request((b"X-Forwarded-For", b"9.9.9.9"))
    prepare(r)
    assert (r.client_ip, r.scheme, r.headers) == (PEER, "http", [(b"X-Forwarded-For", b"9.9.9.9")])


@pytest.mark.parametrize("value, scheme", [
    (b'{"scheme":"https"}', "https"),
    (b'{"scheme": "http"}', "http"),
    (b'{"scheme":"ftp"}', "http"),
    (b'{"scheme":["https"]}', "http"),
    (b'["https"]', "http"),
    (b"https", "http"),
    (b'{"scheme":"https"' + b" " * 300 + b"}", "http"),
    (b"\xff", "http"),
])
def test_cf_visitor_sets_the_scheme(value: bytes, scheme: str) -> None:
    r = request((b"CF-Visitor", value))
    prepare(r)
    assert r.scheme == scheme


def test_ingress_is_one_catch_all_rule_whatever_the_hostnames() -> None:
    # cloudflared matches hostnames case-sensitively and keeps a trailing dot, so
    # per-hostname rules would hide APP.Example.COM from tunnelgate: one catch-all.
    text = render_ingress(["App.Example.com", "*.apps.example.com"], UNIX_SERVICE)
    assert text.startswith("#")
    assert yaml.safe_load(text) == {"ingress": [{"service": UNIX_SERVICE}]}
    assert "http_status" not in text and "hostname:" not in text
    assert "#   app.example.com\n" in text and "#   *.apps.example.com\n" in text


def test_ingress_without_hostnames_is_a_single_catch_all() -> None:
    assert yaml.safe_load(render_ingress([])) == {"ingress": [{"service": DEFAULT_SERVICE}]}


@pytest.mark.parametrize("hostname", [
    "app.example.com:443", "*", "*.", "a.*.example.com", "*example.com", "app..example",
    "-app.example.com", "app-.example.com", "", "exa mple.com", "ex/ample.com",
    "a" * 64 + ".com", "bücher.example", "app.example.com.", "bad_host", "localhost",
    "hello.default.svc.cluster.local", "*.svc.cluster.local", "hello.default.svc"])
def test_bad_hostnames_are_rejected(hostname: str) -> None:
    with pytest.raises(ValueError, match="ingress hostname"):
        render_ingress([hostname])


def test_duplicate_hostnames_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        render_ingress(["a.example.com", "A.example.com"])


@pytest.mark.parametrize("service", [
    "http://127.0.0.1:8082", "https://tunnelgate.ns.svc:8443", "unix:/run/x.sock",
    "unix+tls:/run/x.sock"])
def test_good_services_are_accepted(service: str) -> None:
    assert yaml.safe_load(render_ingress(["a.example.com"], service))["ingress"] == [
        {"service": service}]


@pytest.mark.parametrize("service", [
    "127.0.0.1:8082", "unix:relative.sock", "unix:", "http_status:404", "tcp://h:1",
    "http://", "http://:8082", "http://user@h:1", "hello_world"])
def test_bad_services_are_rejected(service: str) -> None:
    with pytest.raises(ValueError, match="ingress service"):
        render_ingress(["a.example.com"], service)
