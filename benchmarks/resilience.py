"""Failing backends (``--only resilience``): what retries and outlier detection buy,
measured over loopback.

**resilience**: three backends (:mod:`benchmarks.faulty`): one healthy, one answering
503 to half its requests, one never answering a tenth of them. In front of them, each
in turn under ``wrk -c32``: tunnelgate with retries and outlier detection off, with
them on, and nginx with ``proxy_next_upstream`` and passive health checks (its
equivalents). Every system bounds a try's wait for an answer to :data:`TRY_TIMEOUT`.
Success = 2xx answers / all requests (wrk's socket errors and timeouts count as
failures).

**overload** is :mod:`benchmarks.overload`.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from benchmarks import REPO
from benchmarks import wrk as wrkrun
from benchmarks.configgen import BENCH_HOST
from benchmarks.system import LOAD_CPU, PROXY_CPU, Pinned, free_port, wait_http
from benchmarks.systems import Server, _nginx, tunnelgate

TRY_TIMEOUT = "200ms"
CONNECTIONS = 32
FAULTS = (("healthy", 0.0, 0.0), ("503 half", 0.5, 0.0), ("hangs 10 %", 0.0, 0.1))
Log = Callable[..., None]


def faulty_backend(workdir: Path, name: str, fail: float, hang: float, seed: int) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = Pinned([sys.executable, "-m", "benchmarks.faulty", "--port", str(port),
                   "--fail", str(fail), "--hang", str(hang), "--seed", str(seed)],
                  LOAD_CPU, workdir / f"{port}.log", cwd=REPO)
    server = Server(name, port, proc)
    try:
        wait_http(port, "/healthz", proc, timeout=15)
    except BaseException:
        proc.stop()
        raise
    return server


def faulty_config(urls: list[str], on: bool) -> dict:
    rule: dict = {"hostnames": [BENCH_HOST],
                  "backends": [{"url": url, "weight": 1} for url in urls],
                  "timeouts": {"request": "2s", "backend": TRY_TIMEOUT}}
    if on:
        rule["retry"] = {"codes": [502, 503, 504], "attempts": 2, "backoff": "5ms"}
        for backend in rule["backends"]:  # this benchmark fails a fifth of first tries
            backend["retryConstraint"] = {"budget": {"percent": 50}}
    return {"version": 1, "rules": [rule]}


def resilience_section(nginx: str, wrk: str, work: Path, seconds: float, log: Log,
                       source: Path | None = None) -> str:
    rows = []
    with ExitStack() as stack:
        backends = [stack.enter_context(faulty_backend(work / "faulty", name, fail, hang, i))
                    for i, (name, fail, hang) in enumerate(FAULTS)]
        urls = [f"http://127.0.0.1:{b.port}" for b in backends]
        servers = [("nginx (proxy_next_upstream, max_fails)", lambda: _nginx(
            nginx, "nginx", "resilience.conf", work / "nginx-resilience", PROXY_CPU,
            {"SERVERS": "\n".join(f"        server 127.0.0.1:{b.port} max_fails=5 "
                                  "fail_timeout=30s;" for b in backends),
             "TIMEOUT": TRY_TIMEOUT}))]
        for label, on, flags in (("tunnelgate, retries and outlier detection off", False,
                                  ("--outlier-consecutive", "0")),
                                 ("tunnelgate, retries and outlier detection on", True, ())):
            servers.insert(len(servers) - 1, (label, _gate(work, urls, on, flags, source)))
        for label, start in servers:
            log(f"resilience: {label} …")
            with start() as server:
                result = wrkrun.run(wrk, server.url("/"), BENCH_HOST, seconds, CONNECTIONS)
            rows.append(_row(label, result))
    return ("| system | requests | success | p50 | p99 | req/s |\n"
            "|---|---|---|---|---|---|\n" + "\n".join(rows)
            + f"\n\nBackends: {', '.join(name for name, _, _ in FAULTS)}; each try "
            f"bounded to {TRY_TIMEOUT}; tunnelgate on: `retry {{codes: [502, 503, 504], "
            "attempts: 2, backoff: 5ms}`, retry budget 50 %, outlier detection at its "
            "defaults; nginx: up to 3 tries, `max_fails=5 fail_timeout=30s`.")


def _gate(work: Path, urls: list[str], on: bool, flags: tuple[str, ...],
          source: Path | None) -> Callable[[], Server]:
    def start() -> Server:
        server, _ = tunnelgate(work / ("gate-on" if on else "gate-off"),
                               faulty_config(urls, on), extra=flags, source=source)
        return server
    return start


def _row(label: str, r: wrkrun.WrkResult) -> str:
    total = r.requests + r.socket_errors
    ok = max(r.requests - r.non_2xx, 0)
    return (f"| {label} | {total} | {100 * ok / max(total, 1):.3f} % | "
            f"{r.p50_us / 1000:.2f} ms | {r.p99_us / 1000:.2f} ms | {r.rps:.0f} |")
