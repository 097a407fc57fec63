"""Soak: does a process that a controller pushes to all day keep its size?

``python -m benchmarks.soak --minutes 10``: tunnelgate in front of the nginx backend,
50 connections of wrk load — 45 kept alive, 5 that open a new connection for every
request, as clients behind a recycling load balancer do — and the 10,000-rule config
of the push benchmark PUT every 2 s. tunnelgate's RSS is sampled every 10 s. The target:
RSS after the last minute within 10 MB of RSS after the first. Prints the curve and
appends it to RESULTS.md (``--no-record``: print only). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from benchmarks import push, wrk
from benchmarks.configgen import BENCH_HOST, BENCH_PATHS, real_config
from benchmarks.report import Section, append_results, machine_line, mark, render
from benchmarks.system import ensure_tools, unwind_on_termination
from benchmarks.systems import nginx_backend, tunnelgate

KEPT_ALIVE, RECONNECTING = 45, 5
PUSH_EVERY = 2.0
SAMPLE_EVERY = 10.0
RSS_TARGET_MB = 10.0
log = functools.partial(print, flush=True)


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def soak(minutes: float, source: Path | None = None) -> tuple[list[tuple[float, float]],
                                                              list[int]]:
    """Run the soak; ((seconds since start, RSS MB) samples, push statuses)."""
    tools = ensure_tools()
    seconds = minutes * 60
    with tempfile.TemporaryDirectory(prefix="tunnelgate-soak-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        work.chmod(0o755)  # nginx workers run as nobody and must traverse it
        backend = stack.enter_context(nginx_backend(tools["nginx"], work / "backend"))
        backend_url = f"http://127.0.0.1:{backend.port}"
        gate, admin = tunnelgate(work / "tunnelgate", real_config(backend_url),
                                 source=source)
        stack.enter_context(gate)
        body = push.push_body(backend_url)
        target = gate.url(BENCH_PATHS["small"])
        loads = [wrk.start(tools["wrk"], target, BENCH_HOST, seconds + 5, KEPT_ALIVE),
                 wrk.start(tools["wrk"], target, BENCH_HOST, seconds + 5, RECONNECTING,
                           extra=("-H", "Connection: close"))]
        samples: list[tuple[float, float]] = []
        statuses: list[int] = []
        version = int(time.time() * 1000)
        started = time.monotonic()
        next_push, next_sample = started, started
        with httpx.Client(timeout=30.0) as client:
            # Bounded: one push every PUSH_EVERY seconds for the duration, no more.
            for _ in range(int(seconds / PUSH_EVERY) + 1):
                now = time.monotonic()
                if now - started > seconds:
                    break
                if now >= next_sample:
                    samples.append((now - started, rss_mb(gate.proc.pid)))
                    log(f"  {samples[-1][0]:6.0f} s  RSS {samples[-1][1]:6.1f} MB  "
                        f"pushes {sum(s == 200 for s in statuses)}/{len(statuses)}")
                    next_sample += SAMPLE_EVERY
                version += 1
                status, _ = push._push(client, f"http://127.0.0.1:{admin}/config",
                                       push._with_version(body, version))
                statuses.append(status)
                next_push += PUSH_EVERY
                time.sleep(max(0.0, next_push - time.monotonic()))
        samples.append((time.monotonic() - started, rss_mb(gate.proc.pid)))
        for proc in loads:
            wrk.finish(proc, seconds + 5)
    return samples, statuses


def report(samples: list[tuple[float, float]], statuses: list[int]) -> str:
    """The RSS curve (one row a minute) and the verdict."""
    first = next(rss for at, rss in samples if at >= 60) if samples[-1][0] >= 60 else None
    last = samples[-1][1]
    rows = ["| time | RSS MB |", "|---|---|"]
    shown = -60.0
    for index, (at, rss) in enumerate(samples):
        if at - shown >= 60 or index == len(samples) - 1:
            rows.append(f"| {at / 60:4.1f} min | {rss:.1f} |")
            shown = at
    ok = sum(s == 200 for s in statuses)
    lines = [f"{len(statuses)} pushes of the 10,000-rule config every {PUSH_EVERY:g} s "
             f"({ok} answered 200) under wrk: {KEPT_ALIVE} kept-alive connections + "
             f"{RECONNECTING} with `Connection: close`.", "", *rows, ""]
    if first is not None:
        growth = last - first
        lines.append(f"RSS at the end − RSS after 1 min: **{growth:+.1f} MB** (target "
                     f"within {RSS_TARGET_MB:g} MB) {mark(abs(growth) <= RSS_TARGET_MB)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--no-record", action="store_true",
                        help="print only; do not append to benchmarks/RESULTS.md")
    parser.add_argument("--tunnelgate-src", metavar="DIR", type=Path,
                        help="run tunnelgate from this source tree (A/B runs of a change)")
    args = parser.parse_args(argv)
    heading = machine_line("soak", args.tunnelgate_src)
    unwind_on_termination()  # a killed run stops its servers
    log(f"soak: {args.minutes:g} min, a push every {PUSH_EVERY:g} s …")
    samples, statuses = soak(args.minutes, args.tunnelgate_src)
    text = render(heading, [Section(f"Soak: RSS under pushes and load "
                                    f"({args.minutes:g} min)", report(samples, statuses))])
    log("\n" + text)
    if not args.no_record:
        append_results(text)
        log("appended to benchmarks/RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
