"""HTTP/2 on the entrances (issue 41): prior knowledge on the same port as HTTP/1.1,
the same Handler behind it, to HTTP/1.1 and h2c backends, over real loopback sockets."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
from hyperframe.frame import GoAwayFrame

from proxy.control import demo
from proxy.entrances.http1 import HTTP1Protocol
from proxy.entrances.listener import Entrance, EntranceSettings
from proxy.request import Request, Responder
from tests.h2client import H2Client
from tests.helpers import HOST, RawClient, TestBackend, make_tls, on_uvloop
from tests.knative import QueueProxy, proxy_v2_header
from tests.test_h2c import H2Backend
from tests.test_knative_probe import knative_config, knative_hash
from tests.stack import running

LISTEN = ("--listen", f"{HOST}:0")
INTERNAL_ERROR = 0x2  # RST_STREAM / GOAWAY error codes (RFC 9113 §7)
REFUSED_STREAM = 0x7
CANCEL = 0x8


def _config(url: str, protocol: str | None = None) -> dict:
    backend: dict = {"url": url, "weight": 1}
    if protocol:
        backend["protocol"] = protocol
    return {"version": 1, "rules": [{"backends": [backend]}]}


@on_uvloop
async def test_prior_knowledge_and_http1_share_the_port() -> None:
    async with TestBackend() as backend, running(*LISTEN, config=_config(backend.url)) as stack:
        client = await H2Client.connect(stack.cluster_port)
        try:
            reply = await client.request("POST", "/echo?a=1", [(b"x-test", b"yes")], b"hello")
        finally:
            client.close()
        assert reply.status == 200
        seen = json.loads(bytes(reply.body))
        assert seen["path"] == "/echo" and seen["query"] == "a=1" and seen["body"] == "hello"
        assert ["x-test", "yes"] in seen["headers"]
        raw = await RawClient.connect(stack.cluster_port)
        raw.send(b"GET /echo HTTP/1.1\r\nHost: example.test\r\n\r\n")
        response = await raw.read_response()
        raw.close()
        assert response.status == 200


# -- the demo config: curl over HTTP/1.1 and with --http2-prior-knowledge


DEMO = ["-H", "Host: demo.local"]
DEMO_REQUESTS = [  # (path, curl arguments): the demo's banner, without the random split
    ("/", [*DEMO, "-H", "X-Canary: always"]),
    ("/green", DEMO),
    ("/old/page", DEMO),
    ("/api/users", DEMO),
    ("/nothing-here", ["-H", "Host: other.example"]),
    ("/", ["-H", "Host: x.demo.local"]),
    ("/green", [*DEMO, "-X", "POST", "--data-binary", "payload"]),
    ("/green", [*DEMO, "-I"]),
]


async def _curl(port: int, path: str, extra: list[str], http2: bool) -> tuple[int, dict, bytes]:
    args = ["curl", "-s", "-i", "--max-time", "5", *extra,
            f"http://{HOST}:{port}{path}"]
    if http2:
        args.insert(1, "--http2-prior-knowledge")
    process = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
    out, _ = await process.communicate()
    head, _, body = out.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    assert status_line.startswith(b"HTTP/2 " if http2 else b"HTTP/1.1 "), status_line
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@on_uvloop
async def test_curl_gets_the_same_answers_over_http2_as_over_http1() -> None:
    blue, blue_port = await demo.start_backend("blue")
    green, green_port = await demo.start_backend("green")
    try:
        async with running(*LISTEN) as stack:
            await stack.runtime.admin.apply(demo.demo_config(blue_port, green_port))
            for path, extra in DEMO_REQUESTS:
                one = await _curl(stack.cluster_port, path, extra, http2=False)
                two = await _curl(stack.cluster_port, path, extra, http2=True)
                assert one[0] == two[0], (path, extra)
                for name in (b"x-demo-route", b"location", b"content-type",
                             b"content-length"):
                    assert one[1].get(name) == two[1].get(name), (path, extra, name)
                if one[2] and one[1].get(b"content-type") == b"application/json":
                    first, second = json.loads(one[2]), json.loads(two[2])
                    for key in ("backend", "method", "path", "body_bytes"):
                        assert first[key] == second[key], (path, extra, key)
                else:
                    assert one[2] == two[2], (path, extra)
    finally:
        blue.close()
        green.close()


# -- streaming, trailers, cancellation, drain


MB = 1024 * 1024


@on_uvloop
async def test_large_bodies_stream_both_ways_within_small_windows() -> None:
    async with TestBackend() as backend, running(*LISTEN, config=_config(backend.url)) as stack:
        client = await H2Client.connect(stack.cluster_port, window=16 * 1024)
        try:
            upload = bytes(range(256)) * 4096  # 1 MiB, more than every window
            reply = await client.request("PUT", "/echo", body=upload, timeout=20.0)
            assert reply.status == 200
            assert json.loads(bytes(reply.body))["body"].encode("latin-1") == upload
            reply = await client.request("GET", f"/chunked?size={3 * MB}&chunk=65536")
            assert reply.status == 200 and reply.reset is None
            assert len(reply.body) == 3 * MB
        finally:
            client.close()


@on_uvloop
async def test_trailers_reach_a_client_that_takes_them() -> None:
    async with TestBackend() as backend, running(*LISTEN, config=_config(backend.url)) as stack:
        client = await H2Client.connect(stack.cluster_port)
        try:
            reply = await client.request("GET", "/trailers", [(b"te", b"trailers")])
            plain = await client.request("GET", "/trailers")
        finally:
            client.close()
        assert bytes(reply.body) == b"ok" and (b"grpc-status", b"0") in reply.trailers
        assert bytes(plain.body) == b"ok" and plain.trailers == []


@on_uvloop
async def test_client_reset_cancels_the_h2c_backend_stream() -> None:
    async with H2Backend() as backend, running(
            *LISTEN, config=_config(backend.url, "h2c")) as stack:
        client = await H2Client.connect(stack.cluster_port)
        try:
            sid = client.open("GET", "/hang")
            for _ in range(200):
                if backend.requests:
                    break
                await asyncio.sleep(0.01)
            assert backend.requests
            client.reset(sid)
            for _ in range(200):
                if backend.resets:
                    break
                await asyncio.sleep(0.01)
            assert backend.resets == [CANCEL]
            reply = await client.request("GET", "/echo")  # the connection goes on
            assert reply.status == 200
        finally:
            client.close()


@on_uvloop
async def test_a_broken_backend_answer_reaches_the_client_as_a_reset() -> None:
    async with TestBackend() as backend, running(*LISTEN, config=_config(backend.url)) as stack:
        client = await H2Client.connect(stack.cluster_port)
        try:
            broken = await client.request("GET", "/close-early")
            after = await client.request("GET", "/echo")
        finally:
            client.close()
        assert broken.status == 200 and broken.reset == INTERNAL_ERROR
        assert after.status == 200


@on_uvloop
async def test_drain_sends_goaway_and_lets_streams_in_flight_finish() -> None:
    async with TestBackend() as backend, running(*LISTEN, config=_config(backend.url)) as stack:
        client = await H2Client.connect(stack.cluster_port)
        try:
            first = client.open("GET", "/slow?delay=0.5")
            await asyncio.sleep(0.1)
            stack.runtime.plane.stop_accepting("cluster")  # type: ignore[union-attr]
            late = client.open("GET", "/echo")
            reply = await client.reply(first)
            refused = await client.reply(late)
            await client.wait_closed()
        finally:
            client.close()
        assert client.goaway == (0, first)
        assert reply.status == 200
        assert refused.reset == REFUSED_STREAM


@on_uvloop
async def test_knative_probe_over_h2c() -> None:
    pods = {name: await QueueProxy(name).start() for name in ("hello-00001", "hello-00002")}
    digest = knative_hash("h2")
    try:
        config = knative_config(1, digest, {n: p.url for n, p in pods.items()})
        async with running(*LISTEN, config=config) as stack:
            client = await H2Client.connect(stack.cluster_port)
            try:
                probe = [(b"user-agent", b"Knative-Ingress-Probe"),
                         (b"k-network-hash", b"override"), (b"k-network-probe", b"probe")]
                ready = await client.request("GET", "/", probe,
                                             authority=b"hello.default.svc")
                for pod in pods.values():
                    await pod.close()
                down = await client.request("GET", "/", probe,
                                            authority=b"hello.default.svc")
            finally:
                client.close()
        assert ready.status == 200 and ready.header(b"k-network-hash") == digest.encode()
        assert down.status == 503
    finally:
        for pod in pods.values():
            await pod.close()


@on_uvloop
async def test_requests_over_http2_are_counted_and_logged(capsys: Any) -> None:
    async with TestBackend() as backend, running(
            *LISTEN, config=_config(backend.url),
            environ={"PROXY_ACCESS_LOG_ENABLED": "true"}) as stack:
        client = await H2Client.connect(stack.cluster_port)
        try:
            for _ in range(3):
                assert (await client.request("GET", "/echo?n=1")).status == 200
        finally:
            client.close()
        async with httpx.AsyncClient() as admin:
            metrics = (await admin.get(f"{stack.admin_url}/metrics")).text
    counted = [line for line in metrics.splitlines()
               if line.startswith("cftunnel_proxy_requests_total") and '"2xx"' in line]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) == 3.0
    logged = [json.loads(line) for line in capsys.readouterr().out.splitlines()
              if '"access"' in line]
    assert len(logged) == 3 and all(line["status"] == 200 for line in logged)


@on_uvloop
async def test_after_max_requests_a_graceful_goaway_ends_the_connection() -> None:
    async with TestBackend() as backend, running(
            *LISTEN, "--h2-max-requests", "3", config=_config(backend.url)) as stack:
        client = await H2Client.connect(stack.cluster_port)
        try:
            sids = [client.open("GET", "/slow?delay=0.2") for _ in range(4)]  # 1 3 5 7
            replies = [await client.reply(sid) for sid in sids]
            await client.wait_closed()
        finally:
            client.close()
        assert [reply.status for reply in replies[:3]] == [200, 200, 200]
        assert client.goaway == (0, 5) and replies[3].reset == REFUSED_STREAM


@on_uvloop
async def test_streams_in_flight_are_answered_after_the_clients_goaway() -> None:
    async with TestBackend() as backend, running(*LISTEN, config=_config(backend.url)) as stack:
        client = await H2Client.connect(stack.cluster_port)
        try:
            sid = client.open("GET", "/slow?delay=0.3")
            client.send_raw(GoAwayFrame(0, last_stream_id=0).serialize())  # h2load's end
            reply = await client.reply(sid)
            await client.wait_closed()  # nothing left: the server closes
        finally:
            client.close()
        assert reply.status == 200 and reply.reset is None


@on_uvloop
async def test_a_malformed_request_gets_400_and_the_connection_goes_on() -> None:
    async with TestBackend() as backend, running(*LISTEN, config=_config(backend.url)) as stack:
        client = await H2Client.connect(stack.cluster_port)
        client.conn.config.validate_outbound_headers = False  # send what h2 would refuse
        client.conn.config.normalize_outbound_headers = False
        try:
            bad = await client.request("GET", "/echo", [(b"x-bad", b"a\nInjected: 1")])
            upper = await client.request("GET", "/echo", [(b"X-Upper", b"1")])
            fine = await client.request("GET", "/echo")
        finally:
            client.close()
        assert bad.status == 400 and upper.status == 400 and fine.status == 200
        assert len(backend.requests) == 1


# -- the TLS seam: a TLS listener with the entrance's protocol factory and ALPN


async def _hello(request: Request, responder: Responder) -> None:
    responder.respond(200, [(b"content-type", b"text/plain")],
                      f"{request.http_version} {request.host}{request.path}".encode())


@on_uvloop
async def test_alpn_h2_over_tls_uses_the_same_protocol_factory(tmp_path: Path) -> None:
    files = make_tls(str(tmp_path), san="DNS:gateway.test")
    server_tls = files.server_context()
    server_tls.set_alpn_protocols(["h2", "http/1.1"])
    loop = asyncio.get_running_loop()
    entrance = Entrance(_hello, EntranceSettings(name="cluster", scheme="https"), loop)
    server = await loop.create_server(lambda: HTTP1Protocol(entrance), HOST, 0,
                                      ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    try:
        for alpn, expected in ((["h2"], b"2 gateway.test/x"),
                               (["http/1.1"], b"1.1 gateway.test/x")):
            client_tls = ssl.create_default_context(cadata=files.ca_pem)
            client_tls.set_alpn_protocols(alpn)
            if alpn == ["h2"]:
                client = await H2Client.connect(port, tls=client_tls,
                                                server_hostname="gateway.test")
                try:
                    reply = await client.request("GET", "/x", authority=b"gateway.test")
                finally:
                    client.close()
                assert reply.status == 200 and bytes(reply.body) == expected
            else:
                reader, writer = await asyncio.open_connection(
                    HOST, port, ssl=client_tls, server_hostname="gateway.test")
                writer.write(b"GET /x HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
                answer = await asyncio.wait_for(reader.read(65536), 5)
                writer.close()
                assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(expected)
    finally:
        server.close()


@on_uvloop
@pytest.mark.parametrize("split", [False, True])
async def test_prior_knowledge_after_a_proxy_protocol_header(split: bool) -> None:
    async with TestBackend() as backend, running(
            *LISTEN, "--cluster-proxy-protocol", config=_config(backend.url)) as stack:
        reader, writer = await asyncio.open_connection(HOST, stack.cluster_port)
        header = proxy_v2_header(("203.0.113.7", 40000), (HOST, stack.cluster_port))
        first = b"PRI * HTTP/2.0\r\n"
        if split:  # the header alone, then the preface in two reads of its own
            writer.write(header)
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(first)
            await writer.drain()
            await asyncio.sleep(0.05)
        else:
            writer.write(header)  # the preface follows in the same segment
        client = H2Client(reader, _Rest(writer, first if split else b""),  # type: ignore[arg-type]
                          None)
        try:
            reply = await client.request("GET", "/echo")
        finally:
            client.close()
        assert reply.status == 200
        headers = dict((n.lower(), v) for n, v in json.loads(bytes(reply.body))["headers"])
        assert headers["x-forwarded-for"] == "203.0.113.7"


class _Rest:
    """A stream writer whose first write loses the part of it already sent."""

    def __init__(self, writer: asyncio.StreamWriter, sent: bytes) -> None:
        self.writer, self.sent, self.transport = writer, sent, writer.transport

    def write(self, data: bytes) -> None:
        if self.sent:
            assert data.startswith(self.sent)
            data, self.sent = data[len(self.sent):], b""
        self.writer.write(data)

    def is_closing(self) -> bool:
        return self.writer.is_closing()
