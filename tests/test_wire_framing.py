"""proxy.wire.framing: how response heads and request heads are framed, as tables
(sans-IO: header lists in, header lists, lines and flags out)."""

from __future__ import annotations

import httptools
import pytest

from proxy.request import Headers
from proxy.wire.framing import (
    DateLine, ResponseFraming, coding_list, content_length, find_length,
    parser_frames_chunked, poolable, request_framing, response_framing, transfer_codings,
    without_framing)

DATE = b"Date: Tue, 01 Dec 2026 12:00:00 GMT\r\n"
DATES = DateLine(lambda: 1796126400.25)  # that second
CHUNKED = b"Transfer-Encoding: chunked\r\n"
CLOSE = b"Connection: close\r\n"
KEEP = b"Connection: keep-alive\r\n"
X: Headers = [(b"X-A", b"1")]
CL42: Headers = [(b"Content-Length", b"42")]
# what a Handler may pass along that the entrance owns and drops
HOP: Headers = [(b"Connection", b"x-b"), (b"Keep-Alive", b"timeout=5"),
                (b"Proxy-Connection", b"keep-alive"), (b"Transfer-Encoding", b"chunked")]


def outcome(f: ResponseFraming) -> tuple[Headers, bytes, bool, int | None, bool, bool]:
    return f.headers, f.lines, f.chunked, f.remaining, f.keep_alive, f.no_body


# (method, status, http10, headers, body length (None: streamed), keep_alive)
#   -> (headers kept, lines after them, chunked, remaining, keep_alive, no body)
MATRIX: list[tuple[tuple[str, int, bool, Headers, int | None, bool],
                   tuple[Headers, bytes, bool, int | None, bool, bool]]] = [
    # complete bodies: the length is the body's, whatever the Handler said
    (("GET", 200, False, X, 3, True),
     (X, b"Content-Length: 3\r\n" + DATE, False, None, True, False)),
    (("GET", 200, False, X + CL42 + HOP, 3, True),
     (X, b"Content-Length: 3\r\n" + DATE, False, None, True, False)),
    (("GET", 200, False, [], 0, True), ([], b"Content-Length: 0\r\n" + DATE, False, None,
                                        True, False)),
    # HEAD and 304 keep the length of the body they stand for (RFC 9110 §8.6)
    (("HEAD", 200, False, CL42, 0, True), (CL42, DATE, False, None, True, True)),
    (("HEAD", 200, False, X, 0, True), (X, b"Content-Length: 0\r\n" + DATE, False, None,
                                        True, True)),
    (("GET", 304, False, CL42 + HOP, 0, True), (CL42, DATE, False, None, True, True)),
    (("GET", 304, False, X, 0, True), (X, DATE, False, None, True, True)),
    # 204 never has a Content-Length (RFC 9110 §8.6)
    (("GET", 204, False, CL42 + X, 0, True), (X, DATE, False, None, True, True)),
    (("HEAD", 204, False, CL42, 0, True), ([], DATE, False, None, True, True)),
    # Date: added only when missing (RFC 9110 §6.6.1), under whatever spelling
    (("GET", 200, False, [(b"date", b"yesterday")], 1, True),
     ([(b"date", b"yesterday")], b"Content-Length: 1\r\n", False, None, True, False)),
    # the Connection line: keep-alive is announced to an HTTP/1.0 client only
    (("GET", 200, True, X, 1, True),
     (X, b"Content-Length: 1\r\n" + DATE + KEEP, False, None, True, False)),
    (("GET", 200, True, X, 1, False),
     (X, b"Content-Length: 1\r\n" + DATE + CLOSE, False, None, False, False)),
    (("GET", 200, False, X, 1, False),
     (X, b"Content-Length: 1\r\n" + DATE + CLOSE, False, None, False, False)),
    # streamed bodies: the Handler's Content-Length, else chunked, else close-delimited
    (("GET", 200, False, X + CL42, None, True),
     (X + CL42, DATE, False, 42, True, False)),
    (("GET", 200, True, CL42, None, True), (CL42, DATE + KEEP, False, 42, True, False)),
    (("GET", 200, False, X + HOP, None, True),
     (X, CHUNKED + DATE, True, None, True, False)),
    (("GET", 200, True, X + HOP, None, True),
     (X, DATE + CLOSE, False, None, False, False)),
    # codings other than chunked are still announced, chunked last (RFC 9112 §6.1)...
    (("GET", 200, False, [(b"Transfer-Encoding", b"gzip")], None, True),
     ([], b"Transfer-Encoding: gzip, chunked\r\n" + DATE, True, None, True, False)),
    (("GET", 200, False, [(b"transfer-encoding", b"GZIP, Chunked")], None, True),
     ([], b"Transfer-Encoding: gzip, chunked\r\n" + DATE, True, None, True, False)),
    # ...but not to HTTP/1.0 (no transfer codings there), nor beside a length
    (("GET", 200, True, [(b"Transfer-Encoding", b"gzip")], None, True),
     ([], DATE + CLOSE, False, None, False, False)),
    (("GET", 200, False, CL42 + [(b"Transfer-Encoding", b"gzip")], None, True),
     (CL42, DATE, False, 42, True, False)),
    # streamed, no body by rule: the length stays, nothing is counted or chunked
    (("HEAD", 200, False, CL42, None, True), (CL42, DATE, False, None, True, True)),
    (("HEAD", 200, False, X + HOP, None, True), (X, DATE, False, None, True, True)),
    (("HEAD", 200, True, X, None, True), (X, DATE + KEEP, False, None, True, True)),
    (("GET", 304, False, CL42, None, True), (CL42, DATE, False, None, True, True)),
    (("GET", 304, True, [], None, True), ([], DATE + KEEP, False, None, True, True)),
    (("GET", 204, False, CL42 + X, None, True), (X, DATE, False, None, True, True)),
    (("GET", 204, False, [(b"Transfer-Encoding", b"gzip")], None, True),
     ([], DATE, False, None, True, True)),
    # 1xx: no framing, no Date, no Connection line; keep-alive is left as it was
    (("GET", 103, False, [(b"Link", b"</s>")] + CL42 + HOP, None, True),
     ([(b"Link", b"</s>")], b"", False, None, True, True)),
    (("POST", 102, False, [], None, False), ([], b"", False, None, False, True)),
]


@pytest.mark.parametrize("given, expected", MATRIX)
def test_response_framing(given: tuple[str, int, bool, Headers, int | None, bool],
                          expected: tuple[Headers, bytes, bool, int | None, bool, bool]
                          ) -> None:
    method, status, http10, headers, length, keep_alive = given
    assert outcome(response_framing(method, status, http10, headers, length, keep_alive,
                                    DATES)) == expected


@pytest.mark.parametrize("headers, lines", [
    ([], b"Connection: upgrade\r\nUpgrade: websocket\r\n"),
    ([(b"upgrade", b"WebSocket")] + CL42 + HOP, b"Connection: upgrade\r\n"),
])
def test_switching_protocols(headers: Headers, lines: bytes) -> None:
    framing = response_framing("GET", 101, False, headers, None, True, DATES, b"websocket")
    kept = [(n, v) for n, v in headers if n == b"upgrade"]
    assert outcome(framing) == (kept, lines, False, None, False, True)


def test_the_date_line_is_formatted_once_per_second() -> None:
    now = [1796126400.25]
    dates = DateLine(lambda: now[0])
    first = dates.line()
    now[0] += 0.5
    assert dates.line() is first == DATE
    now[0] += 1
    assert dates.line() == b"Date: Tue, 01 Dec 2026 12:00:01 GMT\r\n"


def test_headers_not_copied_when_nothing_is_dropped() -> None:
    headers = X + CL42
    assert response_framing("GET", 200, False, headers, None, True, DATES).headers is headers


@pytest.mark.parametrize("method, status, length", [
    ("GET", 200, None),  # the length decides a streamed body's framing
    ("HEAD", 200, 0),  # and is kept for HEAD
    ("GET", 304, 0),
])
def test_malformed_length_raises(method: str, status: int, length: int | None) -> None:
    with pytest.raises(ValueError):
        response_framing(method, status, False, [(b"Content-Length", b"4x")], length,
                         True, DATES)


@pytest.mark.parametrize("method, status, length", [
    ("GET", 200, 3),  # replaced by the body's own
    ("GET", 204, None),  # dropped
])
def test_malformed_length_ignored_where_dropped(method: str, status: int,
                                                length: int | None) -> None:
    framing = response_framing(method, status, False, [(b"Content-Length", b"4x")],
                               length, True, DATES)
    assert framing.headers == []


@pytest.mark.parametrize("method, length, line", [
    ("GET", None, b"Transfer-Encoding: chunked\r\n"),
    ("POST", None, b"Transfer-Encoding: chunked\r\n"),
    ("GET", 5, b"Content-Length: 5\r\n"),
    ("POST", 65536, b"Content-Length: 65536\r\n"),
    ("GET", 0, b""),
    ("HEAD", 0, b""),
    ("DELETE", 0, b""),
    ("OPTIONS", 0, b""),
    # methods that define a body announce an empty one (RFC 9110 §8.6)
    ("POST", 0, b"Content-Length: 0\r\n"),
    ("PUT", 0, b"Content-Length: 0\r\n"),
    ("PATCH", 0, b"Content-Length: 0\r\n"),
])
def test_request_framing(method: str, length: int | None, line: bytes) -> None:
    assert request_framing(method, length) == line


@pytest.mark.parametrize("headers, expected", [
    ([], None),
    (X, None),
    ([(b"content-length", b" 12 ")], 12),
    ([(b"Content-Length", b"0"), (b"Content-Length", b"7")], 0),  # the first one
])
def test_find_length(headers: Headers, expected: int | None) -> None:
    assert find_length(headers) == expected


@pytest.mark.parametrize("value, expected", [
    (b"0", 0), (b"13", 13), (b"007", 7), (b"65536", 65536),
    (b"9" * 18, 10**18 - 1), (b"9" * 19, 10**19 - 1), (b"1" * 40, int("1" * 40)),
    (b" 12\t", 12),
])
def test_content_length(value: bytes, expected: int) -> None:
    assert content_length(value) == expected


@pytest.mark.parametrize("value", [b"", b"-1", b"+1", b"1.0", b"0x10", b"1 2", b"1_0",
                                   b"\xd9\xa1", b"1" * 17 + b"/"])
def test_find_length_malformed(value: bytes) -> None:
    with pytest.raises(ValueError):
        content_length(value)
    with pytest.raises(ValueError):
        find_length([(b"Content-Length", value)])
    with pytest.raises(ValueError):
        without_framing([(b"Content-Length", value)], True)


@pytest.mark.parametrize("headers, keep_length, expected", [
    (X, False, (X, False, None, None)),
    (X, True, (X, False, None, None)),
    (X + CL42, True, (X + CL42, False, None, 42)),
    (X + CL42 + [(b"Content-Length", b"7")], True,
     (X + CL42 + [(b"Content-Length", b"7")], False, None, 42)),  # the first one counts
    (X + CL42, False, (X, False, None, None)),
    (HOP + [(b"Date", b"d")], False, ([(b"Date", b"d")], True, None, None)),
    (HOP + CL42, True, (CL42, False, None, 42)),
    ([(b"Transfer-Encoding", b"br, chunked")], False, ([], False, b"br", None)),
    ([(b"Transfer-Encoding", b"chunked")], False, ([], False, None, None)),
])
def test_without_framing(headers: Headers, keep_length: bool,
                         expected: tuple[Headers, bool, bytes | None, int | None]) -> None:
    assert without_framing(headers, keep_length) == expected


@pytest.mark.parametrize("value, codings", [
    (b"chunked", [b"chunked"]),
    (b", chunked", [b"chunked"]),  # RFC 9110 §5.6.1: empty elements are ignored
    (b"chunked,", [b"chunked"]),
    (b" , chunked ,\t", [b"chunked"]),
    (b"chunked\t", [b"chunked"]),  # optional whitespace: SP and HTAB only
    (b"\x0bchunked", [b"\x0bchunked"]),  # (a vertical tab is no whitespace here)
    (b"GZIP,chunked", [b"gzip", b"chunked"]),
    (b"", []),
    (b" , ", []),
])
def test_coding_list_reads_a_transfer_encoding_list(value: bytes, codings: list[bytes]
                                                    ) -> None:
    assert coding_list(value) == codings


@pytest.mark.parametrize("head_only, status, length, coded, kept", [
    (True, 200, 100, False, True),  # RFC 9110 §9.3.2: a HEAD answer's length is the GET's
    (True, 304, 100, False, True),
    (True, 200, None, True, False),  # a HEAD answer with a Transfer-Encoding
    (True, 204, 10, False, False),  # a 204 announces no body (RFC 9110 §8.6)
    (False, 204, 10, False, False),
    (False, 304, 10, False, False),
    (False, 304, None, True, False),
    (False, 304, 0, False, True),
    (False, 200, 100, False, True),
])
def test_which_bodiless_answers_keep_their_connection(head_only: bool, status: int,
                                                      length: int | None, coded: bool,
                                                      kept: bool) -> None:
    assert poolable(head_only, status, length, coded) is kept


# Transfer-Encoding values as a backend may send them (untrimmed).
CODINGS_SENT = [
    b"chunked", b"Chunked", b"CHUNKED", b" chunked", b"\tchunked", b"chunked ", b"chunked  ",
    b"gzip, chunked", b"gzip,chunked", b"gzip ,chunked", b"gzip,\tchunked",
    b"gzip;q=1, chunked", b", chunked", b"chunked,", b"chunked ,", b"chunked\t",
    b"chunked\t ", b"chunked \t ", b"gzip, chunked, ", b"chunked, gzip", b"xchunked",
    b"chunkedx", b"chunked;q=1", b"gzip", b"identity",
]


def llhttp_reads_chunked(sent: bytes) -> bool:
    """Whether llhttp itself ends a response with this Transfer-Encoding at its last
    chunk (else it waits for the connection to close)."""
    ended = []
    parser = httptools.HttpResponseParser(
        type("Ends", (), {"on_message_complete": lambda self: ended.append(True)})())
    parser.feed_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + sent
                     + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    return bool(ended)


@pytest.mark.parametrize("sent", CODINGS_SENT)
def test_parser_frames_chunked_agrees_with_llhttp(sent: bytes) -> None:
    assert parser_frames_chunked(sent) is llhttp_reads_chunked(sent)


@pytest.mark.parametrize("sent", [b"chunked,", b"chunked ,", b"chunked\t", b"chunked\t ",
                                  b"gzip, chunked, "])
def test_llhttp_leaves_list_spellings_of_chunked_unframed(sent: bytes) -> None:
    """The cases the upstream reader refuses: chunked by the list rules, not to llhttp."""
    assert transfer_codings(sent.strip(b" \t"))[1]
    assert not parser_frames_chunked(sent)
