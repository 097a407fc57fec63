"""Suite-wide guard: never test a compiled build that no longer matches its sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.control import native

ROOT = Path(__file__).resolve().parent.parent


def pytest_sessionstart(session: pytest.Session) -> None:
    stale = native.stale_extensions(ROOT)
    if stale:
        pytest.exit(f"compiled modules are older than their sources ({', '.join(stale)}): "
                    "run `make test` (it rebuilds them), or `make clean`", returncode=4)
