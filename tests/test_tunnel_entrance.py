"""The tunnel entrance as cloudflared uses it: room for the edge's own header fields,
and gRPC to an h2c backend (a real ``h2`` server) with ``te: trailers`` on every call.

The edge and cloudflared add a dozen or more fields (Cf-Ray, Cf-Visitor, Cdn-Loop,
Cf-Warp-Tag-Id, X-Forwarded-*, ...) before a request reaches the tunnel entrance, so
the count limit must leave a client well over a hundred of its own.
"""

from __future__ import annotations

import pytest

from proxy.control.settings import DEFAULT_MAX_HEADER_COUNT, SettingsError
from tests.helpers import HOST, RawClient, RawResponse, TestBackend
from tests.stack import make_settings, running
from tests.test_h2c import H2Backend, assert_grpc_trailers_relayed, h2c_config

TUNNEL = ("--tunnel-listen", f"{HOST}:0")
EDGE = [(b"Cdn-Loop", b"cloudflare"), (b"Cf-Connecting-Ip", b"203.0.113.7"),
        (b"Cf-Ipcountry", b"XX"), (b"Cf-Ray", b"8f00000000000000-TST"),
        (b"Cf-Visitor", b'{"scheme":"https"}'),
        (b"Cf-Warp-Tag-Id", b"957a6b87-44f9-4858-9f9c-44557b79f8f7"),
        (b"Connection", b"keep-alive"), (b"X-Forwarded-For", b"203.0.113.7"),
        (b"X-Forwarded-Proto", b"https"), (b"Accept-Encoding", b"gzip")]


def config(url: str) -> dict:
    return {"version": 1, "rules": [{"backends": [{"url": url, "weight": 1}]}]}


async def send(port: int, head: list[bytes], body: bytes = b"") -> RawResponse:
    client = await RawClient.connect(port)
    try:
        client.send(b"\r\n".join(head) + b"\r\n\r\n" + body)
        return await client.read_response()
    finally:
        client.close()


def with_headers(count: int) -> list[bytes]:
    """A GET with the edge's fields and ``count`` client fields of its own."""
    return ([b"GET /echo HTTP/1.1", b"Host: app.example.com"]
            + [n + b": " + v for n, v in EDGE]
            + [b"X-H%d: %d" % (i, i) for i in range(count)])


async def test_150_client_headers_pass_the_tunnel_entrance_by_default() -> None:
    async with TestBackend() as backend, running(*TUNNEL, config=config(backend.url)) as stack:
        answer = await send(stack.tunnel_port, with_headers(150))
        assert answer.status == 200
        seen = backend.requests[-1]
        assert seen.header(b"x-h149") == b"149"
        assert seen.header(b"cf-ray") == b"8f00000000000000-TST"
        # Host + 10 edge fields + 150: still below the default (not at the edge of it).
        assert 1 + len(EDGE) + 150 < DEFAULT_MAX_HEADER_COUNT


@pytest.mark.parametrize("entrance", ["tunnel", "cluster"])
async def test_max_header_count_lowers_the_limit_on_both_entrances(entrance: str) -> None:
    async with TestBackend() as backend, running(
            *TUNNEL, "--listen", f"{HOST}:0", "--cluster-scope", "all",
            "--max-header-count", "40", config=config(backend.url)) as stack:
        port = stack.tunnel_port if entrance == "tunnel" else stack.cluster_port
        # 1 (Host) + 10 (edge) + 29 = 40 fields: allowed; one more is a 431.
        assert (await send(port, with_headers(29))).status == 200
        assert (await send(port, with_headers(30))).status == 431
    assert len(backend.requests) == 1


def test_max_header_count_from_the_environment_and_bad_values() -> None:
    assert make_settings().max_header_count == DEFAULT_MAX_HEADER_COUNT == 200
    assert make_settings(environ={"PROXY_MAX_HEADER_COUNT": "300"}).max_header_count == 300
    flag = make_settings("--max-header-count", "50",
                         environ={"PROXY_MAX_HEADER_COUNT": "300"})
    assert flag.max_header_count == 50
    for flags, environ, name in ((("--max-header-count", "0"), {}, "--max-header-count"),
                                 ((), {"PROXY_MAX_HEADER_COUNT": "many"},
                                  "PROXY_MAX_HEADER_COUNT")):
        with pytest.raises(SettingsError) as raised:
            make_settings(*flags, environ=environ)
        assert raised.value.name == name


# ----------------------------------------------------------------------------- gRPC

GRPC_PING = b"\0\0\0\0\x05hello"  # one uncompressed length-prefixed message


def grpc_call(te: bool) -> list[bytes]:
    head = [b"POST /trailers HTTP/1.1", b"Host: grpc.example.com",
            b"Content-Length: %d" % len(GRPC_PING), b"Content-Type: application/grpc"]
    head += [n + b": " + v for n, v in EDGE]
    return head + ([b"TE: trailers"] if te else [])


async def test_grpc_unary_call_through_the_tunnel_entrance_to_h2c() -> None:
    async with H2Backend() as backend, running(
            *TUNNEL, config=h2c_config(backend.url)) as stack:
        # cloudflared does not pass the client's TE on: the backend must still see it.
        without = await send(stack.tunnel_port, grpc_call(te=False), GRPC_PING)
        assert without.status == 200
        assert (b"te", b"trailers") in backend.requests[-1].headers
        # The HTTP/1.1 client that announced trailers gets gRPC's status back.
        answer = await send(stack.tunnel_port, grpc_call(te=True), GRPC_PING)
        assert (b"te", b"trailers") in backend.requests[-1].headers
    assert_grpc_trailers_relayed(answer)
    assert [r.method for r in backend.requests] == ["POST", "POST"]
