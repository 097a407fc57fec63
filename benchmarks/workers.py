"""``serve --workers 2`` against one process, under the same load, in rounds.

The single process is pinned to the proxy CPU as in the main comparison; the two
workers (and their supervisor) may use both CPUs, which they share with wrk and the
backend. On a two-core machine this shows that the multi-process mode works and what
it costs per request, not how it scales: that needs more cores than the load needs.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from benchmarks import compare
from benchmarks.configgen import real_config
from benchmarks.system import LOAD_CPU, PROXY_CPU
from benchmarks.systems import tunnelgate

SCENARIO = (compare.SCENARIOS[0],)  # 13 B GET: the proxy's own cost dominates
BOTH_CPUS = f"{PROXY_CPU},{LOAD_CPU}"


def section(wrk_path: str, work: Path, backend_url: str, rounds: int, seconds: float,
            warmup: float, source: Path | None = None, log=print) -> str:
    """Markdown table of 1 vs 2 workers, or why it could not be measured."""
    with ExitStack() as stack:
        servers = []
        for workers, cpus in ((1, PROXY_CPU), (2, BOTH_CPUS)):
            try:
                server, _ = tunnelgate(work / f"workers-{workers}", real_config(backend_url),
                                       extra=("--workers", str(workers)), cpu=cpus,
                                       source=source)
            except (RuntimeError, OSError) as err:
                return f"Not measured: `serve --workers {workers}` did not start: {err}"
            stack.enter_context(server)
            server.name = f"{workers} worker{'s' if workers > 1 else ''} (CPU {cpus})"
            servers.append(server)
        rows = compare.summarise(compare.run_rounds(
            servers, wrk_path, rounds, seconds, warmup, work, log, scenarios=SCENARIO))
    base = rows[0].rps
    lines = ["13 B GET, wrk -t1 -c32; CPU counts every process of the proxy (supervisor "
             "included). Two cores in all, shared with wrk and the backend.", "",
             "| tunnelgate | req/s | p50 µs | p99 µs | CPU µs/req | CPU busy (cores) | "
             "× 1 worker req/s |", "|---|--:|--:|--:|--:|--:|--:|"]
    for row in rows:
        cpu = f"{row.cpu_us:.1f}" if row.cpu_us is not None else "—"
        busy = f"{row.cpu_busy:.2f}" if row.cpu_busy is not None else "—"
        lines.append(f"| {row.system} | {row.rps:,.0f} | {row.p50_us:,.0f} | "
                     f"{row.p99_us:,.0f} | {cpu} | {busy} | {row.rps / base:.2f} |")
    return "\n".join(lines)
