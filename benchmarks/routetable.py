"""Route-table micro-benchmarks, in process, no sockets.

Measures, for a generated table (:func:`benchmarks.configgen.large_config`):
``parse_config`` and ``Table.compile`` time, cold (nothing to reuse) and for the same
config pushed again (a :class:`~routing.reuse.RuleReuse` holding the first push, as the
proxy's snapshot holder keeps one), ``Table.lookup`` latency over a shuffled
mix of hits and misses, and the resident memory of a fresh interpreter that loaded
the table (``python -m benchmarks.routetable CONFIG``, which prints JSON).
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import REPO
from benchmarks.configgen import Probe, dumps, large_config, miss_probes
from benchmarks.system import with_harness
from routing.config import parse_config
from routing.reuse import RuleReuse
from routing.table import Table

ENTRANCE = "tunnel"


@dataclass(frozen=True, slots=True)
class TableResult:
    rules: int
    hosts: int
    config_bytes: int
    parse_s: float  # cold
    compile_s: float  # cold
    again_s: float  # parse + compile of the same config again, reusing the first
    lookup_p50_us: float
    lookup_p99_us: float
    hit_p50_us: float
    miss_p50_us: float
    hits_found: float  # fraction of hit probes that found a rule (sanity, should be 1)
    misses_found: float  # fraction of miss probes that found one (should be 0)
    rss_mb: float | None  # VmRSS of a fresh process holding the compiled table
    rss_base_mb: float | None  # the same process before loading it


def run(rules: int = 10_000, hosts: int = 2_000, lookups: int = 4_000,
        repeats: int = 3, rss: bool = True, seed: int = 1) -> TableResult:
    """Generate, parse, compile and query a table; ``repeats`` cold compiles, each
    followed by one of the same config again; medians kept."""
    config, hit_probes = large_config(rules, hosts, seed=seed)
    body = dumps(config)
    parse_times, compile_times, again_times = [], [], []
    table = Table.empty()
    for _ in range(max(1, repeats)):
        reuse = RuleReuse()
        start = time.perf_counter()
        parsed = parse_config(body, None, reuse)
        middle = time.perf_counter()
        table = Table.compile(parsed, reuse=reuse)
        done = time.perf_counter()
        table = Table.compile(parse_config(body, None, reuse), reuse=reuse)
        again_times.append(time.perf_counter() - done)
        compile_times.append(done - middle)
        parse_times.append(middle - start)
    rng = random.Random(seed)
    hits = [hit_probes[rng.randrange(len(hit_probes))] for _ in range(lookups // 2)]
    misses = miss_probes(hit_probes, lookups - len(hits), seed=seed + 1)
    hit_us, hits_found = _time_lookups(table, hits)
    miss_us, misses_found = _time_lookups(table, misses)
    both = sorted(hit_us + miss_us)
    base_mb = rss_mb = None
    if rss:
        base_mb, rss_mb = fresh_process_rss(body)
    return TableResult(
        rules=rules, hosts=hosts, config_bytes=len(body),
        parse_s=statistics.median(parse_times), compile_s=statistics.median(compile_times),
        again_s=statistics.median(again_times),
        lookup_p50_us=statistics.median(both), lookup_p99_us=_percentile(both, 0.99),
        hit_p50_us=statistics.median(hit_us), miss_p50_us=statistics.median(miss_us),
        hits_found=hits_found, misses_found=misses_found,
        rss_mb=rss_mb, rss_base_mb=base_mb)


def _time_lookups(table: Table, probes: list[Probe]) -> tuple[list[float], float]:
    """Per-call latency (µs) in shuffled order, after one untimed warm pass."""
    order = list(probes)
    random.Random(len(order)).shuffle(order)
    lookup, clock = table.lookup, time.perf_counter_ns
    for p in order:
        lookup(p.host, p.path, p.query, p.headers, p.method, ENTRANCE)
    times, found = [], 0
    for p in order:
        start = clock()
        hit = lookup(p.host, p.path, p.query, p.headers, p.method, ENTRANCE)
        times.append((clock() - start) / 1e3)
        found += hit is not None
    return times, found / max(1, len(order))


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fresh_process_rss(body: bytes) -> tuple[float, float]:
    """(MB before, MB after) loading ``body`` into a table in a new interpreter."""
    with tempfile.NamedTemporaryFile(suffix=".json") as handle:
        handle.write(body)
        handle.flush()
        out = subprocess.run([sys.executable, "-m", "benchmarks.routetable", handle.name],
                             cwd=REPO, capture_output=True, text=True, timeout=120,
                             check=True, preexec_fn=with_harness()).stdout
    numbers = json.loads(out)
    return numbers["base_kb"] / 1024, numbers["loaded_kb"] / 1024


def _vm_rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def _child(path: str) -> None:
    """Runs in the fresh interpreter: routing already imported, load, report VmRSS."""
    base = _vm_rss_kb()
    table = Table.compile(parse_config(Path(path).read_bytes()))
    print(json.dumps({"base_kb": base, "loaded_kb": _vm_rss_kb(),
                      "rules": table.rules_count}))


if __name__ == "__main__":
    _child(sys.argv[1])
