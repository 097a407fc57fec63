"""The OriginProxy bridge and the two recording response writers.

The handle functions here are tiny stand-ins for the Handler: the point is the adapter
semantics between proxy.request's Responder and cloudflared's ResponseWriter.
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

import pytest

from proxy.request import BodyError, Request, Responder
from tunnel import headers as blob
from tunnel.origin import Bridge, OriginError, OriginProxy, TCPNotSupported, TunnelRequest
from tunnel.writers import (
    STATUS_NOT_WRITTEN, HijackedError, Http2TransportWriter, QuicTransportWriter,
    RecordedResponse, WriterError, stream_pair)

META = blob.RESPONSE_META.encode()
BLOB = blob.RESPONSE_HEADERS.encode()


def get(url: str = "https://app.example.com/a?b=1", **kwargs: object) -> TunnelRequest:
    return TunnelRequest("GET", url, **kwargs)  # type: ignore[arg-type]


class Seen:
    """Records the Request each handle call received."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.bodies: list[bytes] = []

    async def __call__(self, request: Request, responder: Responder) -> None:
        self.requests.append(request)
        chunks = []
        while chunk := await request.body.read():
            chunks.append(chunk)
        self.bodies.append(b"".join(chunks))
        responder.respond(204, [])


# --- response side -----------------------------------------------------------------

async def streamed(request: Request, responder: Responder) -> None:
    responder.start(200, [
        (b"Content-Type", b"text/plain"), (b"Set-Cookie", b"a=1"),
        (b"Cf-Int-Secret", b"x"), (b"cf-cloudflared-response-meta", b"forged"),
        (b"CF-Proxy-Src", b"y"), (b"Set-Cookie", b"b=2"), (b"Content-Length", b"10"),
        (b"cf-int-cloudflared-tracing", b"trace-1"),
    ])
    await responder.write(b"hello")
    await responder.write(b"world")
    responder.finish()


async def test_http2_packs_user_headers_into_the_blob() -> None:
    rec = await Bridge(streamed).serve(get())
    assert rec.error is None
    assert rec.completion is not None and rec.completion.done()
    assert rec.status == 200
    assert rec.body == b"helloworld"
    assert json.loads(rec.wire_header(META)) == {"src": "origin"}
    assert rec.wire_header(b"content-length") == b"10"
    assert rec.wire_header(b"cf-int-cloudflared-tracing") == b"trace-1"
    assert blob.decode_bytes(rec.wire_header(BLOB).decode()) == [
        (b"Content-Type", b"text/plain"), (b"Set-Cookie", b"a=1"),
        (b"Set-Cookie", b"b=2"), (b"Content-Length", b"10")]
    assert {n.lower() for n, _ in rec.wire_headers} == {
        b"content-length", b"cf-int-cloudflared-tracing", BLOB, META}
    assert rec.flushes == 0  # a known length is not flushed per write


async def test_quic_sends_headers_as_they_are() -> None:
    rec = await Bridge(streamed, transport="quic").serve(get())
    assert rec.status == 200
    assert rec.header(b"cf-int-secret") == b"x"
    assert [v for n, v in rec.headers() if n == b"Set-Cookie"] == [b"a=1", b"b=2"]
    assert rec.wire_header(BLOB) is None


@pytest.mark.parametrize("headers", [
    [],  # no Content-Length
    [(b"Content-Length", b"6"), (b"Content-Type", b"text/event-stream")],
    [(b"Content-Length", b"6"), (b"Content-Type", b"application/grpc+proto")],
    [(b"Content-Type", b"application/x-ndjson")],
])
async def test_streaming_responses_flush_every_write(headers: list) -> None:
    async def handle(request: Request, responder: Responder) -> None:
        responder.start(200, headers)
        for part in (b"ab", b"cd", b"ef"):
            await responder.write(part)
        responder.finish()

    rec = await Bridge(handle).serve(get())
    assert rec.chunks == [b"ab", b"cd", b"ef"]
    assert rec.flushes == 3


async def test_respond_frames_the_body_and_head_sends_none() -> None:
    async def handle(request: Request, responder: Responder) -> None:
        responder.respond(404, [(b"Content-Type", b"text/plain"),
                                (b"Content-Length", b"999")], b"no matching route\n")

    rec = await Bridge(handle).serve(get())
    assert (rec.status, rec.body) == (404, b"no matching route\n")
    assert [v for n, v in rec.headers() if n.lower() == b"content-length"] == [b"18"]
    head = await Bridge(handle).serve(TunnelRequest("HEAD", "https://h/"))
    assert (head.status, head.body, head.header(b"content-length")) == (404, b"", b"18")


async def test_trailers_reach_http2_and_vanish_on_quic() -> None:
    async def handle(request: Request, responder: Responder) -> None:
        responder.start(200, [(b"Content-Type", b"application/grpc")])
        await responder.write(b"\x00\x00\x00\x00\x00")
        responder.finish([(b"grpc-status", b"0"), (b"grpc-message", b"ok")])

    http2 = await Bridge(handle).serve(get())
    assert http2.trailers == [(b"grpc-status", b"0"), (b"grpc-message", b"ok")]
    quic = await Bridge(handle, transport="quic").serve(get())
    assert quic.trailers == []
    assert quic.body == http2.body == b"\x00" * 5


async def echo_upgrade(request: Request, responder: Responder) -> None:
    stream = await responder.upgrade([(b"Upgrade", b"websocket"),
                                      (b"Connection", b"Upgrade"),
                                      (b"Sec-WebSocket-Accept", b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")])
    while data := await stream.read():
        await stream.write(data.upper())
    stream.close()


async def talk(rec: RecordedResponse) -> None:
    assert rec.stream is not None
    for word in (b"ping", b"pong"):
        await rec.stream.write(word)
        assert await asyncio.wait_for(rec.stream.read(), 2) == word.upper()
    rec.stream.close()
    await asyncio.wait_for(rec.completion, 2)


async def test_upgrade_on_http2_is_200_then_raw_bytes() -> None:
    rec = await Bridge(echo_upgrade).serve(get(), is_websocket=True)
    assert rec.status == 200  # HTTP/2 has no 101
    assert rec.header(b"sec-websocket-accept") == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert rec.header(b"upgrade") == b"websocket"
    await talk(rec)
    assert rec.error is None


async def test_upgrade_on_quic_keeps_101() -> None:
    rec = await Bridge(echo_upgrade, transport="quic").serve(get(), is_websocket=True)
    assert rec.status == 101
    await talk(rec)
    assert rec.error is None


async def test_websocket_flag_reinjects_upgrade_headers_and_drops_body() -> None:
    seen = Seen()
    await Bridge(seen).serve(get(headers=[
        ("Connection", "keep-alive"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-version", "8")], body=b"ignored"), is_websocket=True)
    request = seen.requests[0]
    assert request.upgrade == "websocket"
    assert seen.bodies == [b""]
    lowered = [(n.lower(), v) for n, v in request.headers]
    assert [v for n, v in lowered if n == b"connection"] == [b"Upgrade"]
    assert [v for n, v in lowered if n == b"upgrade"] == [b"websocket"]
    assert [v for n, v in lowered if n == b"sec-websocket-version"] == [b"13"]
    assert (b"sec-websocket-key", b"dGhlIHNhbXBsZSBub25jZQ==") in lowered


# --- the writers directly -----------------------------------------------------------

def test_http2_hijack_needs_the_status_first_and_only_once() -> None:
    writer = Http2TransportWriter(RecordedResponse("http2"))
    with pytest.raises(WriterError, match=STATUS_NOT_WRITTEN):
        writer.hijack()
    writer.write_resp_headers(101, [(b"Upgrade", b"websocket")])
    writer.hijack()
    with pytest.raises(HijackedError, match="connection has been hijacked"):
        writer.hijack()


async def test_http2_ignores_headers_after_hijack_and_refuses_writes() -> None:
    record = RecordedResponse("http2")
    writer = Http2TransportWriter(record)
    writer.write_resp_headers(101, [])
    writer.hijack()
    writer.write_resp_headers(500, [(b"X-Late", b"1")])
    assert record.status == 200
    assert record.header(b"x-late") is None
    with pytest.raises(HijackedError):
        await writer.write(b"late")


def test_http2_trailer_before_status_is_ignored() -> None:
    record = RecordedResponse("http2")
    writer = Http2TransportWriter(record)
    writer.add_trailer(b"grpc-status", b"0")
    writer.write_resp_headers(200, [])
    writer.add_trailer(b"grpc-status", b"13")
    assert record.trailers == [(b"grpc-status", b"13")]


def test_quic_hijack_any_time_returns_the_same_stream() -> None:
    record = RecordedResponse("quic")
    writer = QuicTransportWriter(record)
    first = writer.hijack()
    assert writer.hijack() is first
    assert record.status is None


async def test_write_before_status_implies_200() -> None:
    record = RecordedResponse("http2")
    writer = Http2TransportWriter(record)
    await writer.write(b"x")
    assert record.status == 200
    assert record.headers() == []
    assert record.flushes == 1  # no Content-Length: flushed


# --- requests -----------------------------------------------------------------------

@pytest.mark.parametrize("url, headers, want", [
    ("https://app.example.com/a%2Fb?x=1&y=http://z", [("Host", "other")],
     ("https", "app.example.com", "/a%2Fb", "x=1&y=http://z")),
    ("/p?q", [("Host", "h.example:8443")], ("http", "h.example:8443", "/p", "q")),
    ("/p", [], ("http", "localhost:8080", "/p", "")),
    ("wss://ws.example/chat", [], ("https", "ws.example", "/chat", "")),
    ("http://h.example", [], ("http", "h.example", "/", "")),
])
async def test_request_target_and_host(url: str, headers: list, want: tuple) -> None:
    seen = Seen()
    await Bridge(seen, prepare=lambda r: None).serve(get(url, headers=headers))
    r = seen.requests[0]
    assert (r.scheme, r.host, r.path, r.query) == want
    assert r.entrance == "tunnel"
    assert r.upgrade is None


@pytest.mark.parametrize("request_", [
    get(headers=[("X-Evil", "a\r\nX-Injected: 1")]),
    get(headers=[("X-Evil", "a\nb")]),
    get(headers=[("X-Evil\r\nX-Injected", "1")]),
    get(headers=[("X-Evil", "a\0b")]),
    get(headers=[(b"X-Evil", b"a\r\nX-Injected: 1")]),
    get(headers=[("X-Evil", "tab\there, then\nLF")]),
    get("https://app.example.com/a\r\nX-Injected: 1"),
    TunnelRequest("GET\r\n", "https://h/"),
])
async def test_line_breaks_in_a_tunnel_request_fail_it_before_the_handler(
        request_: TunnelRequest) -> None:
    """A tunnel request, the one source of fields no parser checked, is refused where it
    enters (cloudflared answers 502 for an origin that fails before writing): a
    rendered head is only scanned for LF, and a bare CR must not get through either."""
    seen = Seen()
    rec = await Bridge(seen).serve(request_)
    assert seen.requests == []
    assert isinstance(rec.error, OriginError)
    assert rec.status == 502


async def test_tabs_and_utf8_in_tunnel_headers_pass() -> None:
    seen = Seen()
    await Bridge(seen).serve(get(headers=[("X-Tab", "a\tb"), (b"X-Raw", b"\xc3\xa9")]))
    assert seen.requests[0].header(b"x-tab") == b"a\tb"


async def test_trust_rules_apply_on_the_bridge() -> None:
    seen = Seen()
    bridge = Bridge(seen)
    await bridge.serve(get(client_ip="198.51.100.9", headers=[
        ("CF-Connecting-IP", "203.0.113.7"), ("X-Forwarded-For", "6.6.6.6, 203.0.113.7"),
        ("CF-Visitor", '{"scheme":"https"}')]))
    await bridge.serve(get("http://h/", client_ip="198.51.100.9",
                           headers=[("CF-Connecting-IP", "not-an-ip")]))
    trusted, untrusted = seen.requests
    assert (trusted.client_ip, trusted.scheme) == ("203.0.113.7", "https")
    assert trusted.header(b"x-forwarded-for") is None
    assert (untrusted.client_ip, untrusted.scheme) == ("198.51.100.9", "http")


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        await asyncio.sleep(0)
        yield part


async def test_iterator_body_is_streamed() -> None:
    seen = Seen()
    await Bridge(seen).serve(TunnelRequest("POST", "/up", body=chunks(b"ab", b"", b"cd")))
    assert seen.bodies == [b"abcd"]
    assert seen.requests[0].body.length is None


@pytest.mark.parametrize("length, parts", [("3", (b"ab", b"cd")), ("5", (b"ab", b"cd"))])
async def test_iterator_body_must_match_its_content_length(length: str, parts: tuple) -> None:
    seen = Seen()
    rec = await Bridge(seen).serve(TunnelRequest(
        "POST", "/up", headers=[("Content-Length", length)], body=chunks(*parts)))
    assert isinstance(rec.error, BodyError)
    assert seen.requests[0].body.length == int(length)


# --- failures -----------------------------------------------------------------------

async def test_error_before_status_is_cloudflareds_502() -> None:
    async def broken(request: Request, responder: Responder) -> None:
        raise RuntimeError("boom")

    rec = await Bridge(broken).serve(get())
    assert isinstance(rec.error, RuntimeError)
    assert rec.status == 502
    assert json.loads(rec.wire_header(META)) == {"src": "cloudflared"}
    quic = await Bridge(broken, transport="quic").serve(get())
    assert (quic.status, quic.wire_headers) == (502, [])


async def test_abort_after_status_is_an_error_not_a_clean_end() -> None:
    async def truncated(request: Request, responder: Responder) -> None:
        responder.start(200, [(b"Content-Length", b"100")])
        await responder.write(b"partial")
        responder.abort()

    rec = await Bridge(truncated).serve(get())
    assert isinstance(rec.error, OriginError)
    assert (rec.status, rec.body) == (200, b"partial")


async def test_handler_returning_without_a_response_is_an_error() -> None:
    async def silent(request: Request, responder: Responder) -> None:
        return None

    rec = await Bridge(silent).serve(get())
    assert isinstance(rec.error, OriginError)
    assert rec.status == 502


async def test_proxy_tcp_is_refused() -> None:
    with pytest.raises(TCPNotSupported, match="not supported"):
        await OriginProxy(Seen()).proxy_tcp(object(), object())


def test_unknown_transport_is_rejected() -> None:
    with pytest.raises(ValueError):
        Bridge(Seen(), transport="h3")


# --- the in-memory stream -----------------------------------------------------------

async def test_stream_pair_backpressure_and_close() -> None:
    a, b = stream_pair(high_water=4)
    await a.write(b"1234")
    blocked = asyncio.ensure_future(a.write(b"5"))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    assert await b.read() == b"1234"
    await asyncio.wait_for(blocked, 1)
    a.close()
    assert await b.read() == b"5"  # buffered data survives the writer's close
    assert await b.read() == b""
    await asyncio.wait_for(b.write(b"dropped"), 1)  # the reader is gone: no block, no error


async def test_stream_close_wakes_a_blocked_writer() -> None:
    a, b = stream_pair(high_water=2)
    await a.write(b"12")
    blocked = asyncio.ensure_future(a.write(b"3"))
    await asyncio.sleep(0.01)
    b.close()
    await asyncio.wait_for(blocked, 1)
    assert await a.read() == b""
