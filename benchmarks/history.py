"""benchmarks/RESULTS.md as readers want it: the latest results, then a compact history.

The file has three parts:

- the header (what is measured and how to read it);
- ``## Latest results``: for every kind of section a run writes (``### Proxy
  comparison …``, ``### Config push under load``, …) the newest one, each under a line
  naming the run it came from. A run that measured only some parts (``--only``)
  replaces only those;
- ``## History``: one row per run that compared the proxies — tunnelgate's req/s as a
  ratio to the bare loop and to nginx per scenario, and for an A/B run (``--base``) its
  req/s and CPU per request as ratios to the base's — and ``history.svg`` beside this
  file, the bare-loop ratios drawn over the runs.

Older runs leave the file; git keeps them (``git log -p benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LATEST = "## Latest results"
HISTORY = "## History"
SCENARIOS = ("13 B GET", "64 KiB GET", "16 KiB POST")
_HISTORY_HEAD = ("| run | commit | machine | "
                 + " | ".join(f"{s} × bare loop" for s in SCENARIOS) + " | "
                 + " | ".join(f"{s} × nginx" for s in SCENARIOS) + " | "
                 + " | ".join(f"{s} × base req/s · CPU" for s in SCENARIOS) + " |")
_HISTORY_RULE = "|---|---|---|" + "--:|" * (3 * len(SCENARIOS))
_COLUMNS = 3 + 3 * len(SCENARIOS)
_HEADING = re.compile(r"^(\d{4}-\d\d-\d\d [\d:–-]+ UTC) · (\w+) · \S+ · (.+?) · \d+ CPUs"
                      r"(?: · commit (\w+))?")
_BASE = re.compile(r" · base (\w+)")  # an A/B run's base tree (benchmarks.__main__)


@dataclass
class Run:
    """One run as ``benchmarks.report.render`` writes it: a heading and sections."""

    heading: str
    sections: list[tuple[str, str]]  # (title, body)

    @classmethod
    def parse(cls, text: str) -> Run:
        """Split ``## heading`` / ``### title`` markdown into a run."""
        heading, _, rest = text.strip().partition("\n")
        parts = re.split(r"^### (.+)$", rest, flags=re.M)
        sections = [(parts[i].strip(), parts[i + 1].strip())
                    for i in range(1, len(parts) - 1, 2)]
        return cls(heading.removeprefix("## ").strip(), sections)

    def history_row(self) -> str | None:
        """The History row of this run, or None when it did not compare the proxies."""
        table = next((body for title, body in self.sections
                      if title.startswith("Proxy comparison")), None)
        found = _HEADING.match(self.heading)
        if table is None or found is None:
            return None
        when, _mode, machine, commit = found.groups()
        base = _BASE.search(self.heading)
        if base:
            commit = f"{commit or '?'} vs base {base.group(1)}"
        bare = [_cell(table, [s, "tunnelgate"], "× bare loop req/s") for s in SCENARIOS]
        nginx = [_cell(table, [s, "tunnelgate"], "× nginx req/s") for s in SCENARIOS]
        ab = [_pair(_cell(table, [s], "× base req/s"), _cell(table, [s], "CPU × base"))
              for s in SCENARIOS]
        return (f"| {when} | {commit or '?'} | {machine} | "
                + " | ".join(bare + nginx + ab) + " |")


def _cell(body: str, key: list[str], column: str) -> str:
    """The value in ``column`` of the first row that starts with the cells ``key``, in
    the first markdown table of ``body`` with that column; ``—`` when there is none."""
    for table in _tables(body):
        if column in table[0]:
            for cells in table[2:]:
                if cells[:len(key)] == key:
                    return cells[table[0].index(column)]
    return "—"


def _tables(body: str) -> list[list[list[str]]]:
    """The markdown tables of ``body``, each a list of rows of stripped cells."""
    tables: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*body.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def _pair(rps: str, cpu: str) -> str:
    """One History cell for the base ratios: ``req/s · CPU``, ``—`` without a base."""
    return "—" if rps == cpu == "—" else f"{rps} · {cpu}"


def _padded(row: str) -> str:
    """A History row written before its table had its last columns, filled with ``—``."""
    return row + " — |" * (_COLUMNS - row.count("|") + 1)


def record(existing: str, header: str, run_text: str) -> str:
    """RESULTS.md after ``run_text`` (one rendered run) is recorded into ``existing``
    (the file as it is, or empty; ``header`` starts a new file)."""
    latest, rows = split(existing) if existing else ({}, [])
    run = Run.parse(run_text)
    for title, body in run.sections:
        latest[kind(title)] = (title, f"Run: {run.heading}\n\n{body}")
    row = run.history_row()
    if row is not None:
        rows.append(row)
    preamble = existing.split(LATEST, 1)[0].rstrip() if LATEST in existing else header.rstrip()
    return compose(preamble, latest, rows)


def kind(title: str) -> str:
    """What a section is about, without how long it ran: ``Proxy comparison (wrk …,
    medians of 5 × 5 s)`` and ``Proxy comparison (… 1 × 2 s)`` replace each other."""
    return title.split(" (", 1)[0]


def split(text: str) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """The Latest sections (kind → (title, body), in order) and the History rows of a
    file."""
    latest_part, _, history_part = text.split(LATEST, 1)[-1].partition(HISTORY)
    parts = re.split(r"^### (.+)$", latest_part, flags=re.M)
    latest = {kind(parts[i].strip()): (parts[i].strip(), parts[i + 1].strip())
              for i in range(1, len(parts) - 1, 2)}
    rows = [line for line in history_part.splitlines()
            if line.startswith("| ") and not line.startswith("| run |")]
    return latest, rows


def compose(preamble: str, latest: dict[str, tuple[str, str]], rows: list[str]) -> str:
    """The whole file from its three parts."""
    out = [preamble, "", LATEST, ""]
    for title, body in latest.values():
        out += [f"### {title}", "", body, ""]
    out += [HISTORY, "",
            "tunnelgate's req/s over the bare loop's and over nginx's, in the same run "
            "(paired medians); in an A/B run (`--base`) also its req/s and its CPU µs per "
            "request over the base tree's. The chart draws the bare-loop columns.", "",
            "![tunnelgate req/s × bare loop, per run](history.svg)", "",
            _HISTORY_HEAD, _HISTORY_RULE, *map(_padded, rows)]
    return "\n".join(out) + "\n"


def chart(rows: list[str]) -> str:
    """An SVG line chart of the bare-loop ratios of the History rows (one line per
    scenario, a dashed line at 1.0)."""
    width, height, pad = 720, 260, 40
    if not rows:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="40">'
                '<text x="4" y="20">no proxy comparison recorded yet</text></svg>\n')
    series = [[_number(row.split("|")[4 + i]) for row in rows] for i in range(len(SCENARIOS))]
    values = [v for line in series for v in line if v is not None] + [1.0]
    low, high = min(values) * 0.95, max(values) * 1.05

    def point(index: int, value: float) -> str:
        x = pad + (width - 2 * pad) * index / max(1, len(rows) - 1)
        y = height - pad - (height - 2 * pad) * (value - low) / (high - low)
        return f"{x:.1f},{y:.1f}"

    colours = ("#1f77b4", "#d62728", "#2ca02c")
    lines = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<polyline points="{point(0, 1.0)} {point(len(rows) - 1, 1.0)}" '
             'stroke="grey" stroke-dasharray="4" fill="none"/>',
             f'<text x="4" y="{point(0, 1.0).split(",")[1]}">1.0</text>']
    for i, (name, line) in enumerate(zip(SCENARIOS, series)):
        points = " ".join(point(j, v) for j, v in enumerate(line) if v is not None)
        lines += [f'<polyline points="{points}" stroke="{colours[i]}" fill="none" '
                  'stroke-width="2"/>',
                  f'<text x="{pad + 150 * i}" y="16" fill="{colours[i]}">{name}</text>']
    lines.append(f'<text x="{pad}" y="{height - 8}">runs, oldest first; '
                 'y: tunnelgate req/s × bare loop</text></svg>')
    return "\n".join(lines) + "\n"


def _number(cell: str) -> float | None:
    try:
        return float(cell.strip().split()[0])
    except (ValueError, IndexError):
        return None
