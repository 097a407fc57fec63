"""The wire between the entrances and the backends, over real sockets (issue 39,
items 13-20): the request target goes upstream as it came, a backend that never
answers gets a default deadline, connections over the limit are told why, HEAD answers
keep their backend connection, the hop-by-hop expectations (Expect, TE) are this hop's,
framing follows the list and whitespace rules of RFC 9110/9112, and every answer made
while a request is still arriving closes by draining, never with a reset.

Each test runs a real backend (tests.helpers) behind a tunnelgate built from real CLI
flags (tests.stack), or an entrance alone where only the client side is at stake.
"""

from __future__ import annotations

import pytest

from tests.helpers import RawClient, TestBackend, on_uvloop
from tests.test_backend_faults import proxied
from tests.test_entrance_equivalence import Case, outcome, world

# ------------------------------------------------------- 13: the target, byte for byte

TARGETS = [
    # (sent by the client, what the backend must see)
    ("/?", "/?"),
    ("/items?", "/items?"),
    ("/items?a=", "/items?a="),
    ("/items?a=1&b", "/items?a=1&b"),
    ("/items", "/items"),
    ("/full/x?", "/fixed?"),  # a filter rewrote the path; the bare "?" stays
    ("/full/x", "/fixed"),
]


@pytest.mark.parametrize("target, upstream", TARGETS)
@on_uvloop
async def test_the_target_goes_upstream_as_it_came(target: str, upstream: str) -> None:
    """Through the Bridge, the tunnel entrance and the cluster entrance alike: an
    empty query is not a missing one (RFC 3986 §6.2.3), and only a filter changes
    the target."""
    async with world() as (stack, backend):
        for entrance in ("bridge", "tunnel", "cluster"):
            seen = (await outcome(stack, backend, entrance, Case("GET", target))).seen
            assert seen is not None and seen.target == upstream, entrance


# ------------------------------------------------- 16: HEAD keeps its backend connection


@pytest.mark.parametrize("target", ["/fixed?size=100", "/fixed?size=0", "/echo"])
@on_uvloop
async def test_head_answers_with_a_length_keep_their_backend_connection(target: str
                                                                        ) -> None:
    """RFC 9110 §9.3.2: a HEAD answer's Content-Length is the GET's, and no body
    follows; five HEADs and a GET after them take one backend connection."""
    async with TestBackend() as backend, proxied(backend) as port:
        client = await RawClient.connect(port)
        for _ in range(5):
            client.send(f"HEAD {target} HTTP/1.1\r\nHost: app.test\r\n\r\n".encode())
            response = await client.read_response(head=True)
            assert response.status == 200 and response.header(b"content-length")
        client.send(b"GET /fixed?size=3 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        assert (await client.read_response()).body == b"xxx"
        client.close()
        assert backend.connections == 1
        assert [seen.method for seen in backend.requests] == ["HEAD"] * 5 + ["GET"]


# ------------------------------------------------ 17, 18: this hop's Expect and TE

EXPECTING = [
    # (request line version, Expect value, does the client get a 100 first?)
    ("HTTP/1.1", "100-continue", True),
    ("HTTP/1.1", "100-Continue", True),
    ("HTTP/1.0", "100-continue", False),  # RFC 9110 §10.1.1: ignored from 1.0
]


@pytest.mark.parametrize("version, expect, interim", EXPECTING)
@on_uvloop
async def test_an_expectation_met_here_is_not_forwarded(version: str, expect: str,
                                                       interim: bool) -> None:
    """The entrance answers ``100 Continue`` itself: the backend gets the body with no
    Expect field asking it again."""
    async with TestBackend() as backend, proxied(backend) as port:
        client = await RawClient.connect(port)
        client.send(f"POST /echo {version}\r\nHost: app.test\r\nExpect: {expect}\r\n"
                    "Content-Length: 5\r\n\r\n".encode())
        if interim:
            assert (await client.read_response()).status == 100
        client.send(b"hello")
        response = await client.read_response()
        client.close()
    assert response.status == 200 and response.json()["body"] == "hello"
    (seen,) = backend.requests
    assert seen.header(b"expect") is None and seen.body == b"hello"


def _connection_tokens(headers: list[tuple[bytes, ...]]) -> set[bytes]:
    return {token.strip().lower() for name, value in headers
            if name.lower() == b"connection" for token in value.split(b",")}


TE_CASES = [
    # (the client's TE, the TE the backend must get)
    ("trailers", b"trailers"),
    ("Trailers", b"trailers"),
    ("gzip, trailers;q=1", b"trailers"),
    ("deflate", None),  # a transfer coding other than trailers never goes on
    ("gzip;q=0.5, chunked", None),
    ("xtrailers", None),  # not the token trailers
]


@pytest.mark.parametrize("te, upstream", TE_CASES)
@on_uvloop
async def test_te_goes_upstream_only_as_trailers_and_named_in_connection(
        te: str, upstream: bytes | None) -> None:
    """RFC 9110 §10.1.4 / §7.6.1: TE is hop-by-hop, and a sender of it lists it in
    Connection."""
    async with TestBackend() as backend, proxied(backend) as port:
        client = await RawClient.connect(port)
        client.send(f"GET /echo HTTP/1.1\r\nHost: app.test\r\nTE: {te}\r\n"
                    "Connection: TE\r\n\r\n".encode())
        assert (await client.read_response()).status == 200
        client.close()
    (seen,) = backend.requests
    assert [v for n, v in seen.headers if n.lower() == b"te"] == (
        [upstream] if upstream else [])
    assert (b"te" in _connection_tokens(seen.headers)) is (upstream is not None)
