"""What runs: the package version, whether the hot path runs compiled (mypyc, see
setup.py) — and whether that build may be stale.

An editable install builds the compiled modules next to their sources; Python then
imports the extension, not the ``.py``. A source edited after the build would silently
not run, so :func:`stale_extensions` finds such pairs (``make`` rebuilds them, and the
test suite refuses to start on a stale build).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import sys
from pathlib import Path

PACKAGES = ("routing", "proxy", "tunnel")
_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def compiled_modules() -> list[str]:
    """Names of the loaded ``routing``/``proxy``/``tunnel`` modules that are C extensions."""
    return sorted(
        name for name, module in list(sys.modules.items())
        if name.partition(".")[0] in PACKAGES and "." in name
        and str(getattr(module, "__file__", "") or "").endswith(_SUFFIXES)
        and not name.endswith("__mypyc"))


def version() -> str:
    """The installed package's version (its metadata); ``unknown`` when the sources run
    without being installed."""
    try:
        return importlib.metadata.version("tunnelgate")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build() -> str:
    """Which build runs: ``compiled`` (mypyc hot path loaded) or ``plain`` (Python)."""
    return "compiled" if compiled_modules() else "plain"


def describe() -> str:
    """One line for logs and benchmark records."""
    return _summary(len(compiled_modules()))


def describe_tree(root: Path) -> str:
    """Like :func:`describe`, for the source tree at ``root`` (a proxy about to be
    started from it, as the benchmarks do), without importing anything from it."""
    extensions = [path for package in PACKAGES for path in (root / package).rglob("*.so")
                  if not path.name.split(".", 1)[0].endswith("__mypyc")]
    stale = bool(extensions) and bool(stale_extensions(root))
    return _summary(len(extensions)) + (" — STALE: older than its sources" if stale else "")


def _summary(compiled: int) -> str:
    if not compiled:
        return "pure Python (hot path not compiled)"
    return f"mypyc-compiled hot path ({compiled} modules)"


def stale_extensions(root: Path) -> list[str]:
    """Compiled sources under ``root``'s packages (a module's ``.py``, or the ``.c`` of
    a hand-written extension) edited after their package was last built (relative
    paths). A rebuild rewrites the package's shared library but may leave a module's
    small loader extension untouched, so the newest extension file of the package is
    the build time."""
    stale = []
    for package in PACKAGES:
        extensions = list((root / package).rglob("*.so"))
        if not extensions:
            continue
        built = max(path.stat().st_mtime for path in extensions)
        for extension in extensions:
            stem = extension.name.split(".", 1)[0]
            for source in (extension.with_name(stem + ".py"), extension.with_name(stem + ".c")):
                if source.exists() and source.stat().st_mtime > built:
                    stale.append(str(source.relative_to(root)))
    return sorted(stale)
