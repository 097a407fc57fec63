"""``serve --workers N``: a supervisor and worker processes sharing the entrance ports.

Real processes, real sockets. Which worker served a connection is read from the kernel,
not from the proxy: the accepted socket's inode (``/proc/net/tcp``) is looked up among
each worker's open file descriptors (``/proc/<pid>/fd``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.control.runtime import Runtime, worker_main
from proxy.control.flags import add_serve_arguments
from proxy.control.resolve import from_args
from proxy.control.settings import SettingsError
from proxy.control.workerprocess import WorkerLink
from tests.fake_cloudflared import make_launcher
from tests.helpers import RawClient, TestBackend
from tests.test_cli import ROOT, clean_env, cli, free_port

pytestmark = pytest.mark.timeout(30)

HOST = "a.example.com"
REFUSED_VERSION = 13  # the version the stand-in worker below fails to compile
# Generous: other suites and benchmarks may be saturating this 2-core machine.
READ_TIMEOUT = 10.0


def route(backend: str, version: int) -> dict:
    """Every request to ``a.example.com`` goes to ``backend``; the response says which
    config version routed it (``X-Config``)."""
    return {"version": version, "rules": [{
        "hostnames": [HOST],
        "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {
            "set": [{"name": "X-Config", "value": f"v{version}"}]}}],
        "backends": [{"url": backend, "weight": 1}]}]}


# --------------------------------------------------------------------------- processes


def worker_pids(parent: int) -> set[int]:
    """PIDs of the live spawned workers whose parent is ``parent``."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        # A worker renames itself (tunnelgate worker N) moments after the spawn.
        if int(fields[1]) == parent and fields[0] != "Z" and (
                b"spawn_main" in cmdline or cmdline.startswith(b"tunnelgate worker ")):
            pids.add(int(entry))
    return pids


def children(parent: int) -> set[int]:
    """Every live child of ``parent`` (workers and multiprocessing's helper)."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def accepted_inodes(port: int, client_ports: set[int]) -> set[int]:
    """Inodes of the server-side sockets of 127.0.0.1:``port`` ↔ ``client_ports``."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if (int(local.split(":")[1], 16) == port and fields[3] == "01"
                and int(remote.split(":")[1], 16) in client_ports):
            inodes.add(int(fields[9]))
    return inodes


async def served_by(port: int, pids: set[int], count: int,
                    host: str = HOST) -> tuple[dict[int, int], set[bytes]]:
    """Open ``count`` connections at once, one request each, and keep them open while
    asking the kernel which worker accepted each; returns (connections per PID, the
    ``X-Config`` values seen)."""
    clients = await asyncio.gather(*(RawClient.connect(port) for _ in range(count)))
    try:
        for client in clients:
            client.send(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        responses = await asyncio.gather(*(c.read_response(timeout=READ_TIMEOUT)
                                           for c in clients))
        assert {r.status for r in responses} == {200}
        ports = {c.writer.get_extra_info("sockname")[1] for c in clients}
        accepted = accepted_inodes(port, ports)
        assert len(accepted) == count
        owners = {pid: len(accepted & socket_inodes(pid)) for pid in pids}
        assert sum(owners.values()) == count, owners
        return owners, {r.header(b"x-config") or b"" for r in responses}
    finally:
        for client in clients:
            client.close()


async def fresh_connections(port: int, count: int, path: str = "/") -> set[bytes]:
    """``count`` requests at once, each on a new connection; the ``X-Config`` values."""

    async def one() -> bytes:
        client = await RawClient.connect(port)
        try:
            client.send(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n"
                        .encode())
            response = await client.read_response(timeout=READ_TIMEOUT)
            assert response.status == 200, response
            return response.header(b"x-config") or b""
        finally:
            client.close()

    return set(await asyncio.gather(*(one() for _ in range(count))))


class Supervisor:
    """``tunnelgate serve --workers 2`` as a child process."""

    def __init__(self, *extra: str, env: dict[str, str] | None = None) -> None:
        self.port, self.admin_port = free_port(), free_port()
        self.args = [sys.executable, "-m", "proxy", "serve", "--workers", "2",
                     "--admin", f"127.0.0.1:{self.admin_port}", "--grace-period", "10s",
                     *extra]
        if "--tunnel-listen" not in extra or "--listen" in extra:
            self.args += ["--listen", f"127.0.0.1:{self.port}"]
        self.env = clean_env(env)
        self.proc: subprocess.Popen[str] | None = None

    async def __aenter__(self) -> "Supervisor":
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, text=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.admin = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.admin_port}",
                                       timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read()  # type: ignore[union-attr]
            try:
                if (await self.admin.get("/healthz")).status_code == 200:
                    return self
            except httpx.TransportError:
                await asyncio.sleep(0.05)
        raise AssertionError("supervisor did not answer /healthz within 15 s")

    async def __aexit__(self, *exc: object) -> None:
        await self.admin.aclose()
        if self.proc is not None and self.proc.poll() is None:
            metrics_dir = self.metrics_dir()
            self.proc.kill()  # the workers follow (PR_SET_PDEATHSIG)
            self.proc.wait(timeout=10)
            if metrics_dir:  # a killed supervisor cannot remove it
                shutil.rmtree(metrics_dir, ignore_errors=True)

    def metrics_dir(self) -> str | None:
        """The supervisor's PROMETHEUS_MULTIPROC_DIR, as its workers were given it."""
        for pid in worker_pids(self.pid):
            try:
                return environ(pid)["PROMETHEUS_MULTIPROC_DIR"]
            except (OSError, KeyError):
                continue
        return None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def push(self, config: dict | str) -> httpx.Response:
        body = config if isinstance(config, str) else json.dumps(config)
        return await self.admin.put("/config", content=body,
                                    headers={"Content-Type": "application/json"})

    async def workers(self, count: int = 2, timeout: float = 10) -> set[int]:
        """The worker PIDs, once there are ``count`` of them."""
        deadline = time.monotonic() + timeout
        while len(pids := worker_pids(self.pid)) != count:
            assert time.monotonic() < deadline, f"workers: {pids}"
            await asyncio.sleep(0.05)
        return pids


@pytest.fixture
async def backend() -> AsyncIterator[TestBackend]:
    async with TestBackend() as server:
        yield server


def requests_total(metrics_text: str) -> float:
    return sum(sample.value for family in text_string_to_metric_families(metrics_text)
               for sample in family.samples
               if sample.name == "cftunnel_proxy_requests_total"
               and sample.labels == {"hostname": HOST, "status_class": "2xx"})


# --------------------------------------------------------------------------- tests


async def test_workers_share_the_ports_and_take_every_push(tmp_path: Path,
                                                           backend: TestBackend) -> None:
    tunnel_path = str(tmp_path / "tunnel.sock")
    async with Supervisor("--tunnel-listen", f"unix:{tunnel_path}", "--listen",
                          f"127.0.0.1:{free_port()}", "--cluster-scope", "all") as served:
        assert (await served.admin.get("/readyz")).text == "not ready: no config loaded\n"
        assert (await served.push(route(backend.url, 1))).status_code == 200
        assert (await served.admin.get("/readyz")).status_code == 200
        pids = await served.workers()

        # SO_REUSEPORT: the kernel hands connections on the one port to both workers.
        owners, seen = await served_by(served.port, pids, 40)
        assert seen == {b"v1"}
        assert all(owners.values()), owners

        # /metrics (supervisor) sums the requests both workers counted.
        metrics = (await served.admin.get("/metrics")).text
        assert requests_total(metrics) == 40
        assert "cftunnel_proxy_requests_in_flight 0.0" in metrics

        # 200 means every worker swapped: no fresh connection sees the old route.
        assert (await served.push(route(backend.url, 2))).status_code == 200
        assert await fresh_connections(served.port, 50) == {b"v2"}

        # Rejected pushes stop in the supervisor; no worker changes.
        stale = await served.push(route(backend.url, 1))
        assert (stale.status_code, stale.text) == (409, "stale config version\n")
        invalid = await served.push({"version": 9, "rules": [{"backends": [{"url": ""}]}]})
        assert invalid.status_code == 400
        assert (await served.push("{nope")).status_code == 400
        assert await fresh_connections(served.port, 50) == {b"v2"}
        assert (await served.admin.get("/config")).json() == {"version": 2, "ready": True}

        # The unix-socket tunnel entrance is one socket, bound once, shared by both.
        listener = next(int(line.split()[6]) for line in
                        Path("/proc/net/unix").read_text().splitlines()[1:]
                        if line.endswith(tunnel_path) and line.split()[3] == "00010000")
        assert all(listener in socket_inodes(pid) for pid in pids)
        tunnel = await RawClient.connect(0, path=tunnel_path)
        tunnel.send(f"GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        assert (await tunnel.read_response()).header(b"x-config") == b"v2"
        tunnel.close()

        # Workers die with the supervisor, however it ends (PR_SET_PDEATHSIG).
        metrics_dir = served.metrics_dir()
        assert metrics_dir is not None
        os.kill(served.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in pids):
            assert time.monotonic() < deadline, "workers outlived a killed supervisor"
            await asyncio.sleep(0.05)
        shutil.rmtree(metrics_dir)  # left behind: nobody survived to remove it


async def test_crashed_worker_restarts_with_the_latest_config_then_sigterm_drains(
        backend: TestBackend) -> None:
    async with Supervisor() as served:
        assert (await served.push(route(backend.url, 1))).status_code == 200
        before = await served.workers()
        tracker = children(served.pid) - before  # multiprocessing's resource tracker
        metrics_dir = served.metrics_dir()
        assert metrics_dir is not None and os.path.isdir(metrics_dir)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{victim}"):  # until the supervisor has reaped it
            assert time.monotonic() < deadline, "the killed worker was never reaped"
            await asyncio.sleep(0.01)
        # Pushed while the victim is dead or restarting: the replacement must get it.
        assert (await served.push(route(backend.url, 2))).status_code == 200
        deadline = time.monotonic() + 10
        while True:
            pids = await served.workers()
            if victim not in pids:
                newcomer = (pids - before).pop()
                owners, seen = await served_by(served.port, pids, 30)
                assert seen == {b"v2"}
                if owners[newcomer]:
                    break
            assert time.monotonic() < deadline, "the restarted worker never served"
            await asyncio.sleep(0.1)
        assert requests_total((await served.admin.get("/metrics")).text) >= 30

        # SIGTERM: not ready at once, in-flight requests finish, every process exits.
        pending = asyncio.ensure_future(fresh_connections(served.port, 4, "/slow?delay=1"))
        await asyncio.sleep(0.4)  # the requests now wait on the backend
        os.kill(served.pid, signal.SIGTERM)
        await asyncio.sleep(0.2)
        readyz = await served.admin.get("/readyz")
        assert (readyz.status_code, readyz.text) == (503, "not ready: draining\n")
        assert await pending == {b"v2"}
        assert served.proc is not None
        assert await asyncio.to_thread(served.proc.wait, 15) == 0
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in pids | tracker):
            assert time.monotonic() < deadline, [p for p in pids | tracker if alive(p)]
            await asyncio.sleep(0.05)
        log = served.proc.stderr.read() if served.proc.stderr else ""
        assert "worker exited unexpectedly" in log and f"pid={victim}" in log
        assert not os.path.exists(metrics_dir)


async def test_tunnel_mode_keeps_cloudflared_and_secrets_in_the_supervisor(
        tmp_path: Path, backend: TestBackend) -> None:
    tunnel_port = free_port()
    env = {"TUNNEL_TOKEN": "tunnel-token", "FAKE_CF_EXPECT_TOKEN": "tunnel-token",
           "FAKE_CF_READY_AFTER_MS": "800", "PROXY_AUTH_TOKEN": "api-token"}
    async with Supervisor("--tunnel-listen", f"127.0.0.1:{tunnel_port}", "--cloudflared-bin",
                          str(make_launcher(tmp_path)), "--grace-period", "1s",
                          env=env) as served:
        served.admin.headers["Authorization"] = "Bearer api-token"
        assert (await served.push(route(backend.url, 1))).status_code == 200
        deadline = time.monotonic() + 10
        while (readyz := await served.admin.get("/readyz")).status_code != 200:
            assert readyz.text == "not ready: tunnel not connected to edge\n"
            assert time.monotonic() < deadline, "cloudflared never became ready"
            await asyncio.sleep(0.1)
        pids = await served.workers()
        cloudflared = [pid for pid in children(served.pid) - pids
                       if b"cloudflared" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(cloudflared) == 1 and all(not children(pid) for pid in pids)
        for pid in pids:
            assert not {"TUNNEL_TOKEN", "PROXY_AUTH_TOKEN"} & set(environ(pid))
        owners, _ = await served_by(tunnel_port, pids, 20)
        assert all(owners.values()), owners
        # The tunnel entrance's trust rules run in the workers.
        client = await RawClient.connect(tunnel_port)
        client.send(f"GET / HTTP/1.1\r\nHost: {HOST}\r\nCF-Connecting-IP: 203.0.113.9\r\n"
                    "X-Forwarded-For: 6.6.6.6\r\n\r\n".encode())
        echoed = dict((await client.read_response(timeout=READ_TIMEOUT)).json()["headers"])
        client.close()
        assert echoed["X-Forwarded-For"] == "203.0.113.9"
        # The supervisor serves /metrics: the workers' sums and cloudflared's series.
        metrics = (await served.admin.get("/metrics")).text
        assert "\ncloudflared_tunnel_ha_connections 4" in metrics
        assert 'tunnelgate_cloudflared_state{state="connected"} 1.0' in metrics
        assert "cftunnel_proxy_requests_total" in metrics
        served.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert await asyncio.to_thread(served.proc.wait, 15) == 0  # type: ignore[union-attr]
        log = served.proc.stderr.read()  # type: ignore[union-attr]
        assert "Tunnel server stopped" in log
        assert not any(alive(pid) for pid in [*pids, *cloudflared])


async def test_second_signal_kills_the_workers_at_once(backend: TestBackend) -> None:
    async with Supervisor() as served:
        assert (await served.push(route(backend.url, 1))).status_code == 200
        pids = await served.workers()
        metrics_dir = served.metrics_dir()
        assert metrics_dir is not None
        pending = asyncio.ensure_future(fresh_connections(served.port, 2, "/hang"))
        await asyncio.sleep(0.4)
        started = time.monotonic()
        os.kill(served.pid, signal.SIGTERM)
        await asyncio.sleep(0.3)
        os.kill(served.pid, signal.SIGTERM)
        assert await asyncio.to_thread(served.proc.wait, 10) == 1  # type: ignore[union-attr]
        assert time.monotonic() - started < 5
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await pending
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in pids):
            assert time.monotonic() < deadline, "workers survived the second signal"
            await asyncio.sleep(0.05)
        assert not os.path.exists(metrics_dir)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def refusing_worker(settings, link: WorkerLink) -> int:  # noqa: ANN001
    """The real worker, except that worker 1 cannot compile version 13 (a stand-in for a
    compile bug: a validated config never fails to compile in the real code), and that
    every worker refuses a config that is not the JSON as pushed (the test pushes it
    indented; re-encoding it would cost the supervisor a to_wire and a dump per push)."""
    import proxy.control.workerprocess

    build = proxy.control.workerprocess._build

    def refuse(holder, body: bytes, pause):  # noqa: ANN001, ANN202
        if link.index == 1 and json.loads(body)["version"] == REFUSED_VERSION:
            raise RuntimeError("compile bug")
        if b"\n" not in body:
            raise RuntimeError("not the pushed bytes: the supervisor re-encoded them")
        return build(holder, body, pause)

    proxy.control.workerprocess._build = refuse  # in this worker process only
    return worker_main(settings, link)


async def test_a_worker_that_cannot_take_a_push_makes_it_500_and_changes_nothing(
        backend: TestBackend) -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    settings = from_args(parser.parse_args(
        ["--workers", "2", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]), {})
    runtime = Runtime(settings, worker_entry=refusing_worker)
    listening = await runtime.start()
    assert listening.cluster is not None and listening.cluster.port
    try:
        async with httpx.AsyncClient(base_url=f"http://{listening.admin}") as admin:

            async def push(version: int) -> httpx.Response:
                return await admin.put("/config",
                                       content=json.dumps(route(backend.url, version), indent=1),
                                       headers={"Content-Type": "application/json"})

            assert (await push(12)).status_code == 200
            failed = await push(REFUSED_VERSION)
            assert (failed.status_code, failed.text) == (500, "internal server error\n")
            # Worker 0 compiled 13 too, but the push was aborted everywhere.
            assert await fresh_connections(listening.cluster.port, 40) == {b"v12"}
            assert (await admin.get("/config")).json()["version"] == 12
            assert (await push(14)).status_code == 200
            assert await fresh_connections(listening.cluster.port, 40) == {b"v14"}
        pids = worker_pids(os.getpid())
        assert len(pids) == 2
        assert await runtime.drain()
    finally:
        await runtime.close()
    assert not any(alive(pid) for pid in pids)
    assert not os.path.exists(runtime.plane.metrics_dir)  # type: ignore[union-attr]


def test_a_busy_port_stops_the_supervisor_before_any_worker() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli("serve", "--workers", "2", "--listen", f"127.0.0.1:{port}",
                   "--admin", f"127.0.0.1:{free_port()}", timeout=20)
    assert done.returncode == 1
    assert "cannot start" in done.stderr and "worker listening" not in done.stderr


def test_workers_flag_is_bounded() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert from_args(parser.parse_args(["--workers", "64"]), {}).workers == 64
    for bad in ("0", "65", "two"):
        with pytest.raises(SettingsError, match="--workers"):
            from_args(parser.parse_args(["--workers", bad]), {})


async def test_meaningless_signals_to_a_worker_are_ignored(backend: TestBackend) -> None:
    async with Supervisor() as served:
        assert (await served.push(route(backend.url, 1))).status_code == 200
        before = await served.workers()
        for pid in before:
            for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
                os.kill(pid, signum)
        await asyncio.sleep(0.5)
        assert all(alive(pid) for pid in before)
        assert await served.workers() == before  # none died, none was restarted
        _, seen = await served_by(served.port, before, 10)
        assert seen == {b"v1"}
