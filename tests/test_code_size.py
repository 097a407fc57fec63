"""The code stays readable: no module over 500 lines, no class over about 250, no
function over about 50, in every package of the product (``proxy``, ``routing``,
``tunnel``). Read from the sources with ``ast`` (line counts include docstrings and
comments).

No exceptions are left: every module, class and function is within its limit."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "routing", "tunnel")
HTTP1_LAYER = ("proxy/entrances", "proxy/wire")  # the request path: checked for sure
MAX_MODULE = 500
MAX_CLASS = 260  # "about 250"
MAX_FUNCTION = 55  # "about 50"


def oversized(source: str, max_class: int, max_function: int) -> list[tuple[str, int]]:
    """(name, lines) of every class and function in ``source`` over its limit."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            limit = max_class
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            limit = max_function
        else:
            continue
        assert node.end_lineno is not None
        size = node.end_lineno - node.lineno + 1
        if size > limit:
            found.append((node.name, size))
    return found


def lines_of(source: str) -> int:
    return len(source.splitlines())


def modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def name_of(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_package_and_the_http1_layer_are_checked() -> None:
    names = {name_of(path) for path in modules()}
    for folder in HTTP1_LAYER:
        assert any(name.startswith(folder + "/") for name in names)
    assert {"proxy/entrances/http1.py", "proxy/wire/framing.py", "routing/table.py",
            "tunnel/origin.py"} <= names


@pytest.mark.parametrize("path", modules(), ids=name_of)
def test_no_module_is_too_long(path: Path) -> None:
    assert lines_of(path.read_text()) <= MAX_MODULE


@pytest.mark.parametrize("path", modules(), ids=name_of)
def test_no_class_or_function_is_oversized(path: Path) -> None:
    assert oversized(path.read_text(), MAX_CLASS, MAX_FUNCTION) == []


def test_the_check_finds_an_oversized_class_and_function() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(8))
    source = f"class Big:\n    def long(self):\n{body}\n"
    assert oversized(source, 5, 5) == [("Big", 10), ("long", 9)]
    assert oversized(source, 10, 9) == []
    assert lines_of(source) == 10
    assert lines_of(source + "\n\n# one more\n") == 13
