"""docs/config.md names every field the parsers accept, and no wire field they do not.

The parsers' field names are taken from their own key sets: every set of keys handed to
the object reader (``routing.node.Node``: wire objects, and with the ``YAML`` dialect,
as nested ``node.node(...)`` objects of one, HTTPRoute YAML), read from the source with
``ast`` (the compiled build has the same sources), plus the filter payload keys of the
filter registry. A field added to a parser without documenting it fails here.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from routing.filterkinds import KINDS

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "config.md").read_text()
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9]*\Z")
_NOT_PARSERS = ("lint.py",)


def _strings(node: ast.AST, assigned: dict[str, ast.AST], seen: frozenset[str] = frozenset()
             ) -> set[str]:
    """Identifier-like string constants in ``node``, following module-level names."""
    found: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            if _IDENTIFIER.match(child.value):
                found.add(child.value)
        elif isinstance(child, ast.Name) and child.id in assigned and child.id not in seen:
            found |= _strings(assigned[child.id], assigned, seen | {child.id})
    return found


def _assigned(tree: ast.Module) -> dict[str, ast.AST]:
    """The module-level names of ``tree`` and what they are assigned."""
    assigned: dict[str, ast.AST] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    assigned[target.id] = statement.value
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) \
                and statement.value is not None:
            assigned[statement.target.id] = statement.value
    return assigned


def _key_sets(path: Path) -> tuple[set[str], set[str]]:
    """(wire, YAML) keys of the key-set arguments of ``Node(value, path, keys[,
    dialect])`` calls in ``path`` (YAML: the ``YAML`` dialect), and of ``.node(key,
    keys)`` calls (nested objects, read in YAML only)."""
    tree = ast.parse(path.read_text())
    assigned = _assigned(tree)
    wire: set[str] = set()
    yaml: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "node" and len(node.args) == 2:
            yaml |= _strings(node.args[1], assigned)
        elif getattr(func, "id", "") == "Node" and len(node.args) >= 3:
            dialect = node.args[3] if len(node.args) > 3 else None
            is_yaml = isinstance(dialect, ast.Name) and dialect.id == "YAML"
            (yaml if is_yaml else wire).update(_strings(node.args[2], assigned))
    return wire, yaml


def _parsers() -> list[Path]:
    return sorted(path for path in (ROOT / "routing").rglob("*.py")
                  if path.name not in _NOT_PARSERS)


def _payload_keys() -> set[str]:
    """The filter payload keys, from the filter registry."""
    return {kind.key for kind in KINDS.values()}


def wire_fields() -> set[str]:
    keys = _payload_keys()
    for path in _parsers():
        keys |= _key_sets(path)[0]
    return keys


def yaml_fields() -> set[str]:
    keys = _payload_keys()
    for path in _parsers():
        keys |= _key_sets(path)[1]
    return keys


def _section(title: str) -> str:
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end != -1 else None]


def _named(text: str) -> set[str]:
    """Identifiers written in code spans: `a`, `{a, b}`, `a.b[]`."""
    names: set[str] = set()
    for span in re.findall(r"`([^`]+)`", text):
        names.update(re.findall(r"[A-Za-z][A-Za-z0-9]*", span))
    return names


def _field_column(text: str) -> set[str]:
    """First-column names of the tables whose header starts with ``| field |``."""
    names: set[str] = set()
    in_fields = False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_fields = False
            continue
        first = line.split("|")[1].strip()
        if first == "field":
            in_fields = True
        elif in_fields and not first.startswith("---"):
            names.update(re.findall(r"`([A-Za-z][A-Za-z0-9]*)`", first))
    return names


def test_the_parsers_key_sets_were_found() -> None:
    wire, yaml = wire_fields(), yaml_fields()
    # Fields from every level: document, rule, match, filter payloads, backend, TLS.
    assert {"version", "hasGrpcRoute", "unavailableStatus", "entrances", "queryParams",
            "requestMirror", "replacePrefixMatch", "backendUrl", "maxAge", "websocket",
            "subjectAltNameUris", "clientKeyPem", "backend"} <= wire
    assert {"backendRefs", "backendRequest", "sessionPersistence", "fraction",
            "numerator", "extensionRef", "items"} <= yaml


def test_every_wire_field_is_documented() -> None:
    missing = wire_fields() - _named(_section("Wire format"))
    assert missing == set(), f"docs/config.md does not name wire fields {sorted(missing)}"


def test_the_wire_tables_name_no_field_the_parser_lacks() -> None:
    unknown = _field_column(_section("Wire format")) - wire_fields()
    assert unknown == set(), f"docs/config.md documents unknown fields {sorted(unknown)}"


def test_every_httproute_field_is_documented() -> None:
    missing = yaml_fields() - _named(_section("HTTPRoute YAML"))
    assert missing == set(), f"docs/config.md does not name HTTPRoute fields {sorted(missing)}"


# --------------------------------------------------------------------------- standalone docs

_UNSHIPPED = re.compile(r"REFERENCE|DESIGN\.md|\.\./shared")
# A section sign is fine when it points into a public spec named on the line (or the
# line before, for a wrapped sentence): RFC 9110 §7.6.1, :rfc:`5891` §4.2, spec §2.1.
_SPEC = re.compile(r"RFC|:rfc:|spec|GEP")


def test_nothing_cites_documents_a_reader_of_the_repository_lacks() -> None:
    """Docs, comments and docstrings stand alone: no sections of design notes that are
    not in the repository."""
    offenders = []
    for path in _shipped_text_files():
        name = path.relative_to(ROOT).as_posix()
        if name == "tests/test_config_doc.py":
            continue
        previous = ""
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _UNSHIPPED.search(line) or ("§" in line and not _SPEC.search(previous + line)):
                offenders.append(f"{name}:{number}: {line.strip()}")
            previous = line
    assert offenders == [], "\n".join(offenders)


_TEXT_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", "Makefile", "Dockerfile")
# What a checkout holds but the repository does not: the venv, build output, caches.
_NOT_SHIPPED = frozenset((".git", ".venv", "build", "__pycache__", ".pytest_cache",
                          ".hypothesis", ".mypy_cache", "out"))


def _shipped_text_files() -> list[Path]:
    """The repository's text files, found by walking the tree (the suite also runs in a
    copy without ``.git``, so git cannot be asked)."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = sorted(name for name in subfolders if name not in _NOT_SHIPPED
                               and not name.endswith(".egg-info"))
        found.extend(Path(folder, name) for name in sorted(files)
                     if name.endswith(_TEXT_SUFFIXES))
    return found
