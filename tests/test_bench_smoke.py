"""Smoke tests of the benchmark harness (``benchmarks/``).

They check that the harness's pieces work — generated configs are valid and route as
intended, parsers read what the tools print, the report renders, the bare forwarding
loop forwards — on small inputs. They never time anything as a pass/fail criterion and
need neither nginx nor wrk.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import AsyncIterator

import pytest

from benchmarks import REPO, instructions, profile, propagation, routetable, tls, wrk
from benchmarks.compare import Sample, summarise
from benchmarks.configgen import (
    BENCH_HOST, BENCH_PATHS, MAX_PUSH_BYTES, ROUTE_HEADER, dumps, large_config,
    miss_probes, real_config)
from benchmarks.push import _with_version, push_body
from benchmarks.report import proxy_table, table_table
from benchmarks.system import free_port
from benchmarks.systems import render
from routing.config import parse_config
from routing.table import Table
from tests.helpers import HOST, RawClient, TestBackend

BACKEND = "http://127.0.0.1:9"


def lookup(table: Table, host: str, path: str, headers=(), method: str = "GET",
           query: str = ""):
    return table.lookup(host, path, query, list(headers), method, "tunnel")


def test_real_config_routes_the_benchmarked_paths_to_the_filtered_rule() -> None:
    wire = real_config(BACKEND, rules=300, hosts=100)
    config = parse_config(dumps(wire))
    assert len(config.rules) == 300
    assert len({h for r in config.rules for h in r.hostnames}) == 100
    table = Table.compile(config)
    for path in BENCH_PATHS.values():
        hit = lookup(table, BENCH_HOST, path)
        assert hit is not None and hit.host_pattern == BENCH_HOST
        (modifier,) = hit.route.rule.filters
        assert modifier.request_header_modifier.set == (ROUTE_HEADER,)
        assert hit.route.rule.backends[0].url == BACKEND
    assert lookup(table, BENCH_HOST, "/elsewhere") is None


def test_large_config_probes_hit_their_rules_and_misses_miss() -> None:
    wire, probes = large_config(rules=1200, hosts=240)
    table = Table.compile(parse_config(dumps(wire)))
    kinds = {r["matches"][0]["path"]["type"] for r in wire["rules"]}
    assert kinds == {"Exact", "PathPrefix", "RegularExpression"}
    assert any("headers" in r["matches"][0] for r in wire["rules"])
    assert any(r["hostnames"][0].startswith("*.") for r in wire["rules"] if "hostnames" in r)
    assert any("hostnames" not in r for r in wire["rules"])
    for index, p in enumerate(probes):
        hit = lookup(table, p.host, p.path, p.headers, p.method, p.query)
        assert hit is not None and hit.route.index == index, p
    for p in miss_probes(probes, 200):
        assert lookup(table, p.host, p.path, p.headers, p.method, p.query) is None


def test_pushed_config_fits_the_api_limit_and_takes_each_version() -> None:
    body = push_body(BACKEND)
    assert len(body) <= MAX_PUSH_BYTES
    config = parse_config(_with_version(body, 1767225600123))
    assert config.version == 1767225600123 and len(config.rules) == 10_000
    assert lookup(Table.compile(config), BENCH_HOST, BENCH_PATHS["small"]) is not None


def test_route_table_micro_benchmark_on_a_small_table() -> None:
    result = routetable.run(rules=300, hosts=60, lookups=400, repeats=1, rss=True)
    assert (result.rules, result.hosts) == (300, 60)
    assert result.hits_found == 1.0 and result.misses_found == 0.0
    assert result.rss_mb is not None and result.rss_base_mb is not None
    assert result.rss_mb >= result.rss_base_mb > 0
    assert all(math.isfinite(v) and v > 0 for v in (
        result.parse_s, result.compile_s, result.again_s, result.lookup_p50_us,
        result.lookup_p99_us))
    assert "300 rules over 60 hostnames" in table_table(result)


WRK_OUTPUT = """Running 5s test @ http://127.0.0.1:8080/bench/small
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.21ms  312.00us   9.01ms   88.00%
  Latency Distribution
     50%  850.00us
     75%    1.10ms
     90%    1.40ms
     99%    2.50ms
  61234 requests in 5.10s, 9.10MB read
  Socket errors: connect 0, read 3, write 1, timeout 2
  Non-2xx or 3xx responses: 7
Requests/sec:  12006.67
Transfer/sec:      1.78MB
"""


def test_wrk_report_is_parsed_with_units_and_errors() -> None:
    result = wrk.parse(WRK_OUTPUT)
    assert result.requests == 61234 and result.rps == 12006.67
    assert result.mean_us == 1210.0
    assert math.isclose(result.concurrency, 12006.67 * 1210e-6)
    assert math.isclose(result.seconds, 5.10)
    assert result.p50_us == 850.0 and result.p99_us == 2500.0
    assert result.non_2xx == 7 and result.socket_errors == 6


@pytest.mark.skipif(shutil.which("valgrind") is None or
                    shutil.which("callgrind_annotate") is None,
                    reason="valgrind is not installed")
def test_callgrind_counts_are_read_from_a_real_dump(tmp_path: Path) -> None:
    # One real run: the process copies 1 MiB once, which callgrind counts per byte
    # (rep movsb), so the copies alone pass a million instructions.
    out = tmp_path / "callgrind.out"
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                    sys.executable, "-S", "-c", "b = bytearray(1 << 20); bytes(b)"],
                   check=True, timeout=120, capture_output=True)
    total = instructions.parse_totals(out.read_text(errors="replace"))
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no",
                                "--threshold=100", str(out)], check=True, timeout=120,
                               capture_output=True, text=True).stdout
    copies = instructions.copy_instructions(annotated)
    assert 1 << 20 <= copies < total
    with pytest.raises(ValueError):
        instructions.parse_totals("events: Ir\n")


def test_instruction_table_compares_without_copies() -> None:
    counts = [instructions.Count("13 B GET", "tunnelgate", 100, 60_000.0, 1_000.0),
              instructions.Count("13 B GET", "bare loop", 200, 45_000.0, 1_000.0),
              instructions.Count("64 KiB GET", "bare loop", 50, 180_000.0, 130_000.0),
              instructions.Count("64 KiB GET", "tunnelgate", 90, 80_000.0, 1_000.0)]
    lines = instructions._table(counts).splitlines()
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]]
    assert [row[:2] for row in cells] == [["13 B GET", "bare loop"],
                                          ["13 B GET", "tunnelgate"],
                                          ["64 KiB GET", "bare loop"],
                                          ["64 KiB GET", "tunnelgate"]]
    assert cells[1][3:] == ["60,000", "1,000", "59,000", "1.34"]
    assert cells[3][5:] == ["79,000", "1.58"]


def sample(system: str, round_: int, rps: float, p99: float, cpu: float | None,
            mean_us: float = 1_000.0, errors: int = 0) -> Sample:
    result = wrk.WrkResult(int(rps), 1.0, rps, mean_us, 500.0, p99, errors, 0)
    return Sample("13 B GET", system, result, cpu, None if cpu is None else cpu / 4,
                  None if cpu is None else 0.8, round_)


def test_ratios_are_paired_within_rounds() -> None:
    # Round 0 ran at half the host's speed for both systems. The ratio of the medians,
    # 18,000 / 20,000 = 0.90, compares runs of different rounds; the paired ratios are
    # 1.0, 0.9 and 1.0.
    samples = [sample("bare loop", 0, 10_000, 2_000, 40.0),
               sample("tunnelgate", 0, 10_000, 2_200, 44.0),
               sample("bare loop", 1, 20_000, 1_000, 20.0),
               sample("tunnelgate", 1, 18_000, 1_000, 22.0),
               sample("bare loop", 2, 21_000, 1_000, 20.0),
               sample("tunnelgate", 2, 21_000, 1_500, 20.0)]
    rows = {row.system: row for row in summarise(samples)}
    gate = rows["tunnelgate"]
    assert gate.rps == 18_000 and rows["bare loop"].rps == 20_000
    assert gate.ratio("bare loop", "rps") == pytest.approx(1.0)
    assert gate.ratio("bare loop", "cpu") == pytest.approx(1.1)
    assert gate.ratio("bare loop", "p99") == pytest.approx(1.1)
    assert math.isnan(gate.ratio("nginx", "rps"))
    assert rows["bare loop"].ratio("tunnelgate", "rps") == pytest.approx(1.0)


def test_proxy_table_reports_ratios_and_targets() -> None:
    samples = [sample("direct", 0, 40_000, 600, None, mean_us=775),
               sample("nginx", 0, 20_000, 1_000, 20.0, mean_us=1_500),
               sample("bare loop", 0, 12_500, 1_200, 40.0, mean_us=2_480),
               sample("tunnelgate", 0, 10_000, 2_000, 80.0, mean_us=200, errors=5)]
    text = proxy_table(summarise(samples))
    line = next(l for l in text.splitlines() if "| tunnelgate |" in l)
    cells = [c.strip() for c in line.split("|")]
    assert cells[6:15] == ["80.0 (20)", "80%", "0.50", "0.80", "2.00", "1.67", "0.25",
                           "2.00", "5"]
    assert "req/s ≥0.65× nginx ✗" in line and "CPU ≤40 µs ✗" in line
    assert "req/s ≥0.9× bare ✗" in line and "CPU ≤1.1× bare ✗" in line
    assert "p99 ≤1.2× bare ✗" in line
    assert "5 errors ✗" in line and "only 2.0 of 32 connections progressing" in line
    assert "progressing" not in text.replace(line, "")
    nginx = next(l for l in text.splitlines() if "| nginx |" in l)
    assert [c.strip() for c in nginx.split("|")][8] == "1.00"  # itself


def test_nginx_templates_render_completely() -> None:
    values = {"DIR": "/tmp/x", "PORT": "1", "BACKEND_PORT": "2", "ROUTE_HEADER": "v"}
    for template in ("backend.conf", "proxy.conf"):
        text = render(template, values)
        assert "listen 127.0.0.1:1 " in text and "access_log off;" in text
        assert "worker_processes 1;" in text and "daemon off;" in text
    assert "keepalive 64;" in render("proxy.conf", values)


def test_tls_template_and_h2load_report() -> None:
    text = render("proxy-tls.conf", {"DIR": "/tmp/x", "PORT": "1", "BACKEND_PORT": "2",
                                     "ROUTE_HEADER": "v", "CERT": "/c.pem", "KEY": "/k.pem"})
    assert "listen 127.0.0.1:1 ssl http2 " in text and "ssl_certificate /c.pem;" in text
    report = ("finished in 2.00s, 3352.50 req/s, 1.23MB/s\n"
              "requests: 6705 total, 6705 started, 6705 done, 6700 succeeded, 5 failed, "
              "0 errored, 0 timeout\nstatus codes: 6700 2xx, 0 3xx, 5 4xx, 0 5xx\n")
    assert tls.parse_h2load(report) == (3352.5, 6705, 6700)
    with pytest.raises(RuntimeError):
        tls.parse_h2load("h2load: connection refused")


def test_py_spy_raw_output_is_summarised_by_function() -> None:
    raw = ("main (a.py:1);serve (b.py:5);parse (c.py:9) 30\n"
           "main (a.py:1);serve (b.py:5) 10\n"
           "main (a.py:1);idle (d.py:2) 60\n")
    samples, spots = profile.parse_raw(raw)
    assert samples == 100
    by_name = {s.function: s for s in spots}
    assert spots[0].function == "idle (d.py:2)" and spots[0].own == 0.6
    assert by_name["serve (b.py:5)"].own == 0.1 and by_name["serve (b.py:5)"].total == 0.4
    assert by_name["main (a.py:1)"].total == 1.0


@contextlib.asynccontextmanager
async def _bare_loop(backend_port: int) -> AsyncIterator[int]:
    """``python -m benchmarks.bareloop`` in front of ``backend_port``; yields its port."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.bareloop", "--listen", str(port),
        "--backend", str(backend_port), cwd=str(REPO), stdin=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(200):  # bounded: 10 s
            try:
                _, writer = await asyncio.open_connection(HOST, port)
                writer.close()
                break
            except OSError:
                assert proc.returncode is None, "the bare loop exited"
                await asyncio.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)


async def test_bare_loop_forwards_get_and_post_over_keep_alive() -> None:
    async with TestBackend() as backend:
        async with _bare_loop(backend.port) as port:
            client = await RawClient.connect(port)
            try:
                for _ in range(3):  # one client connection, one reused upstream one
                    client.send(b"GET /bench/x?q=1 HTTP/1.1\r\nHost: b.test\r\n"
                                b"Connection: keep-alive\r\nTE: trailers\r\n\r\n")
                    got = await client.read_response()
                    assert got.status == 200, got.body[:200]
                    echoed = got.json()
                    assert (echoed["method"], echoed["path"], echoed["query"]) == (
                        "GET", "/bench/x", "q=1")
                    names = {n.lower() for n, _ in echoed["headers"]}
                    assert "host" in names and not names & {"connection", "te"}
                body = bytes(range(256)) * 64  # 16 KiB, as the POST scenario sends
                client.send(b"POST /bench/post HTTP/1.1\r\nHost: b.test\r\n"
                            b"Content-Length: %d\r\n\r\n" % len(body) + body)
                got = await client.read_response()
                assert got.status == 200 and got.json()["body"] == body.decode("latin-1")
                client.send(b"POST /c HTTP/1.1\r\nHost: b.test\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
                got = await client.read_response()
                assert got.json()["body"] == "hello"
                client.send(b"GET /chunked?size=3000&chunk=1000 HTTP/1.1\r\nHost: b\r\n\r\n")
                got = await client.read_response()
                assert got.status == 200 and len(got.body) == 3000
            finally:
                client.close()
            assert backend.connections == 1


def test_propagation_pushes_gzip_only_over_the_cap_and_reports_targets() -> None:
    small, gzipped = propagation.wire(propagation.config(1_000, "http://127.0.0.1:9", 2))
    assert not gzipped and json.loads(small)["rules"][1]["hostnames"] == ["r0.prop.test"]
    large, gzipped = propagation.wire(propagation.config(10_000, "http://127.0.0.1:9", 2))
    assert gzipped and len(gzip.decompress(large)) > propagation.BODY_CAP >= len(large)
    results = [propagation.SizeResult(1_000, add_ms=[5.0, 6.0], rss_loaded_mb=40.0),
               propagation.SizeResult(5_000, add_ms=[9.0, 9.0, 30.0], errors=2),
               propagation.SizeResult(10_000, add_ms=[15.0, 16.0], rss_loaded_mb=58.0,
                                      cold_ms=[900.0, 1100.0, 800.0],
                                      baseline_p99_ms=[2.0, 2.0, 2.0],
                                      cold_p99_ms=[3.0, 5.0, 2.0])]
    text = propagation.table(results, 2)
    assert "5,000 routes p50 ≤ 10 ms ✓, p99 ≤ 25 ms ✗" in text
    assert "0 errors ✗ (2)" in text and "per route 2.05 KB ≤ 2 KB ✗" in text
    assert "(started with the routes: 0.00 KB)" in text
    assert "| 1100 ms | 2.0 / 3.0 ms |" in text
    assert "cold push of 10,000 ≤ 1 s ✗ (each: 900, 1100, 800 ms)" in text
    assert "the p99 before it: median 1.50× ✓ (each: 1.50, 2.50, 1.00)" in text
    assert "end to end through Kubernetes" in text
