"""What an operator reads off a running proxy: the config and per-backend metric series,
access-log fields beyond the anchor's, request ids, entrance refusals, route decisions at
debug level and the warnings for dial failures and rejected pushes."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from contextlib import redirect_stdout
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import RawClient, TestBackend
from tests.stack import running
from tests.test_e2e_routing import LISTEN, ask
from tests.test_workers import Supervisor

HOST = "app.example.com"
DOWN = "http://127.0.0.1:1"  # nothing listens on port 1: every dial fails


def config(url: str, version: int = 3) -> dict[str, Any]:
    return {"version": version, "rules": [
        {"hostnames": [HOST], "matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
         "backends": [{"url": url, "weight": 1}]},
        {"hostnames": [HOST], "matches": [{"path": {"type": "PathPrefix", "value": "/down"}}],
         "backends": [{"url": DOWN, "weight": 1}]},
        {"hostnames": [HOST], "matches": [{"path": {"type": "PathPrefix",
                                                    "value": "/status"}}],
         "backends": [{"url": url, "weight": 1}]},
    ]}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (name, sorted labels)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def labels(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


async def scrape(admin_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient() as client:
        return samples((await client.get(f"{admin_url}/metrics")).text)


async def test_config_series_count_pushes_and_describe_the_served_config(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tunnelgate.admin")
    token = "t0ken"
    async with running(*LISTEN, environ={"PROXY_AUTH_TOKEN": token}) as stack:
        before = time.time()
        assert (await stack.push(config(DOWN, 5), token=token)).status_code == 200
        assert (await stack.push(config(DOWN, 4), token=token)).status_code == 409
        assert (await stack.push(b"{nope", token=token)).status_code == 400
        invalid = config(DOWN, 6)
        invalid["rules"][0]["backends"][0]["weight"] = -1
        assert (await stack.push(invalid, token=token)).status_code == 400
        assert (await stack.push(config(DOWN, 6), token="wrong")).status_code == 401
        got = await scrape(stack.admin_url)
    assert got[("tunnelgate_config_version", ())] == 5
    assert got[("tunnelgate_config_rules", ())] == 3
    assert before <= got[("tunnelgate_config_last_applied_timestamp_seconds", ())] <= time.time()
    pushes = {key[1]: value for key, value in got.items()
              if key[0] == "tunnelgate_config_pushes_total"}
    assert pushes == {labels(result="applied", status="200"): 1,
                      labels(result="rejected", status="409"): 1,
                      labels(result="rejected", status="400"): 2,
                      labels(result="rejected", status="401"): 1}
    # Rejected pushes are logged at warning with their status.
    assert [(r.levelname, r.status) for r in caplog.records  # type: ignore[attr-defined]
            if r.getMessage() == "config push rejected"] == [
        ("WARNING", 409), ("WARNING", 400), ("WARNING", 400), ("WARNING", 401)]


async def test_backend_series_and_the_anchor_series_unchanged() -> None:
    async with TestBackend() as echo:
        async with running(*LISTEN, config=config(echo.url)) as stack:
            for _ in range(3):
                assert (await ask(stack.cluster_port, HOST, "/api/x")).status == 200
            assert (await ask(stack.cluster_port, HOST, "/status/503")).status == 503
            assert (await ask(stack.cluster_port, HOST, "/down")).status == 502
            got = await scrape(stack.admin_url)
    backend = {key[1]: value for key, value in got.items()
               if key[0] == "tunnelgate_backend_requests_total"}
    assert backend == {labels(backend=echo.url, status_class="2xx"): 3,
                       labels(backend=echo.url, status_class="5xx"): 1,
                       labels(backend=DOWN, status_class="error"): 1}
    assert got[("tunnelgate_backend_latency_seconds_count", labels(backend=echo.url))] == 4
    assert got[("tunnelgate_backend_latency_seconds_sum", labels(backend=echo.url))] > 0
    # The anchor's series keep their label sets: hostname (+ status_class / reason) only.
    anchor = [key for key in got if key[0].startswith("cftunnel_proxy_requests_total")]
    assert {tuple(name for name, _ in key[1]) for key in anchor} == {
        ("hostname", "status_class")}
    assert got[("cftunnel_proxy_requests_total", labels(hostname=HOST, status_class="2xx"))] == 3


async def test_access_log_fields_and_request_ids() -> None:
    out = io.StringIO()
    async with TestBackend() as echo:
        with redirect_stdout(out):
            async with running(*LISTEN, config=config(echo.url),
                               environ={"PROXY_ACCESS_LOG_ENABLED": "1"}) as stack:
                made = await ask(stack.cluster_port, HOST, "/api/a")
                kept = await ask(stack.cluster_port, HOST, "/api/b",
                                 headers=[("X-Request-Id", "from-the-client")])
                assert (await ask(stack.cluster_port, HOST, "/nowhere")).status == 404
                assert (await ask(stack.cluster_port, HOST, "/down")).status == 502
        first, second = echo.requests[-2:]
    assert made.status == kept.status == 200
    entries = [json.loads(line) for line in out.getvalue().splitlines()]
    a, b, missing, down = entries
    generated = first.header(b"x-request-id")
    assert generated is not None and re.fullmatch(rb"[0-9a-f]{32}", generated)
    assert a["request_id"] == generated.decode()
    assert second.header(b"x-request-id") == b"from-the-client"
    assert b["request_id"] == "from-the-client"
    # The anchor's fields first, in its order; ours after them.
    assert list(a)[:11] == ["time", "level", "msg", "method", "host", "path", "query",
                            "status", "bytes_written", "duration_ms", "user_agent"]
    assert {k: a[k] for k in ("client", "entrance", "rule", "backend")} == {
        "client": "127.0.0.1", "entrance": "cluster", "rule": "rules[0].matches[0]",
        "backend": echo.url}
    for entry in (a, b):  # both in ms to the µs: the part never exceeds the total
        assert isinstance(entry["duration_ms"], float)
        assert isinstance(entry["upstream_ms"], float)
        assert 0 < entry["upstream_ms"] <= entry["duration_ms"]
    assert (missing["status"], missing["rule"], missing["backend"],
            missing["upstream_ms"]) == (404, "", "", None)
    assert (down["status"], down["backend"], down["upstream_ms"]) == (502, DOWN, None)


async def test_entrance_refusals_are_logged_and_counted() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        async with running(*LISTEN, "--header-timeout", "0.3s", config=config(DOWN),
                           environ={"PROXY_ACCESS_LOG_ENABLED": "1"}) as stack:
            for raw in (b"GET / HTTP/1.1\r\n\r\n",  # no Host: 400
                        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # 414
                        b"GET / HTTP/1.1\r\nHost: x\r\n"):  # never finished: 408
                client = await RawClient.connect(stack.cluster_port)
                client.send(raw)
                try:
                    response = await client.read_response(timeout=5)
                finally:
                    client.close()
                assert response.status in (400, 414, 408)
            got = await scrape(stack.admin_url)
    refused = {key[1]: value for key, value in got.items()
               if key[0] == "tunnelgate_http_rejected_requests_total"}
    assert refused == {labels(entrance="cluster", status=str(code)): 1
                       for code in (400, 414, 408)}
    entries = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["msg"], e["status"], e["entrance"], e["client"]) for e in entries] == [
        ("rejected", code, "cluster", "127.0.0.1") for code in (400, 414, 408)]
    assert entries[0]["reason"] == "missing Host header"


async def test_debug_level_logs_each_route_decision(caplog: pytest.LogCaptureFixture) -> None:
    async with TestBackend() as echo:
        with caplog.at_level(logging.DEBUG, logger="tunnelgate.route"):
            async with running(*LISTEN, config=config(echo.url)) as stack:
                assert stack.runtime.in_flight.reporting.debug_routes
                assert (await ask(stack.cluster_port, HOST, "/api/z")).status == 200
                assert (await ask(stack.cluster_port, "x.test", "/")).status == 404
    decisions = [r for r in caplog.records if r.name == "tunnelgate.route"]
    hit, miss = decisions
    assert hit.getMessage() == "route decision"
    assert (hit.rule, hit.backend, hit.bucket, hit.path) == (  # type: ignore[attr-defined]
        "rules[0].matches[0]", echo.url, HOST, "/api/z")
    assert hit.why == (  # type: ignore[attr-defined]
        "first satisfied match in precedence order (PathPrefix, length 4, method no, "
        "0 header(s), 0 query param(s), rule 0, match 0)")
    assert re.fullmatch(r"[0-9a-f]{32}", hit.request_id)  # type: ignore[attr-defined]
    assert miss.getMessage() == "no matching route" and miss.host == "x.test"  # type: ignore[attr-defined]


async def test_info_level_pays_for_no_decision_logging() -> None:
    logging.getLogger("tunnelgate.route").setLevel(logging.INFO)
    try:
        async with running(*LISTEN) as stack:
            handler = stack.runtime.in_flight
            assert not handler.reporting.debug_routes and not handler.reporting.observing
    finally:
        logging.getLogger("tunnelgate.route").setLevel(logging.NOTSET)


async def test_dial_failures_warn_once_per_backend_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tunnelgate.handler"):
        async with running(*LISTEN, config=config(DOWN)) as stack:
            for _ in range(5):
                assert (await ask(stack.cluster_port, HOST, "/down")).status == 502
    warned = [r for r in caplog.records if r.getMessage() == "backend dial failed"]
    assert len(warned) == 1 and warned[0].levelname == "WARNING"
    assert warned[0].backend == DOWN  # type: ignore[attr-defined]


async def test_workers_serve_the_new_series(tmp_path: Any) -> None:
    async with TestBackend() as echo:
        async with Supervisor() as served:
            assert (await served.push(config(echo.url, 9))).status_code == 200
            await served.workers()
            for _ in range(6):
                assert (await ask(served.port, HOST, "/api/w")).status == 200
            client = await RawClient.connect(served.port)
            client.send(b"GET / HTTP/1.1\r\n\r\n")
            assert (await client.read_response()).status == 400
            client.close()
            got = samples((await served.admin.get("/metrics")).text)
    assert got[("tunnelgate_config_version", ())] == 9
    assert got[("tunnelgate_config_pushes_total", labels(result="applied", status="200"))] == 1
    assert got[("tunnelgate_backend_requests_total",
                labels(backend=echo.url, status_class="2xx"))] == 6
    assert got[("tunnelgate_backend_latency_seconds_count", labels(backend=echo.url))] == 6
    assert got[("tunnelgate_http_rejected_requests_total",
                labels(entrance="cluster", status="400"))] == 1
