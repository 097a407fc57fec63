"""An A/B run (``python -m benchmarks --base DIR``): tunnelgate from the tree a change
starts from runs as one more system in the same rounds; the paired ratios tunnelgate /
base are tabled beside the issues' A/B targets (req/s ≥0.97×, CPU µs/request ≤1.03×,
the bare-loop targets still holding) and recorded in RESULTS.md's latest results and
history."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import REPO, history
from benchmarks import __main__ as bench
from benchmarks.compare import BARE, BASE, TUNNELGATE, Row, summarise
from benchmarks.report import Section, base_table, commit, machine_line, proxy_table, render
from tests.test_bench_smoke import sample

# Per round: (system, req/s, CPU µs/request). Round 0 ran with the host at half speed.
# Paired within rounds, tunnelgate / base is 1.0, 0.95, 1.0 for req/s (median 1.0, the
# target met) and 1.1, 1.05, 1.0 for CPU (median 1.05, missed); the ratio of the medians,
# 19,000 / 20,000 = 0.95, would compare runs from different rounds.
ROUNDS = [[(BARE, 10_000, 40.0), (TUNNELGATE, 10_000, 44.0), (BASE, 10_000, 40.0)],
          [(BARE, 20_000, 20.0), (TUNNELGATE, 19_000, 21.0), (BASE, 20_000, 20.0)],
          [(BARE, 20_000, 20.0), (TUNNELGATE, 20_000, 20.0), (BASE, 20_000, 20.0)]]
OLD_ROW = "| 2026-12-06 21:57 UTC | 71b2579 | AMD EPYC | 1.07 | 1.12 | 1.10 | 0.73 | 1.09 | 0.71 |"


def _rows() -> list[Row]:
    return summarise([sample(system, r, rps, 1_000, cpu)
                      for r, runs in enumerate(ROUNDS) for system, rps, cpu in runs])


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_the_base_table_pairs_tunnelgate_with_the_base_within_rounds() -> None:
    (line,) = [l for l in base_table(_rows()).splitlines() if l.startswith("| 13 B GET")]
    assert _cells(line) == [
        "13 B GET", "19,000", "20,000", "1.000", "21.0", "20.0", "1.050",
        "req/s ≥0.97× ✓; CPU ≤1.03× ✗",
        "req/s ≥0.9× bare ✓; CPU ≤1.1× bare ✓; p99 ≤1.2× bare ✓"]
    main = proxy_table(_rows())
    assert "| 13 B GET | tunnelgate (base) | 20,000 |" in main  # a system of its own


def test_without_a_base_there_is_no_base_table() -> None:
    rows = [row for row in _rows() if row.system != BASE]
    assert base_table(rows) == ""


def test_an_ab_run_is_recorded_in_the_latest_results_and_the_history() -> None:
    rows = _rows()
    heading = machine_line("full", base=REPO)
    body = "\n\n".join((proxy_table(rows), base_table(rows)))
    text = render(heading, [Section("Proxy comparison (wrk, medians of 3 × 5 s)", body)])
    before = history.compose("# Results", {}, [OLD_ROW])
    after = history.record(before, "# unused\n", text)
    latest, rows_after = history.split(after)
    assert base_table(rows) in latest["Proxy comparison"][1]
    table = [l for l in after.split(history.HISTORY)[1].splitlines() if l.startswith("|")]
    assert len({len(_cells(line)) for line in table}) == 1  # old rows padded to the width
    old, new = (_cells(line) for line in table[-2:])
    assert old[:9] == _cells(OLD_ROW) and old[9:] == ["—"] * 3
    assert new[1] == f"{commit(REPO).split()[0]} vs base {commit(REPO).split()[0]}"
    assert new[3] == "1.00" and new[9:] == ["1.000 · 1.050", "—", "—"]
    assert len(rows_after) == 2


def test_the_base_is_a_source_tree_compared_in_the_proxy_rounds(tmp_path: Path) -> None:
    assert bench._arguments(["--base", str(REPO / "tests" / "..")]).base == REPO
    with pytest.raises(SystemExit):  # argparse: not a tree to run tunnelgate from
        bench._arguments(["--base", str(tmp_path)])
    with pytest.raises(SystemExit, match="add 'proxy'"):
        bench.main(["--only", "table", "--base", str(REPO), "--no-record"])
