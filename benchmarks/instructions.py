"""Instructions per request, counted by callgrind: tunnelgate against the bare loop.

Requests per second on a shared machine move by ±10 % from run to run; instructions
do not (the same binary, inputs and environment give the same count whatever else the
machine does). So this part runs each proxy under ``valgrind --tool=callgrind`` with
collection off, warms it up, switches collection on for a fixed stretch of wrk load
(``-c4``: under valgrind a proxy is ~50× slower, and a deeper queue would only batch
more), dumps, and divides the user-space instructions by the requests wrk completed.

Copies are reported apart: glibc's ``memcpy`` moves large blocks with ``rep movsb``,
which callgrind counts once per byte, so a 64 KiB copy looks like 64k instructions
although it costs about as much as a few hundred. The column without them is the
fairer comparison of work done.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks import wrk
from benchmarks.compare import SCENARIOS
from benchmarks.configgen import BENCH_PATHS, real_config
from benchmarks.system import with_harness
from benchmarks.systems import Server, bare_loop, tunnelgate

CONNECTIONS = 4
_TOTALS = re.compile(r"^totals:\s+(\d+)", re.M)
# callgrind_annotate's function lines: "12,345 (1.2%)  file:function [object]".
_FUNCTION = re.compile(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S+)", re.M)
_COPIES = ("memcpy", "memmove")


@dataclass(frozen=True, slots=True)
class Count:
    """One system in one scenario: user-space instructions per completed request."""

    scenario: str
    system: str
    requests: int
    per_request: float
    copies_per_request: float  # the memcpy/memmove part of per_request


def parse_totals(dump: str) -> int:
    """The ``totals:`` line of a callgrind dump (instructions executed)."""
    found = _TOTALS.search(dump)
    if found is None:
        raise ValueError("not a callgrind dump: no totals line")
    return int(found.group(1))


def copy_instructions(annotated: str) -> int:
    """Instructions spent in memcpy/memmove, from ``callgrind_annotate``'s listing of
    exclusive costs per function."""
    return sum(int(count.replace(",", "")) for count, name in _FUNCTION.findall(annotated)
               if any(word in name for word in _COPIES))


def section(tools: dict[str, str], work: Path, backend_url: str, backend_port: int,
            seconds: float, warmup: float, source: Path | None = None) -> str:
    """Run both proxies under callgrind, one at a time; the table of counts
    (``source``: tunnelgate from another source tree)."""
    counts: list[Count] = []
    wrapper = (tools["valgrind"], "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={work}/callgrind.%p")
    starts = (("bare loop", lambda: bare_loop(work / "cg-bare", backend_port, wrapper)),
              ("tunnelgate", lambda: tunnelgate(work / "cg-tunnelgate",
                                                real_config(backend_url),
                                                source=source, wrapper=wrapper)[0]))
    for name, start in starts:
        with start() as server:
            counts += _count(server, name, tools, work, seconds, warmup)
    return _table(counts)


def _count(server: Server, name: str, tools: dict[str, str], work: Path, seconds: float,
           warmup: float) -> list[Count]:
    pid = str(server.proc.pid)
    control = tools["callgrind_control"]
    counts = []
    for part, (label, key, post) in enumerate(SCENARIOS, start=1):
        script = wrk.post_script(work) if post else None
        url = server.url(BENCH_PATHS[key])
        wrk.run(tools["wrk"], url, server.host, warmup, CONNECTIONS, script)
        _control(control, "-i", "on", pid)
        result = wrk.run(tools["wrk"], url, server.host, seconds, CONNECTIONS, script)
        _control(control, "-i", "off", pid)
        _control(control, "-d", pid)
        dump = work / f"callgrind.{pid}.{part}"
        total = parse_totals(dump.read_text(errors="replace"))
        copies = copy_instructions(_annotate(tools["callgrind_annotate"], dump))
        requests = max(result.requests, 1)
        counts.append(Count(label, name, result.requests, total / requests,
                            copies / requests))
    return counts


def _control(control: str, *args: str) -> None:
    subprocess.run([control, *args], check=True, timeout=120, capture_output=True,
                   preexec_fn=with_harness())


def _annotate(annotate: str, dump: Path) -> str:
    return subprocess.run([annotate, "--inclusive=no", "--auto=no", "--threshold=100",
                           str(dump)], check=True, timeout=300, capture_output=True,
                          text=True, preexec_fn=with_harness()).stdout


def _table(counts: list[Count]) -> str:
    lines = ["| scenario | system | requests | instructions/req | of them copies | "
             "without copies | × bare loop (without copies) |",
             "|---|---|--:|--:|--:|--:|--:|"]
    bare = {c.scenario: c for c in counts if c.system == "bare loop"}
    order = [label for label, _, _ in SCENARIOS]
    for c in sorted(counts, key=lambda c: (order.index(c.scenario), c.system != "bare loop")):
        rest = c.per_request - c.copies_per_request
        base = bare.get(c.scenario)
        ratio = (rest / (base.per_request - base.copies_per_request)
                 if base is not None and base.per_request > base.copies_per_request
                 else float("nan"))
        lines.append(f"| {c.scenario} | {c.system} | {c.requests:,} | "
                     f"{c.per_request:,.0f} | {c.copies_per_request:,.0f} | {rest:,.0f} | "
                     f"{ratio:.2f} |")
    return "\n".join(lines)
