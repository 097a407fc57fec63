"""The questions asked of a read that holds a large message (proxy.wire.scan): the
Python functions are the reference; the C ones built with the compiled hot path
(proxy/wire/_scan.c) must give the same answers, and ``sole_view`` may say True only
when no other holder of the store's bytes is alive."""

from __future__ import annotations

import ctypes
from typing import Callable

import pytest

from proxy.wire import scan

FINDS: dict[str, Callable[[bytes | bytearray, int], int]] = {
    "python": scan.find_blank_line}
VIEWS: dict[str, Callable[[memoryview], bool]] = {}
if scan._C is not None:  # (the compiled build)
    FINDS["c"] = scan.FIND_BLANK_LINE
    VIEWS["c"] = scan.SOLE_VIEW


@pytest.mark.parametrize("find", FINDS)
@pytest.mark.parametrize("data, size, expected", [
    (b"", 0, -1),
    (b"\r\n\r\n", 4, 0),
    (b"\r\n\r\n", 3, -1),  # the blank line must lie within size
    (b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody", 29, 21),
    (b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody", 25, 21),
    (b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody", 24, -1),
    (b"\r\r\n\r\n", 5, 1),  # a CR before the blank line
    (b"\r\n\r\r\n\r\n", 7, 3),
    (b"\n\n\r\n\n", 5, -1),  # bare LFs are no blank line here (llhttp judges those)
    (b"a\r\n\r\nb\r\n\r\n", 11, 1),  # the first one
    (b"abc\r\n\r\n", 100, 3),  # a size past the end is the end
    (b"\r\n\r\n", -1, -1),  # a negative size finds nothing
    (b"x" * 70_000 + b"\r\n\r\n", 70_004, 70_000),
    (b"\r" * 10_000, 10_000, -1),
])
def test_the_first_blank_line_within_size_is_found(find: str, data: bytes, size: int,
                                                   expected: int) -> None:
    assert FINDS[find](data, size) == expected
    assert FINDS[find](bytearray(data), size) == expected


@pytest.mark.parametrize("find", FINDS)
def test_a_blank_line_is_looked_for_in_bytes_only(find: str) -> None:
    with pytest.raises((TypeError, AttributeError)):
        FINDS[find]("\r\n\r\n", 4)  # type: ignore[arg-type]


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
