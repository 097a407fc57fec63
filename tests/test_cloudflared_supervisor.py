"""Supervising cloudflared against tests/fake_cloudflared.py."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import AsyncIterator, Callable

import pytest

from tests.fake_cloudflared import make_launcher
from tunnel.child import go_duration
from tunnel.cloudflared import (
    KILL_MARGIN, Backoff, CloudflaredNotFound, CloudflaredSupervisor, resolve_binary)
from tunnel.readiness import ReadyProbe

TOKEN = "eyJhIjoiYWNjb3VudCIsInQiOiJ0dW5uZWwiLCJzIjoiYzJWamNtVjAifQ=="
FAST = Backoff(initial=0.05, cap=0.2, reset_after=60.0)


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


class Lines(list):
    """Collects relayed cloudflared lines."""

    def __call__(self, line: str) -> None:
        self.append(line)

    def count_with(self, text: str) -> int:
        return sum(text in line for line in self)


@pytest.fixture
def binary(tmp_path: Path) -> str:
    return str(make_launcher(tmp_path))


@pytest.fixture
async def supervise(binary: str) -> AsyncIterator[Callable[..., CloudflaredSupervisor]]:
    """Build supervisors around the fake; every one is stopped at the end."""
    made: list[CloudflaredSupervisor] = []

    def build(fake_env: dict[str, str] | None = None, **kwargs: object) -> CloudflaredSupervisor:
        kwargs.setdefault("backoff", FAST)
        kwargs.setdefault("poll_interval", 0.05)
        kwargs.setdefault("grace_period", 0.2)  # the fake waits all of it on SIGTERM
        env = {**os.environ, "FAKE_CF_EXPECT_TOKEN": TOKEN, **(fake_env or {})}
        sup = CloudflaredSupervisor(binary, TOKEN, env=env, **kwargs)  # type: ignore[arg-type]
        made.append(sup)
        return sup

    yield build
    for sup in made:
        await sup.stop(grace=1.0)


def test_missing_binary_names_the_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope" / "cloudflared")
    with pytest.raises(CloudflaredNotFound, match="nope/cloudflared"):
        resolve_binary(missing)
    with pytest.raises(CloudflaredNotFound, match="PATH="):
        resolve_binary("tunnelgate-test-no-such-cloudflared")
    not_executable = tmp_path / "cloudflared"
    not_executable.write_text("#!/bin/false\n")
    with pytest.raises(CloudflaredNotFound):
        resolve_binary(str(not_executable))


async def test_start_with_missing_binary_fails_clearly(tmp_path: Path) -> None:
    sup = CloudflaredSupervisor(str(tmp_path / "cloudflared"), TOKEN)
    with pytest.raises(CloudflaredNotFound, match=str(tmp_path)):
        await sup.start()
    assert await sup.stop(grace=0.1) is None


def test_argv_shape_keeps_the_token_out() -> None:
    sup = CloudflaredSupervisor("cloudflared", TOKEN, "127.0.0.1:20241",
                                extra_args=("--loglevel", "debug"), protocol="http2",
                                grace_period=2.5)
    assert sup.argv == ["cloudflared", "tunnel", "--no-autoupdate", "--metrics",
                        "127.0.0.1:20241", "--grace-period", "2500ms", "--protocol", "http2",
                        "--loglevel", "debug", "run"]
    assert TOKEN not in repr(sup)
    with pytest.raises(ValueError):
        CloudflaredSupervisor("cloudflared", "")
    with pytest.raises(ValueError):
        CloudflaredSupervisor("cloudflared", TOKEN, protocol="h3")


def test_backoff_is_full_jitter_capped() -> None:
    backoff = Backoff(initial=1.0, cap=30.0)
    assert [backoff.delay(n, 1.0) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay(3, 0.5) == 4.0
    assert backoff.delay(10_000, 0.0) == 0.0
    assert go_duration(30) == "30000ms"


async def test_readiness_follows_ready_and_latches(supervise: Callable[..., CloudflaredSupervisor]) -> None:
    lines = Lines()
    sup = supervise({"FAKE_CF_READY_AFTER_MS": "400"}, on_log=lines)
    started = time.monotonic()
    await sup.start()
    assert not sup.ready and not sup.ever_connected
    await wait_until(lambda: sup.ready)
    assert time.monotonic() - started >= 0.35
    assert sup.ever_connected
    assert lines.count_with("INF Starting metrics server") == 1
    pid = sup.pid
    assert pid is not None
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        assert TOKEN.encode() not in cmdline.read()  # it travels in TUNNEL_TOKEN only


async def test_crash_is_followed_by_a_restart(supervise: Callable[..., CloudflaredSupervisor]) -> None:
    lines = Lines()
    sup = supervise({"FAKE_CF_CRASH_AFTER_MS": "600"}, on_log=lines,
                    backoff=Backoff(initial=0.5, cap=1.0), rand=lambda: 1.0)
    await sup.start()
    first = sup.pid
    await wait_until(lambda: sup.ready)
    await wait_until(lambda: sup.pid is None)  # crashed; waiting out the 0.5 s backoff
    assert not sup.ready and sup.ever_connected
    await wait_until(lambda: sup.restarts == 1 and sup.pid is not None)
    assert sup.pid != first
    await wait_until(lambda: sup.ready)
    assert lines.count_with("ERR crashing on purpose") >= 1
    assert lines.count_with("INF Starting metrics server") >= 2


async def test_wrong_token_keeps_restarting_with_backoff(
        supervise: Callable[..., CloudflaredSupervisor]) -> None:
    lines = Lines()
    sup = supervise({"FAKE_CF_EXPECT_TOKEN": "something-else"}, on_log=lines)
    await sup.start()
    await wait_until(lambda: sup.restarts >= 2)
    assert not sup.ever_connected
    assert lines.count_with("TUNNEL_TOKEN missing or wrong") >= 2


async def test_stop_waits_out_cloudflareds_own_grace_period(
        supervise: Callable[..., CloudflaredSupervisor],
        caplog: pytest.LogCaptureFixture) -> None:
    # Like the real one, the fake waits its whole --grace-period after SIGTERM, idle
    # or not: the default kill deadline leaves it KILL_MARGIN more, so it exits 0.
    caplog.set_level(logging.INFO, logger="tunnelgate.cloudflared")
    lines = Lines()
    sup = supervise(on_log=lines, grace_period=1.0)
    await sup.start()
    await wait_until(lambda: sup.ready)
    pid = sup.pid
    assert pid is not None
    started = time.monotonic()
    assert await sup.stop() == 0
    assert 0.95 <= time.monotonic() - started < 1.0 + KILL_MARGIN
    assert sup.pid is None and not sup.ready and sup.restarts == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert lines.count_with("graceful shutdown") == 1
    assert lines.count_with("Tunnel server stopped") == 1
    assert not any("killing" in r.getMessage() for r in caplog.records)


async def test_states_are_watchable_and_logged_once_each(
        supervise: Callable[..., CloudflaredSupervisor],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tunnelgate.cloudflared")
    sup = supervise({"FAKE_CF_READY_AFTER_MS": "300", "FAKE_CF_CRASH_AFTER_MS": "900"},
                    on_log=Lines(), backoff=Backoff(initial=0.3, cap=0.3), rand=lambda: 1.0)
    assert sup.state == "stopped"
    seen: list[str] = []

    def record() -> None:
        if not seen or seen[-1] != sup.state:
            seen.append(sup.state)

    await sup.start()
    record()
    assert sup.state == "starting" and sup.connections == 0
    await wait_until(lambda: (record(), sup.state == "connected")[1])
    assert sup.connections == 4  # readyConnections of its /ready
    await wait_until(lambda: (record(), sup.state == "reconnecting")[1])  # it crashed
    assert sup.connections == 0
    await wait_until(lambda: (record(), sup.restarts == 1 and sup.state == "connected")[1])
    task = asyncio.ensure_future(sup.stop())
    await wait_until(lambda: (record(), sup.state == "draining")[1])
    await task
    record()
    assert seen == ["starting", "connected", "reconnecting", "connected", "draining",
                    "stopped"]
    changes = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("cloudflared state ")]
    assert changes == ["cloudflared state stopped -> starting",
                       "cloudflared state starting -> connected",
                       "cloudflared state connected -> reconnecting",
                       "cloudflared state reconnecting -> connected",
                       "cloudflared state connected -> draining",
                       "cloudflared state draining -> stopped"]


async def test_stop_escalates_to_sigkill(supervise: Callable[..., CloudflaredSupervisor]) -> None:
    sup = supervise({"FAKE_CF_IGNORE_SIGTERM": "1"}, on_log=Lines())
    await sup.start()
    await wait_until(lambda: sup.ready)
    started = time.monotonic()
    assert await sup.stop(grace=0.3) == -9
    assert 0.25 <= time.monotonic() - started < 3.0


async def test_stop_during_backoff_is_prompt(supervise: Callable[..., CloudflaredSupervisor]) -> None:
    sup = supervise({"FAKE_CF_CRASH_AFTER_MS": "100"}, on_log=Lines(),
                    backoff=Backoff(initial=30.0, cap=30.0), rand=lambda: 1.0)
    await sup.start()
    await wait_until(lambda: sup.pid is None)
    started = time.monotonic()
    assert await sup.stop(grace=1.0) == 1
    assert time.monotonic() - started < 1.0


async def test_set_protocol_restarts_with_the_new_flag(
        supervise: Callable[..., CloudflaredSupervisor]) -> None:
    lines = Lines()
    sup = supervise(on_log=lines, protocol="quic", grace_period=1.0)
    await sup.start()
    await wait_until(lambda: lines.count_with("protocol=quic") == 1)
    first, first_addr = sup.pid, sup.metrics_addr
    with pytest.raises(ValueError):
        await sup.set_protocol("udp")
    await sup.set_protocol("http2")
    await wait_until(lambda: lines.count_with("protocol=http2") == 1)
    await wait_until(lambda: lines.count_with("graceful shutdown") == 1)
    assert sup.restarts == 1 and sup.pid != first
    assert sup.pids == [first, sup.pid]  # the old one drains its 1 s grace meanwhile
    assert sup.metrics_addr != first_addr  # both ran side by side for a while
    assert sup.argv[sup.argv.index("--protocol") + 1] == "http2"
    await wait_until(lambda: lines.count_with("Tunnel server stopped") == 1)
    await wait_until(lambda: sup.pids == [sup.pid])
    assert sup.ready and sup.state == "connected"


async def test_switch_to_a_child_that_never_registers_keeps_the_old_one(
        supervise: Callable[..., CloudflaredSupervisor],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tunnelgate.cloudflared")
    lines = Lines()
    sup = supervise({"FAKE_CF_UNREADY_PROTOCOL": "http2"}, on_log=lines, protocol="quic",
                    switch_timeout=1.0)
    await sup.start()
    await wait_until(lambda: sup.ready)
    old = sup.pid
    await sup.set_protocol("http2")
    assert sup.protocol == "http2"
    await wait_until(lambda: any("--protocol http2" in r.getMessage()
                                 for r in caplog.records))  # the new child was started
    await wait_until(lambda: sup.protocol == "quic", timeout=10.0)  # gave up, reverted
    assert any("did not register within 1 s" in r.getMessage() for r in caplog.records)
    assert sup.pid == old and sup.ready and sup.restarts == 0
    assert lines.count_with("graceful shutdown") == 0  # the old child was never told


async def test_default_relay_logs_with_prefix_and_level(
        supervise: Callable[..., CloudflaredSupervisor], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tunnelgate.cloudflared")
    sup = supervise({"FAKE_CF_CRASH_AFTER_MS": "200"}, backoff=Backoff(initial=10.0),
                    rand=lambda: 1.0)
    await sup.start()
    await wait_until(lambda: any("crashing on purpose" in r.getMessage() for r in caplog.records))
    relayed = [r for r in caplog.records if r.getMessage().startswith("cloudflared: ")]
    assert any("INF Starting metrics server" in r.getMessage()
               and r.levelno == logging.INFO for r in relayed)
    assert any("ERR crashing" in r.getMessage() and r.levelno == logging.ERROR for r in relayed)
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


# --- ReadyProbe (sidecar mode) ------------------------------------------------------

class ReadyServer:
    """A real /ready endpoint on 127.0.0.1 whose status the test sets."""

    def __init__(self) -> None:
        self.status = 503
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()).strip():
            pass
        body = b'{"status":%d,"readyConnections":0}' % self.status
        writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s"
                     % (self.status, len(body), body))
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/ready"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def test_ready_probe_latches_first_connection() -> None:
    endpoint = ReadyServer()
    async with endpoint as url:
        probe = ReadyProbe(url, timeout=1.0)
        assert await probe.check() is False
        assert not probe.ever_connected
        endpoint.status = 200
        assert await probe.check() is True
        endpoint.status = 503
        assert await probe.check() is False
        assert probe.ever_connected
    assert await probe.check() is False  # nothing listens any more
    assert probe.ever_connected


async def test_ready_probe_polls_in_the_background() -> None:
    endpoint = ReadyServer()
    async with endpoint as url:
        probe = ReadyProbe(url, interval=0.05)
        probe.start()
        try:
            await asyncio.sleep(0.1)
            assert not probe.ready
            endpoint.status = 200
            await wait_until(lambda: probe.ready)
        finally:
            await probe.stop()


@pytest.mark.parametrize("url", ["https://127.0.0.1:1/ready", "127.0.0.1:2000/ready", "http:///ready"])
def test_ready_probe_rejects_unusable_urls(url: str) -> None:
    with pytest.raises(ValueError):
        ReadyProbe(url)


async def test_fake_can_reach_a_url(supervise: Callable[..., CloudflaredSupervisor]) -> None:
    endpoint = ReadyServer()
    endpoint.status = 200
    async with endpoint as url:
        lines = Lines()
        sup = supervise({"FAKE_CF_GET_URL": url}, on_log=lines)
        await sup.start()
        await wait_until(lambda: lines.count_with(f"GET {url} -> 200") == 1)
