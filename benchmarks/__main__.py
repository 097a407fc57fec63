"""``python -m benchmarks`` (``make bench``): every scenario, one table, RESULTS.md.

Parts (``--only`` picks some): ``proxy`` (direct / nginx / bare loop / tunnelgate side by
side, 13 B GET, 64 KiB GET and 16 KiB POST), ``h2`` (the same over h2c with h2load:
nginx / bare HTTP/2 loop / tunnelgate), ``instructions`` (callgrind's count per
request, tunnelgate against the bare loop: the measure the host's noise does not move),
``push`` (config pushes under load), ``propagation`` (a route added per push at 1,000,
5,000 and 10,000 routes: time to first 200, errors, RSS), ``tls`` (HTTPS/1.1 and h2 over
TLS against nginx with the same certificate), ``workers`` (``serve --workers 2`` vs one
process), ``table`` (route-table micro-benchmarks), ``bridge`` (the in-process tunnel
bridge, no client sockets), ``resilience`` (failing backends: retries and outlier
detection on and off, and nginx's equivalents), ``overload`` (4x the saturating load,
with and without load shedding). ``--base DIR`` adds tunnelgate from another source tree
(the commit a change starts from) to the ``proxy`` part's rounds as one more system,
"tunnelgate (base)", with the paired ratios tunnelgate / base. ``--profile`` adds a py-spy profile of tunnelgate under
load. The default run takes about nine minutes, ``--quick`` about two. Everything runs
on 127.0.0.1 and every loop is bounded.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from benchmarks import (
    bridge, compare, h2bench, instructions, overload, propagation, push, resilience, routetable,
    tls, workers)
from benchmarks import profile as profiler
from benchmarks.compare import BASE
from benchmarks.configgen import real_config
from benchmarks.report import (
    Section, append_results, base_table, machine_line, proxy_table, push_table,
    render, table_table)
from benchmarks.system import LOAD_CPU, ensure_tools, unwind_on_termination
from benchmarks.systems import Server, bare_loop, nginx_backend, nginx_proxy, tunnelgate

PARTS = ("proxy", "h2", "instructions", "push", "propagation", "tls", "workers", "table",
         "bridge", "resilience", "overload")  # the default run
OPTIONAL = ("profile",)
log = functools.partial(print, flush=True)


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    rounds: int
    seconds: float  # per wrk run
    warmup: float  # per system and scenario, before the rounds
    push_seconds: float
    push_rounds: int
    lookups: int
    compiles: int
    profile_seconds: float
    bridge_seconds: float
    callgrind_seconds: float  # per system and scenario, collected (after a warm-up)
    propagation_adds: int  # routes added one per push, at each table size


FULL = Mode("full", rounds=5, seconds=5, warmup=1, push_seconds=10, push_rounds=2,
            lookups=4_000, compiles=3, profile_seconds=15, bridge_seconds=5,
            callgrind_seconds=5, propagation_adds=100)
QUICK = Mode("quick", rounds=1, seconds=2, warmup=1, push_seconds=4, push_rounds=1,
             lookups=2_000, compiles=1, profile_seconds=5, bridge_seconds=2,
             callgrind_seconds=2, propagation_adds=20)
PROPAGATION_SIZES = (1_000, 5_000, 10_000)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    mode = QUICK if args.quick else FULL
    parts = set(args.only.split(",")) if args.only else set(PARTS)
    if args.profile:
        parts.add("profile")
    if unknown := parts - set(PARTS + OPTIONAL):
        raise SystemExit(f"unknown part(s) {sorted(unknown)}; choose from "
                         f"{PARTS + OPTIONAL}")
    if args.base and "proxy" not in parts:
        raise SystemExit("--base compares in the proxy part's rounds: add 'proxy' to --only")
    # The commits and time the run started at.
    heading = machine_line(mode.name, args.tunnelgate_src, args.base)
    # The harness shares the load CPU with wrk and the backend, never the proxy's.
    os.sched_setaffinity(0, {int(LOAD_CPU)})
    unwind_on_termination()  # a killed run stops its servers (benchmarks.system)
    sections: list[Section] = []
    if parts & {"proxy", "h2", "instructions", "push", "propagation", "tls", "workers",
                 "bridge", "profile", "resilience", "overload"}:
        sections += _socket_parts(mode, parts, args.tunnelgate_src, args.base)
    if "table" in parts:
        log("route table micro-benchmarks …")
        result = routetable.run(lookups=mode.lookups, repeats=mode.compiles)
        sections.append(Section("Route table (in process, no sockets)", table_table(result)))
    text = render(heading, sections)
    log("\n" + text)
    if not args.no_record:
        append_results(text)
        log("appended to benchmarks/RESULTS.md")
    return 0


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="about one minute, 1 round")
    parser.add_argument("--only", metavar="PARTS",
                        help=f"comma list of {','.join(PARTS + OPTIONAL)}")
    parser.add_argument("--profile", action="store_true",
                        help="add a py-spy profile of tunnelgate under load (the 'profile' "
                             "part; installs py-spy into this environment)")
    parser.add_argument("--no-record", action="store_true",
                        help="print only; do not append to benchmarks/RESULTS.md")
    parser.add_argument("--tunnelgate-src", metavar="DIR", type=_source_tree,
                        help="run tunnelgate from this source tree (A/B runs of a change)")
    parser.add_argument("--base", metavar="DIR", type=_source_tree,
                        help="also run tunnelgate from this source tree, as the system "
                             f"'{BASE}', in the proxy part's rounds (paired A/B ratios)")
    return parser.parse_args(argv)


def _source_tree(text: str) -> Path:
    """A tree to run tunnelgate from, absolute: its servers run with it as their working
    directory and on PYTHONPATH."""
    tree = Path(text).resolve()
    if not (tree / "proxy" / "__main__.py").is_file():
        raise argparse.ArgumentTypeError(f"{tree} is not a tunnelgate source tree")
    return tree


def _socket_parts(mode: Mode, parts: set[str], source: Path | None,
                  base: Path | None) -> list[Section]:
    """Start the backend (and, for load parts, nginx proxy and tunnelgate); run them."""
    tools = ensure_tools()
    sections = []
    with tempfile.TemporaryDirectory(prefix="tunnelgate-bench-") as tmp, \
            ExitStack() as stack:
        work = Path(tmp)
        work.chmod(0o755)  # nginx workers run as nobody and must traverse it
        backend = stack.enter_context(nginx_backend(tools["nginx"], work / "backend"))
        backend_url = f"http://127.0.0.1:{backend.port}"
        if parts & {"proxy", "push", "profile"}:
            sections += _proxy_parts(mode, parts, tools, work, backend, stack, source, base)
        if "propagation" in parts:
            log("route propagation under load …")
            results = propagation.run(backend_url, PROPAGATION_SIZES, mode.propagation_adds,
                                      work, source, log)
            sections.append(Section("Route propagation at 1,000 / 5,000 / 10,000 routes",
                                    propagation.table(results, mode.propagation_adds)))
        if "h2" in parts:
            sections.append(Section(
                f"HTTP/2 cleartext (h2load -t1 -c{h2bench.CLIENTS} -m{h2bench.STREAMS}, "
                f"medians of {mode.rounds} × {mode.seconds:g} s)",
                h2bench.section(tools["h2load"], tools["nginx"], work, backend.port,
                                real_config(backend_url), mode.rounds, mode.seconds,
                                mode.warmup, source, log,
                                mode.profile_seconds if "profile" in parts else None)))
        if "instructions" in parts:
            log("instructions per request under callgrind (bare loop, tunnelgate) …")
            sections.append(Section(
                "Instructions per request (callgrind, wrk -c4)", instructions.section(
                    tools, work, backend_url, backend.port, mode.callgrind_seconds,
                    mode.warmup, source)))
        if "tls" in parts:
            log("TLS: nginx and tunnelgate with one certificate …")
            sections.append(Section(
                f"HTTPS (wrk -t1 -c{compare.CONNECTIONS} over TLS; h2load -c"
                f"{tls.H2_CONNECTIONS} -m{tls.H2_STREAMS}; medians of {mode.rounds} × "
                f"{mode.seconds:g} s)",
                tls.section(tools, work, backend, mode.rounds, mode.seconds, mode.warmup,
                            source, log)))
        if "workers" in parts:
            log("workers: 1 process vs --workers 2 …")
            sections.append(Section("Worker processes (`serve --workers 2`)", workers.section(
                tools["wrk"], work, backend_url, mode.rounds, mode.seconds, mode.warmup,
                source, log)))
        if "bridge" in parts:
            log("in-process tunnel bridge …")
            sections.append(Section("In-process tunnel bridge (no client sockets)",
                                    bridge.section(backend_url, mode.bridge_seconds, source)))
        sections += _resilience_parts(mode, parts, tools, work, backend_url, source)
    return sections


def _proxy_parts(mode: Mode, parts: set[str], tools: dict[str, str], work: Path,
                 backend: Server, stack: ExitStack, source: Path | None,
                 base: Path | None) -> list[Section]:
    """The parts that load nginx and tunnelgate (and the bare loop, and the base)."""
    sections = []
    backend_url = f"http://127.0.0.1:{backend.port}"
    nginx = stack.enter_context(nginx_proxy(tools["nginx"], work / "nginx-proxy", backend.port))
    gate, admin, gap = _start_tunnelgate(work / "tunnelgate", backend_url, stack, source)
    if "proxy" in parts:
        bare = stack.enter_context(bare_loop(work / "bare-loop", backend.port))
        servers = [backend, nginx, bare] + ([gate] if gate else [])
        if base is not None:
            log(f"A/B: tunnelgate from {base} as '{BASE}' …")
            other, _, base_gap = _start_tunnelgate(work / "base", backend_url, stack, base,
                                                   BASE)
            servers += [other] if other else []
            gap = "; ".join(filter(None, (gap, base_gap)))
        sections.append(_proxy_section(mode, servers, tools["wrk"], work, gap))
    if "profile" in parts:
        log(f"profiling tunnelgate for {mode.profile_seconds:g} s …")
        sections.append(Section(
            "Where tunnelgate spends its CPU (py-spy, 13 B GET)",
            profiler.section(gate, tools["wrk"], work, mode.profile_seconds)
            if gate else f"Not measured: {gap}"))
    if "push" in parts:
        log("config push under load …")
        sections.append(Section(
            "Config push under load",
            push_table(push.run(gate, admin, tools["wrk"], backend_url,
                                mode.push_seconds, mode.push_rounds, log=log))
            if gate else f"Not measured: {gap}"))
    return sections


def _resilience_parts(mode: Mode, parts: set[str], tools: dict[str, str], work: Path,
                      backend_url: str, source: Path | None) -> list[Section]:
    sections = []
    if "resilience" in parts:
        sections.append(Section(
            f"Failing backends (wrk -t1 -c{resilience.CONNECTIONS}, {mode.seconds:g} s each)",
            resilience.resilience_section(tools["nginx"], tools["wrk"], work,
                                          mode.seconds, log, source)))
    if "overload" in parts:
        sections.append(Section(
            "Overload: 4x the saturating connections, load shedding off and on",
            overload.overload_section(tools["wrk"], work, backend_url, mode.seconds,
                                      log, source)))
    return sections


def _proxy_section(mode: Mode, servers: list[Server], wrk_path: str, work: Path,
                   gap: str) -> Section:
    for server in servers:
        compare.verify(server)
    runs = mode.rounds * len(servers) * len(compare.SCENARIOS)
    log(f"proxy comparison: {runs} runs of {mode.seconds:g} s in {mode.rounds} rounds "
        "(+ warm-up) …")
    samples = compare.run_rounds(servers, wrk_path, mode.rounds, mode.seconds,
                                 mode.warmup, work, log)
    rows = compare.summarise(samples)
    body = "\n\n".join(filter(None, (proxy_table(rows), base_table(rows),
                                      f"**Gap:** {gap}" if gap else "")))
    return Section(f"Proxy comparison (wrk -t1 -c32, medians of {mode.rounds} × "
                   f"{mode.seconds:g} s)", body)


def _start_tunnelgate(workdir: Path, backend_url: str, stack: ExitStack,
                      source: Path | None, name: str = compare.TUNNELGATE
                      ) -> tuple[Server | None, int, str]:
    """(server, admin port, "") or (None, 0, why it could not be measured)."""
    try:
        gate, admin = tunnelgate(workdir, real_config(backend_url), source=source,
                                 name=name)
        stack.enter_context(gate)
        compare.verify(gate)
    except (RuntimeError, OSError) as err:
        return None, 0, f"{name} could not be benchmarked: {err}"
    return gate, admin, ""


if __name__ == "__main__":
    sys.exit(main())
