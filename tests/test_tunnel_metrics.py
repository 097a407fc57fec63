"""cloudflared's series on tunnelgate's ``/metrics`` (supervised child, or a sidecar's
``--cloudflared-metrics-url``), the supervision series, and a hung endpoint never
holding a scrape up. cloudflared is ``tests/fake_cloudflared.py``, a real process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import AsyncIterator, Iterator

import httpx
import pytest

from tests.fake_cloudflared import make_launcher
from tests.fake_cloudflared import sidecar as run_sidecar
from tests.stack import Stack, running
from tests.test_cli import free_port
from tunnel.metrics import cloudflared_families

HOST = "127.0.0.1"
TOKEN = "metrics-test-token"


async def scrape(stack: Stack) -> tuple[str, float]:
    """``GET /metrics``: its text and how long it took."""
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=5) as client:
        answer = await client.get(f"{stack.admin_url}/metrics")
    assert answer.status_code == 200
    return answer.text, time.monotonic() - started


async def eventually_in(stack: Stack, line: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while line not in (text := (await scrape(stack))[0]):
        assert time.monotonic() < deadline, f"{line!r} never in /metrics:\n{text}"
        await asyncio.sleep(0.1)
    return text


@pytest.fixture
async def supervised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     request: pytest.FixtureRequest) -> AsyncIterator[Stack]:
    """tunnelgate supervising the fake; an indirect parameter adds fake variables."""
    for name, value in getattr(request, "param", {}).items():
        monkeypatch.setenv(name, value)  # the supervisor passes our environment on
    async with running("--tunnel-listen", f"{HOST}:0", "--grace-period", "0.5s",
                       "--cloudflared-bin", str(make_launcher(tmp_path)),
                       environ={"TUNNEL_TOKEN": TOKEN}) as stack:
        try:
            yield stack
        finally:
            await stack.runtime.drain()  # stops cloudflared


async def test_supervised_cloudflared_series_show_up(supervised: Stack) -> None:
    text = await eventually_in(supervised, 'tunnelgate_cloudflared_state{state="connected"} 1.0')
    assert "\ncloudflared_tunnel_ha_connections 4" in text
    assert "# TYPE cloudflared_tunnel_total_requests counter" in text
    assert 'cloudflared_tunnel_server_locations{connection_id="0",edge_location="tst01"} 1' in text
    assert "go_goroutines" not in text  # cloudflared's runtime series would collide
    assert text.count("# TYPE process_cpu_seconds_total") == 1  # ours only
    assert 'tunnelgate_cloudflared_state{state="starting"} 0.0' in text
    assert "tunnelgate_cloudflared_restarts_total 0.0" in text
    assert "tunnelgate_cloudflared_edge_connections 4.0" in text
    assert "cftunnel_proxy_requests_in_flight" in text  # our own series are all still there


@pytest.mark.parametrize("supervised", [{"FAKE_CF_METRICS_HANG": "1"}], indirect=True)
async def test_a_hung_cloudflared_endpoint_never_holds_up_the_scrape(
        supervised: Stack) -> None:
    await eventually_in(supervised, 'tunnelgate_cloudflared_state{state="connected"} 1.0')
    text, took = await scrape(supervised)
    assert took < 1.0
    assert "cloudflared_tunnel_" not in text.replace("tunnelgate_cloudflared_", "")
    assert "cftunnel_proxy_requests_in_flight" in text


@pytest.fixture
def sidecar() -> Iterator[str]:
    """A fake cloudflared beside tunnelgate; yields its metrics address."""
    addr = f"{HOST}:{free_port()}"
    with run_sidecar(addr):
        yield addr


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_sidecar_metrics_url_with_and_without_workers(sidecar: str, workers: str) -> None:
    async with running("--tunnel-listen", f"{HOST}:0", "--workers", workers,
                       "--cloudflared-ready-url", f"http://{sidecar}/ready",
                       "--cloudflared-metrics-url", f"http://{sidecar}/metrics") as stack:
        text = await eventually_in(stack, "tunnelgate_cloudflared_edge_connections 4.0")
        assert "\ncloudflared_tunnel_ha_connections 4" in text
        assert "tunnelgate_cloudflared_state" not in text  # nothing supervised here
        assert "go_goroutines" not in text


def test_only_cloudflared_families_are_kept() -> None:
    text = (b"# HELP go_goroutines n\n# TYPE go_goroutines gauge\ngo_goroutines 3\n"
            b"# HELP cloudflared_tunnel_x help text\n# TYPE cloudflared_tunnel_x gauge\n"
            b"cloudflared_tunnel_x{a=\"b\"} 1\n\n# a comment\n"
            b"cloudflared_config_local_config_pushes 2\nprocess_open_fds 9\n")
    assert cloudflared_families(text) == (
        b"# HELP cloudflared_tunnel_x help text\n# TYPE cloudflared_tunnel_x gauge\n"
        b"cloudflared_tunnel_x{a=\"b\"} 1\ncloudflared_config_local_config_pushes 2\n")
