"""The in-process tunnel bridge: cloudflared's OriginProxy path with no client sockets.

A child interpreter pinned to the proxy CPU (``python -m benchmarks.bridge``) builds the
Handler as ``tunnelgate serve`` composes it, wraps it in ``tunnel.origin.Bridge`` and
runs :data:`CONCURRENCY` clients for a fixed time (a request that never waits, as a
redirect does, completes before its client yields: those run one after the other), in
two scenarios:

* ``redirect`` — a RequestRedirect rule: routing + filters + the Handler + the bridge,
  no socket at all (the handler-only cost);
* ``forward`` — the benchmarked 13 B GET route, forwarded to the nginx backend (the
  only socket is the upstream one).

It prints one JSON object; :func:`section` renders it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import REPO
from benchmarks.configgen import BENCH_HOST, BENCH_PATHS, real_config
from benchmarks.system import PROXY_CPU, with_harness

CONCURRENCY = 32
REQUEST_TIMEOUT = 2.0  # a request stuck longer is counted as "stalled" and abandoned
REDIRECT_PATH = "/redirect/here"


def config(backend_url: str) -> dict:
    """The proxy's benchmark config plus one redirect rule on the benchmarked host."""
    wire = real_config(backend_url)
    wire["rules"].append({
        "hostnames": [BENCH_HOST],
        "matches": [{"path": {"type": "PathPrefix", "value": "/redirect"}}],
        "filters": [{"type": "RequestRedirect",
                     "requestRedirect": {"scheme": "https", "statusCode": 301}}]})
    return wire


def section(backend_url: str, seconds: float, source: Path | None = None) -> str:
    """Markdown results of a child run, or why there are none.

    ``source`` runs the child against another source tree's packages (A/B runs).
    """
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(REPO)  # benchmarks/ from here, the rest from source
    try:
        out = subprocess.run(
            ["taskset", "-c", PROXY_CPU, sys.executable, "-m", "benchmarks.bridge",
             "--backend", backend_url, "--seconds", str(seconds)],
            cwd=source or REPO, env=env, capture_output=True, text=True,
            timeout=4 * seconds + 60, preexec_fn=with_harness())
    except subprocess.TimeoutExpired:
        return "Not measured: the bridge benchmark did not finish in time."
    if out.returncode != 0:
        return f"Not measured: the bridge benchmark failed:\n\n```\n{out.stderr[-1500:]}\n```"
    results = json.loads(out.stdout)
    lines = [f"{CONCURRENCY} requests in flight through `tunnel.origin.Bridge` "
             f"(HTTP/2 transport writer) for {seconds:g} s each, one core.", "",
             "| scenario | req/s | CPU µs/req | p50 µs | p99 µs | status |",
             "|---|--:|--:|--:|--:|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['rps']:,.0f} | {r['cpu_us']:.1f} | {r['p50_us']:,.0f} "
                     f"| {r['p99_us']:,.0f} | "
                     + ", ".join(f"{k}: {v}" for k, v in r["statuses"].items()) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ the child process


def _handle(backend_url: str):
    """The Handler exactly as ``tunnelgate serve`` composes it (the public embedding API)."""
    from proxy.control.embedding import standalone_handler

    return standalone_handler(config(backend_url))


async def _scenario(bridge, url: str, seconds: float) -> dict:
    from tunnel.origin import TunnelRequest

    latencies: list[float] = []
    statuses: dict[str, int] = {}
    deadline = time.monotonic() + seconds

    async def client() -> None:
        # Bounded by time and by count, whichever ends first. One timeout per client,
        # not per request: a per-request wait_for (a Task each) or timeout scope cost
        # as much as the bridge itself once the bridge was fast. A request stuck past
        # the end by REQUEST_TIMEOUT ends its client and is counted as stalled.
        try:
            async with asyncio.timeout(seconds + REQUEST_TIMEOUT):
                for _ in range(10_000_000):
                    if time.monotonic() >= deadline:
                        return
                    start = time.perf_counter()
                    record = await bridge.serve(TunnelRequest("GET", url, [("Accept", "*/*")]))
                    latencies.append((time.perf_counter() - start) * 1e6)
                    status = str(record.status)
                    statuses[status] = statuses.get(status, 0) + 1
        except TimeoutError:
            statuses["stalled"] = statuses.get("stalled", 0) + 1

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    latencies.sort()
    return {"rps": len(latencies) / wall, "cpu_us": cpu * 1e6 / max(1, len(latencies)),
            "p50_us": statistics.median(latencies),
            "p99_us": latencies[int(0.99 * (len(latencies) - 1))], "statuses": statuses}


async def _main(backend_url: str, seconds: float) -> dict:
    from tunnel.origin import Bridge

    bridge = Bridge(_handle(backend_url))
    base = f"https://{BENCH_HOST}"
    results = {}
    for name, path in (("redirect (no sockets)", REDIRECT_PATH),
                       ("forward 13 B GET to nginx", BENCH_PATHS["small"])):
        await _scenario(bridge, base + path, min(1.0, seconds))  # warm-up
        results[name] = await _scenario(bridge, base + path, seconds)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    import uvloop

    print(json.dumps(uvloop.run(_main(args.backend, args.seconds))))
