"""The anchor's metric names, types, labels and buckets, as Prometheus sees them."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.control.runtime import Runtime
from proxy.control.demo import start_backend
from proxy.control.flags import add_serve_arguments
from proxy.control.resolve import from_args
from proxy.observability.metrics import (
    BACKEND_ERROR_REASONS, DURATION_BUCKETS, Metrics, status_class)
from routing.config import parse_config

FAMILIES = {
    "cftunnel_proxy_requests_in_flight": ("gauge", set()),
    "cftunnel_proxy_websocket_active_sessions": ("gauge", set()),
    "cftunnel_proxy_request_duration_seconds": ("histogram", {"hostname"}),
    "cftunnel_proxy_requests": ("counter", {"hostname", "status_class"}),
    "cftunnel_proxy_backend_errors": ("counter", {"hostname", "reason"}),
    "cftunnel_proxy_response_bytes": ("counter", {"hostname"}),
    "cftunnel_proxy_request_bytes": ("counter", {"hostname"}),
}


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, keyed by (name, sorted labels)."""
    text, _ = metrics.render()
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


# (host, status, duration, request bytes, response bytes), played in order: hosts and
# status classes interleaved (series order is first-seen order), every status class,
# every bucket edge and just above it, beyond the last one, bodies of 0 bytes.
TRAFFIC = [
    ("a.example.com", 200, 0.005, 0, 120), ("*.example.com", 404, 0.0051, 17, 0),
    ("a.example.com", 503, 30.0, 5, 2), ("", 0, 0.0, 0, 0),
    ("a.example.com", 201, 31.5, 0, 9), ("*.example.com", 101, 0.3, 0, 0),
    ("b.test", 99, 0.1, 1, 1), ("b.test", 700, 2.5, 0, 3), ("", 302, 0.25, 0, 0),
    ("b.test", 150, 1e-9, 0, 0),
    *[("edges.test", 200, edge, 3, 4) for edge in DURATION_BUCKETS],
    *[("edges.test", 200, edge * 1.0001, 0, 1) for edge in DURATION_BUCKETS]]

# What main rendered for TRAFFIC (and play's other events) before the per-host series
# became flat lists: the exposition must stay byte for byte what it was.
GOLDEN = Path(__file__).parent / "data" / "metrics_exposition.txt"


def play(metrics: Metrics) -> None:
    for host, status, duration, request_bytes, response_bytes in TRAFFIC:
        metrics.request_started()
        if status == 101:
            metrics.upgrade_completed(host, duration, request_bytes)
            metrics.websocket_closed()
        else:
            metrics.request_finished(host, status, duration, request_bytes, response_bytes)
    metrics.backend_error("only-errors.test", "dial")  # a host seen only failing
    metrics.backend_error("a.example.com", "timeout")
    metrics.backend_error("a.example.com", "bogus")
    metrics.backend_answered("http://127.0.0.1:1", 200, 0.01)
    metrics.backend_failed("http://127.0.0.1:2")
    metrics.probe_failure("b.test", "no_backend")
    finish(metrics, "a.example.com", 200, duration=0.0333)


def test_exposition_is_byte_identical_to_the_golden_text() -> None:
    metrics = Metrics()
    play(metrics)
    text = metrics.render()[0].decode()
    # The process collector's values change from run to run; everything else may not.
    kept = "".join(line + "\n" for line in text.splitlines()
                   if not line.startswith(("process_", "# HELP process_", "# TYPE process_")))
    assert kept == GOLDEN.read_text()


def test_a_host_pattern_costs_a_few_hundred_bytes() -> None:
    """Issue 43: every host pattern that served a request keeps its series; one more
    host used to cost about 1.1 KB of Python objects (a child, a float and a label tuple
    per series), then one list of 20 counts (about 330 bytes), now one list only as long
    as the slots counted (a fast 2xx host: 8 of them, about 240 bytes)."""
    metrics = Metrics()
    hosts = [f"h{i}.example.com" for i in range(2000)]
    finish(metrics, "warm.example.com", 200)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for host in hosts:
            finish(metrics, host, 200, duration=0.0031, response_bytes=120)
        per_host = (tracemalloc.get_traced_memory()[0] - before) / len(hosts)
    finally:
        tracemalloc.stop()
    assert per_host < 280, per_host


def finish(metrics: Metrics, host: str, status: int, duration: float = 0.02,
           request_bytes: int = 0, response_bytes: int = 0) -> None:
    metrics.request_started()
    metrics.request_finished(host, status, duration, request_bytes, response_bytes)


@pytest.mark.parametrize("status, expected", [
    (0, "aborted"), (99, "aborted"), (100, "1xx"), (101, "1xx"), (200, "2xx"),
    (204, "2xx"), (301, "3xx"), (404, "4xx"), (499, "4xx"), (500, "5xx"), (599, "5xx"),
    (600, "other"), (999, "other")])
def test_status_class(status: int, expected: str) -> None:
    assert status_class(status) == expected


def test_names_types_and_labels_in_the_exposition() -> None:
    metrics = Metrics()
    finish(metrics, "app.example.com", 200, response_bytes=10)
    metrics.backend_error("app.example.com", "dial")
    text, content_type = metrics.render()
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    for name, (kind, labels) in FAMILIES.items():
        assert families[name].type == kind, name
        for sample in families[name].samples:
            assert set(sample.labels) - {"le"} == labels, sample
    exposed = text.decode()
    assert "cftunnel_proxy_requests_total{" in exposed
    assert "_created" not in exposed  # the Go client has none; neither do we
    assert "process_cpu_seconds_total" in exposed  # process collector registered


def test_buckets_are_the_anchors() -> None:
    metrics = Metrics()
    finish(metrics, "a.example.com", 200, duration=0.007)
    finish(metrics, "a.example.com", 200, duration=12.0)
    got = samples(metrics)
    bucket = "cftunnel_proxy_request_duration_seconds_bucket"
    les = sorted(float(dict(labels)["le"]) for name, labels in got if name == bucket)
    assert les == sorted([*DURATION_BUCKETS, float("inf")])
    assert DURATION_BUCKETS == (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)

    def count(le: str) -> float:
        return got[(bucket, (("hostname", "a.example.com"), ("le", le)))]
    assert count("0.005") == 0 and count("0.01") == 1 and count("10.0") == 1
    assert count("30.0") == 2 and count("+Inf") == 2


def test_request_counters_bytes_and_in_flight() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.request_started()
    metrics.request_finished("*.example.com", 200, 0.01, 100, 2000)
    metrics.request_finished("*.example.com", 503, 0.01, 0, 20)
    got = samples(metrics)
    assert got[("cftunnel_proxy_requests_in_flight", ())] == 1
    labels = (("hostname", "*.example.com"),)
    assert got[("cftunnel_proxy_request_bytes_total", labels)] == 100
    assert got[("cftunnel_proxy_response_bytes_total", labels)] == 2020
    assert got[("cftunnel_proxy_requests_total",
                (("hostname", "*.example.com"), ("status_class", "2xx")))] == 1
    assert got[("cftunnel_proxy_requests_total",
                (("hostname", "*.example.com"), ("status_class", "5xx")))] == 1


def test_aborted_and_unmatched_requests() -> None:
    metrics = Metrics()
    finish(metrics, "", 404)
    finish(metrics, "", 0)
    got = samples(metrics)
    assert got[("cftunnel_proxy_requests_total",
                (("hostname", ""), ("status_class", "4xx")))] == 1
    assert got[("cftunnel_proxy_requests_total",
                (("hostname", ""), ("status_class", "aborted")))] == 1
    assert got[("cftunnel_proxy_requests_in_flight", ())] == 0


def test_upgrade_moves_the_request_to_the_session_gauge() -> None:
    metrics = Metrics()
    metrics.request_started()
    metrics.upgrade_completed("ws.example.com", 0.3, request_bytes=0)
    got = samples(metrics)
    assert got[("cftunnel_proxy_requests_in_flight", ())] == 0
    assert got[("cftunnel_proxy_websocket_active_sessions", ())] == 1
    assert got[("cftunnel_proxy_requests_total",
                (("hostname", "ws.example.com"), ("status_class", "1xx")))] == 1
    assert got[("cftunnel_proxy_request_duration_seconds_count",
                (("hostname", "ws.example.com"),))] == 1
    metrics.websocket_closed()
    assert samples(metrics)[("cftunnel_proxy_websocket_active_sessions", ())] == 0


def test_backend_error_reasons_are_a_closed_set() -> None:
    metrics = Metrics()
    for reason in BACKEND_ERROR_REASONS:
        metrics.backend_error("h", reason)
    metrics.backend_error("h", "made-up-by-someone")
    got = samples(metrics)
    reasons = {dict(labels)["reason"]: value for (name, labels), value in got.items()
               if name == "cftunnel_proxy_backend_errors_total"}
    assert set(reasons) == set(BACKEND_ERROR_REASONS)
    assert reasons["other"] == 2


def test_instances_do_not_share_a_registry() -> None:
    first, second = Metrics(), Metrics()
    finish(first, "only-first", 200)
    assert not any(dict(labels).get("hostname") == "only-first"
                   for _, labels in samples(second))


def test_multiprocess_mode_aggregates_workers(tmp_path) -> None:
    """The workers seam: two processes write mmap files, a third renders the sum."""
    worker = textwrap.dedent("""
        from proxy.observability.metrics import Metrics
        m = Metrics()
        m.request_started()
        m.request_finished("app.example.com", 200, 0.02, 0, 7)
        m.backend_error("app.example.com", "dial")
        m.request_started()  # one still in flight when the worker reports
    """)
    render = textwrap.dedent("""
        import sys
        from proxy.observability.metrics import Metrics
        sys.stdout.write(Metrics(multiprocess_dir=sys.argv[1]).render()[0].decode())
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _ in range(2):
        subprocess.run([sys.executable, "-c", worker], env=env, cwd=cwd, check=True,
                       timeout=30)
    out = subprocess.run([sys.executable, "-c", render, str(tmp_path)], env=env, cwd=cwd,
                         check=True, timeout=30, capture_output=True, text=True).stdout
    got = {}
    for family in text_string_to_metric_families(out):
        for sample in family.samples:
            got[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert got[("cftunnel_proxy_requests_total",
                (("hostname", "app.example.com"), ("status_class", "2xx")))] == 2
    assert got[("cftunnel_proxy_response_bytes_total", (("hostname", "app.example.com"),))] == 14
    assert got[("cftunnel_proxy_backend_errors_total",
                (("hostname", "app.example.com"), ("reason", "dial")))] == 2
    assert got[("cftunnel_proxy_request_duration_seconds_bucket",
                (("hostname", "app.example.com"), ("le", "0.025")))] == 2


@contextlib.asynccontextmanager
async def serving(rules: Callable[[str, str], list[dict[str, Any]]]) -> AsyncIterator[Any]:
    """The composed runtime serving ``rules(live, dead)``: the URLs of a demo backend
    and of a port with nothing listening (dial fails). Yields its listening addresses."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    settings = from_args(parser.parse_args(
        ["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]), {})
    backend, port = await start_backend("blue")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    runtime = Runtime(settings)
    await runtime.admin.apply(parse_config({"version": 1, "rules": rules(
        f"http://127.0.0.1:{port}", f"http://127.0.0.1:{dead}")}))
    try:
        yield await runtime.start()
    finally:
        await runtime.close()
        backend.close()


async def test_end_to_end_through_the_handler() -> None:
    """Real requests through the composed runtime: labels are host *patterns*, a dead
    backend counts as a ``dial`` error and a 5xx, an unknown host as ``""``/4xx."""
    def rules(live: str, dead: str) -> list[dict[str, Any]]:
        return [{"hostnames": ["*.example.com"], "backends": [{"url": live, "weight": 1}]},
                {"hostnames": ["dead.example.org"], "backends": [{"url": dead, "weight": 1}]}]
    async with serving(rules) as listening:
        async with httpx.AsyncClient(base_url=f"http://{listening.cluster}",
                                     timeout=5) as client:
            ok = await client.post("/x", content=b"12345", headers={"Host": "a.example.com"})
            assert ok.status_code == 200
            assert (await client.get("/", headers={"Host": "dead.example.org"})).status_code == 502
            assert (await client.get("/", headers={"Host": "nobody.test"})).status_code == 404
        async with httpx.AsyncClient(base_url=f"http://{listening.admin}") as admin:
            text = (await admin.get("/metrics")).text
    got = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            got[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    wildcard = (("hostname", "*.example.com"),)
    assert got[("cftunnel_proxy_requests_total", wildcard + (("status_class", "2xx"),))] == 1
    assert got[("cftunnel_proxy_request_bytes_total", wildcard)] == 5
    assert got[("cftunnel_proxy_response_bytes_total", wildcard)] == len(ok.content)
    assert got[("cftunnel_proxy_backend_errors_total",
                (("hostname", "dead.example.org"), ("reason", "dial")))] == 1
    assert got[("cftunnel_proxy_requests_total",
                (("hostname", "dead.example.org"), ("status_class", "5xx")))] == 1
    assert got[("cftunnel_proxy_requests_total",
                (("hostname", ""), ("status_class", "4xx")))] == 1
    assert got[("cftunnel_proxy_requests_in_flight", ())] == 0
    assert not any(dict(labels).get("hostname") in ("a.example.com", "nobody.test")
                   for _, labels in got)


# Requests through a real server, in order: Host, the host pattern it matches, body,
# expected status.
SERVED = [("a.test", "a.test", b"", 200), ("x.w.test", "*.w.test", b"abc", 200),
          ("moved.test", "moved.test", b"", 302), ("a.test", "a.test", b"12345", 200),
          ("dead.test", "dead.test", b"", 502), ("nobody.test", "", b"", 404),
          ("y.w.test", "*.w.test", b"", 200), ("moved.test", "moved.test", b"zz", 302)]


def scraped_lines(text: str, family: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(family)]


async def test_scraped_host_series_after_a_table_of_requests() -> None:
    """A real server's /metrics after SERVED: the per-host series, in the order and with
    the values main exposed for the same traffic (durations aside: only their count)."""
    def rules(live: str, dead: str) -> list[dict[str, Any]]:
        backends = [{"url": live, "weight": 1}]
        return [{"hostnames": ["a.test", "*.w.test"], "backends": backends},
                {"hostnames": ["moved.test"], "backends": backends, "filters": [
                    {"type": "RequestRedirect", "requestRedirect": {"hostname": "a.test"}}]},
                {"hostnames": ["dead.test"], "backends": [{"url": dead, "weight": 1}]}]
    sizes: list[int] = []
    async with serving(rules) as listening:
        async with httpx.AsyncClient(base_url=f"http://{listening.cluster}",
                                     timeout=5) as client:
            for host, _, body, status in SERVED:
                answer = await client.post("/p", content=body, headers={"Host": host})
                assert answer.status_code == status, host
                sizes.append(len(answer.content))
        async with httpx.AsyncClient(base_url=f"http://{listening.admin}") as admin:
            text = (await admin.get("/metrics")).text
    # Per pattern, in first-seen order (dicts keep it): requests, bytes in, bytes out.
    hosts: dict[str, list[int]] = {}
    classes: dict[tuple[str, str], int] = {}
    for (_, pattern, body, status), size in zip(SERVED, sizes):
        totals = hosts.setdefault(pattern, [0, 0, 0])
        totals[0] += 1
        totals[1] += len(body)
        totals[2] += size
        key = (pattern, status_class(status))
        classes[key] = classes.get(key, 0) + 1
    assert scraped_lines(text, "cftunnel_proxy_request_duration_seconds_count") == [
        f'cftunnel_proxy_request_duration_seconds_count{{hostname="{host}"}} {float(count)}'
        for host, (count, _, _) in hosts.items()]
    assert scraped_lines(text, "cftunnel_proxy_requests_total") == [
        f'cftunnel_proxy_requests_total{{hostname="{host}",status_class="{label}"}} '
        f'{float(count)}' for (host, label), count in classes.items()]
    assert scraped_lines(text, "cftunnel_proxy_backend_errors_total") == [
        'cftunnel_proxy_backend_errors_total{hostname="dead.test",reason="dial"} 1.0']
    assert scraped_lines(text, "cftunnel_proxy_response_bytes_total") == [
        f'cftunnel_proxy_response_bytes_total{{hostname="{host}"}} {float(size)}'
        for host, (_, _, size) in hosts.items()]
    assert scraped_lines(text, "cftunnel_proxy_request_bytes_total") == [
        f'cftunnel_proxy_request_bytes_total{{hostname="{host}"}} {float(size)}'
        for host, (_, size, _) in hosts.items()]
