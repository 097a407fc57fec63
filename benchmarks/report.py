"""Markdown tables of measured values beside the issue's targets, and RESULTS.md.

A target is shown as ✓ (met in this run) or ✗ (missed); the verdict is information for
whoever optimises next, never a pass/fail of anything.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks import REPO, RESULTS, history
from benchmarks.compare import BARE, BASE, CONNECTIONS, DIRECT, NGINX, TUNNELGATE, Row
from benchmarks.push import PushResult, median
from benchmarks.routetable import TableResult
from proxy.control import native

# Issue targets for tunnelgate relative to nginx in the same run.
RPS_TARGETS = {"13 B GET": 0.65, "64 KiB GET": 0.85, "16 KiB POST": 0.7}
CPU_TARGET_US = {"13 B GET": 40.0}
P99_TARGETS = {"13 B GET": 1.5}
LOOKUP_TARGET_US = 5.0
COMPILE_TARGET_S = 1.0
RSS_TARGET_MB = 150.0
PUSH_P99_TARGET = 2.0
# The request-path issue's targets, relative to the bare forwarding loop in the same run.
BARE_RPS_TARGETS = {"13 B GET": 0.9, "64 KiB GET": 1.0, "16 KiB POST": 0.9}
BARE_CPU_TARGETS = {"13 B GET": 1.1}
BARE_P99_TARGETS = {"13 B GET": 1.2, "64 KiB GET": 1.2, "16 KiB POST": 1.2}
# A change against the tree it starts from (``--base``, issues 40–42), every scenario:
# req/s at least this share of the base's, CPU per request at most this multiple.
BASE_RPS_TARGET = 0.97
BASE_CPU_TARGET = 1.03
# Below this share of the connections in flight (Little's law), a run is flagged.
STALL_FRACTION = 0.5

_HEADER = """# Benchmark results

Written by `make bench` (`python -m benchmarks`): the latest result of each kind, then a
history table with one row per run and a chart of it (`history.svg`). Older runs are in
git (`git log -p benchmarks/RESULTS.md`). Each run is on one machine: tunnelgate, nginx as a reverse proxy, the bare uvloop + httptools
forwarding loop (`benchmarks/bareloop.py`: the floor of an asyncio proxy, no features)
and the direct nginx backend are measured side by side, interleaved in rounds, and
compared by ratio within the run (absolute numbers on a shared 2-core machine are
noisy). Ratios are paired: taken between two systems' runs in the same round, then the
median over rounds (runs recorded before 2026-12-06 took the ratio of the medians).
Setup: the proxy under test is pinned to CPU 0, wrk (`-t1 -c32`) and the backend to
CPU 1; "proxy CPU" is the proxy process's utime+stime per request (stime, the kernel's
share, in brackets), "proxy core busy" that time per wall-clock second.
When the proxy core is not busy the run was bound by CPU 1 (wrk and the backend share
it), so nginx's req/s is a lower bound of what it can do and "proxy CPU µs/req" is the
fairer efficiency comparison. ✓/✗ mark the issue's targets; they are not tests.
An A/B run (`--base DIR`) adds tunnelgate from the tree a change starts from as one more
system in the same rounds, and a table of the paired ratios tunnelgate / base.
"""


def mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def proxy_table(rows: list[Row]) -> str:
    """One line per (scenario, system) with paired ratios (see :mod:`benchmarks.compare`)
    to nginx, to the bare forwarding loop (req/s, proxy CPU per request, p99) and to
    direct."""
    lines = ["| scenario | system | req/s | p50 µs | p99 µs | proxy CPU µs/req (kernel) | "
             "proxy core busy | × nginx req/s | × bare loop req/s | CPU × bare loop | "
             "p99 × bare loop | × direct req/s | p99 × nginx | errors | targets, notes |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for row in rows:
        cpu = (f"{row.cpu_us:.1f} ({row.sys_us:.0f})"
               if row.cpu_us is not None and row.sys_us is not None else "—")
        busy = f"{row.cpu_busy:.0%}" if row.cpu_busy is not None else "—"
        target = _targets(row) if row.system == TUNNELGATE else ""
        if row.concurrency < STALL_FRACTION * CONNECTIONS:
            target += (f"{'; ' if target else ''}⚠ only {row.concurrency:.1f} of "
                       f"{CONNECTIONS} connections progressing (stalled requests)")
        lines.append(f"| {row.scenario} | {row.system} | {row.rps:,.0f} | {row.p50_us:,.0f} "
                     f"| {row.p99_us:,.0f} | {cpu} | {busy} | {_vs(row, NGINX, 'rps'):.2f} "
                     f"| {_vs(row, BARE, 'rps'):.2f} | {_vs(row, BARE, 'cpu'):.2f} "
                     f"| {_vs(row, BARE, 'p99'):.2f} | {_vs(row, DIRECT, 'rps'):.2f} "
                     f"| {_vs(row, NGINX, 'p99'):.2f} | {row.errors} | {target} |")
    return "\n".join(lines)


def _vs(row: Row, other: str, measure: str) -> float:
    """``row``'s paired ratio to ``other`` (1 against itself)."""
    return 1.0 if other == row.system else row.ratio(other, measure)


def _targets(row: Row) -> str:
    parts = []
    if row.scenario in RPS_TARGETS:
        goal = RPS_TARGETS[row.scenario]
        parts.append(f"req/s ≥{goal}× nginx {mark(row.ratio(NGINX, 'rps') >= goal)}")
    if row.scenario in CPU_TARGET_US and row.cpu_us is not None:
        goal = CPU_TARGET_US[row.scenario]
        parts.append(f"CPU ≤{goal:.0f} µs {mark(row.cpu_us <= goal)}")
    if row.scenario in P99_TARGETS:
        goal = P99_TARGETS[row.scenario]
        parts.append(f"p99 ≤{goal}× nginx {mark(row.ratio(NGINX, 'p99') <= goal)}")
    parts += _bare_targets(row)
    if row.errors:
        parts.append(f"{row.errors} errors ✗")
    return "; ".join(parts)


def _bare_targets(row: Row) -> list[str]:
    """The request-path issue's targets against the bare loop, each marked."""
    parts = []
    if row.scenario in BARE_RPS_TARGETS:
        goal = BARE_RPS_TARGETS[row.scenario]
        parts.append(f"req/s ≥{goal}× bare {mark(row.ratio(BARE, 'rps') >= goal)}")
    if row.scenario in BARE_CPU_TARGETS:
        goal = BARE_CPU_TARGETS[row.scenario]
        parts.append(f"CPU ≤{goal}× bare {mark(row.ratio(BARE, 'cpu') <= goal)}")
    if row.scenario in BARE_P99_TARGETS:
        goal = BARE_P99_TARGETS[row.scenario]
        parts.append(f"p99 ≤{goal}× bare {mark(row.ratio(BARE, 'p99') <= goal)}")
    return parts


def base_table(rows: list[Row]) -> str:
    """tunnelgate against its base tree run in the same rounds (``--base``): per
    scenario both medians and the paired ratios, with the A/B targets and whether the
    bare-loop targets still hold; "" when no base ran."""
    base = {row.scenario: row for row in rows if row.system == BASE}
    gates = [row for row in rows if row.system == TUNNELGATE and row.scenario in base]
    if not gates:
        return ""
    lines = [f"tunnelgate against {BASE} (A/B, paired within rounds): req/s "
             f"≥{BASE_RPS_TARGET}× and CPU µs/req ≤{BASE_CPU_TARGET}× the base's, and "
             "the bare-loop targets still hold.", "",
             "| scenario | req/s | base req/s | × base req/s | CPU µs/req | base CPU µs/req "
             "| CPU × base | A/B targets | bare-loop targets |",
             "|---|--:|--:|--:|--:|--:|--:|---|---|"]
    for row in gates:
        rps, cpu = row.ratio(BASE, "rps"), row.ratio(BASE, "cpu")
        targets = (f"req/s ≥{BASE_RPS_TARGET}× {mark(rps >= BASE_RPS_TARGET)}; "
                   f"CPU ≤{BASE_CPU_TARGET}× {mark(cpu <= BASE_CPU_TARGET)}")
        lines.append(f"| {row.scenario} | {row.rps:,.0f} | {base[row.scenario].rps:,.0f} "
                     f"| {rps:.3f} | {_cpu(row)} | {_cpu(base[row.scenario])} | {cpu:.3f} "
                     f"| {targets} | {'; '.join(_bare_targets(row)) or '—'} |")
    return "\n".join(lines)


def _cpu(row: Row) -> str:
    return f"{row.cpu_us:.1f}" if row.cpu_us is not None else "—"


def table_table(t: TableResult) -> str:
    """Route-table micro-benchmark results."""
    total = t.parse_s + t.compile_s
    rss = (f"{t.rss_mb:.1f} MB (fresh interpreter before loading: {t.rss_base_mb:.1f} MB)"
           if t.rss_mb is not None else "not measured")
    rss_mark = mark(t.rss_mb <= RSS_TARGET_MB) if t.rss_mb is not None else ""
    return "\n".join([
        "| metric | measured | target |", "|---|---|---|",
        f"| table | {t.rules:,} rules over {t.hosts:,} hostnames, "
        f"{t.config_bytes / 1e6:.2f} MB of wire JSON | |",
        f"| parse_config, cold | {t.parse_s * 1e3:.0f} ms | |",
        f"| Table.compile, cold | {t.compile_s * 1e3:.0f} ms | |",
        f"| parse + compile, cold | {total * 1e3:.0f} ms | ≤{COMPILE_TARGET_S:.0f} s "
        f"{mark(total <= COMPILE_TARGET_S)} |",
        f"| parse + compile, same config again (RuleReuse) | {t.again_s * 1e3:.0f} ms | |",
        f"| lookup median (hits+misses) | {t.lookup_p50_us:.2f} µs | "
        f"≤{LOOKUP_TARGET_US:.0f} µs {mark(t.lookup_p50_us <= LOOKUP_TARGET_US)} |",
        f"| lookup p99 | {t.lookup_p99_us:.2f} µs | |",
        f"| lookup median, hits / misses | {t.hit_p50_us:.2f} / {t.miss_p50_us:.2f} µs | |",
        f"| probes resolved as expected | hits {t.hits_found:.0%}, misses found a rule "
        f"{t.misses_found:.0%} | 100 % / 0 % |",
        f"| RSS with the table loaded | {rss} | ≤{RSS_TARGET_MB:.0f} MB {rss_mark} |",
    ])


def push_table(p: PushResult) -> str:
    """Push-under-load results, or the reason the scenario could not run."""
    if p.failure:
        return f"Not measured: {p.failure}."
    base_p99, load_p99 = median(p.baseline, "p99_us"), median(p.loaded, "p99_us")
    dropped = sum(r.non_2xx + r.socket_errors for r in p.loaded)
    ratio = _ratio(load_p99, base_p99)
    pushes = sorted(p.push_ms)
    lines = [
        f"{p.rules:,}-rule config ({p.config_bytes / 1e6:.2f} MB) PUT every second while "
        "wrk loads the 13 B GET route; medians over rounds.", "",
        "| phase | req/s | p50 µs | p99 µs | non-2xx | socket errors | pushes 2xx |",
        "|---|--:|--:|--:|--:|--:|--:|"]
    for name, runs, pushed in (("no pushes", p.baseline, ""),
                               ("push every 1 s", p.loaded,
                                f"{p.pushes_ok}/{len(p.statuses)}")):
        lines.append(
            f"| {name} | {median(runs, 'rps'):,.0f} | {median(runs, 'p50_us'):,.0f} | "
            f"{median(runs, 'p99_us'):,.0f} | {sum(r.non_2xx for r in runs)} | "
            f"{sum(r.socket_errors for r in runs)} | {pushed} |")
    if pushes:
        lines += ["", f"PUT /config latency under load: median {pushes[len(pushes) // 2]:.0f} ms,"
                  f" max {pushes[-1]:.0f} ms."]
    lines += ["", f"Targets: drops nothing {mark(dropped == 0 and p.pushes_ok == len(p.statuses))}"
              f" ({dropped} failed requests); p99 with pushes ≤{PUSH_P99_TARGET:.0f}× without: "
              f"{ratio:.2f}× {mark(ratio <= PUSH_P99_TARGET)}."]
    return "\n".join(lines)


@dataclass
class Section:
    title: str
    body: str


def machine_line(mode: str, source: Path | None = None, base: Path | None = None) -> str:
    """Date, architecture, CPU model, commit and build: the heading of one run; with
    the tree tunnelgate ran from (``source``) and the A/B run's ``base`` tree, if any
    (:mod:`benchmarks.history` reads the base's commit from here)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    line = (f"{now} · {mode} · {platform.machine()} · {_cpu_model()} · "
            f"{os.cpu_count()} CPUs · commit {commit(REPO)} · {native.describe_tree(REPO)}")
    if source is not None:
        line += f" · tunnelgate {commit(source)} from {source} ({native.describe_tree(source)})"
    if base is not None:
        line += f" · base {commit(base)} from {base} ({native.describe_tree(base)})"
    return line


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def commit(tree: Path) -> str:
    """``tree``'s HEAD short hash, marked when the proxy's code on disk differs from it."""
    try:
        head = _git(tree, "rev-parse", "--short", "HEAD")
        dirty = _git(tree, "status", "--porcelain", "--", "proxy", "routing", "tunnel")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} + uncommitted changes" if dirty else head


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True,
                          timeout=10, check=True).stdout.strip()


def render(heading: str, sections: list[Section]) -> str:
    parts = [f"## {heading}"]
    for section in sections:
        parts += ["", f"### {section.title}", "", section.body]
    return "\n".join(parts) + "\n"


def append_results(text: str) -> None:
    """Record one rendered run in benchmarks/RESULTS.md (its latest results and its
    history, see :mod:`benchmarks.history`) and redraw history.svg."""
    existing = RESULTS.read_text() if RESULTS.exists() else ""
    updated = history.record(existing, _HEADER, text)
    RESULTS.write_text(updated)
    RESULTS.with_name("history.svg").write_text(history.chart(history.split(updated)[1]))
