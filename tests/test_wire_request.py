"""proxy.wire.request: request-head validation and target splitting as tables
(sans-IO: no sockets, each case is bytes in, a RequestHead or a Rejection out)."""

from __future__ import annotations

import pytest

from proxy.request import Headers
from proxy.wire.request import (
    Rejection, RequestHead, asks_close, check_line_start, check_transfer_coding,
    lacks_version, names_a_method, relayable_upgrade, split_target, KnownHost,
    valid_host, validate_head)

HOST: Headers = [(b"Host", b"example.com")]


FIELDS = ("method", "path", "query", "host", "chunked", "length", "upgrade",
          "expect_continue", "connection")


def fields(head: RequestHead) -> dict[str, object]:
    return {name: getattr(head, name) for name in FIELDS}


def accepted(method: str = "GET", path: str = "/", query: str = "",
             host: str = "example.com", chunked: bool = False, length: int = 0,
             upgrade: str | None = None, expect_continue: bool = False,
             connection: bool = False) -> dict[str, object]:
    return {"method": method, "path": path, "query": query, "host": host,
            "chunked": chunked, "length": length, "upgrade": upgrade,
            "expect_continue": expect_continue, "connection": connection}


# (version, raw method, target, headers) -> the fields of the RequestHead
ACCEPTED: list[tuple[str, bytes, bytes, Headers, dict[str, object]]] = [
    ("1.1", b"GET", b"/a?b=c", HOST, accepted(path="/a", query="b=c")),
    ("1.1", b"GET", b"/a?", HOST, accepted(path="/a")),
    ("1.1", b"PROPFIND", b"/", HOST, accepted(method="PROPFIND")),
    ("1.0", b"GET", b"/", [], accepted(host="")),  # HTTP/1.0 may omit Host
    ("1.1", b"GET", b"/", [(b"host", b"[::1]:8080")], accepted(host="[::1]:8080")),
    ("1.1", b"POST", b"/", HOST + [(b"Content-Length", b"10")],
     accepted(method="POST", length=10)),
    ("1.1", b"POST", b"/", HOST + [(b"Content-Length", b"0")], accepted(method="POST")),
    ("1.1", b"POST", b"/", HOST + [(b"Transfer-Encoding", b"chunked")],
     accepted(method="POST", chunked=True)),
    ("1.1", b"POST", b"/", HOST + [(b"transfer-encoding", b" Chunked ")],
     accepted(method="POST", chunked=True)),
    ("1.1", b"PUT", b"/", HOST + [(b"Expect", b"100-Continue"), (b"Content-Length", b"3")],
     accepted(method="PUT", length=3, expect_continue=True)),
    # an HTTP/1.0 client does not wait for a 100 (RFC 9110 §10.1.1)
    ("1.0", b"PUT", b"/", HOST + [(b"Expect", b"100-continue"), (b"Content-Length", b"3")],
     accepted(method="PUT", length=3)),
    ("1.1", b"GET", b"/", HOST + [(b"Expect", b"something-else")], accepted()),
    ("1.1", b"GET", b"/ws", HOST + [(b"Upgrade", b"WebSocket ")],
     accepted(path="/ws", upgrade="websocket")),
    # a Connection field sent (then llhttp says whether the connection persists)
    ("1.1", b"GET", b"/", HOST + [(b"connection", b"close")], accepted(connection=True)),
    ("1.0", b"GET", b"/", HOST + [(b"Connection", b"keep-alive")],
     accepted(connection=True)),
    ("1.1", b"GET", b"/", HOST + [(b"Connectiom", b"close")], accepted()),
    # absolute form: the target's authority replaces Host (RFC 9112 §3.2.2)
    ("1.1", b"GET", b"http://other.example/p?q=1", HOST,
     accepted(path="/p", query="q=1", host="other.example")),
    ("1.1", b"GET", b"HTTPS://other.example:8443", HOST,
     accepted(host="other.example:8443")),
    ("1.0", b"GET", b"http://other.example", [], accepted(host="other.example")),
    ("1.1", b"OPTIONS", b"*", HOST, accepted(method="OPTIONS", path="*")),
    ("1.1", b"GET", b"/a#frag", HOST, accepted(path="/a")),
]


@pytest.mark.parametrize("version, method, target, headers, expected", ACCEPTED)
def test_accepted(version: str, method: bytes, target: bytes, headers: Headers,
                  expected: dict[str, object]) -> None:
    assert fields(validate_head(version, method, target, headers, KnownHost())) == expected


CL5 = (b"Content-Length", b"5")


def te(value: bytes) -> tuple[bytes, bytes]:
    return (b"Transfer-Encoding", value)


# (version, raw method, target, headers) -> (status, the start of the reason)
REJECTED: list[tuple[str, bytes, bytes, Headers, tuple[int, str]]] = [
    ("2.0", b"GET", b"/", HOST, (505, "HTTP/2.0")),
    ("0.9", b"GET", b"/", HOST, (400, "no HTTP version")),  # llhttp's "GET /"
    ("1.1", b"CONNECT", b"example.com:443", HOST, (501, "CONNECT")),
    # smuggling: two framings, or a framing the backend may read differently
    ("1.1", b"POST", b"/", HOST + [CL5, te(b"chunked")], (400, "both")),
    ("1.1", b"POST", b"/", HOST + [te(b"chunked"), CL5], (400, "both")),
    ("1.1", b"POST", b"/", HOST + [te(b"gzip")], (400, "chunked must")),
    ("1.1", b"POST", b"/", HOST + [te(b"chunked, gzip")], (400, "chunked must")),
    ("1.1", b"POST", b"/", HOST + [te(b"chunked, chunked")], (400, "chunked must")),
    ("1.1", b"POST", b"/", HOST + [te(b"chunked"), te(b"chunked")], (400, "chunked must")),
    ("1.1", b"POST", b"/", HOST + [te(b"chunked"), te(b"identity")], (400, "chunked must")),
    ("1.1", b"POST", b"/", HOST + [te(b"")], (400, "chunked must")),
    ("1.0", b"POST", b"/", HOST + [te(b"chunked")], (400, "Transfer-Encoding in")),
    ("1.1", b"POST", b"/", HOST + [te(b"gzip, chunked")], (501, "transfer codings")),
    ("1.1", b"POST", b"/", HOST + [te(b"gzip"), te(b"chunked")], (501, "transfer codings")),
    # Host: exactly one, of host[:port] characters (RFC 9112 §3.2)
    ("1.1", b"GET", b"/", [], (400, "missing Host")),
    ("1.1", b"GET", b"/", HOST + HOST, (400, "more than one Host")),
    ("1.0", b"GET", b"/", HOST + [(b"HOST", b"other")], (400, "more than one Host")),
    ("1.1", b"GET", b"/", [(b"Host", b"exa mple.com")], (400, "invalid Host")),
    ("1.1", b"GET", b"/", [(b"Host", b"example.com/evil")], (400, "invalid Host")),
    ("1.1", b"GET", b"/", [(b"Host", b"user@example.com")], (400, "invalid Host")),
    ("1.1", b"GET", b"/", [(b"Host", b"a\\b")], (400, "invalid Host")),
    ("1.1", b"GET", b"/", [(b"Host", b"caf\xc3\xa9")], (400, "invalid Host")),
    # a port is digits only, after the host or an IP literal's "]"
    *[("1.1", b"GET", b"/", [(b"Host", host)], (400, "invalid Host")) for host in (
        b"example.com:abc", b"example.com:-1", b"example.com:80:81", b":80", b"::1",
        b"[::1", b"[::1]80", b"[::1]:x")],
    # target forms
    ("1.1", b"GET", b"*", HOST, (400, "asterisk-form")),
    ("1.1", b"GET", b"a/b", HOST, (400, "invalid request target")),
    ("1.1", b"GET", b"ftp://example.com/", HOST, (400, "invalid request target")),
    ("1.1", b"GET", b"http:///p", HOST, (400, "invalid authority")),
    ("1.1", b"GET", b"http://user@other.example/", HOST, (400, "invalid authority")),
    ("1.1", b"GET", b"http://a\\b/", HOST, (400, "invalid authority")),
]


@pytest.mark.parametrize("version, method, target, headers, expected", REJECTED)
def test_rejected(version: str, method: bytes, target: bytes, headers: Headers,
                  expected: tuple[int, str]) -> None:
    with pytest.raises(Rejection) as caught:
        validate_head(version, method, target, headers, KnownHost())
    assert (caught.value.status, str(caught.value)[:len(expected[1])]) == expected


def test_version_is_checked_before_the_headers() -> None:
    with pytest.raises(Rejection) as caught:
        validate_head("2.0", b"CONNECT", b"*", HOST + HOST, KnownHost())
    assert caught.value.status == 505


# One connection's Host fields in turn -> what each request is: its host, or the status
# it was refused with. The connection remembers the last valid host (KnownHost): a
# repeat is not checked again, anything else is.
HOST_SEQUENCES: list[tuple[list[bytes], list[str | int]]] = [
    ([b"a.example", b"a.example"], ["a.example", "a.example"]),
    ([b"a.example", b"b.example", b"a.example"], ["a.example", "b.example", "a.example"]),
    ([b"a.example", b"a example", b"a.example"], ["a.example", 400, "a.example"]),
    ([b"a example", b"a example"], [400, 400]),
    ([b"", b""], ["", ""]),  # (an empty Host: HTTP/1.1 allows it, RFC 9110 §7.2)
]


@pytest.mark.parametrize("hosts, expected", HOST_SEQUENCES)
def test_one_connection_host_after_host(hosts: list[bytes],
                                        expected: list[str | int]) -> None:
    known = KnownHost()
    seen: list[str | int] = []
    for host in hosts:
        try:
            seen.append(validate_head("1.1", b"GET", b"/", [(b"Host", host)], known).host)
        except Rejection as refused:
            seen.append(refused.status)
    assert seen == expected


def test_an_absolute_target_authority_is_remembered_only_once_valid() -> None:
    known = KnownHost()
    with pytest.raises(Rejection):
        validate_head("1.1", b"GET", b"http://a\\b/", HOST, known)
    assert known.raw == b""
    assert validate_head("1.1", b"GET", b"http://other.example/", HOST, known).host \
        == "other.example"
    assert known.raw == b"other.example"


# target (with a method that is not OPTIONS) -> (path, query, authority)
TARGETS: list[tuple[bytes, tuple[str, str, bytes | None]]] = [
    (b"/", ("/", "", None)),
    (b"/a/b?x=1&y", ("/a/b", "x=1&y", None)),
    (b"/a?x?y", ("/a", "x?y", None)),
    (b"/%2e%2e/a", ("/%2e%2e/a", "", None)),  # decoding is the router's business
    (b"/caf\xc3\xa9", ("/caf\xc3\xa9", "", None)),  # as latin-1, byte for byte
    # a fragment is not part of the target (RFC 9112 §3.2), even where it hides a path
    (b"/a#/admin", ("/a", "", None)),
    (b"/a?q#f?g", ("/a", "q", None)),
    (b"/#", ("/", "", None)),
    (b"http://h", ("/", "", b"h")),
    (b"http://h:80/p", ("/p", "", b"h:80")),
    (b"http://h?q", ("/", "q", b"h")),
    (b"http://h#/admin", ("/", "", b"h")),
    (b"http://h/p#f", ("/p", "", b"h")),
    (b"https://[::1]:8443/p", ("/p", "", b"[::1]:8443")),
    (b"Http://H/P", ("/P", "", b"H")),
]


@pytest.mark.parametrize("target, expected", TARGETS)
def test_split_target(target: bytes, expected: tuple[str, str, bytes | None]) -> None:
    assert split_target(target, "GET") == expected


@pytest.mark.parametrize("target, method, expected", [
    (b"*", "OPTIONS", ("*", "", None)),
    (b"*", "GET", 400),
    (b"*/a", "OPTIONS", 400),
    (b"", "GET", 400),
    (b"?q", "GET", 400),
    (b"http://", "GET", 400),
    (b"http://a@b/", "GET", 400),
    (b"//h/p", "GET", ("//h/p", "", None)),  # origin form whose path starts "//"
])
def test_split_target_forms(target: bytes, method: str,
                            expected: tuple[str, str, bytes | None] | int) -> None:
    if isinstance(expected, int):
        with pytest.raises(Rejection) as caught:
            split_target(target, method)
        assert caught.value.status == expected
    else:
        assert split_target(target, method) == expected


@pytest.mark.parametrize("host, valid", [
    (b"example.com", True), (b"example.com:8080", True), (b"example.com:", True),
    (b"10.0.0.1:80", True), (b"[::1]", True), (b"[::1]:8443", True), (b"", True),
    (b"[::1]:", True), (b"example.com:8o", False), (b"example.com:80 ", False),
])
def test_valid_host_ports(host: bytes, valid: bool) -> None:
    # RFC 3986 §3.2.3: port = *DIGIT, after the host (an IP literal in brackets).
    assert valid_host(host) is valid


@pytest.mark.parametrize("headers, close", [
    ([(b"Connection", b"keep-alive, close")], True),
    ([(b"Connection", b"keep-alive"), (b"connection", b"Close")], True),
    ([(b"Connection", b" CLOSE ")], True),
    ([(b"Connection", b"keep-alive")], False),
    ([(b"Connection", b"closed, x-close")], False),
    ([(b"X-Connection", b"close")], False),
])
def test_asks_close(headers: Headers, close: bool) -> None:
    assert asks_close(headers) is close


@pytest.mark.parametrize("start, method", [
    (b"BREW /pot HTTP/1.1\r\n", True), (b"get / HTTP/1.1\r\n", True),
    (b"X-CUSTOM-VERB / HTTP/1.1", True), (b"M-SEARCH * HTTP/1.1", True),
    (b"\x16\x03\x01\x02\x00", False), (b" GET / HTTP/1.1", False),
    (b"GE(T / HTTP/1.1", False), (b"A" * 40, False),
])
def test_names_a_method(start: bytes, method: bool) -> None:
    # RFC 9110 §9.1: a method is any token; garbage before a space is not one.
    assert names_a_method(start) is method


@pytest.mark.parametrize("upgrade, relayed", [
    ("websocket", True), ("foo/2, websocket", True), ("h2c", False),
    ("websocket, h2c", False), ("websocket,h2c ", False), ("h2c-not", True)])
def test_an_upgrade_naming_h2c_is_never_relayed(upgrade: str, relayed: bool) -> None:
    assert relayable_upgrade(upgrade) is relayed


@pytest.mark.parametrize("start, version_missing", [
    (b"GET /\r\n", True),  # HTTP/0.9
    (b"\r\nGET /x\r\nHost: h\r\n", True),
    (b"GET / HTTP/1.1\r\n", False),
    (b"GET / HTTP/1.1\r\nHost: h\r\n", False),
    (b"GET /", False),  # not all there yet
    (b"GET / HT", False),
    (b"\r\n", False),
    (b"", False),
])
def test_lacks_version(start: bytes, version_missing: bool) -> None:
    assert lacks_version(start) is version_missing


@pytest.mark.parametrize("start, refused", [
    (b"GET / HTTP/1.1\r\n", False),
    (b"\r\nGET / HTTP/1.1\r\n", False),
    (b"\r\n\r\nGET / HTTP/1.1\r\n", False),
    (b"\nGET / HTTP/1.1\r\n", False),  # a lone LF ends a line (RFC 9112 §2.2 allows it)
    (b"\rGET / HTTP/1.1\r\n", True),  # a bare CR is invalid there
    (b"\r\n\rGET / HTTP/1.1\r\n", True),
    (b"\n\rGET / HTTP/1.1\r\n", True),
    (b"\r\r\nGET / HTTP/1.1\r\n", True),
])
def test_check_line_start(start: bytes, refused: bool) -> None:
    if refused:
        with pytest.raises(Rejection) as caught:
            check_line_start(start)
        assert caught.value.status == 400
    else:
        check_line_start(start)


@pytest.mark.parametrize("te, status", [
    (b"chunked", None),
    (b", chunked", None),
    (b"chunked,", None),
    (b"chunked, ,", None),
    (b"gzip, chunked", 501),
    (b", gzip ,chunked", 501),
    (b"chunked, chunked", 400),
    (b"chunked, gzip", 400),
    (b",", 400),  # no coding at all
])
def test_check_transfer_coding_reads_the_list(te: bytes, status: int | None) -> None:
    if status is None:
        check_transfer_coding(te, False, "1.1")
        return
    with pytest.raises(Rejection) as caught:
        check_transfer_coding(te, False, "1.1")
    assert caught.value.status == status


def test_an_expect_100_continue_field_is_met_not_forwarded() -> None:
    headers = [(b"Host", b"h"), (b"Expect", b"100-continue"), (b"Content-Length", b"3")]
    head = validate_head("1.1", b"POST", b"/?", headers, KnownHost())
    assert head.expect_continue and head.empty_query and (head.path, head.query) == ("/", "")
    assert headers == [(b"Host", b"h"), (b"Content-Length", b"3")]
