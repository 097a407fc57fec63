"""A stand-in for the cloudflared binary, for supervisor and CLI tests.

Run as a program it accepts exactly the argv tunnelgate builds —
``tunnel --no-autoupdate --metrics HOST:PORT [--grace-period D] [--protocol P]
[--loglevel L] run`` — and exits 2 on anything else (a token on the command line
included: it must come through ``TUNNEL_TOKEN``). It serves cloudflared's metrics
endpoints ``/ready`` and ``/healthcheck`` on ``--metrics`` and prints
cloudflared-style log lines (``<time> INF …``). Like the real cloudflared 2026.8.2, on
SIGTERM it unregisters (``/ready`` 503) and then waits its **whole** ``--grace-period``
(default 30 s), even with nothing in flight, before it exits 0.

It also serves ``/metrics`` (a few ``cloudflared_tunnel_*`` series plus Go-runtime
ones, as the real exposition has) and acts as a connector: ``GET /proxy/PATH`` is
forwarded to ``$FAKE_CF_ORIGIN/PATH`` with edge headers, and the origin's status and
body come back (in the real product the edge sends requests over the tunnel; here the
test plays the edge). Registration and SIGTERM are logged with ``at=<epoch seconds>``
so a test can order events across processes.

Behaviour is steered by environment variables:

``FAKE_CF_READY_AFTER_MS``  ``/ready`` answers 503 until then, 200 after (default 0)
``FAKE_CF_CRASH_AFTER_MS``  exit 1 after this long
``FAKE_CF_IGNORE_SIGTERM``  ``1``: ignore SIGTERM (only SIGKILL ends it)
``FAKE_CF_EXPECT_TOKEN``    exit 3 unless ``TUNNEL_TOKEN`` equals it
``FAKE_CF_GET_URL``         once ready, GET this URL and log status and body
``FAKE_CF_ORIGIN``          ``http://host:port`` that ``/proxy/…`` forwards to
``FAKE_CF_METRICS_HANG``    ``1``: ``/metrics`` accepts and never answers
``FAKE_CF_UNREADY_PROTOCOL``  run with this ``--protocol``, it never registers

Tests start it through :func:`make_launcher`, an executable file that runs this script
with the current interpreter (no shell involved), or through :func:`sidecar`, which
runs it as a sidecar container would run cloudflared: beside tunnelgate, not under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

_VALUED = ("--metrics", "--grace-period", "--protocol", "--loglevel")


def make_launcher(directory: Path, name: str = "cloudflared") -> Path:
    """Write an executable ``directory/name`` that runs this fake; return its path."""
    path = directory / name
    path.write_text(f"#!{sys.executable}\nimport runpy\n"
                    f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')\n")
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def sidecar(metrics_addr: str, grace: str = "100ms",
            env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run the fake as another process with ``--metrics metrics_addr``, wait until its
    ``/ready`` says 200, yield the process; SIGTERM (then its grace) at the end."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "tunnel", "--no-autoupdate",
         "--metrics", metrics_addr, "--grace-period", grace, "run"],
        env={**os.environ, "TUNNEL_TOKEN": "sidecar-token", **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):  # up to ~10 s
            if proc.poll() is not None:
                raise RuntimeError(f"fake cloudflared exited with {proc.returncode}")
            try:
                if fetch(f"http://{metrics_addr}/ready")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError("fake cloudflared sidecar never became ready")
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)


def say(level: str, message: str) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"{now} {level} {message}", flush=True)


def parse(argv: list[str]) -> dict[str, str]:
    """The flags of ``tunnel … run``; exits 2 on anything unexpected."""
    if not argv or argv[0] != "tunnel" or argv[-1] != "run":
        fail(f"expected 'tunnel ... run', got {argv!r}")
    flags: dict[str, str] = {}
    rest = argv[1:-1]
    while rest:
        arg = rest.pop(0)
        if arg == "--no-autoupdate":
            flags[arg] = ""
        elif arg in _VALUED and rest:
            flags[arg] = rest.pop(0)
        else:
            fail(f"unknown or incomplete argument {arg!r} in {argv!r}")
    if "--no-autoupdate" not in flags or "--metrics" not in flags:
        fail(f"--no-autoupdate and --metrics are required, got {argv!r}")
    return flags


def fail(message: str) -> None:
    print(f"fake-cloudflared: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def env_ms(name: str) -> float | None:
    value = os.environ.get(name)
    return int(value) / 1000 if value else None


def go_seconds(text: str) -> float:
    """A Go duration as tunnelgate writes them (``2500ms``, ``30s``) in seconds."""
    if text.endswith("ms"):
        return int(text[:-2]) / 1000
    if text.endswith("s"):
        return float(text[:-1])
    fail(f"unsupported duration {text!r}")
    return 0.0


METRICS = """\
# HELP cloudflared_tunnel_ha_connections Number of active ha connections
# TYPE cloudflared_tunnel_ha_connections gauge
cloudflared_tunnel_ha_connections {connections}
# HELP cloudflared_tunnel_total_requests Amount of requests proxied through all the tunnels
# TYPE cloudflared_tunnel_total_requests counter
cloudflared_tunnel_total_requests {requests}
# HELP cloudflared_tunnel_server_locations Where each tunnel is connected to.
# TYPE cloudflared_tunnel_server_locations gauge
cloudflared_tunnel_server_locations{{connection_id="0",edge_location="tst01"}} 1
# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 42
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 0.5
"""


class Fake:
    def __init__(self, flags: dict[str, str]) -> None:
        self.flags = flags
        self.loop = asyncio.get_running_loop()
        self.ready_at = self.loop.time() + (env_ms("FAKE_CF_READY_AFTER_MS") or 0)
        self.grace = go_seconds(flags.get("--grace-period", "30s"))
        self.draining = False
        self.requests = 0
        self.done = asyncio.Event()
        self.loop.call_at(self.ready_at, self.registered)

    def registered(self) -> None:
        if self.ready():
            say("INF", f"Registered tunnel connection at={time.time():.6f}")

    def ready(self) -> bool:
        unready = os.environ.get("FAKE_CF_UNREADY_PROTOCOL")
        if unready and self.flags.get("--protocol") == unready:
            return False
        return not self.draining and self.loop.time() >= self.ready_at

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readline()
        while (await reader.readline()).strip():
            pass
        path = request.split(b" ")[1].decode() if request.count(b" ") >= 2 else ""
        content_type = "text/plain; charset=utf-8"
        if path == "/ready":
            status = 200 if self.ready() else 503
            body = json.dumps({"status": status, "readyConnections": 4 if status == 200 else 0,
                               "connectorId": "00000000-0000-4000-8000-000000000000"}).encode()
            content_type = "application/json"
        elif path == "/healthcheck":
            status, body = 200, b"OK\n"
        elif path == "/metrics":
            if os.environ.get("FAKE_CF_METRICS_HANG") == "1":
                await reader.read()  # until the scraper gives up and closes
                writer.close()
                return
            status = 200
            body = METRICS.format(connections=4 if self.ready() else 0,
                                  requests=self.requests).encode()
        elif path.startswith("/proxy/") and os.environ.get("FAKE_CF_ORIGIN"):
            self.requests += 1
            status, body = await asyncio.to_thread(
                fetch, os.environ["FAKE_CF_ORIGIN"] + path[len("/proxy"):],
                {"Cf-Connecting-Ip": "203.0.113.7", "Cf-Visitor": '{"scheme":"https"}'})
        else:
            status, body = 404, b"404 page not found\n"
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s"
                     % (status, content_type.encode(), len(body), body))
        await writer.drain()
        writer.close()

    def on_sigterm(self) -> None:
        if os.environ.get("FAKE_CF_IGNORE_SIGTERM") == "1":
            say("WRN", "SIGTERM ignored on purpose")
            return
        say("INF", f"Initiating graceful shutdown due to signal terminated ... "
                   f"at={time.time():.6f}")
        self.draining = True
        # The real cloudflared waits its whole grace period, in flight or not.
        self.loop.call_later(self.grace, self.done.set)

    async def get_once_ready(self, url: str) -> None:
        await asyncio.sleep(max(0.0, self.ready_at - self.loop.time()))
        try:
            status, body = await asyncio.to_thread(fetch, url)
        except OSError as err:
            say("ERR", f"GET {url} failed: {err}")
            return
        say("INF", f"GET {url} -> {status} {body!r}")


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.read(4096)
    except urllib.error.HTTPError as err:
        return err.code, err.read(4096)
    except OSError:
        return 502, b"origin unreachable\n"  # cloudflared's answer when the origin is down


async def main(argv: list[str]) -> int:
    flags = parse(argv)
    token = os.environ.get("TUNNEL_TOKEN", "")
    expected = os.environ.get("FAKE_CF_EXPECT_TOKEN")
    if not token or (expected is not None and token != expected):
        print("fake-cloudflared: TUNNEL_TOKEN missing or wrong", file=sys.stderr, flush=True)
        return 3
    fake = Fake(flags)
    host, _, port = flags["--metrics"].rpartition(":")
    server = await asyncio.start_server(fake.serve, host.strip("[]"), int(port))
    fake.loop.add_signal_handler(signal.SIGTERM, fake.on_sigterm)
    say("INF", f"Starting metrics server on {flags['--metrics']}/metrics "
               f"protocol={flags.get('--protocol', 'auto')} "
               f"grace={flags.get('--grace-period', '30s')} pid={os.getpid()}")
    crash = env_ms("FAKE_CF_CRASH_AFTER_MS")
    url = os.environ.get("FAKE_CF_GET_URL")
    tasks = [asyncio.ensure_future(fake.get_once_ready(url))] if url else []
    try:
        await asyncio.wait_for(fake.done.wait(), crash)
    except TimeoutError:
        say("ERR", "crashing on purpose")
        return 1
    finally:
        server.close()
        for task in tasks:
            task.cancel()
    say("INF", "Tunnel server stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(sys.argv[1:])))
