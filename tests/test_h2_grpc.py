"""A real gRPC client and server (grpcio) through the cluster entrance over h2c and
over TLS (issue 41's acceptance): the client speaks HTTP/2 with prior knowledge, or
over TLS with ALPN h2 to ``--listen-tls``, to tunnelgate, which forwards each call to
the gRPC server as an h2c backend. Unary, server streaming,
client streaming and bidirectional calls; status, details and trailing metadata intact;
a deadline exceeded and a cancelled call both cancel the call on the server.

The gRPC server and client are grpcio's synchronous ones, run in threads (the proxy
runs in the test's event loop); methods take and return raw bytes (no protobuf)."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest

from tests.helpers import HOST, make_tls, on_uvloop
from tests.stack import running

SERVICE = "tg.Echo"
WAIT = 5.0  # longest a test waits for something to happen on the server side


class EchoServicer:
    """The server's methods; ``cancelled`` is set when a call's context ends early."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.entered = threading.Event()

    def unary(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.set_trailing_metadata((("x-trailer", "kept"),))
        return b"echo:" + request

    def fail(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.set_trailing_metadata((("x-why", "asked"),))
        context.abort(grpc.StatusCode.NOT_FOUND, "nothing called " + request.decode())

    def hang(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.add_callback(self.cancelled.set)
        self.entered.set()
        self.cancelled.wait(WAIT)
        return b"too late"

    def count(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        for i in range(int(request)):
            yield b"%d" % i

    def total(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        return b"%d" % sum(int(r) for r in requests)

    def chat(self, requests: Iterator[bytes], context: grpc.ServicerContext
             ) -> Iterator[bytes]:
        for request in requests:
            yield request.upper()


def _serve(servicer: EchoServicer) -> tuple[grpc.Server, int]:
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(servicer.unary),
        "Fail": grpc.unary_unary_rpc_method_handler(servicer.fail),
        "Hang": grpc.unary_unary_rpc_method_handler(servicer.hang),
        "Count": grpc.unary_stream_rpc_method_handler(servicer.count),
        "Total": grpc.stream_unary_rpc_method_handler(servicer.total),
        "Chat": grpc.stream_stream_rpc_method_handler(servicer.chat),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port(f"{HOST}:0")
    server.start()
    return server, port


def _config(port: int) -> dict[str, Any]:
    return {"version": 1, "rules": [{"backends": [
        {"url": f"http://{HOST}:{port}", "weight": 1, "protocol": "h2c"}]}]}


TRANSPORTS = ["h2c", "tls"]
NAME = "grpc.test"  # the TLS entrance's certificate's name


async def _through_proxy(test: Any, transport: str, tmp_path: Path) -> None:
    servicer = EchoServicer()
    server, port = _serve(servicer)
    try:
        if transport == "tls":
            files = make_tls(str(tmp_path), f"DNS:{NAME}")
            flags = ["--listen-tls", f"{HOST}:0", "--tls-cert", files.cert,
                     "--tls-key", files.key]
        else:
            flags = ["--listen", f"{HOST}:0"]
        async with running(*flags, config=_config(port)) as stack:
            if transport == "tls":
                channel = grpc.secure_channel(
                    f"{HOST}:{stack.tls_port}", grpc.ssl_channel_credentials(
                        files.ca_pem.encode()),
                    options=[("grpc.ssl_target_name_override", NAME),
                             ("grpc.default_authority", NAME)])
            else:
                channel = grpc.insecure_channel(f"{HOST}:{stack.cluster_port}")
            try:
                await test(channel, servicer)
            finally:
                channel.close()
    finally:
        server.stop(0)


def _method(channel: grpc.Channel, kind: str, name: str) -> Any:
    return getattr(channel, kind)(f"/{SERVICE}/{name}")


@pytest.mark.parametrize("transport", TRANSPORTS)
@on_uvloop
async def test_unary_with_trailing_metadata(transport: str, tmp_path: Path) -> None:
    async def check(channel: grpc.Channel, servicer: EchoServicer) -> None:
        call = _method(channel, "unary_unary", "Unary")
        answer, state = await asyncio.to_thread(call.with_call, b"hi", timeout=WAIT)
        assert answer == b"echo:hi"
        assert state.code() == grpc.StatusCode.OK
        assert ("x-trailer", "kept") in state.trailing_metadata()
    await _through_proxy(check, transport, tmp_path)


@pytest.mark.parametrize("transport", TRANSPORTS)
@on_uvloop
async def test_status_details_and_trailers_of_a_failed_call(transport: str, tmp_path: Path) -> None:
    async def check(channel: grpc.Channel, servicer: EchoServicer) -> None:
        call = _method(channel, "unary_unary", "Fail")
        with pytest.raises(grpc.RpcError) as failure:
            await asyncio.to_thread(call, b"bob", timeout=WAIT)
        error: Any = failure.value
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error.details() == "nothing called bob"
        assert ("x-why", "asked") in error.trailing_metadata()
    await _through_proxy(check, transport, tmp_path)


@pytest.mark.parametrize("transport", TRANSPORTS)
@on_uvloop
async def test_streaming_every_way(transport: str, tmp_path: Path) -> None:
    async def check(channel: grpc.Channel, servicer: EchoServicer) -> None:
        count = _method(channel, "unary_stream", "Count")
        assert await asyncio.to_thread(lambda: list(count(b"50", timeout=WAIT))) == [
            b"%d" % i for i in range(50)]
        total = _method(channel, "stream_unary", "Total")
        assert await asyncio.to_thread(
            total, iter([b"%d" % i for i in range(100)]), timeout=WAIT) == b"4950"
        chat = _method(channel, "stream_stream", "Chat")
        words = [b"alpha", b"beta", b"x" * 100_000]
        assert await asyncio.to_thread(
            lambda: list(chat(iter(words), timeout=WAIT))) == [w.upper() for w in words]
    await _through_proxy(check, transport, tmp_path)


@pytest.mark.parametrize("transport", TRANSPORTS)
@on_uvloop
async def test_deadline_exceeded_cancels_the_server_call(transport: str, tmp_path: Path) -> None:
    async def check(channel: grpc.Channel, servicer: EchoServicer) -> None:
        hang = _method(channel, "unary_unary", "Hang")
        with pytest.raises(grpc.RpcError) as failure:
            await asyncio.to_thread(hang, b"", timeout=0.5)
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
        assert await asyncio.to_thread(servicer.cancelled.wait, WAIT)
    await _through_proxy(check, transport, tmp_path)


@pytest.mark.parametrize("transport", TRANSPORTS)
@on_uvloop
async def test_a_cancelled_call_cancels_the_server_call(transport: str, tmp_path: Path) -> None:
    async def check(channel: grpc.Channel, servicer: EchoServicer) -> None:
        hang = _method(channel, "unary_unary", "Hang")
        future = hang.future(b"")
        assert await asyncio.to_thread(servicer.entered.wait, WAIT)
        future.cancel()
        assert await asyncio.to_thread(servicer.cancelled.wait, WAIT)
        assert future.cancelled()
    await _through_proxy(check, transport, tmp_path)
