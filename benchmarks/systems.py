"""The servers a benchmark compares: the nginx backend, nginx as a proxy, the bare
forwarding loop (:mod:`benchmarks.bareloop`, the floor of an asyncio proxy), tunnelgate.

Each is started in its own temporary directory, pinned to a CPU, checked to answer, and
stopped by its own PID when the ``with`` block ends.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks import REPO
from benchmarks.configgen import BENCH_HOST, BENCH_PATHS, ROUTE_HEADER, dumps
from benchmarks.system import LOAD_CPU, PROXY_CPU, Pinned, free_port, wait_http

TEMPLATES = Path(__file__).resolve().parent / "nginx"
LARGE_BODY_BYTES = 64 * 1024


@dataclass
class Server:
    """A running server: where to send load and which process to account CPU to."""

    name: str
    port: int
    proc: Pinned
    host: str = BENCH_HOST
    scheme: str = "http"  # https: a TLS listener (benchmarks/tls.py)

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stop()


def render(template: str, values: dict[str, str]) -> str:
    """Replace every ``@@NAME@@`` in a template under benchmarks/nginx/."""
    text = (TEMPLATES / template).read_text()
    for name, value in values.items():
        text = text.replace(f"@@{name}@@", value)
    if "@@" in text:
        raise ValueError(f"{template}: unreplaced placeholder in\n{text}")
    return text


def _nginx(nginx: str, name: str, template: str, workdir: Path, cpu: str,
           values: dict[str, str]) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    # The worker drops root privileges (to nobody), so it must be able to read here.
    workdir.chmod(0o755)
    port = free_port()
    conf = workdir / "nginx.conf"
    conf.write_text(render(template, {"DIR": str(workdir), "PORT": str(port), **values}))
    proc = Pinned([nginx, "-p", str(workdir), "-e", str(workdir / "error.log"),
                   "-c", str(conf)], cpu, workdir / "stdout.log")
    server = Server(name, port, proc)
    try:
        wait_http(port, "/healthz" if template == "backend.conf" else BENCH_PATHS["small"],
                  proc, timeout=15)
    except BaseException:
        proc.stop()
        raise
    return server


def nginx_backend(nginx: str, workdir: Path) -> Server:
    """nginx serving the fixed bodies on the load CPU (shared with wrk).

    ``workdir``'s parents must be traversable by ``nobody`` (nginx's worker user).
    """
    www = workdir / "www" / "bench"
    www.mkdir(parents=True, exist_ok=True)
    for directory in (workdir / "www", www):
        directory.chmod(0o755)
    (www / "64k").write_bytes(b"x" * LARGE_BODY_BYTES)
    (www / "64k").chmod(0o644)
    return _nginx(nginx, "direct", "backend.conf", workdir, LOAD_CPU, {})


def nginx_proxy(nginx: str, workdir: Path, backend_port: int) -> Server:
    """nginx as a reverse proxy in front of the backend, on the proxy CPU."""
    return _nginx(nginx, "nginx", "proxy.conf", workdir, PROXY_CPU,
                  {"BACKEND_PORT": str(backend_port), "ROUTE_HEADER": ROUTE_HEADER[1]})


def bare_loop(workdir: Path, backend_port: int, wrapper: tuple[str, ...] = ()) -> Server:
    """:mod:`benchmarks.bareloop` in front of the backend, on the proxy CPU.
    ``wrapper``: a command it runs under (valgrind), which also waits longer for it."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = Pinned([*wrapper, sys.executable, "-m", "benchmarks.bareloop", "--listen",
                   str(port), "--backend", str(backend_port)], PROXY_CPU,
                  workdir / "bareloop.log", cwd=REPO)
    server = Server("bare loop", port, proc)
    try:
        wait_http(port, BENCH_PATHS["small"], proc, timeout=120 if wrapper else 15)
    except BaseException:
        proc.stop()
        raise
    return server


def tunnelgate_argv(source: Path | None = None) -> list[str]:
    """``python -m proxy`` from ``source`` if given, else the ``tunnelgate`` console
    script beside this interpreter (else ``-m proxy`` from the repository)."""
    script = Path(sys.executable).parent / "tunnelgate"
    if source is None and script.exists():
        return [str(script)]
    return [sys.executable, "-m", "proxy"]


def tunnelgate(workdir: Path, config: dict, extra: tuple[str, ...] = (),
               cpu: str = PROXY_CPU, source: Path | None = None,
               wrapper: tuple[str, ...] = (), name: str = "tunnelgate") -> tuple[Server, int]:
    """``tunnelgate serve`` with ``config`` on the proxy CPU; returns (server, admin port).

    ``source`` runs another source tree's ``proxy`` package (A/B comparisons of a
    change; ``name`` tells the two apart in one run); ``wrapper`` a command it runs under (valgrind: the interpreter itself is
    wrapped, not the console script, and readiness is waited for longer). Ready means
    ``/readyz`` answers 200 *and* the benchmarked route answers 200.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "config.json"
    conf.write_bytes(dumps(config))
    port, admin = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")}
    if source is not None:
        env["PYTHONPATH"] = str(source)
    argv = [*wrapper, sys.executable, "-m", "proxy"] if wrapper else tunnelgate_argv(source)
    proc = Pinned([*argv, "serve", "--listen", f"127.0.0.1:{port}",
                   "--admin", f"127.0.0.1:{admin}", "--config", str(conf), *extra],
                  cpu, workdir / "tunnelgate.log", env=env, cwd=source or REPO)
    server = Server(name, port, proc)
    try:
        wait_http(admin, "/readyz", proc, timeout=180 if wrapper else 60)
        wait_http(port, BENCH_PATHS["small"], proc, host=BENCH_HOST,
                  timeout=60 if wrapper else 10)
    except BaseException:
        proc.stop()
        raise
    return server, admin
