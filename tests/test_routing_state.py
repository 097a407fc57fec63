"""routing/ keeps no hidden state: pure functions and immutable data only.

Whatever one parse or compile leaves for the next lives in a ``RuleReuse`` the caller
owns (tests/test_routing_pause.py); a module global that is a dict, list or set (or is
rebound with ``global``) would be state shared by every caller in the process.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import routing

MUTABLE = (dict, list, set, bytearray)
SOURCES = Path(routing.__file__).parent


def _modules() -> list[str]:
    """The package's modules (its subpackages' too) by their sources, dotted below
    ``routing`` (a compiled build adds a shared library of its own, ``_native__mypyc``,
    that has no source)."""
    return sorted(".".join(path.relative_to(SOURCES).with_suffix("").parts)
                  for path in SOURCES.rglob("*.py") if path.stem != "__init__")


def test_the_package_has_the_expected_modules() -> None:
    # Guards the check below against scanning nothing (e.g. a broken package path).
    assert {"config", "model", "validate", "jsonscan", "wire", "table",
            "filters.cors"} <= set(_modules())


def test_no_routing_module_holds_a_mutable_global() -> None:
    found = []
    for name in _modules():
        module = importlib.import_module(f"routing.{name}")
        for key, value in vars(module).items():
            if not key.startswith("__") and isinstance(value, MUTABLE):
                found.append(f"routing.{name}.{key}: {type(value).__name__}")
    assert found == []


def test_no_routing_function_rebinds_a_module_global() -> None:
    found = []
    for name in _modules():
        source = f"{name.replace('.', '/')}.py"
        tree = ast.parse((SOURCES / source).read_text())
        found += [f"routing/{source}:{node.lineno}: global {', '.join(node.names)}"
                  for node in ast.walk(tree) if isinstance(node, ast.Global)]
    assert found == []
