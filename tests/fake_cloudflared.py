"""A stand-in for the cloudflared binary, for supervisor and CLI tests.

Run as a program it accepts exactly the argv tunnelgate builds —
``tunnel --no-autoupdate --metrics HOST:PORT [--grace-period D] [--protocol P]
[--loglevel L] run`` — and exits 2 on anything else (a token on the command line
included: it must come through ``TUNNEL_TOKEN``). It serves cloudflared's metrics
endpoints ``/ready`` and ``/healthcheck`` on ``--metrics`` and prints
cloudflared-style log lines (``<time> INF …``).

Behaviour is steered by environment variables:

``FAKE_CF_READY_AFTER_MS``  ``/ready`` answers 503 until then, 200 after (default 0)
``FAKE_CF_CRASH_AFTER_MS``  exit 1 after this long
``FAKE_CF_DRAIN_MS``        on SIGTERM: ``/ready`` 503, keep running this long, exit 0
``FAKE_CF_IGNORE_SIGTERM``  ``1``: ignore SIGTERM (only SIGKILL ends it)
``FAKE_CF_EXPECT_TOKEN``    exit 3 unless ``TUNNEL_TOKEN`` equals it
``FAKE_CF_GET_URL``         once ready, GET this URL and log status and body

Tests start it through :func:`make_launcher`, an executable file that runs this script
with the current interpreter (no shell involved).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

_VALUED = ("--metrics", "--grace-period", "--protocol", "--loglevel")


def make_launcher(directory: Path, name: str = "cloudflared") -> Path:
    """Write an executable ``directory/name`` that runs this fake; return its path."""
    path = directory / name
    path.write_text(f"#!{sys.executable}\nimport runpy\n"
                    f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')\n")
    path.chmod(0o755)
    return path


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


class Fake:
    def __init__(self, flags: dict[str, str]) -> None:
        self.flags = flags
        self.loop = asyncio.get_running_loop()
        self.ready_at = self.loop.time() + (env_ms("FAKE_CF_READY_AFTER_MS") or 0)
        self.draining = False
        self.done = asyncio.Event()

    def ready(self) -> bool:
        return not self.draining and self.loop.time() >= self.ready_at

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readline()
        while (await reader.readline()).strip():
            pass
        path = request.split(b" ")[1] if request.count(b" ") >= 2 else b""
        if path == b"/ready":
            status = 200 if self.ready() else 503
            body = json.dumps({"status": status, "readyConnections": 4 if status == 200 else 0,
                               "connectorId": "00000000-0000-4000-8000-000000000000"}).encode()
        elif path == b"/healthcheck":
            status, body = 200, b"OK\n"
        else:
            status, body = 404, b"404 page not found\n"
        writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (status, len(body), body))
        await writer.drain()
        writer.close()

    def on_sigterm(self) -> None:
        if os.environ.get("FAKE_CF_IGNORE_SIGTERM") == "1":
            say("WRN", "SIGTERM ignored on purpose")
            return
        say("INF", "Initiating graceful shutdown due to signal terminated ...")
        self.draining = True
        self.loop.call_later(env_ms("FAKE_CF_DRAIN_MS") or 0, self.done.set)

    async def get_once_ready(self, url: str) -> None:
        await asyncio.sleep(max(0.0, self.ready_at - self.loop.time()))
        try:
            status, body = await asyncio.to_thread(fetch, url)
        except OSError as err:
            say("ERR", f"GET {url} failed: {err}")
            return
        say("INF", f"GET {url} -> {status} {body!r}")


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read(200)
    except urllib.error.HTTPError as err:
        return err.code, err.read(200)


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
