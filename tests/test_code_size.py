"""The HTTP/1.1 layer stays readable: no class of ``proxy/entrances/`` or
``proxy/wire/`` (the client connection, its parser side, the responder, the sans-IO
framing and head rules) over about 250 lines, no function over about 50. Read from the
sources with ``ast`` (line counts include docstrings and comments)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("proxy/entrances", "proxy/wire")
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


def modules() -> list[Path]:
    return sorted(path for folder in CHECKED for path in (ROOT / folder).glob("*.py"))


def test_the_checked_folders_hold_the_http1_layer() -> None:
    names = {path.stem for path in modules()}
    assert {"http1", "connection", "reader", "cycle", "framing", "head", "request"} <= names


@pytest.mark.parametrize("path", modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_class_or_function_is_oversized(path: Path) -> None:
    assert oversized(path.read_text(), MAX_CLASS, MAX_FUNCTION) == []


def test_the_check_finds_an_oversized_class_and_function() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(8))
    source = f"class Big:\n    def long(self):\n{body}\n"
    assert oversized(source, 5, 5) == [("Big", 10), ("long", 9)]
    assert oversized(source, 10, 9) == []
