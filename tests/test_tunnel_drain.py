"""Tunnel mode as a real ``tunnelgate serve`` process supervising a (fake) cloudflared.

``tests/test_cli.py`` already shows ``/readyz`` waiting for cloudflared's ``/ready`` and
a SIGTERM drain on the cluster entrance. This file adds what happens to the tunnel side
later in its life:

- cloudflared crashes ⇒ it is restarted within the backoff (full jitter: at most the
  initial delay for a first crash), ``/readyz`` stays 200 (tunnel readiness latches on the first
  registration) and the tunnel entrance keeps serving in the gap;
- SIGTERM ⇒ ``/readyz`` 503 at once, cloudflared is told to drain, a slow request that
  came in through the tunnel entrance finishes, requests cloudflared still forwards
  while it drains are served, cloudflared exits 0 by itself at the end of its grace
  period (never killed), and the process exits 0;
- a push with ``hasGrpcRoute`` switches the edge protocol to http2 without a moment
  with no registered connector: the new child registers before the old one is told
  to stop, and a stream of requests sent through whichever connector is registered
  loses none.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx

from proxy.control.runtime import FINISH_MARGIN
from tests.fake_cloudflared import make_launcher, sidecar
from tests.helpers import TestBackend
from tests.stack import running
from tests.test_cli import Served, free_port
from tunnel.cloudflared import KILL_MARGIN, Backoff

HOST = "app.example.com"
TOKEN = "drain-test-token"
EDGE = {"Host": HOST, "CF-Connecting-IP": "203.0.113.50",
        "CF-Visitor": '{"scheme":"https"}'}
# serve supervises with the default Backoff: a first crash waits U(0, initial) s.
FIRST_BACKOFF = Backoff().initial


class StderrLines:
    """Collects a child's stderr lines in a thread (the pipe must never fill up)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stderr is not None
        stream = proc.stderr
        self._thread = threading.Thread(
            target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True)
        self._thread.start()

    def matching(self, pattern: str) -> list[re.Match[str]]:
        return [m for line in list(self.lines) if (m := re.search(pattern, line))]

    async def wait_for(self, pattern: str, count: int = 1,
                       timeout: float = 5.0) -> list[re.Match[str]]:
        """The first ``count`` matches of ``pattern``, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while len(found := self.matching(pattern)) < count:
            assert time.monotonic() < deadline, (
                f"no {count}× {pattern!r} in stderr:\n" + "".join(self.lines[-30:]))
            await asyncio.sleep(0.05)
        return found[:count]


def tunnel_mode(tmp_path: Path, tunnel_port: int, grace: str = "1s", **fake_env: str) -> Served:
    env = {"TUNNEL_TOKEN": TOKEN, "FAKE_CF_EXPECT_TOKEN": TOKEN, **fake_env}
    return Served("--tunnel-listen", f"127.0.0.1:{tunnel_port}", "--grace-period", grace,
                  "--cloudflared-bin", str(make_launcher(tmp_path)), env=env, listen=False)


def config(backend_url: str) -> dict:
    return {"version": 2, "rules": [{"hostnames": [HOST],
                                     "backends": [{"url": backend_url, "weight": 1}]}]}


def catch_all(backend_url: str) -> dict:
    """Every host (the fake connector forwards with its own Host header)."""
    return {"version": 1, "rules": [{"backends": [{"url": backend_url, "weight": 1}]}]}


async def until_ready(served: Served, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while (await served.admin.get("/readyz")).status_code != 200:
        assert time.monotonic() < deadline, "never ready"
        await asyncio.sleep(0.05)


async def test_crash_restarts_cloudflared_within_the_backoff(tmp_path: Path) -> None:
    tunnel_port = free_port()
    async with TestBackend() as backend, tunnel_mode(
            tmp_path, tunnel_port, FAKE_CF_READY_AFTER_MS="100",
            FAKE_CF_CRASH_AFTER_MS="1000") as served:
        log = StderrLines(served.proc)
        assert (await served.push(config(backend.url))).status_code == 200
        await until_ready(served)
        [first] = await log.wait_for(r"started cloudflared \(pid (\d+)\)")
        await log.wait_for(r"cloudflared \(pid \d+\) exited with status 1")
        crashed = time.monotonic()
        [planned] = await log.wait_for(r"cloudflared will restart in ([0-9.]+) s")
        assert 0 <= float(planned[1]) <= FIRST_BACKOFF
        # The tunnel is down until the new child registers; readiness latched
        # and the sidecar entrance does not depend on cloudflared at all.
        assert (await served.admin.get("/readyz")).status_code == 200
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{tunnel_port}") as tunnel:
            assert (await tunnel.get("/during-gap", headers=EDGE)).status_code == 200
        _, second = await log.wait_for(r"started cloudflared \(pid (\d+)\)", count=2,
                                       timeout=FIRST_BACKOFF + 2)
        assert second[1] != first[1]
        assert time.monotonic() - crashed <= FIRST_BACKOFF + 2
        await log.wait_for(r"cloudflared: .*Starting metrics server", count=2)
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0


async def test_sigterm_drains_a_slow_tunnel_request_then_exits_0(tmp_path: Path) -> None:
    tunnel_port = free_port()
    async with TestBackend() as backend, tunnel_mode(tmp_path, tunnel_port, "2s") as served:
        log = StderrLines(served.proc)
        assert (await served.push(config(backend.url))).status_code == 200
        await until_ready(served)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{tunnel_port}",
                                     timeout=10) as tunnel:
            pending = asyncio.ensure_future(tunnel.get("/slow?delay=1.5", headers=EDGE))
            deadline = time.monotonic() + 3
            while not backend.requests:  # the request is now waiting on the backend
                assert time.monotonic() < deadline, "slow request never reached the backend"
                await asyncio.sleep(0.02)
            signalled = time.monotonic()
            served.signal(signal.SIGTERM)
            await log.wait_for(r"msg=draining")
            readyz = await served.admin.get("/readyz")
            assert (readyz.status_code, readyz.text) == (503, "not ready: draining\n")
            # cloudflared drains for its 2 s grace: what it still forwards is served.
            late = await tunnel.get("/late", headers=EDGE)
            assert late.status_code == 200 and late.json()["path"] == "/late"
            response = await pending
        assert response.status_code == 200
        assert response.json()["path"] == "/slow"
        assert response.json()["query"] == "delay=1.5"
        assert await served.wait() == 0
        took = time.monotonic() - signalled
        # cloudflared waited out its whole grace period, then exited by itself.
        assert 2.0 <= took < 2.0 + KILL_MARGIN + FINISH_MARGIN
        await log.wait_for(r"Initiating graceful shutdown")  # cloudflared got SIGTERM
        await log.wait_for(r"Tunnel server stopped")
        await log.wait_for(r"cloudflared \(pid \d+\) exited with status 0 ")
        assert not log.matching(r"killing|exited with status -9")
        await log.wait_for(r"msg=stopped drained=True")


class Edge:
    """Plays Cloudflare's edge for a supervised fake cloudflared: every request goes to
    a connector whose ``/ready`` says it is registered (through the fake's ``/proxy/``
    connector path); with none registered the edge answers 530, as the real one does."""

    def __init__(self, log: StderrLines) -> None:
        self.log = log
        self.statuses: list[int] = []

    def connectors(self) -> list[str]:
        """The metrics addresses of every cloudflared started so far, newest first."""
        return [m[1] for m in reversed(
            self.log.matching(r"started cloudflared .*--metrics (\S+)"))]

    async def one(self, client: httpx.AsyncClient, index: int) -> None:
        for addr in self.connectors():
            try:
                ready = (await client.get(f"http://{addr}/ready")).status_code == 200
            except httpx.TransportError:
                continue
            if ready:
                answer = await client.get(f"http://{addr}/proxy/stream/{index}")
                self.statuses.append(answer.status_code)
                return
        self.statuses.append(530)

    async def stream(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            for index in range(10_000):  # bounded; ends when the test says so
                if stop.is_set():
                    return
                await self.one(client, index)
                await asyncio.sleep(0.01)


async def test_protocol_switch_loses_no_request(tmp_path: Path) -> None:
    tunnel_port = free_port()
    async with TestBackend() as backend, tunnel_mode(
            tmp_path, tunnel_port, "1s", FAKE_CF_READY_AFTER_MS="500",
            FAKE_CF_ORIGIN=f"http://127.0.0.1:{tunnel_port}") as served:
        log = StderrLines(served.proc)
        assert (await served.push(catch_all(backend.url))).status_code == 200
        await until_ready(served)
        edge, stop = Edge(log), asyncio.Event()
        streaming = asyncio.ensure_future(edge.stream(stop))
        await asyncio.sleep(0.3)
        grpc = {**catch_all(backend.url), "version": 2, "hasGrpcRoute": True}
        assert (await served.push(grpc)).status_code == 200
        await log.wait_for(r"started cloudflared .*--protocol http2", timeout=5)
        await log.wait_for(r"Tunnel server stopped", timeout=10)  # the old one is gone
        await asyncio.sleep(0.3)
        stop.set()
        await streaming
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0
    assert len(edge.statuses) > 30
    assert set(edge.statuses) == {200}, edge.statuses
    registered = [float(m[1]) for m in
                  log.matching(r"Registered tunnel connection at=([0-9.]+)")]
    told = [float(m[1]) for m in log.matching(r"graceful shutdown .* at=([0-9.]+)")]
    assert len(registered) >= 2 and told
    assert registered[1] < told[0]  # the new child was ready before the old one was told


async def test_sidecar_drain_serves_what_cloudflared_hands_over_until_it_exits() -> None:
    addr = f"127.0.0.1:{free_port()}"
    # Kubernetes sends SIGTERM to both containers at once; cloudflared keeps handing
    # over requests while it drains, so the tunnel entrance stays open until its
    # metrics endpoint is gone, though nothing is in flight.
    async with TestBackend() as backend, running(
            "--tunnel-listen", "127.0.0.1:0", "--grace-period", "5s",
            "--cloudflared-metrics-url", f"http://{addr}/metrics",
            config=catch_all(backend.url)) as stack:
        with sidecar(addr, "1500ms", {"FAKE_CF_ORIGIN":
                                      f"http://127.0.0.1:{stack.tunnel_port}"}) as proc:
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            draining = asyncio.ensure_future(stack.runtime.drain())
            await asyncio.sleep(1.0)
            async with httpx.AsyncClient(timeout=5) as client:
                late = await client.get(f"http://{addr}/proxy/late")
            assert late.status_code == 200, late.text
            assert await draining is True
            took = time.monotonic() - started
            assert proc.wait(timeout=5) == 0
    assert 1.5 <= took < 1.5 + FINISH_MARGIN
    assert [seen.target for seen in backend.requests] == ["/late"]
