"""One table, three entrances, one outcome.

The same request — byte for byte the same head, the edge headers cloudflared adds
included — is sent through the in-process Bridge (HTTP/2 transport writer), the tunnel
(sidecar) entrance and the cluster entrance (scope ``all``) of one running tunnelgate.
For every route shape the backend must receive the same method, target, body and
headers, in the same order, and the client the same answer.

What legitimately differs, and why:

- ``X-Forwarded-For`` — the tunnel entrance and the Bridge believe ``CF-Connecting-IP``
  and *replace* the incoming XFF with it (the edge appends to a client-supplied XFF,
  cloudflared #1426, so its other entries are attacker-controlled). The cluster
  entrance believes only its socket: the client's XFF is kept and the peer address
  (127.0.0.1) appended.
- ``X-Forwarded-Proto`` — tunnel and Bridge take the scheme from ``CF-Visitor``
  (``https``); the cluster entrance from its own listener (``http``).
- every ``cf-*`` request header — the cluster entrance drops them (a pod dialing it
  could forge an edge-authenticated identity); the tunnel side forwards them.

Bridge and tunnel entrance must agree on everything, those three included. For the
same reason a redirect without an explicit ``scheme`` would differ (its ``Location``
keeps the scheme the entrance vouches for), so the redirect shape here names one.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator

import pytest

from proxy.request import ByteStream, Headers
from tests.helpers import RawClient, Seen, TestBackend, on_uvloop
from tests.stack import Stack, running
from tests.test_websocket import scrape
from tests.wsutil import EchoServer, new_key
from tunnel import sidecar
from tunnel.origin import Bridge, TunnelRequest, WriterResponder, to_request
from tunnel.writers import (
    STATUS_NOT_WRITTEN, Http2TransportWriter, RecordedResponse, WriterError)

HOST = "eq.example.com"
EDGE_IP = "198.51.100.23"
CLIENT_XFF = "10.9.8.7"  # what the eyeball claimed; only the cluster entrance keeps it
EDGE_HEADERS: list[tuple[str, str]] = [
    ("CF-Connecting-IP", EDGE_IP), ("CF-Ray", "8f00aa11bb22cc33-FRA"),
    ("CF-Visitor", '{"scheme":"https"}'), ("CF-IPCountry", "DE"),
    ("X-Forwarded-For", f"{CLIENT_XFF}, {EDGE_IP}"), ("X-Forwarded-Proto", "https")]
DIFFERING = {b"x-forwarded-for", b"x-forwarded-proto"}
RESPONSE_HEADERS = (b"content-type", b"location", b"x-resp", b"x-backend-resp")


def _set(*pairs: tuple[str, str]) -> dict:
    return {"set": [{"name": n, "value": v} for n, v in pairs]}


def _header_filter(*pairs: tuple[str, str]) -> dict:
    return {"type": "RequestHeaderModifier", "requestHeaderModifier": _set(*pairs)}


def table(url: str) -> dict:
    """Route shapes on one host; every rule tags what it did with a header."""
    def rule(match: dict, *filters: dict, backend: dict | None = None) -> dict:
        return {"hostnames": [HOST], "matches": [match], "filters": list(filters),
                "backends": [backend or {"url": url, "weight": 1}]}

    prefix = lambda value: {"path": {"type": "PathPrefix", "value": value}}  # noqa: E731
    return {"version": 7, "rules": [
        rule(prefix("/hdr"),
             {"type": "RequestHeaderModifier", "requestHeaderModifier": {
                 "set": [{"name": "X-Set", "value": "one"}],
                 "add": [{"name": "Accept", "value": "text/html"}],
                 "remove": ["X-Drop"]}},
             {"type": "ResponseHeaderModifier", "responseHeaderModifier": _set(
                 ("X-Resp", "hdr"))}),
        rule(prefix("/rw"), {"type": "URLRewrite", "urlRewrite": {
            "hostname": "internal.svc.cluster.local",
            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2"}}}),
        rule(prefix("/full"), {"type": "URLRewrite", "urlRewrite": {
            "path": {"type": "ReplaceFullPath", "replaceFullPath": "/fixed"}}}),
        rule(prefix("/be"), backend={"url": url, "weight": 1, "filters": [
            _header_filter(("X-Backend", "b1")),
            {"type": "ResponseHeaderModifier", "responseHeaderModifier": _set(
                ("X-Backend-Resp", "b1"))}]}),
        rule({"path": {"type": "PathPrefix", "value": "/q"},
              "queryParams": [{"type": "Exact", "name": "v", "value": "2"}]},
             _header_filter(("X-Rule", "query-v2"))),
        rule(prefix("/q"), _header_filter(("X-Rule", "query-other"))),
        rule({"path": {"type": "RegularExpression", "value": "/items/[0-9]+/?"}},
             _header_filter(("X-Rule", "regex"))),
        rule({"path": {"type": "PathPrefix", "value": "/env"},
              "headers": [{"type": "Exact", "name": "X-Env", "value": "beta"}]},
             _header_filter(("X-Rule", "beta"))),
        rule({"path": {"type": "Exact", "value": "/submit"}, "method": "POST"},
             _header_filter(("X-Rule", "post"))),
        {"hostnames": [HOST], "matches": [prefix("/old")], "backends": None,
         "filters": [{"type": "RequestRedirect", "requestRedirect": {
             "scheme": "https", "hostname": "new.example.com", "statusCode": 301,
             "path": {"type": "ReplacePrefixMatch", "value": "/new"}}}]},
        rule(prefix("/"), _header_filter(("X-Rule", "default"))),
    ]}


@dataclass(frozen=True)
class Case:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    streamed: bool = False  # body of unknown length: chunked on HTTP/1.1, an iterator
    #                         on the Bridge (HTTP/2 has no Transfer-Encoding)


CASES = {
    "header-modifier": Case("GET", "/hdr/a?x=1", (("X-Drop", "secret"), ("X-Set", "old"))),
    "rewrite-host-and-prefix": Case("GET", "/rw/items/7?sort=asc"),
    "rewrite-full-path": Case("GET", "/full/anything/here?keep=me"),
    "backend-filters": Case("GET", "/be/x"),
    "query-match": Case("GET", "/q?v=2&w=3"),
    "query-fallback": Case("GET", "/q?v=3"),
    "regex-path": Case("GET", "/items/42/"),
    "header-match": Case("GET", "/env/x", (("X-Env", "beta"),)),
    "method-match-with-body": Case("POST", "/submit?id=9", (
        ("Content-Type", "application/json"),), b'{"order": [1, 2, 3]}'),
    "streamed-body": Case("POST", "/submit", (("Content-Type", "text/plain"),),
                          b"part one|part two|part three", streamed=True),
    "percent-encoded-path": Case("GET", "/caf%C3%A9/a%20b?q=%2F"),
    "head": Case("HEAD", "/hdr/head"),
    "redirect": Case("GET", "/old/page?ref=mail"),
}


def request_headers(case: Case) -> list[tuple[str, str]]:
    """The head every entrance gets: Host, the client's headers, the edge's headers."""
    headers = [("Host", HOST), ("User-Agent", "curl/8.5.0"), ("Accept", "*/*"),
               *case.headers, *EDGE_HEADERS]
    if case.body and not case.streamed:
        headers.append(("Content-Length", str(len(case.body))))
    return headers


def chunks(case: Case, size: int = 9) -> list[bytes]:
    return [case.body[i:i + size] for i in range(0, len(case.body), size)]


@dataclass
class Outcome:
    """What one entrance made of a request: the backend's view and the client's."""

    seen: Seen | None
    status: int
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""


async def through_socket(port: int, case: Case) -> tuple[int, Headers, bytes]:
    client = await RawClient.connect(port)
    head = "".join(f"{n}: {v}\r\n" for n, v in request_headers(case))
    body = case.body
    if case.streamed:
        head += "Transfer-Encoding: chunked\r\n"
        body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks(case)) + b"0\r\n\r\n"
    client.send(f"{case.method} {case.target} HTTP/1.1\r\n{head}\r\n".encode() + body)
    response = await client.read_response(head=case.method == "HEAD")
    client.close()
    return response.status, response.headers, response.body


async def through_bridge(bridge: Bridge, case: Case) -> tuple[int, Headers, bytes]:
    async def stream() -> AsyncIterator[bytes]:
        for chunk in chunks(case):
            yield chunk

    body = stream() if case.streamed else case.body
    record = await bridge.serve(TunnelRequest(case.method, case.target,
                                              request_headers(case), body))
    assert record.error is None and record.status is not None
    return record.status, record.headers(), record.body


async def outcome(stack: Stack, backend: TestBackend, entrance: str, case: Case) -> Outcome:
    before = len(backend.requests)
    if entrance == "bridge":
        status, headers, body = await through_bridge(Bridge(stack.runtime.in_flight), case)
    else:
        port = stack.tunnel_port if entrance == "tunnel" else stack.cluster_port
        status, headers, body = await through_socket(port, case)
    new = backend.requests[before:]
    assert len(new) <= 1
    picked = {n.lower(): v for n, v in headers if n.lower() in RESPONSE_HEADERS}
    # The echo's body repeats the request headers, which differ as documented above.
    return Outcome(new[0] if new else None, status, picked,
                   body if new == [] or case.method == "HEAD" else b"")


@asynccontextmanager
async def world() -> AsyncIterator[tuple[Stack, TestBackend]]:
    async with TestBackend() as backend, running(
            "--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0",
            "--cluster-scope", "all", config=table(backend.url)) as stack:
        yield stack, backend


def lowered(headers: Headers) -> list[tuple[bytes, bytes]]:
    return [(n.lower(), v) for n, v in headers]


def without(headers: Headers, names: set[bytes]) -> list[tuple[bytes, bytes]]:
    return [(n, v) for n, v in lowered(headers)
            if n not in names and not n.startswith(b"cf-")]


@pytest.mark.parametrize("name", list(CASES))
@on_uvloop
async def test_every_entrance_forwards_the_same_request(name: str) -> None:
    case = CASES[name]
    async with world() as (stack, backend):
        bridge = await outcome(stack, backend, "bridge", case)
        tunnel = await outcome(stack, backend, "tunnel", case)
        cluster = await outcome(stack, backend, "cluster", case)

    for other in (tunnel, cluster):
        assert (other.status, other.headers, other.body) == (
            bridge.status, bridge.headers, bridge.body)
    if name == "redirect":  # answered by the filter, identically, backend untouched
        assert bridge.seen is None and tunnel.seen is None and cluster.seen is None
        assert bridge.status == 301
        assert bridge.headers[b"location"] == b"https://new.example.com/new/page?ref=mail"
        return
    assert bridge.seen is not None and tunnel.seen is not None and cluster.seen is not None
    assert bridge.status == 200
    # The Bridge and the tunnel entrance are the same entrance: everything agrees.
    assert (tunnel.seen.method, tunnel.seen.target, tunnel.seen.body) == (
        bridge.seen.method, bridge.seen.target, bridge.seen.body)
    assert lowered(tunnel.seen.headers) == lowered(bridge.seen.headers)
    # The cluster entrance: same target, same rewritten headers, same order, except
    # for the trust-dependent ones named in the module docstring.
    assert (cluster.seen.method, cluster.seen.target, cluster.seen.body) == (
        bridge.seen.method, bridge.seen.target, bridge.seen.body)
    assert (without(cluster.seen.headers, DIFFERING)
            == without(bridge.seen.headers, DIFFERING))
    edge = bridge.seen
    assert edge.header(b"x-forwarded-for") == EDGE_IP.encode()
    assert edge.header(b"x-forwarded-proto") == b"https"
    assert edge.header(b"cf-ray") == b"8f00aa11bb22cc33-FRA"
    assert cluster.seen.header(b"x-forwarded-for") == (
        f"{CLIENT_XFF}, {EDGE_IP}, 127.0.0.1".encode())
    assert cluster.seen.header(b"x-forwarded-proto") == b"http"
    assert not [n for n, _ in lowered(cluster.seen.headers) if n.startswith(b"cf-")]
    assert edge.header(b"x-forwarded-host") == HOST.encode()


@on_uvloop
async def test_route_shapes_do_what_they_say() -> None:
    """The shapes above are not vacuous: each rewrote what it claims (via the Bridge)."""
    async with world() as (stack, backend):
        seen = {name: (await outcome(stack, backend, "bridge", case)).seen
                for name, case in CASES.items() if name != "redirect"}
    assert seen["header-modifier"].header(b"x-set") == b"one"
    assert seen["header-modifier"].header(b"x-drop") is None
    assert [v for n, v in seen["header-modifier"].headers if n.lower() == b"accept"] == [
        b"*/*", b"text/html"]
    assert seen["rewrite-host-and-prefix"].target == "/v2/items/7?sort=asc"
    assert seen["rewrite-host-and-prefix"].header(b"host") == b"internal.svc.cluster.local"
    assert seen["rewrite-full-path"].target == "/fixed?keep=me"
    assert seen["backend-filters"].header(b"x-backend") == b"b1"
    assert seen["query-match"].header(b"x-rule") == b"query-v2"
    assert seen["query-fallback"].header(b"x-rule") == b"query-other"
    assert seen["regex-path"].header(b"x-rule") == b"regex"
    assert seen["header-match"].header(b"x-rule") == b"beta"
    assert seen["method-match-with-body"].header(b"x-rule") == b"post"
    assert seen["method-match-with-body"].body == b'{"order": [1, 2, 3]}'
    assert seen["streamed-body"].body == b"part one|part two|part three"
    assert seen["streamed-body"].header(b"transfer-encoding") == b"chunked"
    assert seen["percent-encoded-path"].target == "/caf%C3%A9/a%20b?q=%2F"
    assert seen["percent-encoded-path"].header(b"x-rule") == b"default"
    assert seen["head"].method == "HEAD"


# ------------------------------------------------- the HTTP/2 writer and the Handler


def upgrade_request(key: bytes, path: str = "/ws") -> TunnelRequest:
    return TunnelRequest("GET", f"https://{HOST}{path}", [
        ("Sec-WebSocket-Key", key.decode()), ("CF-Connecting-IP", EDGE_IP)])


@asynccontextmanager
async def ws_world() -> AsyncIterator[tuple[Stack, EchoServer]]:
    async with EchoServer() as server, running(
            "--listen", "127.0.0.1:0", config={"version": 1, "rules": [{
                "hostnames": [HOST],
                "backends": [{"url": server.url, "weight": 1, "websocket": True}]}]},
    ) as stack:
        yield stack, server


@on_uvloop
async def test_http2_writer_turns_the_backends_101_into_200_then_pipes() -> None:
    async with TestBackend() as backend, running(
            "--listen", "127.0.0.1:0", config={"version": 1, "rules": [{
                "hostnames": [HOST],
                "backends": [{"url": backend.url, "weight": 1}]}]}) as stack:
        record = await Bridge(stack.runtime.in_flight).serve(
            TunnelRequest("GET", f"https://{HOST}/upgrade"), is_websocket=True)
        assert record.transport == "http2" and record.status == 200
        assert record.header(b"upgrade") == b"websocket"
        assert record.stream is not None and record.error is None
        await record.stream.write(b"raw bytes, no framing")
        assert await asyncio.wait_for(record.stream.read(), 5) == b"raw bytes, no framing"
        record.stream.close()
        await asyncio.wait_for(record.completion, 5)
        assert backend.requests[-1].header(b"upgrade") == b"websocket"
        assert backend.requests[-1].header(b"connection") == b"Upgrade"


class HijackFirst:
    """A stock reverse proxy's order: hijack, then write the 101. The writer a
    WriterResponder is given, reordered: asked for the 101, it hijacks first (the
    responder itself is compiled and cannot be subclassed here)."""

    def __init__(self, writer: Http2TransportWriter) -> None:
        self.writer = writer
        self._stream: ByteStream | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.writer, name)

    def write_resp_headers(self, status: int, headers: Headers) -> None:
        if status == 101:
            self._stream = self.writer.hijack()
        self.writer.write_resp_headers(status, headers)

    def hijack(self) -> ByteStream:
        assert self._stream is not None
        return self._stream


@on_uvloop
async def test_http2_writer_refuses_a_hijack_before_the_status() -> None:
    async with ws_world() as (stack, server):
        key = new_key()
        request = to_request(upgrade_request(key), is_websocket=True)
        sidecar.prepare(request)
        record = RecordedResponse("http2")
        writer = Http2TransportWriter(record, flush_always=True)
        with pytest.raises(WriterError, match=STATUS_NOT_WRITTEN):
            await stack.runtime.in_flight(request, WriterResponder(HijackFirst(writer)))
        assert writer.write_error_response()  # cloudflared's own 502 follows
        assert record.status == 502 and record.stream is None
        # The backend had switched already; the refused session must not linger there.
        session = server.sessions[-1]
        await asyncio.wait_for(session.ended.wait(), 3)
        assert session.saw_eof
        samples = await scrape(stack)
        assert samples["cftunnel_proxy_websocket_active_sessions"] == 0.0
        assert samples["cftunnel_proxy_requests_in_flight"] == 0.0
