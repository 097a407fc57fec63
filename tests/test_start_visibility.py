"""What ``tunnelgate`` says about itself at start: the setting behind a start-up failure,
and which version and build run (the CLI as a real subprocess)."""

from __future__ import annotations

import importlib.metadata
import socket
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

import proxy.control.cli  # noqa: F401  (loads the hot path, so native.build() is true)
from proxy.control import native
from tests.test_cli import Served, cli, free_port

VERSION = importlib.metadata.version("tunnelgate")


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def start_error(stderr: str) -> str:
    """The ``error=`` value of the ``cannot start`` line."""
    lines = [line for line in stderr.splitlines() if 'msg="cannot start"' in line]
    assert len(lines) == 1, stderr
    return lines[0].split(" error=", 1)[1].strip('"')


# Which listener is given the busy port, and the setting the error must start with.
BUSY = [
    ("admin", ["--admin", "{busy}", "--listen", "127.0.0.1:0"], "--admin/PROXY_CONFIG_ADDR"),
    ("cluster", ["--admin", "127.0.0.1:0", "--listen", "{busy}"], "--listen/PROXY_ADDR"),
    ("cluster, workers", ["--workers", "2", "--admin", "127.0.0.1:0", "--listen", "{busy}"],
     "--listen/PROXY_ADDR"),
    ("tunnel", ["--admin", "127.0.0.1:0", "--tunnel-listen", "{busy}"], "--tunnel-listen"),
    ("admin, with --config", ["--admin", "{busy}", "--listen", "127.0.0.1:0",
                              "--config", "{config}"], "--admin/PROXY_CONFIG_ADDR"),
]


@pytest.mark.parametrize("args, owner", [(args, owner) for _, args, owner in BUSY],
                         ids=[name for name, _, _ in BUSY])
def test_a_busy_port_names_the_listener_setting(taken: int, tmp_path: Path,
                                                args: list[str], owner: str) -> None:
    config = tmp_path / "routes.json"
    config.write_text('{"version": 1, "rules": []}')
    args = [a.format(busy=f"127.0.0.1:{taken}", config=config) for a in args]
    done = cli("serve", *args)
    assert done.returncode == 1
    error = start_error(done.stderr)
    assert error.startswith(f"{owner}: cannot listen on 127.0.0.1:{taken}: "), error
    assert "Address already in use" in error and "--config" not in error


def test_a_missing_cloudflared_names_its_flag_and_the_token(tmp_path: Path) -> None:
    done = cli("serve", "--admin", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0",
               "--cloudflared-bin", str(tmp_path / "no-cloudflared"),
               env={"TUNNEL_TOKEN": "t"})
    assert done.returncode == 1
    error = start_error(done.stderr)
    assert error.startswith("--cloudflared-bin: cloudflared executable"), error
    assert "TUNNEL_TOKEN" in error and "--config" not in error


def test_a_bad_start_config_still_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.json"
    done = cli("serve", "--admin", f"127.0.0.1:{free_port()}", "--listen", "127.0.0.1:0",
               "--config", str(path))
    assert done.returncode == 1
    assert start_error(done.stderr).startswith(f"--config: {path}: No such file")


@pytest.mark.parametrize("args", [["--version"], ["version"]])
def test_version_and_build_from_the_package_metadata(args: list[str]) -> None:
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith(f"tunnelgate {VERSION} ({native.build()} build: "), line
    assert native.build() in ("compiled", "plain")


async def test_start_log_and_build_info_metric_name_the_version() -> None:
    async with Served() as served:
        text = (await served.admin.get("/metrics")).text
        served.signal()
        assert await served.wait() == 0
        assert served.proc is not None and served.proc.stderr is not None
        log = served.proc.stderr.read()
    starting = [line for line in log.splitlines() if "msg=starting" in line]
    assert len(starting) == 1 and f"version={VERSION}" in starting[0], log
    info = [sample for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "tunnelgate_build_info"]
    assert [(s.labels, s.value) for s in info] == [
        ({"version": VERSION, "build": native.build()}, 1.0)]
