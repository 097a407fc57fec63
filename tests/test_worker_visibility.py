"""``serve --workers 2`` shows its workers: their ``process_*`` series beside the
supervisor's own, a restart count per slot, and their names in ``ps`` (a real
supervisor subprocess; workers killed for real)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_workers import Supervisor

pytestmark = pytest.mark.timeout(60)

PROCESS_SERIES = ("process_resident_memory_bytes", "process_cpu_seconds_total",
                  "process_start_time_seconds", "process_open_fds")


async def samples(served: Supervisor) -> dict[tuple[str, str | None], float]:
    """(series, worker label or None) → value, for the process and restart series."""
    text = (await served.admin.get("/metrics")).text
    return {(s.name, s.labels.get("worker")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name in PROCESS_SERIES or s.name == "tunnelgate_worker_restarts_total"}


def slot_of(pid: int) -> str:
    """The slot a worker names itself by, read from its command line."""
    title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert title.startswith("tunnelgate worker "), title
    return title.rsplit(" ", 1)[1]


def started_at(pid: int) -> float:
    """The kernel's start time of ``pid`` as ``process_start_time_seconds`` gives it."""
    ticks = os.sysconf("SC_CLK_TCK")
    start = float(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))
    return start / ticks + boot


async def until_pids(served: Supervisor, old: set[int], timeout: float = 20) -> set[int]:
    """The two worker pids, once they differ from ``old`` and both workers have named
    themselves."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = await served.workers(timeout=timeout)
        if pids != old and all(_named(pid) for pid in pids):
            return pids
        await asyncio.sleep(0.1)
    raise AssertionError("no restarted worker appeared")


def _named(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"tunnelgate worker ")
    except OSError:
        return False


async def test_worker_processes_are_named_measured_and_restarts_counted() -> None:
    async with Supervisor() as served:
        pids = await until_pids(served, set())
        slots = {slot_of(pid): pid for pid in pids}
        assert sorted(slots) == ["0", "1"]
        for slot, pid in slots.items():
            assert Path(f"/proc/{pid}/comm").read_text().strip() == f"tunnelgate-w{slot}"
            shown = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], text=True,
                                   capture_output=True, check=True).stdout.strip()
            assert shown == f"tunnelgate worker {slot}"
        got = await samples(served)
        for series in PROCESS_SERIES:
            assert {worker for name, worker in got if name == series} == {None, "0", "1"}
        assert got[("process_start_time_seconds", None)] == pytest.approx(
            started_at(served.pid), abs=0.02)  # unlabelled: the supervisor's own
        for slot, pid in slots.items():
            assert got[("process_start_time_seconds", slot)] == pytest.approx(
                started_at(pid), abs=0.02)
            assert got[("process_resident_memory_bytes", slot)] > 10_000_000
        assert got[("tunnelgate_worker_restarts_total", "0")] == 0
        assert got[("tunnelgate_worker_restarts_total", "1")] == 0

        os.kill(slots["1"], signal.SIGKILL)
        pids = await until_pids(served, pids)
        restarted = {slot_of(pid): pid for pid in pids}
        assert restarted["0"] == slots["0"] and restarted["1"] != slots["1"]
        got = await samples(served)
        assert got[("tunnelgate_worker_restarts_total", "1")] == 1
        assert got[("tunnelgate_worker_restarts_total", "0")] == 0
        assert got[("process_start_time_seconds", "1")] == pytest.approx(
            started_at(restarted["1"]), abs=0.02)
