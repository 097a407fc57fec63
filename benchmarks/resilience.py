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
many connections, with shedding off, with ``--shed-max-in-flight`` at the saturating
count, and at :data:`SHORT_TURNS` (short loop turns: the least a shed answer waits).
A probe client (:data:`PROBES` threads, each a keep-alive connection and a request at
a time, :data:`PROBE_GAP` s apart, or a shed answer's Retry-After: a client that
honours it, where wrk re-sends at once) samples what a client sees meanwhile: the
latency of admitted requests and of shed ones, which wrk's percentiles mix — both as
the probe saw it and as the kernel's receive timestamp says (so the harness's own
scheduling on the shared load CPU is left out) — and the proxy's loop lag gauge says
how long a turn of its event loop ran.
"""

from __future__ import annotations

import re
import socket
import statistics
import struct
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, NamedTuple

from benchmarks import REPO
from benchmarks import wrk as wrkrun
from benchmarks.configgen import BENCH_HOST, BENCH_PATHS
from benchmarks.system import LOAD_CPU, PROXY_CPU, Pinned, free_port, http_get, wait_http
from benchmarks.systems import Server, _nginx, tunnelgate

TRY_TIMEOUT = "200ms"
SMALL = BENCH_PATHS["small"]  # what the overload part asks the fast backend for
CONNECTIONS = 32
PROBE_GAP = 0.002
PROBES = 8  # probe connections (beside wrk's): enough samples of the admitted tenth
LAG_EVERY = 0.1  # seconds between reads of the proxy's loop-lag gauge
SO_TIMESTAMPNS = 35  # Linux (asm-generic): receive timestamps as timespec; Python lacks the name
SATURATION_STEPS = (2, 4, 8, 16, 32, 64, 128)
SHORT_TURNS = 4  # an in-flight limit low enough that each loop turn is short (see RESULTS)
FAULTS = (("healthy", 0.0, 0.0), ("503 half", 0.5, 0.0), ("hangs 10 %", 0.0, 0.1))
Log = Callable[..., None]


class Sample(NamedTuple):
    """One probe request: its status, seconds from its send until the probe had the
    answer (``seen``) and until the answer reached the probe's socket (``wire``), and
    the answer's Retry-After in seconds (0: none)."""

    status: int
    seen: float
    wire: float
    retry_after: float


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
    gate, admin = tunnelgate(work / "overload-off", config, source=source)
    with gate:
        log("overload: finding saturation …")
        steps = [(c, wrkrun.run(wrk, gate.url(SMALL), BENCH_HOST, 2, c))
                 for c in SATURATION_STEPS]
        best = max(r.rps for _, r in steps)
        saturating, at_saturation = next((c, r) for c, r in steps if r.rps >= 0.9 * best)
        log(f"overload: saturates at {saturating} connections; 4x without shedding …")
        base = _loaded(wrk, gate, admin, saturating, seconds)
        unshed = _loaded(wrk, gate, admin, 4 * saturating, seconds)
    rows = [_overload_row(f"{saturating} (saturation), no shedding", *base),
            _overload_row(f"{4 * saturating}, no shedding", *unshed)]
    for limit in (saturating, SHORT_TURNS):
        gate, admin = tunnelgate(work / f"overload-{limit}", config, source=source,
                                 extra=("--shed-max-in-flight", str(limit)))
        with gate:
            log(f"overload: 4x, shedding over {limit} in flight …")
            shed = _loaded(wrk, gate, admin, 4 * saturating, seconds)
        rows.append(_overload_row(f"{4 * saturating}, --shed-max-in-flight {limit}", *shed))
    return (f"Saturation: {saturating} connections, {at_saturation.rps:.0f} req/s, "
            f"wrk p99 {at_saturation.p99_us / 1000:.2f} ms.\n\n"
            "| connections | req/s | admitted req/s | wrk p99 (all) | non-2xx | "
            "socket errors | probe: admitted p99 | probe: shed p50 / p99 (seen) | "
            "probe: shed p50 / p99 (wire) | probe: shed share | loop lag p50 / max |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows)
            + "\n\nProbe times run from a request's send to its whole answer: *seen* when "
            "the probe thread had it, *wire* when it reached the probe's socket (the "
            "kernel's receive timestamp, without the probe's own scheduling); a probe "
            "honours a shed answer's Retry-After, wrk re-sends at once. Loop lag: "
            "tunnelgate's `tunnelgate_event_loop_lag_seconds`, read every "
            f"{LAG_EVERY * 1000:.0f} ms (how late its loop ran a timer: the time a "
            "request that just arrived waits for its turn).")


def _loaded(wrk: str, gate: Server, admin: int, connections: int, seconds: float
            ) -> tuple[wrkrun.WrkResult, list[Sample], list[float]]:
    proc = wrkrun.start(wrk, gate.url(SMALL), BENCH_HOST, seconds, connections)
    lags: list[float] = []
    sampler = threading.Thread(target=_lags, args=(admin, seconds, lags))
    sampler.start()
    samples = _probes(gate.port, seconds)
    sampler.join()
    return wrkrun.finish(proc, seconds), samples, lags


def _lags(admin: int, seconds: float, into: list[float]) -> None:
    """Read the proxy's loop-lag gauge every :data:`LAG_EVERY` s for ``seconds``."""
    end = time.monotonic() + seconds - 0.5
    while time.monotonic() < end:
        try:
            _, body = http_get(admin, "/metrics", timeout=5.0)
        except OSError:
            body = b""
        found = re.search(rb"(?m)^tunnelgate_event_loop_lag_seconds(?:\{[^}]*\})? (\S+)",
                          body)
        if found:
            into.append(float(found.group(1)))
        time.sleep(LAG_EVERY)


def _overload_row(label: str, r: wrkrun.WrkResult, samples: list[Sample],
                  lags: list[float]) -> str:
    admitted = sorted(s.seen for s in samples if s.status == 200)
    seen = sorted(s.seen for s in samples if s.status == 503)
    wire = sorted(s.wire for s in samples if s.status == 503)
    lags = sorted(lags)
    admitted_rps = r.rps - r.non_2xx / max(r.seconds, 1e-9)
    return (f"| {label} | {r.rps:.0f} | {admitted_rps:.0f} | {r.p99_us / 1000:.2f} ms | "
            f"{r.non_2xx} | "
            f"{r.socket_errors} | {_p(admitted, 0.99)} | {_p(seen, 0.5)} / {_p(seen, 0.99)} "
            f"| {_p(wire, 0.5)} / {_p(wire, 0.99)} "
            f"| {100 * len(seen) / max(len(samples), 1):.0f} % of {len(samples)} "
            f"| {_p(lags, 0.5)} / {_p(lags[-1:], 1)} |")


def _p(values: list[float], q: float) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0] * 1000:.2f} ms"
    cut = statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]
    return f"{cut * 1000:.2f} ms"


def _probes(port: int, seconds: float) -> list[Sample]:
    """:data:`PROBES` probe threads (blocking sockets: each waits in the kernel, not in
    a shared event loop of the harness)."""
    runs: list[list[Sample]] = [[] for _ in range(PROBES)]
    threads = [threading.Thread(target=_probe, args=(port, seconds, run)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [sample for run in runs for sample in run]


def _probe(port: int, seconds: float, samples: list[Sample]) -> None:
    """Requests one at a time on a keep-alive connection, ``PROBE_GAP`` apart (or
    the Retry-After of a shed answer: a client that honours it), for ``seconds``, into
    ``samples``; reconnects when closed."""
    end = time.monotonic() + seconds - 0.5
    request = f"GET {SMALL} HTTP/1.1\r\nHost: {BENCH_HOST}\r\n\r\n".encode()
    sock: socket.socket | None = None
    while time.monotonic() < end and len(samples) < 1_000_000:
        try:
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            sent = time.time_ns()
            sock.sendall(request)
            sample = _answer(sock, sent)
            samples.append(sample)
        except (OSError, ValueError):
            if sock is not None:
                sock.close()
            sock = None
            continue
        time.sleep(max(PROBE_GAP, min(sample.retry_after, end - time.monotonic())))
    if sock is not None:
        sock.close()


def _answer(sock: socket.socket, sent: int) -> Sample:
    """Read one answer: its status, the seconds from ``sent`` until the probe had it
    all, and until its last bytes reached the probe's socket (the kernel's receive
    timestamp: what the probe's own scheduling adds is left out)."""
    data, arrived, need = b"", sent, -1
    while need < 0 or len(data) < need:
        chunk, ancillary, _, _ = sock.recvmsg(65536, 64)
        if not chunk:
            raise ValueError("closed")
        data += chunk
        for level, kind, value in ancillary:
            if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS):
                secs, nanos = struct.unpack("qq", value[:16])
                arrived = secs * 1_000_000_000 + nanos
        head_end = data.find(b"\r\n\r\n")
        if need < 0 and head_end >= 0:
            length = re.search(rb"(?im)^content-length:\s*(\d+)", data[:head_end])
            need = head_end + 4 + (int(length.group(1)) if length else 0)
    done = time.time_ns()
    retry = re.search(rb"(?im)^retry-after:\s*(\d+)", data[:need])
    return Sample(int(data.split(b" ", 2)[1]), (done - sent) / 1e9, (arrived - sent) / 1e9,
                  float(retry.group(1)) if retry else 0.0)
