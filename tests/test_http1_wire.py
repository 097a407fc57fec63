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

import asyncio
import socket

import pytest

from proxy.control.settings import SettingsError
from proxy.request import Request, Responder
from tests.helpers import (
    HOST, READ_TIMEOUT, RawClient, TestBackend, on_uvloop, running_entrance)
from tests.stack import make_settings, running
from tests.test_backend_faults import proxied
from tests.test_e2e_filters import one
from tests.test_entrance_equivalence import Case, outcome, world
from tests.test_h2c import H2Backend, ask, h2c_config
from tests.test_websocket import scrape

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


# ---------------------------------------- 14: a default wait for the response head

WAIT = "300ms"  # the default wait in these tests (60 s unless configured)
WAITING = [
    # (backend path, the route's own timeout, the client's status, its body's size)
    ("/hang", None, 504, None),  # never answers: the default wait ends it
    ("/slow?delay=0.8", "3s", 200, None),  # the route's own timeout wins
    ("/chunked?size=5000&chunk=1000&delay=0.2", None, 200, 5000),  # started: not cut
]


@pytest.mark.parametrize("how", ["flag", "environment"])
@pytest.mark.parametrize("path, timeout, status, size", WAITING)
@on_uvloop
async def test_a_backend_that_never_answers_gets_a_default_deadline(
        path: str, timeout: str | None, status: int, size: int | None, how: str) -> None:
    """nginx answers 504 after 60 s without a byte from the backend; so does this
    proxy when the route sets no timeout of its own (``--response-header-timeout`` or
    ``PROXY_RESPONSE_HEADER_TIMEOUT``). It bounds only the wait for the head."""
    flags = ("--response-header-timeout", WAIT) if how == "flag" else ()
    environ = {"PROXY_RESPONSE_HEADER_TIMEOUT": WAIT} if how == "environment" else {}
    async with TestBackend() as backend:
        rule = {"backends": one(backend.url)}
        if timeout is not None:
            rule["timeouts"] = {"request": timeout}
        async with running("--listen", "127.0.0.1:0", *flags, environ=environ,
                           config={"version": 1, "rules": [rule]}) as stack:
            client = await RawClient.connect(stack.cluster_port)
            client.send(f"GET {path} HTTP/1.1\r\nHost: app.test\r\n\r\n".encode())
            response = await client.read_response()
            client.close()
    assert response.status == status
    if size is not None:
        assert len(response.body) == size


@on_uvloop
async def test_an_h2c_backend_that_never_answers_gets_the_default_deadline_too() -> None:
    async with H2Backend() as backend, running(
            "--listen", "127.0.0.1:0", "--response-header-timeout", WAIT,
            config=h2c_config(backend.url)) as stack:
        answer = await ask(stack.cluster_port, "/hang")
        after = await ask(stack.cluster_port, "/echo")  # (its connection lives on)
    assert (answer.status, after.status) == (504, 200)


@pytest.mark.parametrize("flag, environ, seconds", [
    ((), {}, 60.0),
    (("--response-header-timeout", "90s"), {}, 90.0),
    ((), {"PROXY_RESPONSE_HEADER_TIMEOUT": "1m30s"}, 90.0),
    (("--response-header-timeout", "5s"), {"PROXY_RESPONSE_HEADER_TIMEOUT": "7s"}, 5.0),
    (("--response-header-timeout", "0"), {}, 0.0),  # off
])
def test_the_default_wait_is_a_flag_and_a_variable(flag: tuple[str, ...],
                                                   environ: dict[str, str],
                                                   seconds: float) -> None:
    assert make_settings(*flag, environ=environ).response_header_timeout == seconds


@pytest.mark.parametrize("flag, environ, named", [
    (("--response-header-timeout", "soon"), {}, "--response-header-timeout"),
    (("--response-header-timeout=-1s",), {}, "--response-header-timeout"),
    ((), {"PROXY_RESPONSE_HEADER_TIMEOUT": "x"}, "PROXY_RESPONSE_HEADER_TIMEOUT"),
])
def test_a_bad_default_wait_names_its_setting(flag: tuple[str, ...],
                                              environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as caught:
        make_settings(*flag, environ=environ)
    assert caught.value.name == named


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


# ----------------------------------------- 15, 20: answers while a request is arriving


async def ok(request: Request, responder: Responder) -> None:
    responder.respond(200, [], b"ok")


def answered_then_drained(port: int, sent: bytes) -> tuple[bytes, str]:
    """A blocking client that sends ``sent``, reads the answer to the end (the server's
    FIN), then goes on sending the rest of its request (64 KiB) as a client that did
    not wait would, and half-closes. The answer's status line, and how that went:
    ``drained`` when the server read those bytes, else the error a reset gave (on the
    next send, once the reset came back)."""
    with socket.create_connection((HOST, port), timeout=READ_TIMEOUT) as sock:
        sock.sendall(sent)
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
        try:
            for _ in range(64):
                sock.sendall(b"x" * 1024)
            sock.shutdown(socket.SHUT_WR)
            sock.recv(1)
        except OSError as exc:  # BrokenPipeError, ConnectionResetError
            return answer.split(b"\r\n", 1)[0], type(exc).__name__
        return answer.split(b"\r\n", 1)[0], "drained"


ARRIVING = [
    # (case, bytes sent, the answer's status)
    ("malformed field", b"GET / HTTP/1.1\r\nHost: h\r\nX Y: 1\r\n\r\n", 400),
    ("too many fields", b"GET / HTTP/1.1\r\n" + b"".join(
        b"X-%d: 1\r\n" % i for i in range(300)) + b"\r\n", 431),
    ("request line too long", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n", 414),
    ("method not served", b"BREW / HTTP/1.1\r\nHost: h\r\n\r\n", 501),
    ("HTTP/2.0 request line", b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505),
    ("bad chunk mid-body", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked"
     b"\r\n\r\nzz\r\n", 400),
    ("head not in time", b"GET / HTTP/1.1\r\nHost: h\r\nX-Slow:", 408),
]


@pytest.mark.parametrize("sent, status", [case[1:] for case in ARRIVING],
                         ids=[case[0] for case in ARRIVING])
@on_uvloop
async def test_answers_made_while_a_request_arrives_close_by_draining(
        sent: bytes, status: int) -> None:
    """RFC 9112 §9.6: closing with unread input resets the connection, and a reset can
    destroy the answer before the client read it. The answer is followed by a FIN,
    the client's further bytes are read and dropped, and the socket closes on its
    EOF."""
    async with running_entrance(ok, header_timeout=0.2) as port:
        line, ending = await asyncio.to_thread(answered_then_drained, port, sent)
    assert (int(line.split(b" ")[1]), ending) == (status, "drained")


@on_uvloop
async def test_a_connection_past_the_limit_is_answered_503_and_counted() -> None:
    """At ``max_connections`` a new client gets a 503 with ``Connection: close``,
    written before its request is read, then the same lingering close; the refusal is
    counted. A connection freed lets the next one in, while the refused ones still
    linger."""
    refused: list[str] = []
    async with running_entrance(ok, max_connections=2, refused=refused.append) as port:
        held = [await RawClient.connect(port) for _ in range(2)]
        for client in held:  # (both accepted and counted before the third comes)
            client.send(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            assert (await client.read_response()).status == 200
        line, ending = await asyncio.to_thread(
            answered_then_drained, port, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert (line, ending) == (b"HTTP/1.1 503 Service Unavailable", "drained")
        third = await RawClient.connect(port)  # sends nothing: answered all the same
        response = await third.read_response()
        assert (response.status, response.header(b"connection")) == (503, b"close")
        assert await third.closed()  # (the server's FIN; it lingers on, not counted)
        assert refused == ["tunnel", "tunnel"]
        leaving = held.pop()
        leaving.send(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        assert (await leaving.read_response()).status == 200
        assert await leaving.closed()  # (the entrance let go of it before its FIN)
        fourth = await RawClient.connect(port)
        fourth.send(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert (await fourth.read_response()).status == 200
        fourth.close()
        third.close()
        held[0].close()


@on_uvloop
async def test_refused_connections_are_a_metric() -> None:
    async with running("--listen", "127.0.0.1:0", "--max-connections", "1") as stack:
        held = await RawClient.connect(stack.cluster_port)
        held.send(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert (await held.read_response()).status == 404
        refused = await RawClient.connect(stack.cluster_port)
        assert (await refused.read_response()).status == 503
        refused.close()
        held.close()
        metrics = await scrape(stack)
    assert metrics['tunnelgate_connections_refused_total{entrance="cluster"}'] == 1


# ------------------------------------------ 19: list and whitespace rules, request line

NEXT = b"GET /next HTTP/1.1\r\nHost: app.test\r\n\r\n"
CHUNKED_HELLO = b"5\r\nhello\r\n0\r\n\r\n"
FRAMINGS = [
    # (a framing field of a POST whose body is "hello", then a pipelined GET)
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: , chunked",  # RFC 9110 §5.6.1: empty list elements are ignored
    b"Transfer-Encoding: chunked,",
    b"Transfer-Encoding: chunked ,",
    b"Transfer-Encoding: ,chunked,",
    b"Transfer-Encoding: chunked\t",  # RFC 9110 §5.5: the whitespace is not the value
    b"Transfer-Encoding: CHUNKED \t",
    b"Content-Length: 5\t",
]


@pytest.mark.parametrize("framing", FRAMINGS)
@on_uvloop
async def test_framing_fields_follow_the_list_and_whitespace_rules(framing: bytes
                                                                   ) -> None:
    """Each spelling frames the same body; the request after it is read as a request
    (nothing of the body leaks into it, nothing of it into the body)."""
    body = b"hello" if framing.startswith(b"Content-Length") else CHUNKED_HELLO
    async with TestBackend() as backend, proxied(backend) as port:
        client = await RawClient.connect(port)
        client.send(b"POST /echo HTTP/1.1\r\nHost: app.test\r\n" + framing + b"\r\n\r\n"
                    + body + NEXT)
        first = await client.read_response()
        second = await client.read_response()
        client.close()
    assert (first.status, first.json()["body"]) == (200, "hello")
    assert (second.status, second.json()["path"]) == (200, "/next")
    assert [seen.target for seen in backend.requests] == ["/echo", "/next"]


@pytest.mark.parametrize("framing", [b"chunked,", b"chunked\t"])
@on_uvloop
async def test_a_re_framed_chunked_body_may_come_in_many_reads(framing: bytes) -> None:
    """The spellings llhttp does not frame itself, with a body of 200 KB in chunks of
    all sizes that arrives in pieces: the backend gets it byte for byte."""
    body = bytes(range(256)) * 800
    sizes = [1, 10, 4000, 70000, 16384, 5]
    chunks, at = [], 0
    while at < len(body):
        size = sizes[len(chunks) % len(sizes)]
        chunks.append(b"%x\r\n%s\r\n" % (len(body[at:at + size]), body[at:at + size]))
        at += size
    wire = b"".join(chunks) + b"0\r\n\r\n"
    async with TestBackend() as backend, proxied(backend) as port:
        client = await RawClient.connect(port)
        client.send(b"POST /echo HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: "
                    + framing + b"\r\n\r\n" + wire[:3])
        for start in range(3, len(wire), 30000):
            await client.writer.drain()
            await asyncio.sleep(0.01)
            client.send(wire[start:start + 30000])
        response = await client.read_response()
        client.close()
    assert response.status == 200
    assert backend.requests[0].body == body


REQUEST_LINES = [
    # (bytes sent, in pieces sent apart; the status answered at once)
    ((b"GET /\r\n",), 400),  # HTTP/0.9: no version, and no more bytes will come
    ((b"GET /\r\nHost: app.test\r\n",), 400),
    ((b"GET /", b"\r\n"), 400),
    ((b"\rGET /echo HTTP/1.1\r\nHost: app.test\r\n\r\n",), 400),  # RFC 9112 §2.2
    ((b"\r\n\rGET /echo HTTP/1.1\r\nHost: app.test\r\n\r\n",), 400),
    ((b"\r\nGET /echo HTTP/1.1\r\nHost: app.test\r\n\r\n",), 200),  # an empty line
    ((b"\r\n\r\nGET /echo HTTP/1.1\r\nHost: app.test\r\n\r\n",), 200),
]


@pytest.mark.parametrize("pieces, status", REQUEST_LINES)
@on_uvloop
async def test_a_request_line_is_judged_as_soon_as_it_ends(pieces: tuple[bytes, ...],
                                                           status: int) -> None:
    """No 10 s wait for a header timeout (then 408) on a line that can never become a
    head this proxy serves. (The client's read gives up long before the header
    timeout.)"""
    async with TestBackend() as backend, proxied(backend) as port:
        client = await RawClient.connect(port)
        for piece in pieces:
            client.send(piece)
            await client.writer.drain()
            await asyncio.sleep(0.05)  # (apart: they may come in reads of their own)
        response = await client.read_response(timeout=READ_TIMEOUT / 2)
        client.close()
    assert response.status == status
    assert len(backend.requests) == (status == 200)


@pytest.mark.parametrize("split", [1, 8, 16, 17])
@on_uvloop
async def test_a_chunk_size_too_large_is_refused_when_its_line_comes_in_pieces(
        split: int) -> None:
    """llhttp takes any chunk size up to 2^64-1 and would wait for that body; the size
    line is read whole even when it arrives over several reads (``split`` bytes of it
    first), and the answer is a 400 at once, before any request reaches the backend."""
    line = b"ffffffffffffffff\r\n"
    async with TestBackend() as backend, proxied(backend) as port:
        client = await RawClient.connect(port)
        client.send(b"POST /echo HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked"
                    b"\r\n\r\n" + line[:split])
        await client.writer.drain()
        await asyncio.sleep(0.05)  # (apart: the rest comes in a read of its own)
        client.send(line[split:])
        response = await client.read_response(timeout=READ_TIMEOUT / 2)
        client.close()
    assert response.status == 400
    assert [seen.target for seen in backend.requests] in ([], ["/echo"])
