"""Config pushes under load: does a swap drop requests or blow up tail latency?

wrk saturates tunnelgate's benchmarked route while a 10,000-rule config is PUT to the
config API every second; the same wrk run without pushes is the
baseline. The pushed table is loaded once before either phase, so both serve from an
equally large table and differ only by the pushes themselves.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import httpx

from benchmarks import wrk
from benchmarks.configgen import (
    BENCH_PATHS, MAX_PUSH_BYTES, bench_rule, dumps, large_config)
from benchmarks.systems import Server

_VERSION_PREFIX = b'{"version":0,'


@dataclass
class PushResult:
    rules: int
    config_bytes: int
    baseline: list[wrk.WrkResult] = field(default_factory=list)
    loaded: list[wrk.WrkResult] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # 0 = no HTTP answer
    push_ms: list[float] = field(default_factory=list)
    failure: str = ""  # why the scenario could not run, if it could not

    @property
    def pushes_ok(self) -> int:
        return sum(200 <= s < 300 for s in self.statuses)


def push_body(backend_url: str, rules: int = 10_000, hosts: int = 2_000) -> bytes:
    """``rules`` generated rules plus the benchmarked route, version 0 (rewritten per
    push), compact enough for the 1 MiB limit: path matches only, sparse backends."""
    config, _ = large_config(rules - 1, hosts, backend_urls=(backend_url,),
                             backends_every=10, path_only=True)
    config["rules"].insert(len(config["rules"]) // 2, bench_rule(backend_url))
    config["version"] = 0
    body = dumps(config)
    assert body.startswith(_VERSION_PREFIX)
    return body


def _with_version(body: bytes, version: int) -> bytes:
    return b'{"version":%d,' % version + body[len(_VERSION_PREFIX):]


def run(server: Server, admin_port: int, wrk_path: str, backend_url: str,
        seconds: float, rounds: int, interval: float = 1.0, log=print) -> PushResult:
    """Alternate ``rounds`` × (baseline run, run with a push every ``interval`` s)."""
    body = push_body(backend_url)
    result = PushResult(rules=10_000, config_bytes=len(body))
    if len(body) > MAX_PUSH_BYTES:
        result.failure = f"generated config is {len(body)} bytes, over the 1 MiB API limit"
        return result
    url = f"http://127.0.0.1:{admin_port}/config"
    # Versions above anything the proxy holds; time-based like the controller's.
    version = int(time.time() * 1000)
    with httpx.Client(timeout=30.0) as client:
        status, _ = _push(client, url, _with_version(body, version))
        if status != 200:
            result.failure = f"initial push of the 10,000-rule config answered {status}"
            return result
        target = server.url(BENCH_PATHS["small"])
        for r in range(rounds):
            result.baseline.append(wrk.run(wrk_path, target, server.host, seconds))
            proc = wrk.start(wrk_path, target, server.host, seconds)
            deadline = time.monotonic() + seconds + 30
            next_push = time.monotonic() + interval / 2
            for _ in range(int(seconds / interval) + 2):
                time.sleep(max(0.0, next_push - time.monotonic()))
                if proc.poll() is not None or time.monotonic() > deadline:
                    break
                version += 1
                status, ms = _push(client, url, _with_version(body, version))
                result.statuses.append(status)
                result.push_ms.append(ms)
                next_push += interval
            result.loaded.append(wrk.finish(proc, seconds))
            log(f"  push round {r + 1}/{rounds}: baseline p99 "
                f"{result.baseline[-1].p99_us:.0f} µs, with pushes p99 "
                f"{result.loaded[-1].p99_us:.0f} µs, pushes "
                f"{result.pushes_ok}/{len(result.statuses)} ok")
    return result


def _push(client: httpx.Client, url: str, body: bytes) -> tuple[int, float]:
    """PUT one config; (status or 0 on a transport error, milliseconds taken)."""
    start = time.perf_counter()
    try:
        status = client.put(url, content=body,
                            headers={"Content-Type": "application/json"}).status_code
    except httpx.HTTPError:
        status = 0
    return status, (time.perf_counter() - start) * 1e3


def median(results: list[wrk.WrkResult], attribute: str) -> float:
    return statistics.median(getattr(r, attribute) for r in results)
