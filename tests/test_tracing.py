"""Tracing end to end: spans exported over OTLP/gRPC to a real collector endpoint (the
collector's TraceService from opentelemetry-proto, served by grpcio in this process),
W3C trace context in and out, sampling, and the workers path."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from concurrent import futures
from contextlib import redirect_stdout
from typing import Any, AsyncIterator, Iterator

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from proxy.observability.tracing import _unsampled_parent
from tests.helpers import TestBackend
from tests.stack import running
from tests.test_workers import Supervisor

HOST = "app.example.com"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SERVER, CLIENT = trace_pb2.Span.SPAN_KIND_SERVER, trace_pb2.Span.SPAN_KIND_CLIENT


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace endpoint on 127.0.0.1 that keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[trace_pb2.Span] = []
        self.resources: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC's name)
        with self._changed:
            for resource_spans in request.resource_spans:
                self.resources.append(attributes(resource_spans.resource))
                for scope in resource_spans.scope_spans:
                    self.spans.extend(scope.spans)
            self._changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[trace_pb2.Span]:
        """At least ``count`` spans (waits, bounded); all of them."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.spans) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"{len(self.spans)} span(s) of {count} arrived"
                self._changed.wait(left)
            return list(self.spans)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    served = Receiver()
    served.server.start()
    try:
        yield served
    finally:
        served.server.stop(grace=None)


def attributes(item: Any) -> dict[str, Any]:
    """A span's (or resource's) attributes as a plain dict."""
    out = {}
    for kv in item.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


def config(url: str) -> dict[str, Any]:
    return {"version": 1, "rules": [
        {"hostnames": ["other.example.com"],
         "backends": [{"url": "http://127.0.0.1:9", "weight": 1}]},
        {"hostnames": [HOST], "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
         "backends": [{"url": url, "weight": 1}]},
        {"hostnames": [HOST], "matches": [{"path": {"type": "PathPrefix", "value": "/down"}}],
         "backends": [{"url": "http://127.0.0.1:1", "weight": 1}]},
    ]}


def tracing_env(receiver: Receiver, rate: str = "1") -> dict[str, str]:
    return {"PROXY_TRACING_ENABLED": "true",
            "PROXY_TRACING_ENDPOINT": f"127.0.0.1:{receiver.port}",
            "PROXY_TRACING_SAMPLE_RATE": rate}


@pytest.fixture
async def backend() -> AsyncIterator[TestBackend]:
    async with TestBackend() as server:
        yield server


async def ask(port: int, path: str, headers: dict[str, str] | None = None) -> int:
    import httpx

    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{port}{path}",
                                    headers={"Host": HOST, **(headers or {})})
        return response.status_code


def flush(stack: Any) -> None:
    assert stack.runtime.plane.tracing.force_flush()


async def test_server_and_client_spans_with_the_incoming_parent(
        receiver: Receiver, backend: TestBackend) -> None:
    incoming = f"00-{TRACE_ID}-{PARENT_ID}-01"
    async with running("--listen", "127.0.0.1:0", config=config(backend.url),
                       environ=tracing_env(receiver)) as stack:
        status = await ask(stack.cluster_port, "/api/items?x=1",
                           {"traceparent": incoming, "tracestate": "vendor=abc",
                            "User-Agent": "trace-test"})
        assert status == 200
        flush(stack)
    spans = receiver.wait_for(2)
    server = next(s for s in spans if s.kind == SERVER)
    client = next(s for s in spans if s.kind == CLIENT)
    assert server.name == "GET /api" and client.name == "GET"
    # The client's traceparent is the server span's parent; the client span its child.
    assert server.trace_id.hex() == TRACE_ID == client.trace_id.hex()
    assert server.parent_span_id.hex() == PARENT_ID
    assert client.parent_span_id == server.span_id
    assert server.trace_state == "vendor=abc"
    assert attributes(server) == {
        "http.request.method": "GET", "url.path": "/api/items", "url.query": "x=1",
        "url.scheme": "http", "server.address": HOST, "network.protocol.version": "1.1",
        "client.address": "127.0.0.1", "user_agent.original": "trace-test",
        "tunnelgate.entrance": "cluster", "http.route": "/api",
        "tunnelgate.rule": "rules[1].matches[0]", "tunnelgate.host_pattern": HOST,
        "tunnelgate.backend": backend.url, "http.response.status_code": 200}
    assert attributes(client) == {
        "http.request.method": "GET", "server.address": "127.0.0.1",
        "server.port": backend.port, "url.full": f"{backend.url}/api/items?x=1",
        "tunnelgate.backend": backend.url, "http.response.status_code": 200}
    assert receiver.resources[0]["service.name"] == "tunnelgate"
    # The backend was told the client span's context, the trace state carried along.
    seen = backend.requests[-1]
    assert seen.header(b"traceparent") == (
        f"00-{TRACE_ID}-{client.span_id.hex()}-01".encode())
    assert seen.header(b"tracestate") == b"vendor=abc"
    assert len([n for n, _ in seen.headers if n.lower() == b"traceparent"]) == 1


async def test_a_root_span_and_a_failed_backend_call(receiver: Receiver,
                                                     backend: TestBackend) -> None:
    async with running("--listen", "127.0.0.1:0", config=config(backend.url),
                       environ=tracing_env(receiver)) as stack:
        assert await ask(stack.cluster_port, "/api/root") == 200
        assert await ask(stack.cluster_port, "/down") == 502
        assert await ask(stack.cluster_port, "/nowhere") == 404
        flush(stack)
    spans = receiver.wait_for(5)
    roots = [s for s in spans if s.kind == SERVER]
    assert len(roots) == 3 and all(not s.parent_span_id for s in roots)
    by_path = {attributes(s)["url.path"]: s for s in roots}
    sent = backend.requests[-1].header(b"traceparent")
    assert sent is not None and sent.decode().split("-")[1] == by_path["/api/root"].trace_id.hex()
    failed = [s for s in spans if s.kind == CLIENT
              and attributes(s)["tunnelgate.backend"] == "http://127.0.0.1:1"]
    assert len(failed) == 1 and attributes(failed[0])["error.type"] == "dial"
    assert failed[0].status.code == trace_pb2.Status.STATUS_CODE_ERROR
    down = attributes(by_path["/down"])
    assert down["http.response.status_code"] == 502 and down["error.type"] == "502"
    missing = attributes(by_path["/nowhere"])
    assert missing["http.response.status_code"] == 404 and "http.route" not in missing
    assert by_path["/nowhere"].name == "GET"


async def test_unsampled_requests_make_no_span_and_pass_their_context_on(
        receiver: Receiver, backend: TestBackend) -> None:
    unsampled = f"00-{TRACE_ID}-{PARENT_ID}-00"
    async with running("--listen", "127.0.0.1:0", config=config(backend.url),
                       environ=tracing_env(receiver, rate="0")) as stack:
        # Parent-based: a sampled parent is followed even at ratio 0 …
        sampled = f"00-{TRACE_ID}-{PARENT_ID}-01"
        assert await ask(stack.cluster_port, "/api/a", {"traceparent": sampled}) == 200
        # … an unsampled parent is not, and its header reaches the backend untouched;
        assert await ask(stack.cluster_port, "/api/b", {"traceparent": unsampled,
                                                         "tracestate": "k=v"}) == 200
        # a request without a parent is decided by the ratio (0: never).
        assert await ask(stack.cluster_port, "/api/c") == 200
        flush(stack)
    spans = receiver.wait_for(2)
    await asyncio.sleep(0.2)  # nothing else may arrive
    assert len(receiver.spans) == 2
    assert {attributes(s)["url.path"] for s in spans if s.kind == SERVER} == {"/api/a"}
    second, third = backend.requests[-2:]
    assert second.header(b"traceparent") == unsampled.encode()
    assert second.header(b"tracestate") == b"k=v"
    assert third.header(b"traceparent") is None


async def test_the_access_log_names_the_trace(receiver: Receiver,
                                              backend: TestBackend) -> None:
    env = {**tracing_env(receiver), "PROXY_ACCESS_LOG_ENABLED": "1"}
    out = io.StringIO()
    with redirect_stdout(out):
        async with running("--listen", "127.0.0.1:0", config=config(backend.url),
                           environ=env) as stack:
            assert await ask(stack.cluster_port, "/api/log") == 200
            flush(stack)
    line = json.loads(out.getvalue().splitlines()[-1])
    server = next(s for s in receiver.wait_for(2) if s.kind == SERVER)
    assert line["trace_id"] == server.trace_id.hex()
    assert line["span_id"] == server.span_id.hex()


def test_only_a_well_formed_unsampled_parent_short_cuts() -> None:
    assert _unsampled_parent(f"00-{TRACE_ID}-{PARENT_ID}-00".encode())
    assert not _unsampled_parent(f"00-{TRACE_ID}-{PARENT_ID}-01".encode())
    assert not _unsampled_parent(f"00-{TRACE_ID}-{PARENT_ID}-zz".encode())
    assert not _unsampled_parent(b"00-short-00")


async def test_every_worker_exports_its_own_spans(receiver: Receiver,
                                                  backend: TestBackend) -> None:
    env = {**tracing_env(receiver), "OTEL_BSP_SCHEDULE_DELAY": "100"}
    async with Supervisor(env=env) as served:
        assert (await served.push(config(backend.url))).status_code == 200
        await served.workers()
        for index in range(6):
            # Fresh connections: SO_REUSEPORT spreads them over both workers.
            assert await ask(served.port, f"/api/w{index}") == 200
        spans = receiver.wait_for(12, timeout=20)
    servers = [s for s in spans if s.kind == SERVER]
    assert {attributes(s)["url.path"] for s in servers} == {f"/api/w{i}" for i in range(6)}
    for seen in backend.requests[-6:]:
        header = seen.header(b"traceparent")
        assert header is not None
        client = next(s for s in spans if s.kind == CLIENT
                      and s.span_id.hex() == header.decode().split("-")[2])
        assert any(s.span_id == client.parent_span_id for s in servers)


@pytest.mark.parametrize("drawn, traced", [(0.29, True), (0.31, False)])
def test_new_traces_are_drawn_at_the_ratio_and_parents_decide_the_rest(
        drawn: float, traced: bool) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from proxy.observability.settings import TracingSettings
    from proxy.observability.tracing import Tracing
    from proxy.request import EMPTY_BODY, Request

    tracing = Tracing(TracingSettings(True, "", 0.3), InMemorySpanExporter(),
                      rand=lambda: drawn)

    def request(*headers: tuple[bytes, bytes]) -> Request:
        return Request("GET", "/", "", HOST, list(headers), EMPTY_BODY, "tunnel")

    try:
        assert (tracing.start_server(request()) is not None) is traced
        # A malformed traceparent is no parent: a new trace, drawn the same way.
        assert (tracing.start_server(request((b"traceparent", b"00-zz-01")))
                is not None) is traced
        # A valid parent decides, whatever the draw: sampled flag set, or not.
        sampled = f"00-{TRACE_ID}-{PARENT_ID}-01".encode()
        assert tracing.start_server(request((b"Traceparent", sampled))) is not None
        other_version = f"01-{TRACE_ID}-{PARENT_ID}-00".encode()
        assert tracing.start_server(request((b"traceparent", other_version))) is None
    finally:
        tracing.shutdown()
