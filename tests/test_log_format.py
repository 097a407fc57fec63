"""``--log-format json`` / ``PROXY_LOG_FORMAT=json``: every operational log line is one
JSON object with time, level, logger, msg and the record's fields (``tunnelgate
serve`` as a real subprocess, with and without workers)."""

from __future__ import annotations

import json
import logging
import signal
import sys

import pytest

from proxy.observability.logs import JsonFormatter, LogfmtFormatter
from tests.test_cli import Served, backend_config, cli

HUGE = "h" * 100_000


@pytest.mark.parametrize("fields, expected", [
    ({}, {}),
    ({"status": 400, "drained": True, "grace_s": 2.5, "pid": None},
     {"status": 400, "drained": True, "grace_s": 2.5, "pid": None}),
    ({"address": "127.0.0.1:80", "error": 'a "quoted"\nline'},
     {"address": "127.0.0.1:80", "error": 'a "quoted"\nline'}),
    ({"reason": HUGE}, {"reason": "h" * 512 + "… (99488 more characters)"}),
    ({"listener": ("admin", 1)}, {"listener": "('admin', 1)"}),
    ({"time": "not the record's"}, {}),  # the four keys always are the record's
])
def test_a_record_is_one_json_object_with_its_fields(fields: dict, expected: dict) -> None:
    record = logging.makeLogRecord({"name": "tunnelgate.admin", "levelname": "WARNING",
                                    "levelno": 30, "msg": "config %s rejected",
                                    "args": ("push",), "created": 1_780_000_000.25,
                                    "msecs": 250.0, **fields})
    line = JsonFormatter().format(record)
    assert "\n" not in line and line.isascii()
    assert json.loads(line) == {"time": "2026-05-28T20:26:40.250Z", "level": "warning",
                                "logger": "tunnelgate.admin",
                                "msg": "config push rejected", **expected}
    logfmt = LogfmtFormatter().format(record)  # the same record, the same facts
    assert logfmt.startswith("time=2026-05-28T20:26:40.250Z level=warning "
                             'logger=tunnelgate.admin msg="config push rejected"')


def test_a_traceback_goes_whole_into_error() -> None:
    try:
        raise ValueError("x" * 5_000)
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.makeLogRecord({"name": "t", "levelname": "ERROR", "levelno": 40,
                                    "msg": "config apply failed", "exc_info": exc_info})
    line = json.loads(JsonFormatter().format(record))
    assert line["error"].startswith("Traceback") and "x" * 5_000 in line["error"]


def json_lines(stderr: str) -> list[dict]:
    lines = [line for line in stderr.splitlines() if line]
    assert lines
    parsed = [json.loads(line) for line in lines]  # every line, or this fails
    for entry in parsed:
        assert list(entry)[:4] == ["time", "level", "logger", "msg"], entry
    return parsed


@pytest.mark.parametrize("how", [["--log-format", "json"], "PROXY_LOG_FORMAT"])
@pytest.mark.parametrize("workers", ["1", "2"])
async def test_serve_logs_json_lines(how: list[str] | str, workers: str) -> None:
    flags = how if isinstance(how, list) else []
    env = {"PROXY_LOG_FORMAT": " JSON "} if how == "PROXY_LOG_FORMAT" else None
    async with Served(*flags, "--workers", workers, "--grace-period", "1s",
                      "--log-level", "debug", env=env) as served:
        assert (await served.push({"version": "x"})).status_code == 400
        assert (await served.push(backend_config(9000))).status_code == 200
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0
        assert served.proc is not None and served.proc.stderr is not None
        entries = json_lines(served.proc.stderr.read())
    by_msg = {entry["msg"]: entry for entry in entries}
    assert by_msg["starting"]["version"] and by_msg["stopped"]["drained"] is True
    rejected = by_msg["config push rejected"]
    assert rejected["level"] == "warning" and rejected["status"] == 400
    if workers == "2":  # the workers' own lines (only they commit) are JSON too
        committed = [e["worker"] for e in entries if e["msg"] == "config committed"]
        assert sorted(committed) == [0, 1], entries


def test_an_unknown_log_format_variable_stops_the_start() -> None:
    done = cli("serve", "--admin", "127.0.0.1:0", env={"PROXY_LOG_FORMAT": "xml"})
    assert done.returncode == 2
    assert "PROXY_LOG_FORMAT: expected one of logfmt, json, got 'xml'" in done.stderr
