"""``tunnelgate demo`` as a real subprocess: it honours ``PROXY_TRACING_*`` (spans reach
a local OTLP receiver)."""

from __future__ import annotations

import asyncio
import re
import signal
import sys

import httpx

from tests.test_cli import ROOT, clean_env, cli
from tests.test_tracing import SERVER, Receiver, attributes, receiver, tracing_env  # noqa: F401

PROXY = re.compile(r"proxy \(cluster entrance\)\s+http://(\S+)")


async def test_the_demo_exports_spans_when_tracing_is_enabled(receiver: Receiver) -> None:
    env = clean_env({**tracing_env(receiver), "OTEL_BSP_SCHEDULE_DELAY": "100"})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "demo", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        address = None
        for _ in range(50):  # the banner's lines, bounded
            line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
            assert line, "the demo exited before its banner"
            if found := PROXY.search(line):
                address = found.group(1)
                break
        assert address is not None
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(f"http://{address}/green",
                                        headers={"Host": "demo.local"})
            assert response.status_code == 200
        spans = await asyncio.to_thread(receiver.wait_for, 2, 20)
        servers = [s for s in spans if s.kind == SERVER]
        assert [attributes(s)["url.path"] for s in servers] == ["/green"]
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 20)


def test_a_misspelled_tracing_switch_stops_the_demo() -> None:
    done = cli("demo", env={"PROXY_TRACING_ENABLED": "sure"})
    assert done.returncode == 2
    assert "PROXY_TRACING_ENABLED: expected 1/0" in done.stderr
