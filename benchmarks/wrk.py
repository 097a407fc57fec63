"""Run ``wrk`` pinned to the load CPU and parse what it prints."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks.system import LOAD_CPU, with_harness

_UNITS_US = {"us": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6, "h": 3600e6}
_PERCENTILE = re.compile(r"^\s*(\d+(?:\.\d+)?)%\s+([\d.]+)(us|ms|s|m|h)\s*$", re.M)
_MEAN = re.compile(r"^\s*Latency\s+([\d.]+)(us|ms|s|m|h)\s", re.M)
_TOTAL = re.compile(r"(\d+) requests in ([\d.]+)(us|ms|s|m|h)")
_RPS = re.compile(r"Requests/sec:\s+([\d.]+)")
_NON2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")
_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")

POST_BODY_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class WrkResult:
    """One wrk run: throughput, latency percentiles (µs) and error counts."""

    requests: int
    seconds: float
    rps: float
    mean_us: float
    p50_us: float
    p99_us: float
    non_2xx: int
    socket_errors: int

    @property
    def concurrency(self) -> float:
        """Requests in flight on average (Little's law). With every connection busy
        this is the connection count; far less means connections stalled (a request
        that never completes is not in wrk's latency statistics at all)."""
        return self.rps * self.mean_us / 1e6


def parse(output: str) -> WrkResult:
    """Parse wrk's ``--latency`` report; raise ``ValueError`` if it is not one."""
    total, rps = _TOTAL.search(output), _RPS.search(output)
    if total is None or rps is None:
        raise ValueError(f"not a wrk report:\n{output}")
    percentiles = {float(p): float(v) * _UNITS_US[u]
                   for p, v, u in _PERCENTILE.findall(output)}
    mean = _MEAN.search(output)
    non_2xx = _NON2XX.search(output)
    sockets = _SOCKET.search(output)
    return WrkResult(
        requests=int(total.group(1)),
        seconds=float(total.group(2)) * _UNITS_US[total.group(3)] / 1e6,
        rps=float(rps.group(1)),
        mean_us=float(mean.group(1)) * _UNITS_US[mean.group(2)] if mean else float("nan"),
        p50_us=percentiles.get(50.0, float("nan")),
        p99_us=percentiles.get(99.0, float("nan")),
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        socket_errors=sum(map(int, sockets.groups())) if sockets else 0,
    )


def post_script(directory: Path) -> Path:
    """A wrk Lua script that POSTs a 16 KiB body (wrk adds Content-Length)."""
    path = directory / "post16k.lua"
    path.write_text('wrk.method = "POST"\n'
                    f'wrk.body = string.rep("x", {POST_BODY_BYTES})\n'
                    'wrk.headers["Content-Type"] = "application/octet-stream"\n')
    return path


def start(wrk: str, url: str, host: str, seconds: float, connections: int = 32,
          script: Path | None = None, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start one single-threaded wrk run on the load CPU; finish it with :func:`finish`.
    ``extra``: more wrk arguments (``("-H", "Connection: close")``)."""
    argv = ["taskset", "-c", LOAD_CPU, wrk, "-t1", f"-c{connections}",
            f"-d{max(1, round(seconds))}s", "--latency", "--timeout", "5s",
            "-H", f"Host: {host}", *extra]
    if script is not None:
        argv += ["-s", str(script)]
    return subprocess.Popen([*argv, url], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=with_harness())


def finish(proc: subprocess.Popen, seconds: float) -> WrkResult:
    """Wait for a run started by :func:`start` (bounded) and parse its report."""
    try:
        output, _ = proc.communicate(timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=5)
        raise RuntimeError(f"wrk pid {proc.pid} did not finish in {seconds + 30}s")
    return parse(output)


def run(wrk: str, url: str, host: str, seconds: float, connections: int = 32,
        script: Path | None = None) -> WrkResult:
    """One wrk run, start to finish."""
    return finish(start(wrk, url, host, seconds, connections, script), seconds)
