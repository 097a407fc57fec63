"""Who may import what: the rooms of proxy/, routing/ and tunnel/ (docs/internals.md).

The graph is read from the sources with ``ast`` (no import is executed, no git needed:
the suite also runs in a copy of the tree). Every import a module can run counts, at
module level or inside a function (a deferred import hides a cycle, it does not break
it); only what sits under ``if TYPE_CHECKING:`` is left out, since it never runs, and
``from __future__`` is not an import.

The rules:

- no import cycle among the modules;
- ``routing/`` imports nothing from ``proxy/`` or ``tunnel/``, and no I/O or clock
  module (it is the sans-IO core);
- each room of ``proxy/`` imports only the rooms :data:`ROOMS` lists for it;
- only the composition root (``proxy.control.runtime``, the data plane it builds in
  ``proxy.control.dataplane`` and the command line in ``proxy.control.cli``) imports
  ``tunnel``;
- ``tunnel/`` imports from ``proxy/`` only the entrance/Handler contract and the
  body buffer its in-memory streams are made of (:data:`TUNNEL_MAY_IMPORT`);
- no cycle between rooms (the rooms of ``proxy/``, ``routing``, ``tunnel``) even when
  the imports under ``if TYPE_CHECKING:`` count: a type named across rooms both ways
  means the two rooms are one design, whatever runs first.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "routing", "tunnel")

# A proxy/ room → the project rooms its modules may import (its own room always).
# A module is in the room of the longest key that is a prefix of its name.
ROOMS: dict[str, frozenset[str]] = {
    "proxy": frozenset(),  # the package itself and __main__ (below, via control)
    "proxy.request": frozenset(),  # the contract: depends on nothing of ours
    "proxy.wire": frozenset({"proxy.request"}),
    "proxy.flow": frozenset({"proxy.request"}),
    "proxy.observability": frozenset({"proxy.request", "routing"}),
    "proxy.upstream": frozenset({"proxy.request", "proxy.wire", "proxy.flow",
                                 "proxy.observability", "routing"}),
    "proxy.entrances": frozenset({"proxy.request", "proxy.wire", "proxy.flow",
                                  "proxy.observability", "routing"}),
    "proxy.exchange": frozenset({"proxy.request", "proxy.wire", "proxy.flow",
                                 "proxy.upstream", "proxy.observability", "routing"}),
    "proxy.control": frozenset({"proxy", "routing"}),
}
# Outside its room, proxy.__main__ only starts the CLI.
EXTRA = {"proxy.__main__": frozenset({"proxy.control.cli"})}
COMPOSITION_ROOT = ("proxy.control.cli", "proxy.control.dataplane", "proxy.control.runtime")
TUNNEL_MAY_IMPORT = frozenset({"proxy.request", "proxy.flow.buffer"})
# routing/ decides, proxy/ does the I/O: no event loop, sockets, TLS, threads or clock.
ROUTING_NEVER = frozenset({"asyncio", "socket", "ssl", "selectors", "threading",
                           "time", "uvloop", "httptools"})


@dataclass
class Graph:
    """The modules of a tree and what each imports at run time."""

    modules: set[str] = field(default_factory=set)
    imports: dict[str, set[str]] = field(default_factory=dict)  # module → ours
    external: dict[str, set[str]] = field(default_factory=dict)  # module → top names


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_nodes(nodes: list[ast.stmt], typing_too: bool = False,
                  ) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth, skipping TYPE_CHECKING
    blocks (their ``else`` does run) unless ``typing_too``."""
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node.test) and not typing_too:
            yield from _import_nodes(node.orelse)
        else:
            for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                children = getattr(node, name, None)
                if isinstance(children, list):
                    for child in children:
                        inner = getattr(child, "body", None)
                        if isinstance(child, ast.stmt):
                            yield from _import_nodes([child], typing_too)
                        elif isinstance(inner, list):  # except handler, match case
                            yield from _import_nodes(inner, typing_too)


def imported_names(tree: ast.Module, module: str, is_package: bool,
                   typing_too: bool = False) -> Iterator[str]:
    """Dotted names a module imports: modules, or ``module.attribute`` for names
    taken from a module (the caller finds the module part)."""
    for node in _import_nodes(tree.body, typing_too):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
            continue
        if node.module == "__future__":
            continue
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        yield base
        yield from (f"{base}.{alias.name}" for alias in node.names if alias.name != "*")


def _owner(name: str, modules: set[str]) -> str | None:
    """The module ``name`` is or lives in (longest prefix that is a module)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def read_graph(root: Path, packages: tuple[str, ...] = PACKAGES, *,
               typing_too: bool = False) -> Graph:
    """The import graph of ``packages`` under ``root``; ``typing_too`` counts the
    imports under ``if TYPE_CHECKING:`` as well."""
    graph = Graph()
    sources = {module_name(path, root): path
               for package in packages for path in sorted((root / package).rglob("*.py"))}
    graph.modules = set(sources)
    for module, path in sources.items():
        ours: set[str] = set()
        external: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name in imported_names(tree, module, path.name == "__init__.py", typing_too):
            if name.split(".")[0] not in packages:
                external.add(name.split(".")[0])
                continue
            owner = _owner(name, graph.modules)
            while owner:  # importing a.b.c runs the packages a and a.b first
                if owner != module:
                    ours.add(owner)
                owner = owner.rpartition(".")[0]
        graph.imports[module] = ours
        graph.external[module] = external
    return graph


def find_cycle(graph: Graph, prefix: str = "") -> list[str] | None:
    """One import cycle among the modules starting with ``prefix``, as the path
    ``[a, b, ..., a]``, or None."""
    inside = {m for m in graph.modules if m.startswith(prefix)}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.imports[module] & inside):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(inside):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def room_graph(graph: Graph) -> Graph:
    """``graph`` with each module replaced by its room: a proxy/ room of
    :data:`ROOMS`, or the top package (``routing``, ``tunnel``). The package modules
    (``__init__``) are left out: importing ``a.b`` runs ``a`` first whoever imports."""
    packages = {m for m in graph.modules
                if any(other.startswith(m + ".") for other in graph.modules)}

    def room(module: str) -> str:
        return room_of(module) or "" if _within(module, "proxy") else module.split(".")[0]

    rooms = Graph()
    for module in graph.modules - packages:
        mine = room(module)
        rooms.modules.add(mine)
        rooms.imports.setdefault(mine, set()).update(
            room(t) for t in graph.imports[module] - packages if room(t) != mine)
    for name in rooms.modules:
        rooms.imports.setdefault(name, set())
    return rooms


def _within(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def room_of(module: str) -> str | None:
    rooms = [room for room in ROOMS if _within(module, room)]
    return max(rooms, key=len) if rooms else None


def room_violations(graph: Graph) -> list[str]:
    """Imports of proxy/ modules that leave the rooms :data:`ROOMS` allows."""
    found = []
    for module in sorted(m for m in graph.modules if _within(m, "proxy")):
        room = room_of(module)
        assert room is not None
        allowed = ROOMS[room] | EXTRA.get(module, frozenset()) | {room}
        for target in sorted(graph.imports[module]):
            if _within(target, "tunnel"):
                continue  # rule of its own: test_only_the_composition_root_imports_tunnel
            if target in ("proxy", room) or any(_within(target, a) for a in allowed):
                continue
            # A package __init__ on the way to an allowed module is fine.
            if any(_within(a, target) for a in allowed):
                continue
            found.append(f"{module} imports {target} (room {room})")
    return found


def routing_violations(graph: Graph) -> list[str]:
    found = []
    for module in sorted(m for m in graph.modules if _within(m, "routing")):
        found += [f"{module} imports {t}" for t in sorted(graph.imports[module])
                  if not _within(t, "routing")]
        found += [f"{module} imports {t}" for t in sorted(graph.external[module])
                  if t in ROUTING_NEVER]
    return found


def tunnel_importers(graph: Graph) -> list[str]:
    return sorted(m for m in graph.modules if _within(m, "proxy")
                  and any(_within(t, "tunnel") for t in graph.imports[m]))


def tunnel_violations(graph: Graph) -> list[str]:
    found = []
    for module in sorted(m for m in graph.modules if _within(m, "tunnel")):
        for target in sorted(graph.imports[module]):
            if target == "proxy" or not _within(target, "proxy"):
                continue
            if not any(_within(target, a) or _within(a, target) for a in TUNNEL_MAY_IMPORT):
                found.append(f"{module} imports {target}")
    return found


# --------------------------------------------------------------------------- the tree

GRAPH = read_graph(ROOT)


def test_the_graph_covers_the_tree() -> None:
    # Guards every rule below against checking an empty or half-read graph.
    assert {"proxy.control.cli", "proxy.exchange.handler", "proxy.upstream.pool",
            "proxy.entrances.http1", "routing.table", "tunnel.origin"} <= GRAPH.modules
    assert "proxy.exchange.handler" in GRAPH.imports["proxy.control.dataplane"]
    assert all(room_of(m) is not None for m in GRAPH.modules if _within(m, "proxy"))


def test_no_import_cycle_in_proxy() -> None:
    cycle = find_cycle(GRAPH, "proxy")
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_no_import_cycle_anywhere() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_no_cycle_between_rooms_even_through_type_checking_imports() -> None:
    rooms = room_graph(read_graph(ROOT, typing_too=True))
    assert {"proxy.control", "proxy.exchange", "proxy.observability"} <= rooms.modules
    cycle = find_cycle(rooms)
    assert cycle is None, "rooms in a cycle: " + " -> ".join(cycle or ())


def test_routing_imports_neither_proxy_nor_tunnel_nor_io() -> None:
    assert routing_violations(GRAPH) == []


def test_each_proxy_room_imports_only_what_it_may() -> None:
    assert room_violations(GRAPH) == []


def test_only_the_composition_root_imports_tunnel() -> None:
    assert tunnel_importers(GRAPH) == list(COMPOSITION_ROOT)


def test_upstream_never_imports_the_entrances() -> None:
    # Implied by ROOMS; kept as a rule of its own because it was broken once
    # (the upstream side rendered its request head with the entrance's function).
    assert [(m, t) for m in GRAPH.modules if _within(m, "proxy.upstream")
            for t in GRAPH.imports[m] if _within(t, "proxy.entrances")] == []


def test_tunnel_takes_only_the_contract_from_proxy() -> None:
    assert tunnel_violations(GRAPH) == []


def _documented_rooms() -> dict[str, set[str]]:
    """docs/internals.md's room table: room → the names its "may import" cell quotes."""
    rooms = {}
    for line in (ROOT / "docs" / "internals.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`"):
            rooms[cells[0].strip("`").rstrip("/")] = set(re.findall(r"`([^`]+)`", cells[2]))
    return rooms


def test_the_documented_rooms_are_the_checked_ones() -> None:
    documented = _documented_rooms()
    checked = {room: set(allowed) for room, allowed in ROOMS.items()
               if room not in ("proxy", "proxy.control")}
    assert {room: documented.get(room) for room in checked} == checked
    assert documented["tunnel"] - {"routing"} == set(TUNNEL_MAY_IMPORT)
    assert ROUTING_NEVER <= documented["routing"]


# --------------------------------------------------------------------------- the checker


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_finds_planted_violations(tmp_path: Path) -> None:
    _write(tmp_path, {
        "proxy/__init__.py": "",
        "proxy/request.py": "from __future__ import annotations\n",
        "proxy/upstream/__init__.py": "",
        "proxy/upstream/pool.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from proxy.exchange import handler\n"
            "else:\n    import json\n"
            "def later():\n    from ..entrances.http1 import render\n"),
        "proxy/entrances/__init__.py": "",
        "proxy/entrances/http1.py": (
            "try:\n    from proxy.upstream import pool\nexcept ImportError:\n    pass\n"),
        "proxy/exchange/__init__.py": "",
        "proxy/exchange/handler.py": "from proxy.upstream.registry import Pools\n",
        "proxy/upstream/registry.py": "",
        "proxy/control/__init__.py": "",
        "proxy/control/cli.py": "import tunnel.origin\n",
        "proxy/control/admin.py": "from tunnel import origin\n",
        "routing/__init__.py": "",
        "routing/table.py": "import re\nclass T:\n    def f(self):\n        import asyncio\n",
        "routing/config.py": "from proxy.request import Request\n",
        "tunnel/__init__.py": "",
        "tunnel/origin.py": "from proxy.request import Request\nfrom proxy.upstream.pool import P\n",
    })
    graph = read_graph(tmp_path)
    # The TYPE_CHECKING import is no edge; its else branch and the deferred one are.
    assert "proxy.exchange.handler" not in graph.imports["proxy.upstream.pool"]
    assert graph.external["proxy.upstream.pool"] == {"typing", "json"}
    assert "proxy.entrances.http1" in graph.imports["proxy.upstream.pool"]
    assert graph.external["proxy.request"] == set()  # __future__ is no import
    assert find_cycle(graph, "proxy") == [
        "proxy.entrances.http1", "proxy.upstream.pool", "proxy.entrances.http1"]
    assert routing_violations(graph) == ["routing.config imports proxy",
                                         "routing.config imports proxy.request",
                                         "routing.table imports asyncio"]
    assert room_violations(graph) == [
        "proxy.entrances.http1 imports proxy.upstream (room proxy.entrances)",
        "proxy.entrances.http1 imports proxy.upstream.pool (room proxy.entrances)",
        "proxy.upstream.pool imports proxy.entrances (room proxy.upstream)",
        "proxy.upstream.pool imports proxy.entrances.http1 (room proxy.upstream)"]
    assert tunnel_importers(graph) == ["proxy.control.admin", "proxy.control.cli"]
    assert tunnel_violations(graph) == ["tunnel.origin imports proxy.upstream",
                                        "tunnel.origin imports proxy.upstream.pool"]
    # Counting the TYPE_CHECKING import, upstream and exchange name each other.
    typed = read_graph(tmp_path, typing_too=True)
    assert "proxy.exchange.handler" in typed.imports["proxy.upstream.pool"]
    rooms, typed_rooms = room_graph(graph), room_graph(typed)
    assert "proxy.exchange" not in rooms.imports["proxy.upstream"]
    assert typed_rooms.imports["proxy.upstream"] >= {"proxy.exchange", "proxy.entrances"}
    assert "proxy.upstream" in typed_rooms.imports["proxy.exchange"]
    del typed_rooms.imports["proxy.entrances"]  # leaves the cycle through exchange
    typed_rooms.modules.discard("proxy.entrances")
    assert set(find_cycle(typed_rooms) or ()) == {"proxy.exchange", "proxy.upstream"}


def test_the_checker_passes_a_clean_tree(tmp_path: Path) -> None:
    _write(tmp_path, {
        "proxy/__init__.py": "",
        "proxy/request.py": "",
        "proxy/exchange/__init__.py": "",
        "proxy/exchange/handler.py": ("from proxy.request import Request\n"
                                      "from routing.table import Table\n"),
        "proxy/entrances/__init__.py": "",
        "proxy/entrances/policy.py": "from . import http1\n",
        "proxy/entrances/http1.py": "from proxy.request import Request\n",
        "proxy/control/__init__.py": "",
        "proxy/control/cli.py": "from proxy.exchange.handler import H\nimport tunnel.origin\n",
        "routing/__init__.py": "",
        "routing/table.py": "import re\n",
        "tunnel/__init__.py": "",
        "tunnel/origin.py": "from proxy.request import Request\n",
    })
    graph = read_graph(tmp_path)
    assert graph.imports["proxy.entrances.policy"] == {
        "proxy", "proxy.entrances", "proxy.entrances.http1"}
    assert find_cycle(graph) is None
    assert routing_violations(graph) == room_violations(graph) == []
    assert tunnel_importers(graph) == ["proxy.control.cli"]
    assert tunnel_violations(graph) == []
    assert find_cycle(room_graph(read_graph(tmp_path, typing_too=True))) is None
