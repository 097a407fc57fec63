"""Load scenarios comparing tunnelgate with nginx and with the direct backend.

Performance is *measured* here, never asserted by the test suite (timings on a
shared machine are noise). ``python -m benchmarks`` (``make bench``) runs every system side by side in one
invocation, interleaved in rounds, because the machine is shared and noisy: only ratios
taken in the same run are meaningful. All traffic stays on 127.0.0.1.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
