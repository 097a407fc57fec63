"""Backend response heads the reader splits itself and heads it leaves to llhttp, end
to end over real sockets: on one kept-alive backend connection the two ways take turns
as the answers' shapes change, and a head that arrives in one read is relayed exactly
as the same head arriving a few bytes at a time (which llhttp reports field by field).

The backend is a raw asyncio server on 127.0.0.1 writing exactly the bytes a case gives
it; the proxy runs as ``tunnelgate serve`` would (tests.stack.running).
"""

from __future__ import annotations

import pytest

from tests.helpers import RawClient, RawResponse, ScriptBackend, Step
from tests.test_backend_faults import CHUNKED_HEAD, get, proxied

PLAIN = (b"HTTP/1.1 200 OK\r\nServer: raw\r\nX-Spaced:  a  b \t\r\nX-Empty:\r\n"
         b"Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nplain")
TRAILED = CHUNKED_HEAD + b"5\r\nchunk\r\n0\r\nX-Sum: 7\r\n\r\n"
EARLY = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n" + PLAIN
FOLDED = b"HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\nContent-Length: 2\r\n\r\nok"


def dribbled(data: bytes, size: int) -> list[Step]:
    """``data`` written ``size`` bytes at a time, a little apart (separate reads)."""
    return [(0.02, data[at:at + size]) for at in range(0, len(data), size)]


def relayed(answer: RawResponse) -> list[tuple[bytes, bytes]]:
    """The fields of ``answer`` but the Date the proxy adds (the backend sent none)."""
    return [(name, value) for name, value in answer.headers if name != b"Date"]


async def ask_all(port: int, count: int) -> list[RawResponse]:
    """``count`` requests one after another on one client connection."""
    client = await RawClient.connect(port)
    try:
        answers = []
        for n in range(count):
            client.send(get(f"/{n}", ("TE", "trailers")))
            answers.append(await client.read_response())
        return answers
    finally:
        client.close()


async def test_split_and_reported_heads_take_turns_on_one_connection() -> None:
    shapes = [PLAIN, TRAILED, PLAIN, EARLY, PLAIN]
    backend = ScriptBackend(*([(0.0, shape)] for shape in shapes))
    async with backend:
        async with proxied(backend) as port:
            answers = await ask_all(port, len(shapes) + 1)  # (the last shape repeats)
    assert [(a.status, a.body) for a in answers] == [
        (200, b"plain"), (200, b"chunk"), (200, b"plain"), (103, b""), (200, b"plain"),
        (200, b"plain")]
    assert answers[1].trailers == [(b"X-Sum", b"7")]
    assert answers[3].header(b"link") == b"</a.css>"
    assert backend.connections == 1  # every answer kept the connection


@pytest.mark.parametrize("size", [1, 7, 40])
async def test_a_head_in_one_read_is_relayed_as_one_arriving_in_pieces(size: int) -> None:
    whole = ScriptBackend([(0.0, PLAIN)])
    pieces = ScriptBackend(dribbled(PLAIN, size))
    async with whole, pieces:
        async with proxied(whole) as port:
            (at_once,) = await ask_all(port, 1)
        async with proxied(pieces) as port:
            (dribbled_in,) = await ask_all(port, 1)
    assert at_once.headers[:4] == [(b"Server", b"raw"), (b"X-Spaced", b"a  b"),
                                   (b"X-Empty", b""), (b"Content-Type", b"text/plain")]
    assert (at_once.status, at_once.reason, at_once.body) == (200, b"OK", b"plain")
    assert (dribbled_in.status, dribbled_in.reason, relayed(dribbled_in),
            dribbled_in.body) == (at_once.status, at_once.reason, relayed(at_once),
                                  at_once.body)


async def test_a_folded_head_is_refused_and_the_next_answer_is_split_again() -> None:
    backend = ScriptBackend([(0.0, FOLDED)], [(0.0, PLAIN)])
    async with backend:
        async with proxied(backend) as port:
            folded, plain = await ask_all(port, 2)
    assert folded.status == 502  # llhttp rejects an obsolete line folding
    assert (plain.status, plain.body) == (200, b"plain")
    assert backend.connections == 2  # the refused answer's connection was closed


BODY = b"".join(b"%05d" % i for i in range(8_000))  # 40,000 bytes, no two pieces alike
LONG = b"HTTP/1.1 200 OK\r\nServer: raw\r\nContent-Length: %d\r\n\r\n" % len(BODY)
OPEN_ENDED = b"HTTP/1.1 200 OK\r\nServer: raw\r\nConnection: close\r\n\r\n"

# A plain head in a large read, or alone in its read: the reader relays the body
# itself (llhttp counts it after). Each case: the backend's steps for the first
# request, the body the client gets, whether the second request needs a new connection.
RELAYED: dict[str, tuple[list[Step], bytes, bool]] = {
    "one-read": ([(0.0, LONG + BODY)], BODY, False),
    "head-alone-then-pieces": ([(0.0, LONG)] + dribbled(BODY, 9_999), BODY, False),
    "head-alone-then-one-byte": ([(0.0, LONG), (0.02, BODY[:1]), (0.02, BODY[1:])],
                                 BODY, False),
    "close-delimited": ([(0.0, OPEN_ENDED), (0.02, BODY[:20_000]),
                         (0.02, BODY[20_000:]), (0.0, b"")], BODY, True),
    # (a 304 announcing a length closes its connection: the bytes may come yet)
    "not-modified-alone": ([(0.0, b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n"
                            b"\r\n")], b"", True),
    "empty-alone": ([(0.0, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")], b"", False),
}


@pytest.mark.parametrize("case", RELAYED)
async def test_a_body_relayed_past_llhttp_arrives_whole_and_in_turn(case: str) -> None:
    steps, body, reconnects = RELAYED[case]
    backend = ScriptBackend(steps, [(0.0, PLAIN)])
    async with backend:
        async with proxied(backend) as port:
            first, second = await ask_all(port, 2)
    assert first.body == body
    assert (second.status, second.body) == (200, b"plain")
    assert backend.connections == (2 if reconnects else 1)


async def test_a_relayed_body_cut_short_is_never_complete() -> None:
    backend = ScriptBackend([(0.0, LONG + BODY[:30_000]), (0.02, b"")], [(0.0, PLAIN)])
    async with backend:
        async with proxied(backend) as port:
            client = await RawClient.connect(port)
            client.send(get("/cut"))
            head = await client.reader.readuntil(b"\r\n\r\n")
            rest = await client.read_all()
            client.close()
            (after,) = await ask_all(port, 1)
    assert b"Content-Length: %d" % len(BODY) in head
    assert len(rest) < len(BODY) and BODY.startswith(rest)  # the client sees it cut
    assert (after.status, after.body) == (200, b"plain")
