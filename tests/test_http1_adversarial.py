"""Adversarial HTTP/1.1 input at the entrance: request smuggling, malformed framing and
heads. Every case checks the status, that the connection ends, and that no request
hidden inside the attack reached the Handler. Then a differential check: for a corpus
of well-formed requests the entrance and h11 (an independent parser) must agree on
method, target, headers and body."""

from __future__ import annotations

import random

import h11
import pytest

from proxy.request import BodyError, Request, Responder
from tests.helpers import RawClient, on_uvloop, running_entrance

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n"


class Recorder:
    """Records every request the Handler was given (before touching the body)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.seen: list[tuple[str, str, list[tuple[bytes, bytes]], bytes]] = []

    async def __call__(self, request: Request, responder: Responder) -> None:
        self.paths.append(request.path)
        body = b""
        try:
            while chunk := await request.body.read():
                body += chunk
        except BodyError:
            return
        target = request.path + ("?" + request.query if request.query else "")
        self.seen.append((request.method, target, list(request.headers), body))
        responder.respond(200, [], f"{request.host}|{request.path}|{len(body)}".encode())


def post(*headers: bytes, body: bytes = b"") -> bytes:
    return b"POST / HTTP/1.1\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


CHUNKED_SMUGGLE = b"0\r\n\r\n" + SMUGGLED

# (name, raw bytes, expected status, does h11 reject it too?)
CASES = [
    ("CL+TE", post(b"Host: h", b"Content-Length: 40", b"Transfer-Encoding: chunked",
                   body=CHUNKED_SMUGGLE), 400, False),
    ("TE+CL", post(b"Host: h", b"Transfer-Encoding: chunked", b"Content-Length: 5",
                   body=CHUNKED_SMUGGLE), 400, False),
    ("two different CLs", post(b"Host: h", b"Content-Length: 5", b"Content-Length: 41",
                               body=b"12345" + SMUGGLED), 400, True),
    ("CL list", post(b"Host: h", b"Content-Length: 5, 41", body=b"12345" + SMUGGLED), 400, True),
    ("CL with sign", post(b"Host: h", b"Content-Length: +5", body=b"12345" + SMUGGLED),
     400, True),
    ("TE chunked, identity", post(b"Host: h", b"Transfer-Encoding: chunked, identity",
                                  body=CHUNKED_SMUGGLE), 400, True),
    ("TE identity", post(b"Host: h", b"Transfer-Encoding: identity",
                         body=CHUNKED_SMUGGLE), 400, True),
    ("TE gzip, chunked", post(b"Host: h", b"Transfer-Encoding: gzip, chunked",
                              body=CHUNKED_SMUGGLE), 501, True),
    ("TE on two lines", post(b"Host: h", b"Transfer-Encoding: gzip",
                             b"Transfer-Encoding: chunked", body=CHUNKED_SMUGGLE), 501, True),
    ("TE twice chunked", post(b"Host: h", b"Transfer-Encoding: chunked",
                              b"Transfer-Encoding: chunked", body=CHUNKED_SMUGGLE), 400, True),
    ("TE xchunked", post(b"Host: h", b"Transfer-Encoding: xchunked",
                         body=CHUNKED_SMUGGLE), 400, True),
    ("TE with vertical tab", post(b"Host: h", b"Transfer-Encoding: \x0bchunked",
                                  body=CHUNKED_SMUGGLE), 400, True),
    ("space before colon", post(b"Host: h", b"Transfer-Encoding : chunked",
                                body=CHUNKED_SMUGGLE), 400, True),
    ("TE in HTTP/1.0", b"POST / HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
     + CHUNKED_SMUGGLE, 400, False),
    ("bare LF", b"GET / HTTP/1.1\nHost: h\n\n" + SMUGGLED, 400, False),
    ("bare LF in headers", b"GET / HTTP/1.1\r\nHost: h\nX: y\r\n\r\n" + SMUGGLED, 400, False),
    ("bare CR", b"GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n" + SMUGGLED, 400, True),
    ("NUL in value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x00b\r\n\r\n" + SMUGGLED, 400, True),
    ("obs-fold", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n" + SMUGGLED, 400, False),
    ("obs-fold of TE", post(b"Host: h", b"Transfer-Encoding:", b" chunked",
                            body=CHUNKED_SMUGGLE), 400, False),
    ("space in header name", b"GET / HTTP/1.1\r\nHost: h\r\nX Y: 1\r\n\r\n" + SMUGGLED, 400, True),
    ("invalid chunk size", post(b"Host: h", b"Transfer-Encoding: chunked",
                                body=b"zz\r\n" + CHUNKED_SMUGGLE), 400, True),
    ("chunk size overflow", post(b"Host: h", b"Transfer-Encoding: chunked",
                                 body=b"FFFFFFFFFFFFFFFFFFFF\r\nabc\r\n" + CHUNKED_SMUGGLE),
     400, False),
    ("chunk data overrun", post(b"Host: h", b"Transfer-Encoding: chunked",
                                body=b"3\r\nabcdef\r\n" + CHUNKED_SMUGGLE), 400, True),
    ("huge chunk extension", post(b"Host: h", b"Transfer-Encoding: chunked",
                                  body=b"3;ext=" + b"x" * 200_000 + b"\r\nabc\r\n"
                                  + CHUNKED_SMUGGLE), 400, False),
    ("missing Host", b"GET / HTTP/1.1\r\n\r\n" + SMUGGLED, 400, True),
    ("two Hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n" + SMUGGLED, 400, True),
    ("Host with path", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n" + SMUGGLED, 400, False),
    ("Host with userinfo", b"GET / HTTP/1.1\r\nHost: u@a\r\n\r\n" + SMUGGLED, 400, False),
    ("absolute form with userinfo", b"GET http://u@a/ HTTP/1.1\r\nHost: a\r\n\r\n" + SMUGGLED,
     400, False),
    ("absolute form other scheme", b"GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n" + SMUGGLED,
     400, False),
    ("asterisk outside OPTIONS", b"GET * HTTP/1.1\r\nHost: a\r\n\r\n" + SMUGGLED, 400, False),
    ("CONNECT", b"CONNECT evil:443 HTTP/1.1\r\nHost: evil:443\r\n\r\n" + SMUGGLED, 501, False),
    ("Host port not digits", b"GET / HTTP/1.1\r\nHost: a:abc\r\n\r\n" + SMUGGLED, 400, False),
    ("Host port negative", b"GET / HTTP/1.1\r\nHost: a:-1\r\n\r\n" + SMUGGLED, 400, False),
    ("absolute form port not digits", b"GET http://a:8x/ HTTP/1.1\r\nHost: a\r\n\r\n"
     + SMUGGLED, 400, False),
    ("bare IPv6 Host", b"GET / HTTP/1.1\r\nHost: ::1\r\n\r\n" + SMUGGLED, 400, False),
    ("method llhttp does not know", b"BREW / HTTP/1.1\r\nHost: h\r\n\r\n" + SMUGGLED,
     501, False),
    ("binary garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + SMUGGLED,
     400, True),
    ("HTTP/2.0 request line", b"GET / HTTP/2.0\r\nHost: h\r\n\r\n" + SMUGGLED, 505, False),
    ("HTTP/0.9", b"GET /\r\n\r\n" + SMUGGLED, 400, True),  # no version: as in pieces
    ("HTTP/3.0 request line", b"GET / HTTP/3.0\r\nHost: h\r\n\r\n" + SMUGGLED, 505, False),
    ("HTTP/1.x without a minor", b"GET / HTTP/1.\r\nHost: h\r\n\r\n" + SMUGGLED, 400, True),
    ("lower-case method", b"get / HTTP/1.1\r\nHost: h\r\n\r\n" + SMUGGLED, 501, False),
    ("space in target", b"GET /a b HTTP/1.1\r\nHost: h\r\n\r\n" + SMUGGLED, 400, True),
    ("leading whitespace header", b"GET / HTTP/1.1\r\n Host: h\r\n\r\n" + SMUGGLED, 400, True),
]


@pytest.mark.parametrize("raw, status, h11_rejects",
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
@on_uvloop
async def test_rejected_and_nothing_smuggled(raw: bytes, status: int,
                                             h11_rejects: bool) -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(raw)
        response = await client.read_response()
        assert response.status == status
        assert response.header(b"connection") == b"close"
        assert response.header(b"date") is not None  # RFC 9110 §6.6.1, 4xx and 5xx too
        assert await client.closed()
    assert "/smuggled" not in recorder.paths
    assert _h11_rejects(raw) is h11_rejects  # where the two parsers differ, on purpose


def _h11_rejects(raw: bytes) -> bool:
    """Whether h11 refuses the message too (it is an independent parser)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    try:
        while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(event, h11.EndOfMessage):
                return False
    except h11.RemoteProtocolError:
        return True
    return False


@on_uvloop
async def test_pipelined_good_then_bad_answers_both_in_order_then_closes() -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n"
                    + post(b"Host: h", b"Content-Length: 3", b"Transfer-Encoding: chunked",
                           body=CHUNKED_SMUGGLE))
        assert (await client.read_response()).status == 200
        assert (await client.read_response()).status == 400
        assert await client.closed()
    assert recorder.paths == ["/first"]


@pytest.mark.parametrize("raw", [
    # A body that looks like a request stays a body.
    post(b"Host: h", b"Content-Length: %d" % len(SMUGGLED), body=SMUGGLED),
    post(b"Host: h", b"Transfer-Encoding: chunked",
         body=b"%x\r\n" % len(SMUGGLED) + SMUGGLED + b"\r\n0\r\n\r\n"),
    # An upgrade request with a body is served as a plain request: its body is a body,
    # never the start of a raw stream or of a second request.
    b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Content-Length: %d\r\n\r\n" % len(SMUGGLED) + SMUGGLED,
], ids=["content-length", "chunked", "upgrade with body"])
@on_uvloop
async def test_request_shaped_bodies_are_not_requests(raw: bytes) -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(raw)
        response = await client.read_response()
        assert response.status == 200
        assert response.body.endswith(b"|%d" % len(SMUGGLED))
        client.send(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
        assert (await client.read_response()).body == b"h|/next|0"
        client.close()
    assert recorder.paths == ["/", "/next"]


@on_uvloop
async def test_absolute_form_is_routed_by_authority_not_proxied() -> None:
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(b"GET http://internal.example/admin HTTP/1.1\r\nHost: public\r\n\r\n")
        response = await client.read_response()
        client.close()
    assert response.body == b"internal.example|/admin|0"


# ------------------------------------------------------------------- differential


def _corpus(seed: int, count: int) -> list[bytes]:
    """Well-formed requests with varied methods, targets, headers and bodies."""
    rng = random.Random(seed)
    token = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~"
    value = "".join(chr(c) for c in range(0x20, 0x7f)) + "\t"
    path_chars = "abcXYZ019-._~%!$&'()*+,;=:@/"
    out = []
    for i in range(count):
        method = rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
        path = "/" + "".join(rng.choice(path_chars) for _ in range(rng.randrange(0, 30)))
        if rng.random() < 0.5:
            path += "?" + "".join(rng.choice(path_chars + "?") for _ in range(rng.randrange(20)))
        headers = [("Host", f"h{i}.example:{rng.randrange(1, 65536)}")]
        for _ in range(rng.randrange(0, 12)):
            name = "".join(rng.choice(token) for _ in range(rng.randrange(1, 20)))
            if name.lower() in ("host", "content-length", "transfer-encoding",
                                "connection", "upgrade", "expect"):
                continue
            text = "".join(rng.choice(value) for _ in range(rng.randrange(0, 40))).strip()
            headers.append((name, text))
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 3000)))
        framing = rng.choice(["none", "length", "chunked"]) if method != "HEAD" else "none"
        if framing == "none":
            body = b""
        elif framing == "length":
            headers.append(("Content-Length", str(len(body))))
        else:
            headers.append(("Transfer-Encoding", "chunked"))
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(
            f"{n}:{rng.choice(['', ' ', '  ', chr(9)])}{v}{rng.choice(['', ' '])}\r\n"
            for n, v in headers) + "\r\n"
        data = head.encode("latin-1")
        if framing == "length":
            data += body
        elif framing == "chunked":
            at = 0
            while at < len(body):
                size = rng.randrange(1, 700)
                data += b"%x\r\n" % len(body[at:at + size]) + body[at:at + size] + b"\r\n"
                at += size
            data += b"0\r\n\r\n"
        out.append(data)
    return out


def _h11_parse(data: bytes) -> list[tuple[str, str, list[tuple[bytes, bytes]], bytes]]:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    parsed = []
    request: h11.Request | None = None
    body = b""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            request, body = event, b""
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            target = request.target.decode("latin-1")
            if target.endswith("?") and target.index("?") == len(target) - 1:
                target = target[:-1]  # Request keeps no empty query (path, query split)
            parsed.append((request.method.decode(), target,
                           list(request.headers.raw_items()), body))
            return parsed
        elif event is h11.NEED_DATA:
            raise AssertionError("h11 needs more data for a complete corpus request")


@on_uvloop
async def test_entrance_and_h11_agree_on_well_formed_requests() -> None:
    corpus = _corpus(seed=1742, count=120)
    expected = [_h11_parse(raw)[0] for raw in corpus]
    recorder = Recorder()
    async with running_entrance(recorder) as port:
        client = await RawClient.connect(port)
        client.send(b"".join(corpus))  # all pipelined in one go
        for method, *_ in expected:
            assert (await client.read_response(head=method == "HEAD")).status == 200
        client.close()
    # Names keep the case sent; optional whitespace around values is not part of them.
    assert recorder.seen == expected
