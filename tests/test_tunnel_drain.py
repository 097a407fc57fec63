"""Tunnel mode as a real ``tunnelgate serve`` process supervising a (fake) cloudflared.

``tests/test_cli.py`` already shows ``/readyz`` waiting for cloudflared's ``/ready`` and
a SIGTERM drain on the cluster entrance. This file adds what happens to the tunnel side
later in its life (REFERENCE §2.1, §6.4, §7.6):

- cloudflared crashes ⇒ it is restarted within the backoff (full jitter: at most the
  initial delay for a first crash), ``/readyz`` stays 200 (tunnel readiness latches on the first
  registration) and the tunnel entrance keeps serving in the gap;
- SIGTERM ⇒ ``/readyz`` 503 at once, cloudflared is told to drain, a slow request that
  came in through the tunnel entrance finishes, requests cloudflared still forwards
  while it drains are served, and the process exits 0.
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

from tests.fake_cloudflared import make_launcher
from tests.helpers import TestBackend
from tests.test_cli import Served, free_port
from tunnel.cloudflared import Backoff

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


def tunnel_mode(tmp_path: Path, tunnel_port: int, **fake_env: str) -> Served:
    env = {"TUNNEL_TOKEN": TOKEN, "FAKE_CF_EXPECT_TOKEN": TOKEN, **fake_env}
    return Served("--tunnel-listen", f"127.0.0.1:{tunnel_port}", "--grace-period", "10s",
                  "--cloudflared-bin", str(make_launcher(tmp_path)), env=env, listen=False)


def config(backend_url: str) -> dict:
    return {"version": 2, "rules": [{"hostnames": [HOST],
                                     "backends": [{"url": backend_url, "weight": 1}]}]}


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
        # The tunnel is down until the new child registers; readiness latched (§2.1)
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
    async with TestBackend() as backend, tunnel_mode(
            tmp_path, tunnel_port, FAKE_CF_DRAIN_MS="700") as served:
        log = StderrLines(served.proc)
        assert (await served.push(config(backend.url))).status_code == 200
        await until_ready(served)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{tunnel_port}",
                                     timeout=10) as tunnel:
            pending = asyncio.ensure_future(tunnel.get("/slow?delay=2", headers=EDGE))
            deadline = time.monotonic() + 3
            while not backend.requests:  # the request is now waiting on the backend
                assert time.monotonic() < deadline, "slow request never reached the backend"
                await asyncio.sleep(0.02)
            signalled = time.monotonic()
            served.signal(signal.SIGTERM)
            await log.wait_for(r"msg=draining")
            readyz = await served.admin.get("/readyz")
            assert (readyz.status_code, readyz.text) == (503, "not ready: draining\n")
            # cloudflared drains for 700 ms: what it still forwards is served.
            late = await tunnel.get("/late", headers=EDGE)
            assert late.status_code == 200 and late.json()["path"] == "/late"
            response = await pending
        assert response.status_code == 200
        assert response.json()["path"] == "/slow"
        assert response.json()["query"] == "delay=2"
        assert await served.wait() == 0
        assert time.monotonic() - signalled >= 1.0  # it waited for the slow request
        await log.wait_for(r"Initiating graceful shutdown")  # cloudflared got SIGTERM
        await log.wait_for(r"Tunnel server stopped")
        await log.wait_for(r"msg=stopped drained=True")
