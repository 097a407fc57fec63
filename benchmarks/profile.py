"""Where tunnelgate spends its CPU under load: a py-spy sampling profile, summarised.

py-spy (installed into this interpreter's environment on first use) samples the running
proxy from outside, so the proxy needs no instrumentation. Only the thread holding the
GIL is sampled (``--gil``): idle threads and time blocked in ``epoll_wait`` drop out, so
the shares are of the CPU the interpreter actually burns. Samples are aggregated by
function: *own* is the share of samples in which the function was the innermost frame,
*total* the share in which it was anywhere on the stack. Native frames are included
(``--native``), so a system call shows up as its libc function (``write (libc.so.6)``:
the kernel's loopback TCP send, which on loopback also does the receiver's side) and C
extension code (uvloop, httptools) under its own symbols.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks import wrk
from benchmarks.configgen import BENCH_PATHS
from benchmarks.system import LOAD_CPU, with_harness
from benchmarks.systems import Server

TOP = 15
EVERYWHERE = 0.99


@dataclass(frozen=True, slots=True)
class HotSpot:
    function: str  # "name (file:first line)" as py-spy prints it
    own: float  # fraction of samples
    total: float


def ensure_py_spy() -> str:
    """Path of py-spy beside this interpreter, pip-installing it if missing."""
    path = Path(sys.executable).parent / "py-spy"
    if not path.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "py-spy"],
                       check=True, timeout=600, preexec_fn=with_harness())
    return str(path)


def parse_raw(text: str) -> tuple[int, list[HotSpot]]:
    """(sample count, hot spots by own share) from py-spy's ``--format raw`` output."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        n = int(count)
        samples += n
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    if not samples:
        return 0, []
    spots = [HotSpot(f, own[f] / samples, total[f] / samples) for f in total]
    spots.sort(key=lambda s: (s.own, s.total), reverse=True)
    return samples, spots


def record(server: Server, wrk_path: str, workdir: Path,
           seconds: float) -> tuple[str, str]:
    """Raw py-spy samples of ``server`` while wrk loads the 13 B GET route, and a line
    with the run's throughput and user / kernel CPU per request."""
    out = workdir / "py-spy.txt"
    spy = subprocess.Popen(
        ["taskset", "-c", LOAD_CPU, ensure_py_spy(), "record", "--pid", str(server.proc.pid),
         "--duration", str(round(seconds)), "--rate", "200", "--format", "raw",
         "--function", "--gil", "--native", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=with_harness())
    user, system = server.proc.cpu_times()
    result = wrk.run(wrk_path, server.url(BENCH_PATHS["small"]), server.host, seconds + 1)
    user_after, system_after = server.proc.cpu_times()
    per_request = 1e6 / max(1, result.requests)
    summary = (f"{result.rps:,.0f} req/s while sampled; per request "
               f"{(user_after - user) * per_request:.1f} µs user + "
               f"{(system_after - system) * per_request:.1f} µs kernel CPU.")
    try:
        _, err = spy.communicate(timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.communicate(timeout=5)
        raise RuntimeError(f"py-spy pid {spy.pid} did not finish")
    if spy.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed ({spy.returncode}): {err.strip()[-500:]}")
    return out.read_text(), summary


def section(server: Server, wrk_path: str, workdir: Path, seconds: float) -> str:
    """Markdown: the top functions by own and by total share of samples."""
    try:
        raw, summary = record(server, wrk_path, workdir, seconds)
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        return f"Not measured: {err}"
    samples, spots = parse_raw(raw)
    # Python frames only (the event loop's C frames are on nearly every stack), and not
    # those on (nearly) every stack either — runpy, the CLI, the loop runner.
    by_total = sorted((s for s in spots if s.total < EVERYWHERE and ".py:" in s.function),
                      key=lambda s: s.total, reverse=True)
    lines = [f"{samples} GIL-holding samples at 200 Hz over {seconds:g} s. {summary}", "",
             "| own % | total % | function (file:line) |", "|--:|--:|---|"]
    lines += [f"| {s.own:.1%} | {s.total:.1%} | `{s.function}` |" for s in spots[:TOP]]
    lines += ["", "Largest inclusive shares of Python functions (those on every stack "
              "left out):", "",
              "| total % | own % | function (file:line) |", "|--:|--:|---|"]
    lines += [f"| {s.total:.1%} | {s.own:.1%} | `{s.function}` |" for s in by_total[:TOP]]
    return "\n".join(lines)
