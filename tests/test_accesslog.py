"""Access log lines: fields, order, selection rules, query stripping."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

from typing import Any

import pytest

from proxy.observability.settings import AccessLogSettings
from proxy.observability.accesslog import AccessLog, millis
from proxy.request import EMPTY_BODY, Request
from tests.h2client import H2Client
from tests.helpers import HOST, RawClient, TestBackend, on_uvloop
from tests.stack import running

FIELDS = ["time", "level", "msg", "method", "host", "path", "query", "status",
          "bytes_written", "duration_ms", "user_agent"]
# Ours, after the anchor's and only added to (log pipelines key on the names above).
EXTRA = ["client", "entrance", "protocol"]
NOW = 1_780_000_000.25  # 2026-05-28T20:26:40.250Z


def request(user_agent: bytes | None = b"curl/8.6.0", host: str = "app.example.com",
            path: str = "/api/v1/users", query: str = "filter=active") -> Request:
    headers = [(b"Host", host.encode("latin-1"))]
    if user_agent is not None:
        headers.append((b"User-Agent", user_agent))
    return Request("GET", path, query, host, headers, EMPTY_BODY, "tunnel")


def make_log(rate: float = 1.0, strip: bool = False, rand: float = 0.5,
             enabled: bool = True) -> tuple[AccessLog, io.StringIO]:
    stream = io.StringIO()
    log = AccessLog(AccessLogSettings(enabled, rate, strip), stream,
                    rand=lambda: rand, clock=lambda: NOW)
    return log, stream


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_line_fields_order_and_values() -> None:
    log, stream = make_log()
    log.record(request(), 200, 1234, 0.0429)
    raw = stream.getvalue()
    assert raw.endswith("\n") and raw.count("\n") == 1
    entry = json.loads(raw)
    assert list(entry) == FIELDS + EXTRA
    assert entry == {
        "time": "2026-05-28T20:26:40.250Z", "level": "INFO", "msg": "access",
        "method": "GET", "host": "app.example.com", "path": "/api/v1/users",
        "query": "filter=active", "status": 200, "bytes_written": 1234,
        "duration_ms": 42.9, "user_agent": "curl/8.6.0", "client": "",
        "entrance": "tunnel", "protocol": "HTTP/1.1"}


@pytest.mark.parametrize("seconds, printed", [
    (0.0429, "42.9"), (0.0011493, "1.149"), (0.0011499999, "1.149"), (2.5, "2500.0"),
    (0.0, "0.0"), (0.0000004, "0.0"), (0.000001, "0.001"), (61.123456789, "61123.456")])
def test_durations_print_as_milliseconds_to_the_microsecond(seconds: float,
                                                           printed: str) -> None:
    """``duration_ms`` and ``upstream_ms`` share this form: a float, three decimals at
    most (a total never looks smaller than its part, as an int beside a float did)."""
    log, stream = make_log()
    log.record(request(), 200, 1, seconds)
    assert f'"duration_ms":{printed},' in stream.getvalue()
    assert json.dumps(millis(seconds)) == printed


def test_strip_query_blanks_it() -> None:
    log, stream = make_log(strip=True)
    log.record(request(), 200, 1, 0.001)
    assert lines(stream)[0]["query"] == ""


def test_missing_user_agent_is_empty_and_odd_bytes_stay_valid_json() -> None:
    log, stream = make_log()
    log.record(request(user_agent=None), 200, 0, 0.001)
    log.record(request(user_agent=b"\xff\"quoted\"", host="h\xe9st"), 200, 0, 0.001)
    first, second = lines(stream)
    assert first["user_agent"] == ""
    assert second["user_agent"] == "\xff\"quoted\"" and second["host"] == "h\xe9st"
    assert stream.getvalue().isascii()


@pytest.mark.parametrize("status", [0, 101])
def test_nothing_written_and_upgrades_are_never_logged(status: int) -> None:
    log, stream = make_log(rate=1.0, rand=0.0)
    log.record(request(), status, 0, 0.5)
    assert stream.getvalue() == ""


def test_sampling_drops_non_5xx_but_keeps_every_5xx() -> None:
    log, stream = make_log(rate=0.25, rand=0.5)
    for status in (200, 302, 404, 499, 500, 502, 504):
        log.record(request(), status, 3, 0.01)
    assert [e["status"] for e in lines(stream)] == [500, 502, 504]
    sampled_in, stream_in = make_log(rate=0.25, rand=0.1)
    sampled_in.record(request(), 200, 3, 0.01)
    assert [e["status"] for e in lines(stream_in)] == [200]


@pytest.mark.parametrize("rate, rand, logged", [
    (5.0, 0.999, True), (-1.0, 0.0, False), (0.0, 0.0, False), (1.0, 0.999, True)])
def test_rate_is_clamped(rate: float, rand: float, logged: bool) -> None:
    log, stream = make_log(rate=rate, rand=rand)
    log.record(request(), 200, 1, 0.01)
    assert bool(stream.getvalue()) is logged


def test_disabled_writes_nothing_even_for_5xx() -> None:
    log, stream = make_log(enabled=False)
    log.record(request(), 503, 1, 0.01)
    assert stream.getvalue() == ""


def test_default_stream_is_stdout_one_line_per_request() -> None:
    script = textwrap.dedent("""
        from proxy.observability.accesslog import AccessLog
        from proxy.observability.settings import AccessLogSettings
        from proxy.request import EMPTY_BODY, Request
        log = AccessLog(AccessLogSettings(enabled=True))
        for status in (200, 101, 0, 503):
            log.record(Request("PUT", "/x", "a=1", "h", [], EMPTY_BODY, "cluster"),
                       status, 9, 0.002)
    """)
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True,
                          text=True, timeout=30, check=True)
    entries = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(e["method"], e["status"]) for e in entries] == [("PUT", 200), ("PUT", 503)]
    assert done.stderr == ""


@pytest.mark.parametrize("version, protocol", [("1.1", "HTTP/1.1"), ("1.0", "HTTP/1.0"),
                                               ("2", "HTTP/2")])
def test_protocol_is_what_the_client_spoke(version: str, protocol: str) -> None:
    log, stream = make_log()
    req = request()
    req.http_version = version
    log.record(req, 200, 1, 0.001)
    assert lines(stream)[0]["protocol"] == protocol


@on_uvloop
async def test_every_protocol_of_the_cluster_entrance_is_logged(capsys: Any) -> None:
    """HTTP/1.0, HTTP/1.1 and HTTP/2 (prior knowledge) over real sockets: each
    request's access line names the protocol its client spoke."""
    async with TestBackend() as backend, running(
            "--listen", f"{HOST}:0", config={"version": 1, "rules": [
                {"backends": [{"url": backend.url, "weight": 1}]}]},
            environ={"PROXY_ACCESS_LOG_ENABLED": "true"}) as stack:
        for version in (b"1.0", b"1.1"):
            raw = await RawClient.connect(stack.cluster_port)
            raw.send(b"GET /echo?v=" + version + b" HTTP/" + version
                     + b"\r\nHost: example.test\r\n\r\n")
            assert (await raw.read_response()).status == 200
            raw.close()
        client = await H2Client.connect(stack.cluster_port)
        try:
            assert (await client.request("GET", "/echo?v=2")).status == 200
        finally:
            client.close()
    logged = {entry["query"]: entry["protocol"]
              for entry in map(json.loads, capsys.readouterr().out.splitlines())
              if entry.get("msg") == "access"}
    assert logged == {"v=1.0": "HTTP/1.0", "v=1.1": "HTTP/1.1", "v=2": "HTTP/2"}
