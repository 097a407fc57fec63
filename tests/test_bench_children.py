"""A benchmark run's children (nginx, the bare loop, tunnelgate, wrk, …) end when the
harness ends, however it ends: SIGINT, SIGTERM, SIGKILL or an exception. A harness
process is started here with real children as ``python -m benchmarks`` starts its
servers (``Pinned`` processes, each held by a ``with`` block), then ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import REPO
from benchmarks.system import PROXY_CPU, Pinned

HARNESS = """
import sys, time
from contextlib import ExitStack
from pathlib import Path
from benchmarks.system import PROXY_CPU, Pinned, unwind_on_termination
from benchmarks.systems import Server

unwind_on_termination()
with ExitStack() as stack:
    for name in ("nginx", "bare loop"):
        proc = Pinned([sys.executable, "-c", "import time; time.sleep(60)"], PROXY_CPU,
                      Path(sys.argv[2]))
        stack.enter_context(Server(name, 0, proc))
        print(proc.pid, flush=True)
    if sys.argv[1] == "raise":
        raise RuntimeError("a part of the run failed")
    time.sleep(60)
"""
ENDS = [("SIGINT", signal.SIGINT), ("SIGTERM", signal.SIGTERM),
        ("SIGKILL", signal.SIGKILL), ("exception", None)]


def _gone(pid: int) -> bool:
    """The process has ended (an unreaped zombie counts: it runs nothing)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text[text.rindex(")") + 2] == "Z"


def _wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    """The ones of ``pids`` still running after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(map(_gone, pids)):
        time.sleep(0.05)
    return [pid for pid in pids if not _gone(pid)]


def _kill_left(pids: list[int]) -> None:
    for pid in pids:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("end", [sig for _, sig in ENDS], ids=[name for name, _ in ENDS])
def test_every_child_ends_when_the_harness_ends(tmp_path: Path,
                                                end: signal.Signals | None) -> None:
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS, "raise" if end is None else "wait",
         str(tmp_path / "children.log")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        # A shell's background job (as CI runs the suite) starts with SIGINT ignored,
        # and Python then installs no handler for it: the harness gets it as from a
        # terminal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert harness.stdout is not None
    children: list[int] = []
    try:
        children = [int(harness.stdout.readline()) for _ in range(2)]
        if end is not None:
            harness.send_signal(end)
        harness.wait(timeout=30)
        assert _wait_gone(children) == []
    finally:
        harness.kill()
        harness.wait(timeout=10)
        _kill_left(children)


def test_a_child_that_will_not_stop_is_killed_with_its_own_children(tmp_path: Path) -> None:
    # A shell that ignores SIGTERM, as does its child (ignored signals are inherited):
    # nginx's master with a worker, stuck.
    log = tmp_path / "stubborn.log"
    proc = Pinned(["sh", "-c", "trap '' TERM; sleep 60 & echo $!; wait"], PROXY_CPU, log)
    grandchild: list[int] = []
    try:
        for _ in range(200):  # up to 10 s for the shell to say its child's PID
            if log.exists() and log.read_text().strip():
                break
            time.sleep(0.05)
        grandchild = [int(log.read_text().split()[0])]
        proc.stop(timeout=0.5)
        assert not proc.alive()
        assert _wait_gone(grandchild) == []
    finally:
        proc.stop(signal.SIGKILL, timeout=1)
        _kill_left(grandchild)
