"""Machine plumbing: Debian tools, loopback ports, CPU-pinned processes, CPU accounting.

The machine has two cores: the proxy under test is pinned to :data:`PROXY_CPU`, the load
generator and the backend to :data:`LOAD_CPU`, so the proxy's CPU time per request can
be read from ``/proc/<pid>/stat`` without the load generator stealing its core.

Every child the harness starts ends when the harness ends, however it ends: each is
started with :func:`with_harness` (the kernel sends it SIGTERM when the harness dies,
even by SIGKILL), and :func:`unwind_on_termination` turns SIGTERM and SIGHUP into an
exception, as Ctrl-C already is, so the ``with`` blocks stop their servers first.
"""

from __future__ import annotations

import ctypes
import functools
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Callable, NoReturn

PROXY_CPU = "0"
LOAD_CPU = "1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1  # prctl(2)
# Looked up once in the harness: a child between fork and exec should not load libraries.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
# Debian puts nginx in /usr/sbin, which a non-login PATH may lack.
_SEARCH_PATH = os.pathsep.join((os.environ.get("PATH", ""), "/usr/sbin", "/sbin"))
# Tool -> Debian package; "nginx" exists in every current Debian release. valgrind's
# package brings callgrind_control and callgrind_annotate (the instructions part),
# nghttp2-client h2load (the h2c part).
_APT_PACKAGES = {"nginx": "nginx", "wrk": "wrk", "valgrind": "valgrind",
                 "callgrind_control": "valgrind", "callgrind_annotate": "valgrind",
                 "h2load": "nghttp2-client"}


def tool(name: str) -> str | None:
    """Absolute path of an installed tool, or ``None``."""
    return shutil.which(name, path=_SEARCH_PATH)


def ensure_tools() -> dict[str, str]:
    """Install nginx, wrk and valgrind from Debian when missing (we are root); return
    the paths of the tools.

    ``apt-get update`` runs only when a first install attempt fails, since the package
    lists are usually present and the update is slow.
    """
    missing = sorted({pkg for name, pkg in _APT_PACKAGES.items() if tool(name) is None})
    if missing:
        if os.geteuid() != 0:
            raise SystemExit(f"benchmarks need {missing}: apt-get install them as root")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", *missing]
        if subprocess.run(install, env=env, timeout=900).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, check=True, timeout=900)
            subprocess.run(install, env=env, check=True, timeout=900)
    paths = {name: tool(name) for name in _APT_PACKAGES}
    if None in paths.values():
        raise SystemExit(f"could not find {paths} after installing")
    return paths  # type: ignore[return-value]


def with_harness() -> Callable[[], None]:
    """A ``preexec_fn`` for every child of the harness: the child gets SIGTERM when the
    harness's thread that started it ends (PR_SET_PDEATHSIG, prctl(2); it survives the
    exec of ``taskset`` and of the program). Children are started from the main thread."""
    return functools.partial(_end_with_parent, os.getpid())


def _end_with_parent(parent: int) -> None:
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the harness died before the line above: end now
        os.kill(os.getpid(), signal.SIGTERM)


def unwind_on_termination() -> None:
    """SIGTERM and SIGHUP end the harness by an exception, as SIGINT does, so that its
    ``with`` blocks stop their servers before it exits (the default would end it on the
    spot, leaving them to :func:`with_harness`'s signal)."""
    def stop(signum: int, _frame: object) -> NoReturn:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def free_port() -> int:
    """A currently unused TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Pinned:
    """A child process pinned to one CPU with ``taskset``, in a process group of its
    own; stopped by its own PID (and, if it will not stop, with its group: nginx's
    workers, tunnelgate's worker processes).

    ``taskset`` execs the command, so :attr:`pid` is the program itself.
    """

    def __init__(self, argv: list[str], cpu: str, log: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                ["taskset", "-c", cpu, *argv], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True,
                preexec_fn=with_harness())
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu_times(self) -> tuple[float, float]:
        """(user, system) CPU seconds of this process and its live descendants (nginx
        workers, tunnelgate worker processes)."""
        user = system = 0
        for pid in _tree(self.pid):
            fields = _stat_fields(pid)
            if fields:
                # Fields 14 and 15 of proc(5) (utime, stime) are at 11 and 12 here.
                user, system = user + int(fields[11]), system + int(fields[12])
        return user / CLK_TCK, system / CLK_TCK

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Signal our PID, wait up to ``timeout``, then SIGKILL its process group (our
        PID is its ID, and not yet reaped, so it names no one else's)."""
        if not self.alive():
            return
        self.popen.send_signal(sig)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.popen.wait(5)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces or parentheses: split after the last ")".
    return text[text.rindex(")") + 2:].split()


def _tree(root: int) -> list[int]:
    """``root`` and its descendants, from one scan of /proc (bounded by its size)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    tree: list[int] = []
    todo = [root]
    while todo and len(tree) < 10_000:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def http_get(port: int, path: str, host: str = "localhost",
             timeout: float = 5.0, tls: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """One GET to 127.0.0.1:``port`` (over TLS with ``tls``); returns (status, body)."""
    conn = (http.client.HTTPConnection("127.0.0.1", port, timeout=timeout) if tls is None
            else http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout,
                                             context=tls))
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def wait_http(port: int, path: str, proc: Pinned, host: str = "localhost",
              timeout: float = 30.0, tls: ssl.SSLContext | None = None) -> None:
    """Poll until ``GET path`` answers 200; raise with the process's log if it never does."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"process {proc.pid} exited:\n{proc.log_tail()}")
        try:
            status, body = http_get(port, path, host, timeout=2.0, tls=tls)
            if status == 200:
                return
            last = f"{status} {body[:200]!r}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise RuntimeError(f"127.0.0.1:{port}{path} not ready after {timeout}s ({last}):\n"
                       f"{proc.log_tail()}")
