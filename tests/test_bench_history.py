"""benchmarks/RESULTS.md keeps the latest result of each kind and one history row per run."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

from benchmarks import history

HEADING = "2026-12-07 10:00 UTC · full · x86_64 · Test CPU · 2 CPUs · commit {commit} · built"
TABLE = """| scenario | system | req/s | × nginx req/s | × bare loop req/s |
|---|---|--:|--:|--:|
| 13 B GET | nginx | 100 | 1.00 | 1.50 |
| 13 B GET | tunnelgate | 80 | {nginx} | {bare} |
"""


def _run(commit: str, bare: str, nginx: str, extra: str = "") -> str:
    text = (f"## {HEADING.format(commit=commit)}\n\n"
            f"### Proxy comparison (wrk, medians of 5 × 5 s)\n\n"
            f"{TABLE.format(nginx=nginx, bare=bare)}")
    return text + (f"\n### Route table (in process)\n\n{extra}\n" if extra else "")


def test_a_run_replaces_the_latest_of_its_kinds_and_adds_a_history_row() -> None:
    first = history.record("", "# Results\n", _run("aaaa111", "1.01", "0.70", "lookups 1"))
    second = history.record(first, "# unused\n", _run("bbbb222", "1.05", "0.72"))
    latest, rows = history.split(second)
    assert second.startswith("# Results\n")
    assert list(latest) == ["Proxy comparison", "Route table"]
    assert "commit bbbb222" in latest["Proxy comparison"][1]
    assert "commit aaaa111" in latest["Route table"][1]  # not measured again: kept
    assert [row.split("|")[2].strip() for row in rows] == ["aaaa111", "bbbb222"]
    assert rows[1].split("|")[4].strip() == "1.05"
    assert rows[1].split("|")[7].strip() == "0.72"


def test_a_run_without_a_proxy_comparison_adds_no_history_row() -> None:
    text = "## " + HEADING.format(commit="cccc333") + "\n\n### Route table (x)\n\nlookups\n"
    assert history.split(history.record("", "# R\n", text))[1] == []


def test_the_chart_is_an_svg_with_one_line_per_scenario() -> None:
    text = history.record("", "# R\n", _run("aaaa111", "1.01", "0.70"))
    text = history.record(text, "# R\n", _run("bbbb222", "0.95", "0.70"))
    svg = ElementTree.fromstring(history.chart(history.split(text)[1]))
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == 1 + len(history.SCENARIOS)  # the 1.0 line and one per scenario
