"""SIGHUP and ``--watch-config``: ``tunnelgate serve`` re-reads ``--config`` (a real
subprocess, real backends, a client sending requests throughout)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest

from proxy.control.demo import start_backend
from tests.test_cli import Served, backend_config


@pytest.fixture
async def backends() -> AsyncIterator[tuple[int, int]]:
    blue, blue_port = await start_backend("blue")
    green, green_port = await start_backend("green")
    yield blue_port, green_port
    blue.close()
    green.close()


def write(path: Path, port: int, version: int) -> None:
    """Replace ``path`` atomically (rename), as editors and config tools do."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(backend_config(port, version)))
    os.replace(temporary, path)


async def which(served: Served) -> str:
    response = await served.data.get("/", headers={"Host": "app.example.com"})
    assert response.status_code == 200, response.text
    return str(response.json()["backend"])


async def until(served: Served, name: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await which(served) == name:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} never answered within {timeout} s")


class Load:
    """Requests sent back to back on two connections until stopped; every answer kept."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.answers: list[tuple[int, str]] = []
        self.failures: list[str] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> "Load":
        self._tasks = [asyncio.create_task(self._client()) for _ in range(2)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def answered(self, count: int, timeout: float = 15) -> None:
        """Wait until ``count`` answers arrived (the load is really running)."""
        deadline = time.monotonic() + timeout
        while len(self.answers) < count:
            assert time.monotonic() < deadline, "the load never got going"
            await asyncio.sleep(0.02)

    async def _client(self) -> None:
        async with httpx.AsyncClient(base_url=self.served.data.base_url, timeout=10) as client:
            for _ in range(100_000):  # bounded; stopped long before
                if self._stop.is_set():
                    return
                try:
                    response = await client.get("/", headers={"Host": "app.example.com"})
                    self.answers.append((response.status_code, response.json()["backend"]))
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    self.failures.append(repr(exc))


def stderr_after_exit(served: Served) -> str:
    assert served.proc is not None and served.proc.stderr is not None
    return served.proc.stderr.read()


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_sighup_applies_a_changed_file_under_load(tmp_path: Path,
                                                        backends: tuple[int, int],
                                                        workers: str) -> None:
    blue, green = backends
    path = tmp_path / "routes.json"
    write(path, blue, version=1)
    async with Served("--config", str(path), "--workers", workers) as served:
        await until(served, "blue")
        async with Load(served) as load:
            await load.answered(5)
            write(path, green, version=2)
            served.signal(signal.SIGHUP)
            await until(served, "green")
            seen = len(load.answers)
            await load.answered(seen + 5)
        assert load.failures == []
        assert {status for status, _ in load.answers} == {200}
        seen = [name for _, name in load.answers]
        assert "blue" in seen and seen[-1] == "green"
        assert (await served.admin.get("/config")).json() == {"version": 2, "ready": True}
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0
        assert "config reload requested" in stderr_after_exit(served)


async def test_a_bad_or_stale_file_is_rejected_and_the_old_table_serves(
        tmp_path: Path, backends: tuple[int, int]) -> None:
    blue, green = backends
    path = tmp_path / "routes.json"
    write(path, blue, version=5)
    async with Served("--config", str(path)) as served:
        await until(served, "blue")
        path.write_text('{"version": 6, "rules": [{"matches": [{"path": {"type": "Foo"}}]}]}')
        served.signal(signal.SIGHUP)
        await asyncio.sleep(1.5)
        write(path, green, version=4)  # valid, but older than what is serving
        served.signal(signal.SIGHUP)
        await asyncio.sleep(1.5)
        assert await which(served) == "blue"
        assert (await served.admin.get("/config")).json()["version"] == 5
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0
    log = stderr_after_exit(served)
    rejected = [line for line in log.splitlines() if "rejected" in line]
    assert len(rejected) == 2, log
    assert rejected[0].startswith("time=") and "level=warning" in rejected[0]
    assert f'{path}: rules[0].matches[0].path.type: unknown path match type \\"Foo\\"' in (
        rejected[0])
    assert "level=warning" in rejected[1] and "status=409" in rejected[1]


async def test_sighup_without_config_file_is_ignored(backends: tuple[int, int]) -> None:
    async with Served() as served:
        served.signal(signal.SIGHUP)
        await asyncio.sleep(0.5)
        assert (await served.admin.get("/healthz")).status_code == 200
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0
    assert "SIGHUP ignored: no --config file to re-read" in stderr_after_exit(served)


def configmap_volume(directory: Path, port: int, version: int, generation: int) -> Path:
    """Lay out (or update) ``directory`` the way the kubelet projects a ConfigMap:
    ``routes.json -> ..data/routes.json``, ``..data -> ..<generation>``, the symlink
    swapped by a rename so readers see the old or the new directory, never a mix."""
    target = directory / f"..{generation}"
    target.mkdir()
    (target / "routes.json").write_text(json.dumps(backend_config(port, version)))
    link = directory / "..data_tmp"
    link.symlink_to(target.name)
    os.replace(link, directory / "..data")
    visible = directory / "routes.json"
    if not visible.is_symlink():
        visible.symlink_to("..data/routes.json")
    return visible


async def test_watch_config_follows_a_configmap_update(tmp_path: Path,
                                                       backends: tuple[int, int]) -> None:
    blue, green = backends
    path = configmap_volume(tmp_path, blue, version=1, generation=1)
    async with Served("--config", str(path), "--watch-config") as served:
        await until(served, "blue")
        configmap_volume(tmp_path, green, version=2, generation=2)
        await until(served, "green", timeout=10)
        write(tmp_path / "..2" / "routes.json", blue, version=3)  # an in-place edit
        await until(served, "blue", timeout=10)
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0


def test_watch_config_needs_a_config_file() -> None:
    from tests.test_cli import cli
    done = cli("serve", "--watch-config", "--admin", "127.0.0.1:0")
    assert done.returncode == 2
    assert "--watch-config: needs --config FILE" in done.stderr
