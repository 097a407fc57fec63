"""Acceptance, end to end: 50 MB streamed each way through ``tunnelgate serve`` running
as a real subprocess, with the proxy's memory growth bounded ("Streaming,
bounded memory").

The backends run in the test process and produce or consume the bytes incrementally:
:class:`~tests.helpers.TestBackend` ``/chunked`` for the download, and
:class:`CountingSink` — an h11 server that counts request body bytes without keeping
them — for the upload. Memory is read from ``/proc/<pid>/status``: ``VmRSS`` after a
warm-up request, then ``VmHWM`` (the peak) after the transfer.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import AsyncIterator

import h11
import httpx
import pytest

from tests.helpers import LoopbackServer, RawClient, TestBackend
from tests.test_cli import ROOT, clean_env, free_port
from tests.test_e2e_routing import request_bytes

SIZE = 50 * 1024 * 1024
PIECE = 64 * 1024
MAX_GROWTH = 30 * 1024 * 1024
TRANSFER_TIMEOUT = 15.0
TUNNELGATE = Path(sys.executable).parent / "tunnelgate"
STALL = 0.5  # the slow side pauses this long, so only backpressure keeps memory flat

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(),
                                reason="needs /proc for the proxy's memory figures")


class CountingSink(LoopbackServer):
    """An HTTP/1.1 backend that reads each request body to its end, counting the bytes
    without keeping them, and answers ``{"bytes": N, "expect": ...}``. It answers
    ``Expect: 100-continue`` with a 100, then stalls ``stall`` seconds before reading
    the body (a slow consumer)."""

    def __init__(self, stall: float = 0.0) -> None:
        super().__init__()
        self.stall = stall

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        count, expect = 0, ""
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    if conn.they_are_waiting_for_100_continue:
                        writer.write(conn.send(h11.InformationalResponse(status_code=100,
                                                                         headers=[])))
                        await asyncio.sleep(self.stall)
                    data = await reader.read(PIECE)
                    if not data:
                        return
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    expect = dict(event.headers).get(b"expect", b"").decode()
                elif isinstance(event, h11.Data):
                    count += len(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    body = json.dumps({"bytes": count, "expect": expect}).encode()
                    writer.write(conn.send(h11.Response(status_code=200, headers=[
                        ("Content-Length", str(len(body)))])))
                    writer.write(conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
                    await writer.drain()
                    return
                else:
                    return
        except (ConnectionError, h11.ProtocolError):
            return
        finally:
            writer.close()


class ServedProcess:
    """``tunnelgate serve`` as a subprocess with a config file, ready once /readyz is."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.port, self.admin_port = free_port(), free_port()
        self.proc: asyncio.subprocess.Process | None = None
        self._dir = tempfile.TemporaryDirectory()
        self.log = Path(self._dir.name) / "stderr.log"

    async def __aenter__(self) -> "ServedProcess":
        config = Path(self._dir.name) / "config.json"
        config.write_text(json.dumps(self.config))
        with self.log.open("wb") as stderr:
            self.proc = await asyncio.create_subprocess_exec(
                str(TUNNELGATE), "serve", "--listen", f"127.0.0.1:{self.port}",
                "--admin", f"127.0.0.1:{self.admin_port}", "--config", str(config),
                cwd=ROOT, env=clean_env(), stdout=asyncio.subprocess.DEVNULL, stderr=stderr)
        try:
            await self._ready()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _ready(self, timeout: float = 15.0) -> None:
        """Standalone readiness = config loaded."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2) as client:
            while time.monotonic() < deadline:
                if self.proc.returncode is not None:
                    raise AssertionError(f"serve exited: {self.log.read_text()}")
                try:
                    url = f"http://127.0.0.1:{self.admin_port}/readyz"
                    if (await client.get(url)).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
        raise AssertionError(f"serve not ready within {timeout} s: {self.log.read_text()}")

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._dir.cleanup()

    def memory(self, field: str) -> int:
        """``VmRSS`` / ``VmHWM`` of the proxy process, in bytes."""
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field} in /proc status")


def single_route(url: str) -> dict:
    return {"version": 1, "rules": [{"backends": [{"url": url, "weight": 1}]}]}


@pytest.fixture
async def sink() -> AsyncIterator[CountingSink]:
    async with CountingSink(stall=STALL) as server:
        yield server


async def upload(port: int, size: int) -> dict:
    """POST ``size`` bytes chunked with ``Expect: 100-continue``; the sink's JSON answer."""
    client = await RawClient.connect(port)
    try:
        client.send(b"POST /upload HTTP/1.1\r\nHost: up.test\r\nTransfer-Encoding: chunked\r\n"
                    b"Content-Type: application/octet-stream\r\nExpect: 100-continue\r\n\r\n")
        interim = await client.read_response()
        assert interim.status == 100, interim  # nothing is sent before the go-ahead
        piece = b"%x\r\n" % PIECE + b"u" * PIECE + b"\r\n"
        for _ in range(size // PIECE):
            client.send(piece)
            await client.writer.drain()
        client.send(b"0\r\n\r\n")
        final = await client.read_response(timeout=TRANSFER_TIMEOUT)
        assert final.status == 200, final
        return final.json()
    finally:
        client.close()


async def download(port: int, size: int, stall: float = 0.0) -> int:
    """GET ``size`` bytes from the chunked backend, pausing ``stall`` seconds after the
    head (a slow reader); the body length, counted, not kept."""
    client = await RawClient.connect(port)
    try:
        client.send(request_bytes("GET", f"/chunked?size={size}&chunk={PIECE}", "down.test"))
        reader = client.reader
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding: chunked" in head.lower()
        await asyncio.sleep(stall)
        total = 0
        while chunk := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            data = await reader.readexactly(chunk)
            assert data.count(b"x") == chunk
            total += chunk
            assert await reader.readexactly(2) == b"\r\n"
        assert await reader.readuntil(b"\r\n") == b"\r\n"  # no trailers
        return total
    finally:
        client.close()


async def test_50_mb_chunked_upload_streams_through_with_bounded_memory(sink):
    async with ServedProcess(single_route(sink.url)) as served:
        assert (await upload(served.port, PIECE))["bytes"] == PIECE  # warm-up
        before = served.memory("VmRSS")
        answer = await asyncio.wait_for(upload(served.port, SIZE), TRANSFER_TIMEOUT)
        peak = served.memory("VmHWM")
    assert answer["bytes"] == SIZE
    assert peak - before < MAX_GROWTH, (before, peak)


async def test_50_mb_download_streams_through_with_bounded_memory():
    async with TestBackend() as backend, ServedProcess(single_route(backend.url)) as served:
        assert await download(served.port, PIECE) == PIECE  # warm-up
        before = served.memory("VmRSS")
        received = await asyncio.wait_for(download(served.port, SIZE, STALL),
                                          TRANSFER_TIMEOUT)
        peak = served.memory("VmHWM")
    assert received == SIZE
    assert peak - before < MAX_GROWTH, (before, peak)
