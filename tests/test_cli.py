"""The ``tunnelgate`` command as a real subprocess, and settings resolution."""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import AsyncIterator

import httpx
import pytest

from proxy.control.demo import start_backend
from proxy.control.flags import add_serve_arguments
from proxy.control.resolve import from_args
from proxy.control.settings import Address, SettingsError, parse_address
from tests.fake_cloudflared import make_launcher

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "cli-test-token"

CONFIG = {"version": 3, "rules": [
    {"hostnames": ["app.example.com"],
     "matches": [{"path": {"type": "PathPrefix", "value": "/api"},
                  "headers": [{"type": "Exact", "name": "X-Env", "value": "beta"}]}],
     "backends": [{"url": "http://beta.internal:8080", "weight": 1}]},
    {"hostnames": ["app.example.com"],
     "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
     "backends": [{"url": "http://api.internal:8080", "weight": 1}]},
]}

HTTPROUTE = """\
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: shop}
spec:
  hostnames: [shop.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /cart}}]
    backendRefs: [{name: cart, port: 8080}]
"""


def cli(*args: str, env: dict[str, str] | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=ROOT,
                          env=clean_env(env), capture_output=True, text=True,
                          timeout=timeout)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test runner's environment without any PROXY_* / TUNNEL_TOKEN it may carry."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PROXY_") and k != "TUNNEL_TOKEN"}
    return {**env, **(extra or {})}


def free_port() -> int:
    """A loopback port, free now, for a server a test starts later (a subprocess, a
    fake cloudflared). Picked below the kernel's ephemeral range: a port from bind(0)
    could meanwhile go to another bind(0) or to an outgoing connection of the run (the
    proxy's own), and the later bind fail; below the range only another pick can take
    it, and the last picks are not handed out again."""
    low = _ephemeral_low()
    if low < 4096:  # no room below the range: the kernel's pick, as before
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    for _ in range(200):
        port = random.randrange(max(1024, low - 12_000), low)
        if port in _RECENT_PICKS:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or lingering): another one
        _RECENT_PICKS.append(port)
        return port
    raise RuntimeError("no free loopback port below the ephemeral range")


_RECENT_PICKS: collections.deque[int] = collections.deque(maxlen=256)


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 if it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return path


# --------------------------------------------------------------------------- check / explain


def test_check_prints_the_compiled_table(config_file: Path) -> None:
    done = cli("check", str(config_file))
    assert done.returncode == 0, done.stderr
    assert "valid; version 3" in done.stdout
    assert "app.example.com" in done.stdout and "api.internal" in done.stdout


def test_check_reads_httproute_yaml(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(HTTPROUTE)
    done = cli("check", str(path))
    assert done.returncode == 0, done.stderr
    assert "shop.example.com" in done.stdout
    assert "cart.shop.svc.cluster.local" in done.stdout


def test_check_detects_yaml_by_content(tmp_path: Path) -> None:
    path = tmp_path / "routes.txt"
    path.write_text(HTTPROUTE)
    assert cli("check", str(path)).returncode == 0


def test_check_rejects_with_the_field_path(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(CONFIG))
    bad["rules"][1]["matches"][0]["path"]["type"] = "Foo"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    done = cli("check", str(path))
    assert done.returncode == 1
    assert "rules[1].matches[0].path.type" in done.stderr
    missing = cli("check", str(tmp_path / "nope.json"))
    assert missing.returncode == 1 and "nope.json" in missing.stderr


def test_explain_shows_the_winner_and_misses(config_file: Path) -> None:
    done = cli("explain", str(config_file), "--host", "app.example.com", "--path",
               "/api/x", "--header", "X-Env: beta")
    assert done.returncode == 0, done.stderr
    assert "winner" in done.stdout and "beta.internal" in done.stdout
    plain = cli("explain", str(config_file), "--host", "APP.example.com:443",
                "--path", "/api/x")
    assert "api.internal" in plain.stdout and "beta.internal" not in plain.stdout.split(
        "winner")[-1]
    miss = cli("explain", str(config_file), "--host", "other.example.com", "--path", "/")
    assert miss.returncode == 0 and "no matching route" in miss.stdout


def test_explain_rejects_a_malformed_header(config_file: Path) -> None:
    done = cli("explain", str(config_file), "--host", "a", "--path", "/",
               "--header", "no-colon")
    assert done.returncode == 1 and "NAME:VALUE" in done.stderr


def test_cloudflared_config() -> None:
    done = cli("cloudflared-config", "--hostname", "app.example.com",
               "--service", "unix:/run/tunnelgate/origin.sock")
    assert done.returncode == 0, done.stderr
    assert "- service: unix:/run/tunnelgate/origin.sock" in done.stdout
    assert "hostname:" not in done.stdout and "http_status:404" not in done.stdout
    assert cli("cloudflared-config", "--hostname", "bad:80").returncode == 2


# --------------------------------------------------------------------------- serve


class Served:
    """``tunnelgate serve`` as a child process on free 127.0.0.1 ports."""

    def __init__(self, *extra: str, env: dict[str, str] | None = None,
                 listen: bool = True) -> None:
        self.port, self.admin_port = free_port(), free_port()
        self.args = [sys.executable, "-m", "proxy", "serve",
                     "--admin", f"127.0.0.1:{self.admin_port}", *extra]
        if listen:
            self.args += ["--listen", f"127.0.0.1:{self.port}"]
        self.env = clean_env(env)
        self.proc: subprocess.Popen[str] | None = None

    async def __aenter__(self) -> "Served":
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.admin = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.admin_port}",
                                       timeout=5)
        self.data = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited early: {self.proc.stderr.read()}")
            try:
                if (await self.admin.get("/healthz")).status_code == 200:
                    return self
            except httpx.TransportError:
                await asyncio.sleep(0.05)
        raise AssertionError("serve did not answer /healthz within 15 s")

    async def __aexit__(self, *exc: object) -> None:
        await self.admin.aclose()
        await self.data.aclose()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    async def wait(self, timeout: float = 15) -> int:
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait, timeout)

    async def push(self, config: dict, token: str | None = None) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return await self.admin.put("/config", content=json.dumps(config), headers=headers)


def backend_config(port: int, version: int = 5) -> dict:
    return {"version": version, "rules": [{
        "hostnames": ["app.example.com"],
        "filters": [{"type": "ResponseHeaderModifier", "responseHeaderModifier": {
            "set": [{"name": "X-Via", "value": "tunnelgate"}]}}],
        "backends": [{"url": f"http://127.0.0.1:{port}", "weight": 1}]}]}


@pytest.fixture
async def backend() -> AsyncIterator[int]:
    server, port = await start_backend("blue")
    yield port
    server.close()


async def test_serve_health_push_route_and_sigterm(backend: int) -> None:
    async with Served(env={"PROXY_AUTH_TOKEN": TOKEN,
                           "PROXY_ACCESS_LOG_ENABLED": "true"}) as served:
        assert (await served.admin.get("/readyz")).status_code == 503
        assert (await served.push(backend_config(backend))).status_code == 401
        assert (await served.push(backend_config(backend), TOKEN)).status_code == 200
        assert (await served.admin.get("/readyz")).status_code == 200
        response = await served.data.get("/hello?x=1", headers={"Host": "app.example.com"})
        assert response.status_code == 200
        assert response.json()["backend"] == "blue"
        assert response.json()["path"] == "/hello?x=1"
        assert response.headers["x-via"] == "tunnelgate"
        miss = await served.data.get("/", headers={"Host": "nope.example.com"})
        assert miss.status_code == 404
        metrics = (await served.admin.get("/metrics")).text
        assert ('cftunnel_proxy_requests_total{hostname="app.example.com",'
                'status_class="2xx"} 1.0') in metrics
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0
        assert served.proc is not None
        access = [json.loads(line) for line in served.proc.stdout.read().splitlines()]
        assert [(a["path"], a["query"], a["status"]) for a in access] == [
            ("/hello", "x=1", 200), ("/", "", 404)]


async def test_serve_loads_config_file_at_start(tmp_path: Path, backend: int) -> None:
    path = tmp_path / "start.json"
    path.write_text(json.dumps(backend_config(backend, version=11)))
    async with Served("--config", str(path)) as served:
        assert (await served.admin.get("/config")).json() == {"version": 11, "ready": True}
        response = await served.data.get("/", headers={"Host": "app.example.com"})
        assert response.json()["backend"] == "blue"
        served.signal(signal.SIGINT)
        assert await served.wait() == 0


class SlowBackend:
    """Answers every request after ``delay`` seconds (to catch requests mid-drain)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def _client(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(self.delay)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


async def test_sigterm_drains_in_flight_requests_then_exits_0() -> None:
    async with SlowBackend(1.0) as port, Served("--grace-period", "10s") as served:
        assert (await served.push(backend_config(port))).status_code == 200
        pending = asyncio.ensure_future(
            served.data.get("/slow", headers={"Host": "app.example.com"}))
        await asyncio.sleep(0.3)  # the request is now waiting on the backend
        served.signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        readyz = await served.admin.get("/readyz")
        assert readyz.status_code == 503 and readyz.text == "not ready: draining\n"
        response = await pending
        assert response.status_code == 200 and response.text == "slow"
        assert await served.wait() == 0


async def test_second_signal_exits_at_once() -> None:
    async with SlowBackend(30.0) as port, Served("--grace-period", "60s") as served:
        assert (await served.push(backend_config(port))).status_code == 200
        pending = asyncio.ensure_future(
            served.data.get("/hang", headers={"Host": "app.example.com"}))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        served.signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        served.signal(signal.SIGTERM)
        assert await served.wait() == 1
        assert time.monotonic() - started < 5
        with pytest.raises(httpx.TransportError):
            await pending


async def test_tunnel_mode_supervises_cloudflared_and_gates_readiness(
        tmp_path: Path, backend: int) -> None:
    launcher = make_launcher(tmp_path)
    tunnel_port = free_port()
    env = {"TUNNEL_TOKEN": "tunnel-token", "FAKE_CF_EXPECT_TOKEN": "tunnel-token",
           "FAKE_CF_READY_AFTER_MS": "1500"}
    # cloudflared waits its whole --grace-period on SIGTERM: keep the drain short.
    async with Served("--tunnel-listen", f"127.0.0.1:{tunnel_port}", "--grace-period", "1s",
                      "--cloudflared-bin", str(launcher), env=env, listen=False) as served:
        assert (await served.push(backend_config(backend))).status_code == 200
        waiting = await served.admin.get("/readyz")
        assert waiting.text == "not ready: tunnel not connected to edge\n"
        deadline = time.monotonic() + 10
        while (await served.admin.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, "cloudflared never became ready"
            await asyncio.sleep(0.1)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{tunnel_port}") as tunnel:
            response = await tunnel.get("/", headers={
                "Host": "app.example.com", "CF-Connecting-IP": "203.0.113.9",
                "X-Forwarded-For": "6.6.6.6"})
        assert response.json()["headers"]["x-forwarded-for"] == "203.0.113.9"
        with pytest.raises(httpx.ConnectError):  # no cluster entrance unless --listen
            await served.data.get("/", headers={"Host": "app.example.com"})
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0
        assert served.proc is not None
        log = served.proc.stderr.read()
        assert "cloudflared" in log and "Tunnel server stopped" in log


def test_empty_auth_token_refuses_to_start() -> None:
    done = cli("serve", "--listen", f"127.0.0.1:{free_port()}",
               "--admin", f"127.0.0.1:{free_port()}", env={"PROXY_AUTH_TOKEN": ""})
    assert done.returncode == 1
    assert "refusing to start with a broken config-API auth configuration" in done.stderr
    assert "PROXY_AUTH_TOKEN is set but empty" in done.stderr


@pytest.mark.parametrize("args, needle", [
    (["--header-timeout", "soon"], "--header-timeout"),
    (["--workers", "0"], "--workers"),
    (["--listen", "nowhere"], "--listen"),
    (["--cluster-allow", "10.0.0.0/8,bogus"], "--cluster-allow"),
    (["--max-connections", "0"], "--max-connections"),
])
def test_bad_flags_exit_2_naming_the_flag(args: list[str], needle: str) -> None:
    done = cli("serve", "--admin", f"127.0.0.1:{free_port()}", *args)
    assert done.returncode == 2
    assert needle in done.stderr


def test_invalid_start_config_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"version": 1, "rules": [{"backends": [{"url": ""}]}]}')
    done = cli("serve", "--listen", f"127.0.0.1:{free_port()}",
               "--admin", f"127.0.0.1:{free_port()}", "--config", str(path))
    assert done.returncode == 1
    assert "rules[0].backends[0]" in done.stderr


# --------------------------------------------------------------------------- settings


def settings(*args: str, env: dict[str, str] | None = None):  # noqa: ANN201
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return from_args(parser.parse_args(list(args)), env or {})


@pytest.mark.parametrize("text, expected", [
    (":8080", Address(None, 8080)), ("0.0.0.0:80", Address("0.0.0.0", 80)),
    ("[::1]:9000", Address("::1", 9000)), ("localhost:0", Address("localhost", 0)),
    ("unix:/run/tg.sock", Address(path="/run/tg.sock"))])
def test_parse_address(text: str, expected: Address) -> None:
    assert parse_address(text, "--x") == expected


@pytest.mark.parametrize("text", ["8080", "host:", "host:99999", "::1:80", "unix:rel.sock"])
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(SettingsError, match="--x"):
        parse_address(text, "--x")


def test_standalone_defaults() -> None:
    s = settings()
    assert s.listen == Address(None, 8080) and s.admin == Address(None, 8081)
    assert s.tunnel_listen is None and s.cluster_scope == "all"
    assert s.auth_token is None and s.metrics_enabled and s.grace_period == 30.0
    assert settings(env={"PROXY_ADDR": "127.0.0.1:9"}).listen == Address("127.0.0.1", 9)


def test_tunnel_mode_defaults() -> None:
    s = settings(env={"TUNNEL_TOKEN": "abc"})
    assert s.tunnel_listen == Address("127.0.0.1", 8082)
    assert s.listen is None  # the cluster entrance is opt-in with a tunnel
    assert s.cluster_scope == "probes"
    s = settings("--tunnel-listen", "unix:/tmp/x.sock", "--listen", ":8080",
                 env={"PROXY_ADDR": ":1"})
    assert s.listen == Address(None, 8080) and s.cluster_scope == "probes"
    assert s.tunnel_token is None
    assert settings("--tunnel-listen", ":8082", "--cluster-scope", "all").cluster_scope == "all"


@pytest.mark.parametrize("flag, warned", [
    ("127.0.0.1:8082", False), ("localhost:8082", False), ("[::1]:8082", False),
    ("127.0.0.2:8082", False), ("unix:/tmp/t.sock", False), (":8082", True),
    ("0.0.0.0:8082", True), ("[::]:8082", True), ("10.0.0.5:8082", True),
    ("tunnelgate:8082", True)])
def test_a_tunnel_entrance_others_can_reach_is_warned_about(
        caplog: pytest.LogCaptureFixture, flag: str, warned: bool) -> None:
    """It trusts CF-Connecting-IP: off loopback, anyone there could forge it."""
    with caplog.at_level(logging.WARNING, logger="tunnelgate.settings"):
        assert settings("--tunnel-listen", flag).tunnel_listen is not None
    said = [r.getMessage() for r in caplog.records if "--tunnel-listen" in r.getMessage()]
    assert len(said) == int(warned), said


@pytest.mark.parametrize("value, expected", [
    ("45s", 45.0), ("1m30s", 90.0), ("0", 30.0), ("-5s", 30.0), ("soon", 30.0),
    ("10m", 180.0)])
def test_grace_period_env_follows_the_anchor(value: str, expected: float) -> None:
    assert settings(env={"PROXY_GRACE_PERIOD": value}).grace_period == expected


@pytest.mark.parametrize("value, enabled", [
    ("0", False), ("false", False), (" FALSE ", False), ("no", False), ("Off", False),
    ("1", True), ("yes", True), ("", True)])
def test_metrics_enabled_unless_turned_off(value: str, enabled: bool) -> None:
    assert settings(env={"PROXY_METRICS_ENABLED": value}).metrics_enabled is enabled


BOOLEAN_VARIABLES = {
    "PROXY_METRICS_ENABLED": lambda s: s.metrics_enabled,
    "PROXY_ACCESS_LOG_ENABLED": lambda s: s.access_log.enabled,
    "PROXY_ACCESS_LOG_STRIP_QUERY": lambda s: s.access_log.strip_query,
    "PROXY_TRACING_ENABLED": lambda s: s.tracing.enabled,
}
SPELLINGS = [("1", True), ("true", True), ("TRUE", True), (" yes ", True), ("Yes", True),
             ("on", True), ("ON", True), ("0", False), ("false", False), ("False", False),
             ("no", False), ("NO", False), ("off", False), ("Off ", False)]


@pytest.mark.parametrize("variable", sorted(BOOLEAN_VARIABLES))
@pytest.mark.parametrize("value, expected", SPELLINGS)
def test_every_boolean_variable_takes_the_usual_spellings(variable: str, value: str,
                                                          expected: bool) -> None:
    assert BOOLEAN_VARIABLES[variable](settings(env={variable: value})) is expected


@pytest.mark.parametrize("variable", sorted(BOOLEAN_VARIABLES))
@pytest.mark.parametrize("value", ["2", "enabled", "y", "tru", "on off"])
def test_a_boolean_variable_with_another_value_is_refused(variable: str,
                                                          value: str) -> None:
    with pytest.raises(SettingsError, match=f"^{variable}: expected 1/0, true/false"):
        settings(env={variable: value})


def test_serve_refuses_a_misspelled_boolean_at_start() -> None:
    done = cli("serve", "--admin", "127.0.0.1:0", "--listen", "127.0.0.1:0",
               env={"PROXY_ACCESS_LOG_ENABLED": "enabled"})
    assert done.returncode == 2
    assert "PROXY_ACCESS_LOG_ENABLED: expected 1/0, true/false, yes/no or on/off, " \
           "got 'enabled'" in done.stderr


def test_access_log_env() -> None:
    s = settings(env={"PROXY_ACCESS_LOG_ENABLED": " True ",
                      "PROXY_ACCESS_LOG_SAMPLING_RATE": "7",
                      "PROXY_ACCESS_LOG_STRIP_QUERY": "1"})
    assert s.access_log.enabled and s.access_log.strip_query
    assert s.access_log.sampling_rate == 1.0
    assert settings(env={"PROXY_ACCESS_LOG_ENABLED": "yes"}).access_log.enabled is True
    assert settings(env={"PROXY_ACCESS_LOG_SAMPLING_RATE": "x"}).access_log.sampling_rate == 1.0


def test_auth_token_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert settings("--auth-token-file", str(path),
                    env={"PROXY_AUTH_TOKEN": "env"}).auth_token == "from-file"
    path.write_text("\n")
    with pytest.raises(SettingsError) as err:
        settings("--auth-token-file", str(path))
    assert err.value.exit_code == 1


def test_ws_timeouts_and_tunnel_protocol() -> None:
    s = settings(env={"PROXY_WS_DIAL_TIMEOUT": "5s", "PROXY_WS_HANDSHAKE_TIMEOUT": "bad",
                      "PROXY_TUNNEL_PROTOCOL": "sctp"})
    assert s.ws_dial_timeout == 5.0 and s.ws_handshake_timeout == 30.0
    assert s.tunnel_protocol == "auto"
    assert settings(env={"PROXY_TUNNEL_PROTOCOL": "http2"}).tunnel_protocol == "http2"


def test_missing_cloudflared_binary_exits_1(tmp_path: Path) -> None:
    done = cli("serve", "--admin", f"127.0.0.1:{free_port()}",
               "--tunnel-listen", f"127.0.0.1:{free_port()}",
               "--cloudflared-bin", str(tmp_path / "no-such-cloudflared"),
               env={"TUNNEL_TOKEN": "t"})
    assert done.returncode == 1
    assert "no-such-cloudflared" in done.stderr and "not found" in done.stderr


async def test_signals_without_meaning_are_ignored_and_logged_once(backend: int) -> None:
    async with Served("--log-level", "info") as served:
        assert (await served.push(backend_config(backend))).status_code == 200
        assert served.proc is not None
        for signum in (signal.SIGUSR1, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE,
                       signal.SIGALRM, signal.SIGUSR1):
            os.kill(served.proc.pid, signum)
            await asyncio.sleep(0.1)
        assert served.proc.poll() is None, "a meaningless signal ended the process"
        response = await served.data.get("/", headers={"Host": "app.example.com"})
        assert response.status_code == 200
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0
        log = served.proc.stderr.read()
    ignored = [line for line in log.splitlines() if "signal ignored" in line]
    assert [line.split("signal=")[1] for line in ignored] == ["SIGUSR1", "SIGUSR2",
                                                               "SIGALRM"]
    assert all("level=info" in line for line in ignored)


def test_backend_max_connections_flag_env_and_default() -> None:
    assert settings().backend_max_connections == 0  # no limit
    env = {"PROXY_BACKEND_MAX_CONNECTIONS": "16"}
    assert settings(env=env).backend_max_connections == 16
    assert settings("--backend-max-connections", "4", env=env).backend_max_connections == 4
    with pytest.raises(SettingsError, match="PROXY_BACKEND_MAX_CONNECTIONS"):
        settings(env={"PROXY_BACKEND_MAX_CONNECTIONS": "many"})
    with pytest.raises(SettingsError, match="--backend-max-connections"):
        settings("--backend-max-connections", "-1")
