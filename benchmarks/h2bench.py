"""HTTP/2 over cleartext (h2c) side by side: nginx (``listen ... http2``), the bare HTTP/2
forwarding loop (:mod:`benchmarks.bareloop_h2`, the floor of a Python HTTP/2 proxy) and
tunnelgate, each in front of the same nginx backend over HTTP/1.1, loaded by ``h2load``
(Debian's nghttp2-client) with prior knowledge: 8 connections, 100 concurrent streams
on each, the three scenarios of :mod:`benchmarks.compare`.

Rounds, rotation and paired ratios as in :mod:`benchmarks.compare` (its
:func:`~benchmarks.compare.summarise` makes the rows). h2load reports no latency
percentiles, so the p50/p99 columns hold its mean request time.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from benchmarks import REPO, compare, wrk
from benchmarks import profile as profiler
from benchmarks.compare import BARE, NGINX, SCENARIOS, TUNNELGATE, Row, Sample
from benchmarks.configgen import BENCH_HOST, BENCH_PATHS, ROUTE_HEADER
from benchmarks.system import LOAD_CPU, PROXY_CPU, Pinned, free_port, with_harness
from benchmarks.systems import Server, render, tunnelgate

CLIENTS = 8
STREAMS = 100  # per connection (h2load -m)
BARE_RPS_TARGET = 0.9  # tunnelgate over h2c ≥ 0.9× the bare HTTP/2 loop
_FINISHED = re.compile(r"finished in ([\d.]+)(us|ms|s), ([\d.]+) req/s")
_REQUESTS = re.compile(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, "
                       r"(\d+) failed, (\d+) errored, (\d+) timeout")
_CODES = re.compile(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx")
_MEAN = re.compile(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)")
_US = {"us": 1.0, "ms": 1e3, "s": 1e6}


def parse(output: str) -> wrk.WrkResult:
    """h2load's report as a :class:`benchmarks.wrk.WrkResult` (mean request time in
    the percentile fields); ValueError if it is not one."""
    finished, requests, codes = (_FINISHED.search(output), _REQUESTS.search(output),
                                 _CODES.search(output))
    if finished is None or requests is None or codes is None:
        raise ValueError(f"not an h2load report:\n{output}")
    mean = _MEAN.search(output)
    mean_us = float(mean.group(1)) * _US[mean.group(2)] if mean else float("nan")
    failed = sum(int(n) for n in requests.groups()[3:])
    return wrk.WrkResult(
        requests=int(requests.group(3)),
        seconds=float(finished.group(1)) * _US[finished.group(2)] / 1e6,
        rps=float(finished.group(3)), mean_us=mean_us, p50_us=mean_us, p99_us=mean_us,
        non_2xx=sum(int(n) for n in codes.groups()[1:]), socket_errors=failed)


def _scenario_url(server: Server, key: str) -> str:
    return server.url(BENCH_PATHS[key])


def measure(h2load_path: str, server: Server, label: str, key: str, post_file: Path | None,
            seconds: float, round_: int) -> Sample:
    user, system = server.proc.cpu_times()
    argv = ["taskset", "-c", LOAD_CPU, h2load_path, "-t1", f"-c{CLIENTS}", f"-m{STREAMS}",
            "-H", f":authority: {server.host}", "-D", f"{max(1, round(seconds))}"]
    if post_file is not None:
        argv += ["-d", str(post_file)]
    done = subprocess.run([*argv, _scenario_url(server, key)], capture_output=True,
                          text=True, timeout=seconds + 60, preexec_fn=with_harness())
    result = parse(done.stdout)
    user_after, system_after = server.proc.cpu_times()
    spent = user_after - user + system_after - system
    per = 1e6 / result.requests if result.requests else float("nan")
    return Sample(label, server.name, result, spent * per, (system_after - system) * per,
                  spent / result.seconds if result.seconds else None, round_)


def wait_h2(h2load_path: str, server: Server, timeout: float = 30.0) -> None:
    """Poll with one-request h2load runs until the server answers 200 over h2c."""
    deadline = time.monotonic() + timeout
    output = ""
    while time.monotonic() < deadline:
        if not server.proc.alive():
            raise RuntimeError(f"{server.name} exited:\n{server.proc.log_tail()}")
        done = subprocess.run([h2load_path, "-n1", "-c1", "-H",
                               f":authority: {server.host}",
                               _scenario_url(server, "small")],
                              capture_output=True, text=True, timeout=30,
                              preexec_fn=with_harness())
        output = done.stdout
        codes = _CODES.search(output)
        if codes is not None and codes.group(1) == "1":
            return
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} not answering h2c:\n{output}\n"
                       f"{server.proc.log_tail()}")


def nginx_h2(nginx: str, workdir: Path, backend_port: int) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)
    port = free_port()
    conf = workdir / "nginx.conf"
    conf.write_text(render("proxy_h2.conf", {
        "DIR": str(workdir), "PORT": str(port), "BACKEND_PORT": str(backend_port),
        "ROUTE_HEADER": ROUTE_HEADER[1]}))
    proc = Pinned([nginx, "-p", str(workdir), "-e", str(workdir / "error.log"),
                   "-c", str(conf)], PROXY_CPU, workdir / "stdout.log")
    return Server(NGINX, port, proc)


def bare_loop_h2(workdir: Path, backend_port: int) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = Pinned([sys.executable, "-m", "benchmarks.bareloop_h2", "--listen", str(port),
                   "--backend", str(backend_port)], PROXY_CPU, workdir / "bareloop_h2.log",
                  cwd=REPO)
    return Server(BARE, port, proc)


def tunnelgate_h2(workdir: Path, config: dict, source: Path | None) -> Server:
    """tunnelgate with nginx's per-connection request allowance (keepalive_requests
    1000000 in proxy_h2.conf): h2load does not reconnect after a GOAWAY."""
    server, _ = tunnelgate(workdir, config, ("--h2-max-requests", "1000000"),
                           source=source)
    return server


def run_rounds(h2load_path: str, servers: list[Server], rounds: int, seconds: float,
               warmup: float, post_file: Path, log: Callable[[str], None]) -> list[Sample]:
    """Warm every system up once per scenario, then ``rounds`` interleaved rounds."""
    for server in servers:
        for label, key, post in SCENARIOS:
            measure(h2load_path, server, label, key, post_file if post else None,
                    warmup, -1)
    samples = []
    for r in range(rounds):
        order = servers[r % len(servers):] + servers[:r % len(servers)]
        for label, key, post in SCENARIOS:
            for server in order:
                sample = measure(h2load_path, server, label, key,
                                 post_file if post else None, seconds, r)
                log(f"  round {r + 1}/{rounds} {label:<12} {server.name:<10} "
                    f"{sample.result.rps:>9.0f} req/s  cpu {sample.cpu_us or 0:.1f} µs/req")
                samples.append(sample)
    return samples


def table(rows: list[Row]) -> str:
    lines = ["| scenario | system | req/s | mean request ms | proxy CPU µs/req (kernel) "
             "| × nginx req/s | × bare h2 loop req/s | CPU × bare h2 loop | errors "
             "| target |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|---|"]
    for row in rows:
        cpu = (f"{row.cpu_us:.1f} ({row.sys_us:.0f})"
               if row.cpu_us is not None and row.sys_us is not None else "—")
        vs_nginx = 1.0 if row.system == NGINX else row.ratio(NGINX, "rps")
        vs_bare = 1.0 if row.system == BARE else row.ratio(BARE, "rps")
        cpu_bare = 1.0 if row.system == BARE else row.ratio(BARE, "cpu")
        target = ""
        if row.system == TUNNELGATE:
            target = (f"≥{BARE_RPS_TARGET}× bare h2 loop "
                      f"{'✅' if vs_bare >= BARE_RPS_TARGET else '❌'}")
        lines.append(f"| {row.scenario} | {row.system} | {row.rps:,.0f} "
                     f"| {row.p50_us / 1e3:,.1f} | {cpu} | {vs_nginx:.2f} | {vs_bare:.2f} "
                     f"| {cpu_bare:.2f} | {row.errors} | {target} |")
    return "\n".join(lines)


def section(h2load_path: str, nginx: str, work: Path, backend_port: int, config: dict,
            rounds: int, seconds: float, warmup: float, source: Path | None,
            log: Callable[[str], None], profile_seconds: float | None = None) -> str:
    """Start the three h2c systems, run the rounds, return the table (and, given
    ``profile_seconds``, where tunnelgate's CPU goes)."""
    post_file = work / "post16k.bin"
    post_file.write_bytes(b"x" * wrk.POST_BODY_BYTES)
    with ExitStack() as stack:
        servers = [stack.enter_context(nginx_h2(nginx, work / "nginx-h2", backend_port)),
                   stack.enter_context(bare_loop_h2(work / "bare-h2", backend_port)),
                   stack.enter_context(tunnelgate_h2(work / "tunnelgate-h2", config,
                                                     source))]
        for server in servers:
            wait_h2(h2load_path, server)
        log(f"h2c comparison: {rounds} rounds of {len(servers) * len(SCENARIOS)} runs of "
            f"{seconds:g} s (+ warm-up) …")
        samples = run_rounds(h2load_path, servers, rounds, seconds, warmup, post_file, log)
        text = table(compare.summarise(samples))
        if profile_seconds:
            log(f"profiling tunnelgate over h2c for {profile_seconds:g} s …")
            text += ("\n\nWhere tunnelgate spends its CPU over h2c (py-spy, 13 B GET):\n\n"
                     + profile_section(h2load_path, servers[-1], work, profile_seconds))
    return text


def profile_section(h2load_path: str, server: Server, workdir: Path, seconds: float) -> str:
    """Where tunnelgate's CPU goes over h2c: py-spy samples while h2load runs the 13 B
    GET (the same summary as :mod:`benchmarks.profile`'s)."""
    out = workdir / "py-spy-h2.txt"
    spy = subprocess.Popen(
        ["taskset", "-c", LOAD_CPU, profiler.ensure_py_spy(), "record", "--pid",
         str(server.proc.pid), "--duration", str(round(seconds)), "--rate", "200",
         "--format", "raw", "--function", "--gil", "--native", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=with_harness())
    sample = measure(h2load_path, server, "13 B GET", "small", None, seconds + 1, 0)
    spy.communicate(timeout=seconds + 60)
    if spy.returncode != 0 or not out.exists():
        return f"Not measured: py-spy failed ({spy.returncode})"
    samples, spots = profiler.parse_raw(out.read_text())
    lines = [f"{samples} GIL-holding samples at 200 Hz; {sample.result.rps:,.0f} req/s "
             f"while sampled, {sample.cpu_us or 0:.1f} µs CPU per request.", "",
             "| own % | total % | function (file:line) |", "|--:|--:|---|"]
    lines += [f"| {s.own:.1%} | {s.total:.1%} | `{s.function}` |"
              for s in spots[:profiler.TOP]]
    by_total = sorted((s for s in spots if s.total < profiler.EVERYWHERE
                       and ".py:" in s.function), key=lambda s: s.total, reverse=True)
    lines += ["", "Largest inclusive shares (functions on every stack left out):", "",
              "| total % | own % | function (file:line) |", "|--:|--:|---|"]
    lines += [f"| {s.total:.1%} | {s.own:.1%} | `{s.function}` |"
              for s in by_total[:2 * profiler.TOP]]
    return "\n".join(lines)
