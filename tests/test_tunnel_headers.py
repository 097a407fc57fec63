"""The cf-cloudflared-response-headers blob codec and control filter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tunnel import headers as blob

WORKED_HEADERS = [
    ("Content-Type", "text/plain; charset=utf-8"),
    ("Set-Cookie", "a=1"),
    ("Set-Cookie", "b=2"),
    ("K-Network-Hash", "ep-abc"),
]
WORKED_BLOB = (
    "Q29udGVudC1UeXBl:dGV4dC9wbGFpbjsgY2hhcnNldD11dGYtOA;U2V0LUNvb2tpZQ:YT0x;"
    "U2V0LUNvb2tpZQ:Yj0y;Sy1OZXR3b3JrLUhhc2g:ZXAtYWJj"
)


def test_worked_example_encodes_byte_for_byte() -> None:
    assert blob.encode(WORKED_HEADERS) == WORKED_BLOB


def test_worked_example_decodes_in_order() -> None:
    assert blob.decode(WORKED_BLOB) == WORKED_HEADERS


def test_bytes_and_str_encode_alike() -> None:
    as_bytes = [(n.encode(), v.encode()) for n, v in WORKED_HEADERS]
    assert blob.encode(as_bytes) == WORKED_BLOB
    assert blob.decode_bytes(WORKED_BLOB) == as_bytes


def test_non_utf8_bytes_survive_decode_bytes() -> None:
    pairs = [(b"X-Raw", b"\xff\x00\x80")]
    assert blob.decode_bytes(blob.encode(pairs)) == pairs
    with pytest.raises(blob.BlobError):
        blob.decode(blob.encode(pairs))


def test_empty_parts_are_skipped() -> None:
    assert blob.decode(";;" + WORKED_BLOB.replace(";", ";;") + ";") == WORKED_HEADERS
    assert blob.decode("") == []


def test_empty_name_and_value_round_trip() -> None:
    assert blob.encode([("", "")]) == ":"
    assert blob.decode(":") == [("", "")]


@given(st.lists(st.tuples(st.text(), st.text()), max_size=8))
def test_round_trip_text(pairs: list[tuple[str, str]]) -> None:
    assert blob.decode(blob.encode(pairs)) == pairs


@given(st.lists(st.tuples(st.binary(), st.binary()), max_size=8))
def test_round_trip_bytes(pairs: list[tuple[bytes, bytes]]) -> None:
    encoded = blob.encode(pairs)
    assert "=" not in encoded
    assert blob.decode_bytes(encoded) == pairs


@pytest.mark.parametrize(
    "bad",
    [
        "YQ==:Yg",  # padding is not RawStdEncoding
        "YQ:Yg==",
        "YQ",  # no ':'
        "YQ:Yg:Yw",  # two ':'
        "YQ:Yg;YQ",  # a later part without ':'
        "Y*:Yg",  # outside the standard alphabet
        "YQ-_:Yg",  # URL-safe alphabet is not standard
        "Y Q:Yg",
        "Q:Yg",  # length 1 mod 4 is never produced
        "YQ:Ygh8i",
    ],
)
def test_malformed_blobs_are_rejected(bad: str) -> None:
    with pytest.raises(blob.BlobError):
        blob.decode_bytes(bad)


@pytest.mark.parametrize(
    "name",
    [":status", "cf-int-foo", "CF-Int-Foo", "cf-cloudflared-response-meta",
     "Cf-Cloudflared-Anything", "cf-proxy-src", "CF-PROXY-X", b"cf-int-x"],
)
def test_control_headers_are_recognised(name: str | bytes) -> None:
    assert blob.is_control_header(name)


@pytest.mark.parametrize(
    "name",
    ["content-type", "cf-ray", "cf-connecting-ip", "cf-cache-status", "x-cf-int-x",
     "cfint-x", "Sec-WebSocket-Accept", "Connection", "Upgrade", b"set-cookie"],
)
def test_user_headers_are_kept(name: str | bytes) -> None:
    assert not blob.is_control_header(name)


def test_user_headers_filters_and_keeps_order() -> None:
    headers = [("A", "1"), ("Cf-Int-X", "x"), ("B", "2"), (":path", "/"), ("A", "3")]
    assert blob.user_headers(headers) == [("A", "1"), ("B", "2"), ("A", "3")]
