"""The questions asked of a read (proxy.wire.scan): the Python functions are the
reference; the C ones built with the compiled hot path (proxy/wire/_scan.c) must give
the same answers; ``split_response_head`` must agree with llhttp on every head llhttp
accepts; and ``sole_view`` may say True only when no other holder of the store's bytes
is alive."""

from __future__ import annotations

import ctypes
import random
from typing import Callable

import httptools
import pytest

from proxy.request import Headers
from proxy.wire import scan
from proxy.wire.framing import trimmed

Split = Callable[[bytes | bytearray, int, int, int], tuple[int, bytes, Headers] | None]

VIEWS: dict[str, Callable[[memoryview], bool]] = {}
SPLITS: dict[str, Split] = {"python": scan.split_response_head}
if scan._C is not None:  # (the compiled build)
    VIEWS["c"] = scan.SOLE_VIEW
    SPLITS["c"] = scan.SPLIT_RESPONSE_HEAD


def test_python_never_claims_a_sole_view() -> None:
    store = bytearray(16)
    assert scan.sole_view(memoryview(store)) is False


@pytest.mark.parametrize("sole", VIEWS)
def test_a_view_is_sole_only_while_nothing_else_holds_its_bytearray(sole: str) -> None:
    check = VIEWS[sole]
    store = bytearray(64)
    view = memoryview(store)
    assert check(view) is True
    piece = view[2:10]  # a slice, as a read's body piece lent to a transport
    assert check(view) is False
    inner = piece[1:3]
    del piece
    assert check(view) is False  # a slice of the slice still holds the bytes
    del inner
    assert check(view) is True
    other = memoryview(store)  # a second view made from the bytearray itself
    assert check(view) is False
    other.release()
    assert check(view) is True
    taken = (ctypes.c_char * 8).from_buffer(view)  # a buffer taken from the view
    assert check(view) is False
    del taken
    assert check(view) is True
    copy_out = bytes(view[:4])  # a copy holds nothing
    assert check(view) is True and copy_out == bytes(4)
    view.release()
    assert check(view) is False  # a released view views nothing


@pytest.mark.parametrize("sole", VIEWS)
def test_views_of_other_objects_are_never_sole(sole: str) -> None:
    check = VIEWS[sole]
    assert check(memoryview(b"immutable")) is False
    store = bytearray(8)
    sliced = memoryview(store)[2:]  # the slice is alive, its parent view is not
    assert check(sliced) is True  # it alone holds the store: the store is free to it
    with pytest.raises(TypeError):
        check(store)  # type: ignore[arg-type]


# ------------------------------------------------------------- split_response_head

HEAD = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Length: 2\r\n\r\nok"
PLAIN = (len(HEAD) - 2, b"OK", [(b"Server", b"nginx"), (b"Content-Length", b"2")])


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("data, size, expected", [
    (HEAD, len(HEAD), PLAIN),
    (HEAD, len(HEAD) - 2, PLAIN),  # the body need not be there
    (HEAD, len(HEAD) - 3, None),  # the head must be: one byte short
    (HEAD, 100, PLAIN),  # a size past the end is the end
    (b"HTTP/1.1 204\r\n\r\n", 16, (16, b"", [])),  # no reason, no fields
    (b"HTTP/1.1 200 \r\n\r\n", 17, (17, b"", [])),
    (b"HTTP/1.0 200 OK\r\n\r\n", 100, None),  # other versions: llhttp's, read per head
    (b"HTTP/2.0 200 OK\r\n\r\n", 100, None),
    (b"HTTP/1.1 404 Not  Found \r\n\r\n", 29, (28, b"Not  Found ", [])),
    (b"HTTP/1.1 200 OK\r\nA:b:c\r\nB:\t x \t\r\nC:\r\n\r\n", 100,
     (39, b"OK", [(b"A", b"b:c"), (b"B", b"x"), (b"C", b"")])),
    (b"HTTP/1.1 200 OK\r\nX: a\xffb\r\n\r\n", 100, (27, b"OK", [(b"X", b"a\xffb")])),
    (b"HTTP/1.1 100 Continue\r\n\r\n", 100, None),  # interim heads: llhttp's
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", 100, None),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 100, None),
    (b"HTTP/1.1 200 OK\r\ntransfer-ENCODING: gzip\r\n\r\n", 100, None),
    (b"HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n", 100, None),  # folded
    (b"HTTP/1.1 200 OK\r\nA: b\r\n\tc\r\n\r\n", 100, None),
    (b"HTTP/1.1 200 OK\r\nA : b\r\n\r\n", 100, None),  # not a token before ':'
    (b"HTTP/1.1 200 OK\r\n: b\r\n\r\n", 100, None),  # no name
    (b"HTTP/1.1 200 OK\r\nA\r\n\r\n", 100, None),  # no colon
    (b"HTTP/1.1 200 OK\r\nA: b\rc\r\n\r\n", 100, None),  # a CR without LF
    (b"HTTP/1.1 200 O\rK\r\n\r\n", 100, None),
    (b"HTTP/1.1 200 OK\r\n\r\x00", 100, None),
    (b"\r\nHTTP/1.1 200 OK\r\n\r\n", 100, None),  # llhttp skips a CR LF first
    (b"HTTP/1.1 2000 OK\r\n\r\n", 100, None),
    (b"HTTP/1.1 20 OK\r\n\r\n", 100, None),
    (b"HTTP/1.1  200 OK\r\n\r\n", 100, None),
    (b"HTTP/1.10 200 OK\r\n\r\n", 100, None),
    (b"HTTP/1.1 200OK\r\n\r\n", 100, None),
    (b"http/1.1 200 OK\r\n\r\n", 100, None),
    (b"", 0, None),
    (b"HTTP/1.1 200 OK", 15, None),
])
def test_plain_heads_are_split_and_others_left_to_llhttp(
        split: str, data: bytes, size: int,
        expected: tuple[int, bytes, Headers] | None) -> None:
    assert SPLITS[split](data, size, 100, 8192) == expected
    assert SPLITS[split](bytearray(data), size, 100, 8192) == expected


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("max_fields, max_bytes, split_it", [
    (2, 8192, True), (1, 8192, False),  # two fields: a limit of one is passed
    (100, 26, True), (100, 25, False),  # 6 + 5 + 14 + 1 bytes of names and values
    (10_000, 10_000, True),
])
def test_a_head_over_the_limits_is_left_to_llhttp(split: str, max_fields: int,
                                                  max_bytes: int, split_it: bool) -> None:
    assert (SPLITS[split](HEAD, len(HEAD), max_fields, max_bytes) is not None) == split_it


@pytest.mark.parametrize("split", SPLITS)
def test_no_more_than_64_fields_are_split(split: str) -> None:
    def head(fields: int) -> bytes:
        return b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * fields + b"\r\n"
    assert len(SPLITS[split](head(64), 10_000, 100, 8192)[2]) == 64  # type: ignore[index]
    assert SPLITS[split](head(65), 10_000, 100, 8192) is None


class _Fields:
    """What llhttp reports of a response head (the full reader's way: values trimmed)."""

    def __init__(self) -> None:
        self.fields: Headers = []
        self.reason = b""
        self.complete = False

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, trimmed(value)))

    def on_headers_complete(self) -> None:
        self.complete = True


def _llhttp(data: bytes) -> _Fields | None:
    """llhttp's report of the head at the start of ``data``; None if it rejects it or
    the head is not complete within ``data``."""
    seen = _Fields()
    try:
        httptools.HttpResponseParser(seen).feed_data(data)
    except httptools.HttpParserError:
        return None
    return seen if seen.complete else None


# Pieces a head is made of: plain ones, and each way a head can differ from plain.
_LINES = [b"Server: nginx", b"Content-Length: 5", b"X-A:  b c  ", b"X-B:", b"X-C:\tv\t",
          b"Date: Tue, 01 Dec 2026 10:00:00 GMT", b"Connection: keep-alive", b"ETag: \"x\"",
          b"Transfer-Encoding: chunked", b" folded", b"\tfolded", b"X-D : v", b"X-E",
          b": v", b"X-F: a\rb", b"X-G: a\nb", b"X-H: a\x00b", b"X-I: \xff\x80",
          b"X(J): v", b"Content-Length: 5", b"X-K: v\x7f", b""]
_STATUS = [b"HTTP/1.1 200 OK", b"HTTP/1.1 204", b"HTTP/1.0 304 Not Modified",
           b"HTTP/1.1 500 \x01odd", b"HTTP/1.1 103 Early Hints", b"HTTP/1.1 200  two",
           b"HTTP/2.0 200 OK", b"HTTP/1.1 099 OK", b"HTTP/1.1 200 O\nK"]
_ENDS = [b"\r\n", b"\n", b"\r", b"\r\r\n"]


@pytest.mark.parametrize("split", SPLITS)
def test_a_split_head_is_the_head_llhttp_reads(split: str) -> None:
    """Seeded random heads, a few thousand: whenever the head is split and llhttp
    accepts it, llhttp ends it at the same byte and reports the same fields and reason;
    and the Python reference and the C function always agree."""
    shuffle = random.Random(12)
    agreed = 0
    for _ in range(4_000):
        lines = [shuffle.choice(_STATUS)] + [
            shuffle.choice(_LINES) for _ in range(shuffle.randrange(6))]
        head = b"".join(line + (shuffle.choice(_ENDS) if shuffle.random() < 0.1
                                else b"\r\n") for line in lines) + b"\r\n" + b"hello"
        got = SPLITS[split](head, len(head), 100, 8192)
        assert got == scan.split_response_head(head, len(head), 100, 8192), head
        if got is None:
            continue
        end, reason, fields = got
        seen = _llhttp(head[:end])
        if seen is None:
            continue  # llhttp rejects what was split: the answer becomes a 502
        assert _llhttp(head[:end - 1]) is None, head  # not complete a byte earlier
        assert (seen.reason, seen.fields) == (reason, fields), head
        agreed += 1
    assert agreed > 300  # (the table above does not only make broken heads)
