"""Upstream dials per request at high concurrency: does the pool hold or churn?

``python -m benchmarks.dials [--connections 256]``: wrk with 256 kept-alive connections
through tunnelgate to one nginx backend; the backend's own accept counter (nginx
``stub_status``) says how many connections tunnelgate dialed. A warm-up run fills the
pool, then a measured run of the same load: dials per request of the measured run is
the number (target < 0.01). Appends to RESULTS.md unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from benchmarks import wrk
from benchmarks.configgen import BENCH_HOST, BENCH_PATHS, real_config
from benchmarks.report import Section, append_results, machine_line, mark, render
from benchmarks.system import ensure_tools, http_get, unwind_on_termination
from benchmarks.systems import nginx_backend, tunnelgate

TARGET = 0.01
_ACCEPTS = re.compile(rb"server accepts handled requests\s+(\d+)")
log = functools.partial(print, flush=True)


def accepts(port: int) -> int:
    """Connections the nginx backend accepted so far, not counting this query's own."""
    status, body = http_get(port, "/nginx-status")
    found = _ACCEPTS.search(body)
    if status != 200 or found is None:
        raise RuntimeError(f"no stub_status from the backend: {status} {body[:200]!r}")
    return int(found.group(1)) - 1


def measure(connections: int, seconds: float, source: Path | None) -> dict[str, float]:
    tools = ensure_tools()
    with tempfile.TemporaryDirectory(prefix="tunnelgate-dials-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        work.chmod(0o755)  # nginx workers run as nobody and must traverse it
        backend = stack.enter_context(nginx_backend(tools["nginx"], work / "backend"))
        gate, _ = tunnelgate(work / "tunnelgate",
                             real_config(f"http://127.0.0.1:{backend.port}"), source=source)
        stack.enter_context(gate)
        target = gate.url(BENCH_PATHS["small"])
        before = accepts(backend.port)
        warm = wrk.run(tools["wrk"], target, BENCH_HOST, seconds, connections)
        warmed = accepts(backend.port) - 1  # minus the query above
        run = wrk.run(tools["wrk"], target, BENCH_HOST, seconds, connections)
        after = accepts(backend.port) - 2
    return {"warm_dials": warmed - before, "warm_requests": warm.requests,
            "dials": after - warmed, "requests": run.requests, "rps": run.rps,
            "errors": run.socket_errors + run.non_2xx}


def report(connections: int, seconds: float, m: dict[str, float]) -> str:
    per = m["dials"] / max(1, m["requests"])
    return "\n".join([
        f"wrk -t1 -c{connections}, {seconds:g} s warm-up then {seconds:g} s measured, "
        "one nginx backend (its accept counter).", "",
        "| run | requests | upstream dials | dials/request |", "|---|---|---|---|",
        f"| warm-up | {m['warm_requests']:.0f} | {m['warm_dials']:.0f} | "
        f"{m['warm_dials'] / max(1, m['warm_requests']):.4f} |",
        f"| measured | {m['requests']:.0f} | {m['dials']:.0f} | **{per:.4f}** "
        f"(target < {TARGET}) {mark(per < TARGET)} |", "",
        f"{m['rps']:.0f} requests/s measured, {m['errors']:.0f} errors."])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dials", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--tunnelgate-src", metavar="DIR", type=Path,
                        help="run tunnelgate from this source tree (A/B runs of a change)")
    args = parser.parse_args(argv)
    heading = machine_line("dials", args.tunnelgate_src)
    unwind_on_termination()  # a killed run stops its servers
    m = measure(args.connections, args.seconds, args.tunnelgate_src)
    text = render(heading, [Section(f"Upstream dials per request at {args.connections} "
                                    "connections", report(args.connections, args.seconds, m))])
    log(text)
    if not args.no_record:
        append_results(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
