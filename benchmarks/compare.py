"""Side-by-side load runs: direct backend vs nginx proxy vs the bare forwarding loop vs
tunnelgate (and, for an A/B run, tunnelgate from a base tree), in rounds.

Every round runs every (scenario, system) pair once, rotating the system order from
round to round, so slow phases of a noisy shared machine spread over all systems. Per
pair the median over rounds is reported.

Ratios between two systems are paired: taken within each round (the two runs are at most
a round apart, so a slow phase of the host slows both), and the median of those is
reported. A ratio of the two medians would compare runs from different rounds whenever
the host's speed moved between them (seen here: one round at half the speed of the
next, for every system alike).
"""

from __future__ import annotations

import http.client
import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks import wrk
from benchmarks.configgen import BENCH_PATHS
from benchmarks.system import http_get
from benchmarks.systems import Server

# (row label, BENCH_PATHS key, POST?)
CONNECTIONS = 32
SCENARIOS = (("13 B GET", "small", False), ("64 KiB GET", "64k", False),
             ("16 KiB POST", "post", True))
DIRECT, NGINX, BARE, TUNNELGATE = "direct", "nginx", "bare loop", "tunnelgate"
BASE = "tunnelgate (base)"  # ``--base DIR``: the tree a change is measured against


@dataclass(frozen=True, slots=True)
class Sample:
    """One wrk run against one system, with the proxy's CPU time per request."""

    scenario: str
    system: str
    result: wrk.WrkResult
    cpu_us: float | None  # None for the direct backend (no proxy)
    sys_us: float | None  # the kernel's part of cpu_us
    cpu_busy: float | None  # proxy CPU seconds per wall second (1.0 = its core is full)
    round: int = 0  # which round of run_rounds it was taken in

    def measure(self, name: str) -> float | None:
        """One of :data:`MEASURES` of this run (None where it has none)."""
        if name == "cpu":
            return self.cpu_us
        return self.result.rps if name == "rps" else self.result.p99_us


MEASURES = ("rps", "cpu", "p99")


@dataclass(frozen=True, slots=True)
class Row:
    """Medians over rounds for one (scenario, system)."""

    scenario: str
    system: str
    rps: float
    p50_us: float
    p99_us: float
    cpu_us: float | None
    sys_us: float | None
    cpu_busy: float | None
    errors: int  # non-2xx responses + socket errors, summed over rounds
    runs: int
    concurrency: float  # median requests in flight (see WrkResult.concurrency)
    # (other system, measure) -> median over rounds of this system's measure divided by
    # the other's in the same round (see the module docstring); only where both had it.
    paired: dict[tuple[str, str], float]

    def ratio(self, other: str, measure: str) -> float:
        """The paired ratio to ``other`` for ``measure`` (NaN when not measured)."""
        return self.paired.get((other, measure), float("nan"))


def measure(server: Server, wrk_path: str, label: str, path_key: str, post: bool,
            seconds: float, script_dir: Path, proxy: bool, round_: int = 0) -> Sample:
    """One wrk run (in round ``round_``); CPU is the proxy's utime+stime delta over the
    run."""
    script = wrk.post_script(script_dir) if post else None
    user, system = server.proc.cpu_times() if proxy else (0.0, 0.0)
    result = wrk.run(wrk_path, server.url(BENCH_PATHS[path_key]), server.host, seconds,
                     CONNECTIONS, script)
    if not (proxy and result.requests):
        return Sample(label, server.name, result, None, None, None, round_)
    user_after, system_after = server.proc.cpu_times()
    spent = user_after - user + system_after - system
    return Sample(label, server.name, result, spent * 1e6 / result.requests,
                  (system_after - system) * 1e6 / result.requests, spent / result.seconds,
                  round_)


def run_rounds(servers: list[Server], wrk_path: str, rounds: int, seconds: float,
               warmup: float, script_dir: Path, log=print,
               scenarios: tuple = SCENARIOS) -> list[Sample]:
    """Warm every system up once per scenario, then ``rounds`` interleaved rounds."""
    if warmup > 0:
        for server in servers:
            for label, key, post in scenarios:
                measure(server, wrk_path, label, key, post, warmup, script_dir, False)
    samples = []
    for r in range(rounds):
        order = servers[r % len(servers):] + servers[:r % len(servers)]
        for label, key, post in scenarios:
            for server in order:
                sample = measure(server, wrk_path, label, key, post, seconds, script_dir,
                                 server.name != DIRECT, r)
                log(f"  round {r + 1}/{rounds} {label:<12} {server.name:<17} "
                    f"{sample.result.rps:>9.0f} req/s  p99 {sample.result.p99_us:>8.0f} µs"
                    + (f"  cpu {sample.cpu_us:.1f} µs/req" if sample.cpu_us else ""))
                samples.append(sample)
    return samples


def summarise(samples: list[Sample]) -> list[Row]:
    """Median per (scenario, system), both in the order they were first run."""
    rows = []
    for label in dict.fromkeys(s.scenario for s in samples):
        for system in dict.fromkeys(s.system for s in samples):
            group = [s for s in samples if s.scenario == label and s.system == system]
            if not group:
                continue
            cpus = [s.cpu_us for s in group if s.cpu_us is not None]
            busy = [s.cpu_busy for s in group if s.cpu_busy is not None]
            kernel = [s.sys_us for s in group if s.sys_us is not None]
            rows.append(Row(
                scenario=label, system=system,
                rps=statistics.median(s.result.rps for s in group),
                p50_us=statistics.median(s.result.p50_us for s in group),
                p99_us=statistics.median(s.result.p99_us for s in group),
                cpu_us=statistics.median(cpus) if cpus else None,
                sys_us=statistics.median(kernel) if kernel else None,
                cpu_busy=statistics.median(busy) if busy else None,
                errors=sum(s.result.non_2xx + s.result.socket_errors for s in group),
                runs=len(group),
                concurrency=statistics.median(s.result.concurrency for s in group),
                paired=paired_ratios(group, [s for s in samples if s.scenario == label])))
    return rows


def paired_ratios(group: list[Sample], scenario: list[Sample]
                  ) -> dict[tuple[str, str], float]:
    """For one (scenario, system)'s samples ``group``: against every other system of
    ``scenario``, the median over rounds of the per-round ratio of each measure."""
    by_round = {(s.system, s.round): s for s in scenario}
    found: dict[tuple[str, str], list[float]] = {}
    for sample in group:
        for (system, round_), other in by_round.items():
            if round_ != sample.round or system == sample.system:
                continue
            for name in MEASURES:
                mine, theirs = sample.measure(name), other.measure(name)
                if mine is not None and theirs:
                    found.setdefault((system, name), []).append(mine / theirs)
    return {key: statistics.median(values) for key, values in found.items()}


def verify(server: Server) -> None:
    """Each scenario answers 200 with the expected body size before any load is run."""
    for path_key, size in (("small", 13), ("64k", 64 * 1024)):
        status, body = http_get(server.port, BENCH_PATHS[path_key], server.host)
        if status != 200 or len(body) != size:
            raise RuntimeError(f"{server.name} {BENCH_PATHS[path_key]}: {status}, "
                               f"{len(body)} bytes (expected 200, {size})")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("POST", BENCH_PATHS["post"], body=b"x" * wrk.POST_BODY_BYTES,
                     headers={"Host": server.host})
        response = conn.getresponse()
        if response.status != 200 or len(response.read()) != 13:
            raise RuntimeError(f"{server.name} POST {BENCH_PATHS['post']}: "
                               f"{response.status}")
    finally:
        conn.close()
