"""Message heads (proxy.wire.head): the Python join is the reference; the C join built
with the compiled hot path (proxy/wire/_headjoin.c) must give the same bytes and refuse
the same heads."""

from __future__ import annotations

import pytest

from proxy.request import Headers
from proxy.wire import head
from proxy.wire.head import join_head, render_head

GET = b"GET / HTTP/1.1\r\n"

# (first line, headers, extra) -> the head, or None for a ValueError (a LF where a field
# line would be split).
CASES: dict[str, tuple[bytes, Headers, bytes, bytes | None]] = {
    "no-fields": (GET, [], b"", GET + b"\r\n"),
    "fields": (GET, [(b"Host", b"a"), (b"X", b"")], b"",
               GET + b"Host: a\r\nX: \r\n\r\n"),
    "extra-lines": (b"HTTP/1.1 200 OK\r\n", [(b"A", b"1")],
                    b"Content-Length: 0\r\nConnection: close\r\n",
                    b"HTTP/1.1 200 OK\r\nA: 1\r\nContent-Length: 0\r\nConnection: close"
                    b"\r\n\r\n"),
    "last-chunk": (b"0\r\n", [(b"Grpc-Status", b"0")], b"",
                   b"0\r\nGrpc-Status: 0\r\n\r\n"),
    "bare-cr-kept": (GET, [(b"X", b"a\rb")], b"", GET + b"X: a\rb\r\n\r\n"),
    "long": (GET, [(b"N%d" % i, b"v" * i) for i in range(200)], b"",
             GET + b"".join(b"N%d: %s\r\n" % (i, b"v" * i) for i in range(200)) + b"\r\n"),
    "lf-in-value": (GET, [(b"X", b"a\nY: b")], b"", None),
    "crlf-in-value": (GET, [(b"X", b"a\r\nY: b")], b"", None),
    "lf-in-name": (GET, [(b"X\nY", b"a")], b"", None),
    "lf-at-the-end": (GET, [(b"A", b"1"), (b"X", b"a\n")], b"", None),
    "lf-in-first-line": (b"GET /\n HTTP/1.1\r\n", [], b"", None),
}
JOINS = {"python": join_head}
if head._JOIN is not None:  # (the compiled build)
    JOINS["c"] = head._JOIN


@pytest.mark.parametrize("join", JOINS)
@pytest.mark.parametrize("case", CASES)
def test_joins_agree_on_every_head(join: str, case: str) -> None:
    first, headers, extra, expected = CASES[case]
    if expected is None:
        with pytest.raises(ValueError, match="contains LF"):
            JOINS[join](first, headers, extra)
        with pytest.raises(ValueError):
            render_head(first, headers, extra)
    else:
        assert JOINS[join](first, headers, extra) == expected
        assert render_head(first, headers, extra) == expected


@pytest.mark.skipif(head._JOIN is None, reason="the C join is built with the compiled hot path")
def test_the_c_join_declines_what_is_not_exactly_bytes_pairs() -> None:
    join = head._JOIN
    assert join is not None

    class Named(bytes):
        pass

    for first, headers, extra in [
        (bytearray(GET), [], b""),
        (GET, [(b"A", bytearray(b"1"))], b""),
        (GET, [(Named(b"A"), b"1")], b""),
        (GET, [(b"A", b"1", b"2")], b""),
        (GET, [[b"A", b"1"]], b""),
        (GET, (), b""),
        (GET, [], memoryview(b"X: 1\r\n")),
    ]:
        assert join(first, headers, extra) is None  # type: ignore[arg-type]
