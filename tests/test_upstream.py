"""Upstream pools against real backends: reuse, bodies both ways, framing, stale
connections, errors and their reasons, TLS (own CA, SAN lists, mTLS), upgrades."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from dataclasses import replace

import pytest

from proxy.request import EMPTY_BODY, BodyError, BytesBody
from proxy.upstream.base import UpstreamError
from proxy.upstream.dial import dns_matches
from proxy.upstream.registry import Pools, config_pool_keys
from proxy.upstream.response import RESPONSE_HIGH_WATER, UpstreamResponse
from routing.model import Backend, BackendTLS, Config, Filter, Mirror, Rule
from tests.helpers import HOST, TestBackend, TLSFiles, make_tls, on_uvloop


async def body_of(response: UpstreamResponse) -> bytes:
    data = b""
    while chunk := await response.read():
        data += chunk
    return data


async def get(pools: Pools, backend: Backend, target: str, **kw: object) -> UpstreamResponse:
    return await pools.get(backend).send("GET", target, [(b"Host", b"app.example")],
                                         EMPTY_BODY, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- exchanges


@on_uvloop
async def test_get_reuses_one_connection_and_sends_no_extra_headers() -> None:
    pools = Pools()
    async with TestBackend() as server:
        backend = Backend(url=server.url)
        for i in range(5):
            response = await get(pools, backend, f"/echo?i={i}")
            assert response.status == 200 and response.reason == "OK"
            echo = json.loads(await body_of(response))
            assert echo["query"] == f"i={i}"
            assert echo["headers"] == [["Host", "app.example"]]  # no Connection, no CL
        assert server.connections == 1
    pools.close()


@pytest.mark.parametrize("method, body, framing", [
    ("POST", BytesBody(b"small body"), ("Content-Length", "10")),
    ("PUT", BytesBody(b"L" * 1_000_000), ("Content-Length", "1000000")),
    ("POST", BytesBody(b"c" * 300_000, declare_length=False), ("Transfer-Encoding", "chunked")),
    ("POST", BytesBody(b""), ("Content-Length", "0")),
])
@on_uvloop
async def test_request_bodies_are_framed_from_body_length(method: str, body: BytesBody,
                                                          framing: tuple[str, str]) -> None:
    pools = Pools()
    expected = body._data  # type: ignore[attr-defined]
    async with TestBackend() as server:
        response = await pools.get(Backend(url=server.url)).send(
            method, "/echo", [(b"Host", b"h")], body)
        echo = json.loads(await body_of(response))
    assert echo["body"].encode("latin-1") == expected
    assert framing in [tuple(h) for h in echo["headers"]]
    pools.close()


@on_uvloop
async def test_response_bodies_length_chunked_trailers_and_eof() -> None:
    pools = Pools()
    async with TestBackend() as server:
        backend = Backend(url=server.url)
        response = await get(pools, backend, "/fixed?size=1000000")
        assert response.length == 1_000_000
        assert await body_of(response) == b"x" * 1_000_000
        response = await get(pools, backend, "/chunked?size=300000&chunk=1000")
        assert response.length is None
        assert len(await body_of(response)) == 300_000
        response = await get(pools, backend, "/trailers")
        assert await body_of(response) == b"ok"
        assert response.trailers == [(b"Grpc-Status", b"0")]
        assert server.connections == 1
        response = await get(pools, backend, "/eof?size=5000")
        assert len(await body_of(response)) == 5000  # read to EOF...
        await get(pools, backend, "/echo")
        assert server.connections == 2  # ...and that connection was not reused
    pools.close()


@on_uvloop
async def test_head_204_and_interim_responses_keep_the_connection_in_sync() -> None:
    pools = Pools()
    async with TestBackend() as server:
        backend = Backend(url=server.url)
        pool = pools.get(backend)
        response = await pool.send("HEAD", "/fixed?size=100", [(b"Host", b"h")], EMPTY_BODY)
        assert (response.status, response.length) == (200, 100)
        assert await response.read() == b""
        response = await get(pools, backend, "/status/204")
        assert response.status == 204 and await response.read() == b""
        response = await get(pools, backend, "/interim")
        assert response.status == 200  # 100 and 103 skipped
        assert json.loads(await body_of(response))["path"] == "/interim"
        response = await get(pools, backend, "/fixed?size=3")
        assert await body_of(response) == b"xxx"
        # The HEAD's answer announced the body a GET would get (Content-Length: 100,
        # RFC 9110 §9.3.2) and none came: its connection took 204, the interim answers
        # and the rest too.
        assert server.connections == 1
    pools.close()


@on_uvloop
async def test_response_backpressure_bounds_buffering() -> None:
    pools = Pools()
    async with TestBackend() as server:
        response = await get(pools, Backend(url=server.url), "/fixed?size=8000000")
        await asyncio.sleep(0.2)  # the backend keeps sending meanwhile
        assert response.buffered <= RESPONSE_HIGH_WATER + 512 * 1024  # type: ignore[attr-defined]
        assert len(await body_of(response)) == 8_000_000
    pools.close()


@on_uvloop
async def test_connection_returned_with_a_full_buffer_reads_again() -> None:
    pools = Pools()
    async with TestBackend() as server:
        backend = Backend(url=server.url)
        # Arrives in one piece, above the high-water mark: reading pauses just as the
        # message completes and the connection goes back to the pool.
        response = await get(pools, backend, f"/fixed?size={RESPONSE_HIGH_WATER + 4000}")
        await asyncio.sleep(0.05)
        assert len(await body_of(response)) == RESPONSE_HIGH_WATER + 4000
        response = await get(pools, backend, "/fixed?size=10", head_timeout=2.0)
        assert await body_of(response) == b"x" * 10
        assert server.connections == 1
    pools.close()


@on_uvloop
async def test_concurrent_exchanges_share_the_pool_safely() -> None:
    pools = Pools()
    async with TestBackend() as server:
        backend = Backend(url=server.url)

        async def worker(index: int) -> list[str]:
            seen = []
            for i in range(25):
                response = await get(pools, backend, f"/echo?w={index}&i={i}",
                                     head_timeout=5.0)
                seen.append(json.loads(await body_of(response))["query"])
            return seen

        results = await asyncio.gather(*(worker(w) for w in range(8)))
        assert results == [[f"w={w}&i={i}" for i in range(25)] for w in range(8)]
        assert server.connections <= 8
    pools.close()


@on_uvloop
async def test_upgrade_detaches_a_raw_stream() -> None:
    pools = Pools()
    async with TestBackend() as server:
        response = await pools.get(Backend(url=server.url)).send(
            "GET", "/upgrade", [(b"Host", b"h"), (b"Connection", b"Upgrade"),
                                (b"Upgrade", b"websocket")], EMPTY_BODY)
        assert response.status == 101
        stream = response.detach()
        await stream.write(b"ping")
        assert await stream.read() == b"ping"
        stream.close()
    pools.close()


# ----------------------------------------------------------------- stale connections


@on_uvloop
async def test_stale_reused_connection_is_retried_once_for_idempotent_requests() -> None:
    pools = Pools()
    async with TestBackend(drop_reused=True) as server:
        backend = Backend(url=server.url)
        assert (await get(pools, backend, "/echo?n=1")).status == 200
        response = await get(pools, backend, "/echo?n=2")  # pooled conn dropped, retried
        assert json.loads(await body_of(response))["query"] == "n=2"
        assert server.connections == 2
        assert [r.target for r in server.requests] == ["/echo?n=1", "/echo?n=2", "/echo?n=2"]
        # A POST with a body is never replayed: its body was consumed.
        with pytest.raises(UpstreamError) as caught:
            await pools.get(backend).send("POST", "/echo", [(b"Host", b"h")],
                                          BytesBody(b"once"))
        assert caught.value.reason == "other"
    pools.close()


@on_uvloop
async def test_connection_closed_while_idle_is_not_reused() -> None:
    pools = Pools()
    async with TestBackend(idle_close=0.05) as server:
        backend = Backend(url=server.url)
        await body_of(await get(pools, backend, "/echo"))
        await asyncio.sleep(0.3)
        await body_of(await get(pools, backend, "/echo"))
        assert server.connections == 2
        assert len(server.requests) == 2  # detected before reuse: nothing was retried
    pools.close()


# ---------------------------------------------------------------------------- errors


@on_uvloop
async def test_closed_port_is_a_dial_error() -> None:
    sock = socket.socket()
    sock.bind((HOST, 0))
    port = sock.getsockname()[1]
    sock.close()
    pools = Pools()
    with pytest.raises(UpstreamError) as caught:
        await get(pools, Backend(url=f"http://{HOST}:{port}"), "/")
    assert caught.value.reason == "dial"


@on_uvloop
async def test_hanging_backend_times_out_within_the_head_deadline() -> None:
    pools = Pools()
    async with TestBackend() as server:
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(UpstreamError) as caught:
            await get(pools, Backend(url=server.url), "/hang", head_timeout=0.2)
        assert caught.value.reason == "timeout"
        assert 0.15 <= loop.time() - began < 1.0
        # Slow but within the deadline is fine.
        response = await get(pools, Backend(url=server.url), "/slow?delay=0.05",
                             head_timeout=2.0)
        assert response.status == 200
    pools.close()


@pytest.mark.parametrize("path", ["/garbage", "/close"])
@on_uvloop
async def test_garbage_or_no_reply_is_other(path: str) -> None:
    pools = Pools()
    async with TestBackend() as server:
        with pytest.raises(UpstreamError) as caught:
            await get(pools, Backend(url=server.url), path)
        assert caught.value.reason == "other"
    pools.close()


@on_uvloop
async def test_truncated_body_raises_other_on_read() -> None:
    pools = Pools()
    async with TestBackend() as server:
        response = await get(pools, Backend(url=server.url), "/close-early")
        assert response.status == 200
        with pytest.raises(UpstreamError) as caught:
            await body_of(response)
        assert caught.value.reason == "other"
    pools.close()


@on_uvloop
async def test_h2c_backend_goes_to_the_http2_pool() -> None:
    # A closed port proves the h2c pool dialled (HTTP/2 itself: tests/test_h2c.py).
    with pytest.raises(UpstreamError) as caught:
        await get(Pools(), Backend(url="http://127.0.0.1:1", protocol="h2c"), "/")
    assert caught.value.reason == "dial"


@on_uvloop
async def test_failing_client_body_cancels_the_exchange() -> None:
    class Broken:
        length = None

        async def read(self) -> bytes:
            raise BodyError("client went away")

    pools = Pools()
    async with TestBackend() as server:
        with pytest.raises(UpstreamError) as caught:
            await pools.get(Backend(url=server.url)).send(
                "POST", "/echo", [(b"Host", b"h")], Broken())
        assert caught.value.reason == "canceled"
    pools.close()


@on_uvloop
async def test_cancelled_exchange_closes_its_connection() -> None:
    pools = Pools()
    async with TestBackend() as server:
        backend = Backend(url=server.url)
        task = asyncio.ensure_future(get(pools, backend, "/hang"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await get(pools, backend, "/echo")
        assert server.connections == 2  # the hung connection was not pooled
    pools.close()


# ------------------------------------------------------------------------------ pools


@on_uvloop
async def test_pools_share_by_key_and_retain_drops_unused() -> None:
    pools = Pools()
    async with TestBackend() as one, TestBackend() as two:
        a, a_again, b = (Backend(url=one.url, weight=1), Backend(url=one.url + "/base"),
                         Backend(url=two.url))
        assert pools.get(a) is pools.get(a_again)
        assert pools.get(a) is not pools.get(b)
        await body_of(await get(pools, a, "/echo"))
        await body_of(await get(pools, b, "/echo"))
        pool_b = pools.get(b)
        mirror = Filter(type="RequestMirror", request_mirror=Mirror(backend_url=two.url))
        pools.retain(config_pool_keys(
            Config(version=2, rules=(Rule(backends=(a,), filters=(mirror,)),))))
        assert pools.get(b) is pool_b  # still used, by the mirror
        pools.retain(config_pool_keys(Config(version=3, rules=(Rule(backends=(a_again,)),))))
        assert pools.get(b) is not pool_b  # dropped, its idle connection closed
        await body_of(await get(pools, a, "/echo"))
        assert one.connections == 1  # survived both pushes
    pools.close()


@on_uvloop
async def test_idle_connections_expire_and_are_bounded() -> None:
    async with TestBackend() as server:
        backend = Backend(url=server.url)
        pools = Pools(idle_timeout=0.1, max_idle=2)
        responses = await asyncio.gather(*(get(pools, backend, "/echo") for _ in range(4)))
        for response in responses:
            await body_of(response)
        assert server.connections == 4
        assert len(pools.get(backend)._idle) == 2  # type: ignore[attr-defined]
        await asyncio.sleep(0.3)
        assert pools.get(backend)._idle == []  # type: ignore[attr-defined]
        await body_of(await get(pools, backend, "/echo"))
        assert server.connections == 5
        pools.close()


# -------------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TLSFiles]:
    directory = str(tmp_path_factory.mktemp("tls"))
    return {
        "server": make_tls(directory, "DNS:backend.test,DNS:*.wild.test,"
                                      "URI:spiffe://cluster.local/ns/default/sa/api"),
        "other": make_tls(directory, "DNS:backend.test", name="other"),
        "client": make_tls(directory, "DNS:client.test", name="client"),
    }


@pytest.mark.parametrize("tls, ok", [
    (BackendTLS(server_name="backend.test"), True),
    (BackendTLS(server_name="wrong.test"), False),
    (BackendTLS(subject_alt_names=("x.wild.test",)), True),  # RFC 6125 wildcard
    (BackendTLS(subject_alt_names=("a.b.wild.test",)), False),
    (BackendTLS(subject_alt_name_uris=("spiffe://cluster.local/ns/default/sa/api",)), True),
    (BackendTLS(subject_alt_names=("other.test",),
                subject_alt_name_uris=("spiffe://cluster.local/ns/x/sa/y",)), False),
])
@on_uvloop
async def test_tls_verification(tls_files: dict[str, TLSFiles], tls: BackendTLS,
                                ok: bool) -> None:
    files = tls_files["server"]
    pools = Pools()
    async with TestBackend(tls=files.server_context()) as server:
        backend = Backend(url=server.url, tls=replace(tls, ca_bundle=files.ca_pem))
        if ok:
            assert (await get(pools, backend, "/echo")).status == 200
        else:
            with pytest.raises(UpstreamError) as caught:
                await get(pools, backend, "/echo")
            assert caught.value.reason == "tls"
    pools.close()


@pytest.mark.parametrize("bundle", ["other", "garbage"])
@on_uvloop
async def test_untrusted_or_unparseable_ca_fails_closed(tls_files: dict[str, TLSFiles],
                                                        bundle: str) -> None:
    ca = tls_files["other"].ca_pem if bundle == "other" else "not a PEM bundle"
    pools = Pools()
    async with TestBackend(tls=tls_files["server"].server_context()) as server:
        backend = Backend(url=server.url, tls=BackendTLS(ca_bundle=ca,
                                                         server_name="backend.test"))
        with pytest.raises(UpstreamError) as caught:
            await get(pools, backend, "/echo")
        assert caught.value.reason == "tls"
        assert server.requests == []  # never downgraded to plaintext
    pools.close()


@on_uvloop
async def test_mutual_tls_presents_the_client_certificate(
        tls_files: dict[str, TLSFiles]) -> None:
    server_files, client = tls_files["server"], tls_files["client"]
    context = server_files.server_context(client_ca=client.ca_pem)
    # TLS 1.2 makes the server refuse inside the handshake: asyncio's server side drops
    # the TLS 1.3 post-handshake alert unsent, which no client could classify.
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    pools = Pools()
    async with TestBackend(tls=context) as server:
        tls = BackendTLS(ca_bundle=server_files.ca_pem, server_name="backend.test",
                         client_cert_pem=client.read(client.cert),
                         client_key_pem=client.read(client.key))
        assert (await get(pools, Backend(url=server.url, tls=tls), "/echo")).status == 200
        without = Backend(url=server.url, tls=replace(tls, client_cert_pem=b""))
        with pytest.raises(UpstreamError) as caught:
            await get(pools, without, "/echo")
        assert caught.value.reason == "tls"
    pools.close()


@pytest.mark.parametrize("pattern, name, expected", [
    ("api.example.com", "API.example.com.", True),
    ("*.example.com", "a.example.com", True),
    ("*.example.com", "a.b.example.com", False),
    ("*.example.com", "example.com", False),
    ("*.com", "example.com", False),  # a wildcard needs two labels after it
    ("a*.example.com", "ab.example.com", False),  # partial wildcards: not supported
])
def test_dns_matches(pattern: str, name: str, expected: bool) -> None:
    assert dns_matches(pattern, name) is expected
