"""Replays of what the real cloudflared sent (``tests/data/cloudflared/``, see its
README): every recorded request shape of both edge protocols, byte for byte, against a
running tunnelgate with a recording backend.

Through the **tunnel entrance** the backend must get X-Forwarded-For from
``Cf-Connecting-Ip`` (the edge's word replaces the client-supplied chain),
X-Forwarded-Proto from ``Cf-Visitor``, every ``cf-*`` header as sent, every other
end-to-end header unchanged, the same body with the same framing and the raw request
target untouched; a WebSocket upgrade is piped. The answer must keep the recorded
response's meaning (status, framing, content type, duplicate headers, trailers).

The same bytes sent to the **cluster entrance** (as a pod could send them) must lose
every ``cf-*`` header, and X-Forwarded-For must end with the socket peer.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator
from urllib.parse import parse_qs

import h11
import pytest

from tests.helpers import HOST, RawClient, RawResponse, Seen, TestBackend
from tests.stack import Stack, running

DATA = Path(__file__).with_name("data") / "cloudflared"
INDEX = json.loads((DATA / "index.json").read_text())
FIXTURES = [f for f in INDEX["fixtures"] if f.get("reached_tunnelgate", True)]
EDGE_CLIENT = "203.0.113.7"  # the test edge's Cf-Connecting-Ip
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 §1.3
# Fields a proxy does not pass on as they came: hop-by-hop ones (RFC 9110 §7.6.1), the
# forwarding fields it sets itself, and an Expect: 100-continue it meets itself (checked
# in check_forwarded). Everything else must reach the backend as sent.
REWRITTEN = {b"connection", b"keep-alive", b"te", b"transfer-encoding", b"upgrade",
             b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"expect"}
# Shapes whose recorded answer was a defect since fixed: 112 header fields got a 431
# (the count limit then was 100; the edge and cloudflared add a dozen of their own).
FIXED = {"many_headers_100": 200}


def test_every_request_file_is_described_and_used() -> None:
    files = {p.relative_to(DATA).as_posix() for p in DATA.glob("*/*.request.bin")}
    assert files == {f["request_file"] for f in FIXTURES}
    assert len(files) == 72  # 36 shapes × quic and http2
    assert {f["protocol"] for f in FIXTURES} == {"quic", "http2"}
    for fixture in FIXTURES:  # only the 1 MiB upload was cut to its head
        assert fixture["request_file_is_head_only"] == (fixture["name"] == "put_1mb")


# ------------------------------------------------------------------- the recordings


@dataclass
class Recorded:
    """One request file, parsed, and what the index says about it."""

    fixture: dict
    raw: bytes  # what to send (a cut body completed)
    method: str
    target: str
    headers: list[tuple[bytes, bytes]]
    body: bytes  # the body's payload (chunked framing decoded)

    @property
    def name(self) -> str:
        return self.fixture["name"]

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n.lower() == name), None)

    @property
    def head(self) -> bytes:
        return self.raw[:self.raw.index(b"\r\n\r\n") + 4]


def dechunk(data: bytes) -> bytes:
    out, rest = bytearray(), data
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += rest[:size]
        rest = rest[size + 2:]


def load(fixture: dict) -> Recorded:
    raw = (DATA / fixture["request_file"]).read_bytes()
    head, _, body = raw.partition(b"\r\n\r\n")
    request_line, *lines = head.split(b"\r\n")
    method, target, _ = request_line.split(b" ")
    headers = [(n, v.strip()) for n, v in (line.split(b":", 1) for line in lines)]
    framing = fixture["request_body"]["framing"]
    if fixture["request_file_is_head_only"]:
        body = bytes(range(256)) * (fixture["request_body"]["len"] // 256)
        raw += body
    payload = dechunk(body) if framing == "chunked" else body
    assert len(payload) == fixture["request_body"]["len"]
    return Recorded(fixture, raw, method.decode(), target.decode("latin-1"), headers,
                    payload)


def status_of(head: str) -> int:
    return int(head.split(" ", 2)[1])


def head_fields(head: str) -> list[tuple[bytes, bytes]]:
    lines = head.encode("latin-1").split(b"\r\n")[1:]
    return [(n.lower(), v.strip()) for n, v in (line.split(b":", 1) for line in lines if line)]


# ---------------------------------------------------------------- recording backend


class RecordingBackend(TestBackend):
    """:class:`TestBackend` (``/echo`` and the rest) plus the answers the recording's
    backend gave for its special paths, so the replies can be compared."""

    async def _answer(self, conn: h11.Connection, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, method: str, target: str,
                      headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        path, _, query = target.partition("?")
        args = {k: v[0] for k, v in parse_qs(query).items()}
        send = writer.write
        if path == "/ws":
            return await self._websocket(conn, reader, writer, headers)
        if path == "/dupheaders":
            send(conn.send(h11.Response(status_code=200, headers=[
                ("Content-Type", "text/plain"), ("Set-Cookie", "a=1; Path=/"),
                ("Set-Cookie", "b=2; Path=/"), ("X-Dup", "one"), ("X-Dup", "two"),
                ("X-Empty", ""), ("Keep-Alive", "timeout=5"), ("Server", "backend"),
                ("Date", "Mon, 01 Jan 2001 00:00:00 GMT"), ("Cf-Ray", "origin-set"),
                ("Cf-Cloudflared-Secret", "x"), ("Alt-Svc", 'h3=":443"'),
                ("Content-Length", "4")])) + conn.send(h11.Data(data=b"dup\n")))
        elif path == "/gzip":
            packed = gzip.compress(b"hello, compressed world\n" * 4)
            send(conn.send(h11.Response(status_code=200, headers=[
                ("Content-Type", "text/plain"), ("Content-Encoding", "gzip"),
                ("Vary", "Accept-Encoding"), ("Content-Length", str(len(packed)))]))
                 + conn.send(h11.Data(data=packed)))
        elif path == "/download":
            data = bytes(range(256)) * (int(args["n"]) // 256)
            send(conn.send(h11.Response(status_code=200, headers=[
                ("Content-Type", "application/octet-stream"),
                ("X-Sha256", hashlib.sha256(data).hexdigest()),
                ("Transfer-Encoding", "chunked")])))
            for start in range(0, len(data), 192 * 1024):
                send(conn.send(h11.Data(data=data[start:start + 192 * 1024])))
                await writer.drain()
        elif path == "/sse":
            send(conn.send(h11.Response(status_code=200, headers=[
                ("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"),
                ("Transfer-Encoding", "chunked")])))
            for index in range(int(args["count"])):
                send(conn.send(h11.Data(data=b"id: %d\ndata: tick %d\n\n" % (index, index))))
                await writer.drain()
                await asyncio.sleep(float(args["interval"]))
        elif path == "/pkg.Svc/Ping":
            send(conn.send(h11.Response(status_code=200, headers=[
                ("content-type", "application/grpc"), ("grpc-encoding", "identity"),
                ("Transfer-Encoding", "chunked"), ("Trailer", "grpc-status, grpc-message")]))
                 + conn.send(h11.Data(data=b"\0\0\0\0\x0apong-reply"))
                 + conn.send(h11.EndOfMessage(headers=[("grpc-status", "0"),
                                                        ("grpc-message", "ok")])))
            await writer.drain()
            return True
        elif path.startswith("/status/") and path[8:] in ("404", "500", "503"):
            send(conn.send(h11.Response(status_code=int(path[8:]), headers=[
                ("Content-Type", "text/plain"), ("Content-Length", "7")]))
                 + conn.send(h11.Data(data=b"status\n")))
        elif path.startswith("/status/") and path[8:] in ("204", "304"):
            send(conn.send(h11.Response(status_code=int(path[8:]), headers=[
                ("Content-Type", "text/plain")])))
        elif path in ("/early103", "/expect100"):
            interim = 103 if path == "/early103" else 100
            extra = [("Link", "</style.css>; rel=preload; as=style")] if interim == 103 else []
            send(conn.send(h11.InformationalResponse(status_code=interim, headers=extra)))
            return await super()._answer(conn, reader, writer, method, "/echo", headers, body)
        else:
            return await super()._answer(conn, reader, writer, method, target, headers, body)
        send(conn.send(h11.EndOfMessage()))
        await writer.drain()
        return True

    async def _websocket(self, conn: h11.Connection, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter, headers: list[tuple[bytes, bytes]]
                         ) -> bool:
        key = next(v for n, v in headers if n.lower() == b"sec-websocket-key")
        accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\nConnection: upgrade\r\n\r\n")
        while data := await reader.read(65536):  # echo: the pipe is ours to check
            writer.write(data)
            await writer.drain()
        return False


# ------------------------------------------------------------------------- running


@pytest.fixture
async def stack() -> AsyncIterator[tuple[Stack, RecordingBackend]]:
    async with RecordingBackend() as backend:
        config = {"version": 1, "rules": [
            {"hostnames": ["app.example.com", "grpc.example.com"],
             "backends": [{"url": backend.url, "weight": 1}]}]}
        async with running("--tunnel-listen", f"{HOST}:0", "--listen", f"{HOST}:0",
                           "--cluster-scope", "all", config=config) as stack:
            yield stack, backend


async def replay(port: int, recorded: Recorded) -> tuple[list[RawResponse], RawResponse,
                                                         RawClient]:
    """Send the file (the body only after a 100 when it asked for one); the interim
    answers, the final answer and the still-open client."""
    client = await RawClient.connect(port)
    interim: list[RawResponse] = []
    if recorded.header(b"expect") == b"100-continue":
        client.send(recorded.head)
        interim.append(await client.read_response())
        assert interim[0].status == 100
        client.send(recorded.raw[len(recorded.head):])
    else:
        client.send(recorded.raw)
    while True:
        answer = await client.read_response(head=recorded.method == "HEAD")
        if answer.status >= 200 or answer.status == 101:
            return interim, answer, client
        interim.append(answer)


def check_forwarded(recorded: Recorded, seen: Seen, entrance: str) -> None:
    """What the backend got, against the file."""
    assert seen.method == recorded.method
    # Raw: no decoding, no dot-segment removal, no slash merging; an empty query kept
    # (RFC 3986 §6.2.3: "/?" is not "/").
    assert seen.target == recorded.target
    if recorded.header(b"expect") == b"100-continue":
        assert seen.header(b"expect") is None  # the entrance sent the 100 itself
    assert seen.body == recorded.body
    sent_cf = [(n.lower(), v) for n, v in recorded.headers if n[:3].lower() == b"cf-"]
    got = [(n.lower(), v) for n, v in seen.headers]
    got_cf = [(n, v) for n, v in got if n[:3] == b"cf-"]
    xff = seen.header(b"x-forwarded-for")
    if entrance == "tunnel":
        assert sent_cf and got_cf == sent_cf  # every edge field, as the edge sent it
        assert xff == EDGE_CLIENT.encode()  # the edge's word, not the client's chain
        assert seen.header(b"x-forwarded-proto") == b"https"  # Cf-Visitor
    else:
        assert got_cf == []  # a pod could have forged any of them
        sent_xff = recorded.header(b"x-forwarded-for")
        assert xff == (sent_xff + b", " if sent_xff else b"") + HOST.encode()
        assert seen.header(b"x-forwarded-proto") == b"http"
    for name, value in recorded.headers:  # the rest passes unchanged
        if name.lower() not in REWRITTEN and name[:3].lower() != b"cf-":
            assert (name.lower(), value) in got, name
    framing = recorded.fixture["request_body"]["framing"]
    length = seen.header(b"content-length")
    chunked = (seen.header(b"transfer-encoding") or b"").lower() == b"chunked"
    if framing == "content-length":
        assert (length, chunked) == (str(len(recorded.body)).encode(), False)
    elif framing == "chunked":
        assert chunked and length is None
    else:
        assert length is None and not chunked


def check_answer(recorded: Recorded, interim: list[RawResponse], answer: RawResponse) -> None:
    """What came back, against the recorded answer's meaning."""
    fixture = recorded.fixture
    head = fixture["response_head"]
    assert answer.status == FIXED.get(recorded.name, status_of(head))
    if recorded.name in FIXED:
        return
    recorded_fields = head_fields(head)
    fields = [(n.lower(), v) for n, v in answer.headers]
    for name in (b"content-type", b"content-encoding", b"cache-control", b"x-sha256"):
        assert dict(fields).get(name) == dict(recorded_fields).get(name), name
    framing = fixture["response_body"]["framing"]
    if framing == "content-length":
        assert answer.header(b"content-length") is not None
    elif framing == "chunked":
        assert (answer.header(b"transfer-encoding") or b"").lower() == b"chunked"
        trailers = {(n.lower(), v) for n, v in answer.trailers}
        assert trailers == {(n.lower().encode(), v.strip().encode()) for n, _, v in
                            (t.partition(":") for t in fixture["response_body"]["trailers"])}
    name = recorded.name
    if name == "resp_103_early_hints":  # relayed now (the recording predates that)
        assert [(r.status, r.header(b"link")) for r in interim] == [
            (103, b"</style.css>; rel=preload; as=style")]
    else:
        # 100 Continue at most once, whoever else sent one (the backend may, too).
        assert [r.status for r in interim] in ([], [100])
        assert bool(interim) == bool(fixture["interim_response_heads"])
    if name == "resp_dup_headers":  # duplicates kept, hop-by-hop Keep-Alive gone
        assert fields == recorded_fields
    elif name == "resp_download_chunked_1mb":
        assert len(answer.body) == fixture["response_body"]["len"]
        assert hashlib.sha256(answer.body).hexdigest().encode() == answer.header(b"x-sha256")
    elif name == "resp_sse":
        assert answer.body.count(b"data: tick") == 5
    elif name in ("resp_gzip", "resp_gzip_no_ae"):  # passed through, not decoded
        assert gzip.decompress(answer.body).startswith(b"hello, compressed world")
    elif name == "websocket_upgrade":
        key = recorded.header(b"sec-websocket-key")
        assert key is not None
        accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
        assert answer.header(b"sec-websocket-accept") == accept
        assert (answer.header(b"upgrade") or b"").lower() == b"websocket"


@pytest.mark.parametrize("entrance", ["tunnel", "cluster"])
@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f"{f['protocol']}-{f['name']}")
async def test_replay(stack: tuple[Stack, RecordingBackend], fixture: dict,
                      entrance: str) -> None:
    tunnelgate, backend = stack
    recorded = load(fixture)
    port = tunnelgate.tunnel_port if entrance == "tunnel" else tunnelgate.cluster_port
    interim, answer, client = await replay(port, recorded)
    try:
        if recorded.name == "unrouted_host":
            assert answer.status == 404 and backend.requests == []
            return
        [seen] = backend.requests
        check_forwarded(recorded, seen, entrance)
        check_answer(recorded, interim, answer)
        if recorded.name == "websocket_upgrade":  # piped both ways after the 101
            frame = b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58"  # masked "Hello"
            client.send(frame)
            assert await asyncio.wait_for(client.reader.readexactly(len(frame)), 5) == frame
    finally:
        client.close()
