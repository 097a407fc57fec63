"""The HTTP/2 request header block check (proxy.entrances.h2fields), as a table, and
against the h2 library's own checker (turned off in the entrance) on the same blocks;
and how queued response bytes are cut into DATA frames."""

from __future__ import annotations

from collections import deque

import h2.exceptions
import h2.utilities
import pytest

from proxy.entrances.h2fields import read_head, read_trailers
from proxy.entrances.h2stream import take_bytes
from proxy.wire.request import Rejection

BASE = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"a.test"),
        (b":path", b"/p?q=1")]

CASES = [  # (name, fields, status the entrance answers; None: served)
    ("plain", BASE + [(b"accept", b"*/*")], None),
    ("empty value", BASE + [(b"x-empty", b"")], None),
    ("te trailers", BASE + [(b"te", b"trailers")], None),
    ("host equal to authority", BASE + [(b"host", b"a.test")], None),
    ("upper-case name", BASE + [(b"Accept", b"*/*")], 400),
    ("space in name", BASE + [(b"x y", b"1")], 400),
    ("colon in name", BASE + [(b"x:y", b"1")], 400),
    ("non-ASCII name", BASE + [(b"x\xff", b"1")], 400),
    ("empty name", BASE + [(b"", b"1")], 400),
    ("CR in value", BASE + [(b"x", b"a\rb")], 400),
    ("LF in value", BASE + [(b"x", b"a\nb")], 400),
    ("NUL in value", BASE + [(b"x", b"a\x00b")], 400),
    ("leading space", BASE + [(b"x", b" a")], 400),
    ("trailing tab", BASE + [(b"x", b"a\t")], 400),
    ("connection", BASE + [(b"connection", b"close")], 400),
    ("transfer-encoding", BASE + [(b"transfer-encoding", b"chunked")], 400),
    ("upgrade", BASE + [(b"upgrade", b"websocket")], 400),
    ("keep-alive", BASE + [(b"keep-alive", b"5")], 400),
    ("te gzip", BASE + [(b"te", b"gzip")], 400),
    ("pseudo after regular", BASE[:3] + [(b"x", b"1"), BASE[3]], 400),
    ("unknown pseudo", BASE + [(b":status", b"200")], 400),
    ("repeated pseudo", BASE + [(b":path", b"/other")], 400),
    ("no path", BASE[:3], 400),
    ("empty path", BASE[:3] + [(b":path", b"")], 400),
    ("no method", BASE[1:], 400),
    ("host differs", BASE + [(b"host", b"b.test")], 400),
]
OURS_ONLY = [("bad length", BASE + [(b"content-length", b"x1")], 400),
             ("two lengths", BASE + [(b"content-length", b"1"), (b"content-length", b"1")],
              400),
             ("CONNECT", [(b":method", b"CONNECT"), (b":authority", b"a.test:443")], 501)]


@pytest.mark.parametrize("name,fields,status", CASES + OURS_ONLY,
                         ids=[c[0] for c in CASES + OURS_ONLY])
def test_request_blocks(name: str, fields: list, status: int | None) -> None:
    if status is None:
        head = read_head(fields, 100)
        assert head.method == b"GET" and head.path == b"/p?q=1"
        assert head.authority == b"a.test"
    else:
        with pytest.raises(Rejection) as refused:
            read_head(fields, 100)
        assert refused.value.status == status


@pytest.mark.parametrize("name,fields,status", CASES, ids=[c[0] for c in CASES])
def test_h2_agrees(name: str, fields: list, status: int | None) -> None:
    flags = h2.utilities.HeaderValidationFlags(
        is_client=False, is_trailer=False, is_response_header=False, is_push_promise=False)
    if status is None:
        list(h2.utilities.validate_headers(fields, flags))
    else:
        with pytest.raises(h2.exceptions.ProtocolError):
            list(h2.utilities.validate_headers(fields, flags))


def test_cookies_are_joined_and_counted_fields_are_limited() -> None:
    head = read_head(BASE + [(b"cookie", b"a=1"), (b"x", b"y"), (b"cookie", b"b=2")], 100)
    assert head.headers == [(b"x", b"y"), (b"cookie", b"a=1; b=2")]
    with pytest.raises(Rejection) as refused:
        read_head(BASE + [(b"x-%d" % i, b"v") for i in range(101)], 100)
    assert refused.value.status == 431


def test_trailers() -> None:
    assert read_trailers([(b"grpc-status", b"0")]) == [(b"grpc-status", b"0")]
    for bad in ([(b":path", b"/")], [(b"x", b"a\r\nb")], [(b"Upper", b"1")]):
        with pytest.raises(Rejection):
            read_trailers(bad)


@pytest.mark.parametrize("sizes,room,frames", [
    ([65536], 16384, [16384] * 4),
    ([5000, 20000, 40536], 16384, [16384] * 4),  # reads of any size, full frames
    ([10, 20, 30], 16384, [60]),
    ([100], 40, [40, 40, 20]),
])
def test_queued_pieces_go_out_in_full_frames(sizes: list[int], room: int,
                                            frames: list[int]) -> None:
    pieces = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    queue: deque = deque(memoryview(p) if i % 2 else p for i, p in enumerate(pieces))
    taken = []
    while (piece := take_bytes(queue, room)) is not None:
        taken.append(bytes(piece))
    assert [len(t) for t in taken] == frames
    assert b"".join(taken) == b"".join(pieces)
