"""Failing backends and overload (``--only resilience,overload``): what retries,
outlier detection and load shedding buy, measured over loopback.

**resilience**: three backends (:mod:`benchmarks.faulty`): one healthy, one answering
503 to half its requests, one never answering a tenth of them. In front of them, each
in turn under ``wrk -c32``: tunnelgate with retries and outlier detection off, with
them on, and nginx with ``proxy_next_upstream`` and passive health checks (its
equivalents). Every system bounds a try's wait for an answer to :data:`TRY_TIMEOUT`.
Success = 2xx answers / all requests (wrk's socket errors and timeouts count as
failures).

**overload**: tunnelgate in front of the fast nginx backend. First the connection count
it saturates at (the least that reaches 90 % of the best throughput), then 4× that
many connections, with shedding off and with ``--shed-max-in-flight`` at the
saturating count. A probe client (here, :data:`PROBES` keep-alive connections, each a
request at a time, :data:`PROBE_GAP` s apart) samples what a client sees meanwhile:
the latency of admitted requests and of shed ones, which wrk's percentiles mix.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from benchmarks import REPO
from benchmarks import wrk as wrkrun
from benchmarks.configgen import BENCH_HOST, BENCH_PATHS
from benchmarks.system import LOAD_CPU, PROXY_CPU, Pinned, free_port, wait_http
from benchmarks.systems import Server, _nginx, tunnelgate

TRY_TIMEOUT = "200ms"
SMALL = BENCH_PATHS["small"]  # what the overload part asks the fast backend for
CONNECTIONS = 32
PROBE_GAP = 0.002
PROBES = 8  # probe connections (beside wrk's): enough samples of the admitted tenth
SATURATION_STEPS = (2, 4, 8, 16, 32, 64, 128)
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


# ------------------------------------------------------------------------ overload


def overload_section(wrk: str, work: Path, backend_url: str, seconds: float,
                     log: Log, source: Path | None = None) -> str:
    config = {"version": 1, "rules": [{"hostnames": [BENCH_HOST],
                                       "backends": [{"url": backend_url, "weight": 1}]}]}
    with tunnelgate(work / "overload-off", config, source=source)[0] as gate:
        log("overload: finding saturation …")
        steps = [(c, wrkrun.run(wrk, gate.url(SMALL), BENCH_HOST, 2, c))
                 for c in SATURATION_STEPS]
        best = max(r.rps for _, r in steps)
        saturating, at_saturation = next((c, r) for c, r in steps if r.rps >= 0.9 * best)
        log(f"overload: saturates at {saturating} connections; 4x without shedding …")
        base = _loaded(wrk, gate, saturating, seconds)
        unshed = _loaded(wrk, gate, 4 * saturating, seconds)
    with tunnelgate(work / "overload-on", config, source=source,
                    extra=("--shed-max-in-flight", str(saturating)))[0] as gate:
        log("overload: 4x with shedding …")
        shed = _loaded(wrk, gate, 4 * saturating, seconds)
    rows = [_overload_row(f"{saturating} (saturation), no shedding", *base),
            _overload_row(f"{4 * saturating}, no shedding", *unshed),
            _overload_row(f"{4 * saturating}, --shed-max-in-flight {saturating}", *shed)]
    return (f"Saturation: {saturating} connections, {at_saturation.rps:.0f} req/s, "
            f"wrk p99 {at_saturation.p99_us / 1000:.2f} ms.\n\n"
            "| connections | req/s | wrk p99 (all) | non-2xx | socket errors | "
            "probe: admitted p99 | probe: shed p50 / p99 | probe: shed share |\n"
            "|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))


def _loaded(wrk: str, gate: Server, connections: int, seconds: float
            ) -> tuple[wrkrun.WrkResult, list[tuple[int, float]]]:
    proc = wrkrun.start(wrk, gate.url(SMALL), BENCH_HOST, seconds, connections)
    samples = asyncio.run(_probes(gate.port, seconds))
    return wrkrun.finish(proc, seconds), samples


def _overload_row(label: str, r: wrkrun.WrkResult, samples: list[tuple[int, float]]) -> str:
    admitted = sorted(t for s, t in samples if s == 200)
    shed = sorted(t for s, t in samples if s == 503)
    return (f"| {label} | {r.rps:.0f} | {r.p99_us / 1000:.2f} ms | {r.non_2xx} | "
            f"{r.socket_errors} | {_p(admitted, 0.99)} | {_p(shed, 0.5)} / {_p(shed, 0.99)} "
            f"| {100 * len(shed) / max(len(samples), 1):.0f} % of {len(samples)} |")


def _p(values: list[float], q: float) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0] * 1000:.2f} ms"
    cut = statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]
    return f"{cut * 1000:.2f} ms"


async def _probes(port: int, seconds: float) -> list[tuple[int, float]]:
    runs = await asyncio.gather(*(_probe(port, seconds) for _ in range(PROBES)))
    return [sample for run in runs for sample in run]


async def _probe(port: int, seconds: float) -> list[tuple[int, float]]:
    """Requests one at a time on a keep-alive connection, ``PROBE_GAP`` apart, for
    ``seconds``: (status, seconds to the whole answer) each; reconnects when closed."""
    samples: list[tuple[int, float]] = []
    end = time.monotonic() + seconds - 0.5
    request = f"GET {SMALL} HTTP/1.1\r\nHost: {BENCH_HOST}\r\n\r\n".encode()
    reader = writer = None
    while time.monotonic() < end and len(samples) < 1_000_000:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert reader is not None
            sent = time.perf_counter()
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            samples.append((int(head.split(b" ")[1]), time.perf_counter() - sent))
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            if writer is not None:
                writer.close()
            reader = writer = None
        await asyncio.sleep(PROBE_GAP)
    if writer is not None:
        writer.close()
    return samples
