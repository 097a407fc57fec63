"""The compiled hot path (setup.py, proxy/control/native.py): complete, fresh, and reported."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from proxy.control import native
from tests.stack import make_settings

ROOT = Path(__file__).resolve().parent.parent


def _listed() -> list[str]:
    """setup.py's NATIVE table, read without running setup()."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "NATIVE":
            table = ast.literal_eval(node.value)
            return sorted(f"{package}.{name.replace('/', '.')}"
                          for package, names in table.items()
                          for name in names)
    raise AssertionError("setup.py has no NATIVE table")


def test_the_build_is_all_or_nothing() -> None:
    # A partial build would mean some listed module failed to compile yet the rest
    # imported: compiled classes then meet interpreted subclasses, which mypyc forbids.
    listed = _listed()
    for name in listed:
        importlib.import_module(name)
    compiled = [name for name in native.compiled_modules() if name in listed]
    assert compiled in ([], listed)
    if os.environ.get("TUNNELGATE_REQUIRE_NATIVE"):  # set by .ci/run
        assert compiled == listed, native.describe()
    assert native.describe().startswith("mypyc" if compiled else "pure Python")


def test_no_listed_module_is_subclassed_from_interpreted_code() -> None:
    listed = set(_listed())
    classes = set()
    for name in listed:
        tree = ast.parse((ROOT / (name.replace(".", "/") + ".py")).read_text())
        classes.update(node.name for node in tree.body if isinstance(node, ast.ClassDef))
    offenders = []
    for path in (p for top in ("routing", "proxy", "tunnel", "tests", "benchmarks")
                 for p in (ROOT / top).rglob("*.py")):  # tests and benchmarks included
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module in listed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    name = base.attr if isinstance(base, ast.Attribute) else getattr(
                        base, "id", "")
                    if name in classes:
                        offenders.append(f"{module}.{node.name}({name})")
    assert offenders == []


def test_stale_extensions_are_found(tmp_path: Path) -> None:
    package = tmp_path / "proxy"
    package.mkdir()
    source = package / "http1.py"
    extension = package / "http1.cpython-311-x86_64-linux-gnu.so"
    shared = package / "_native__mypyc.cpython-311-x86_64-linux-gnu.so"
    for path in (source, extension, shared):
        path.write_text("")
    now = time.time()
    os.utime(extension, (now - 20, now - 20))  # a rebuild may leave the loader as is…
    os.utime(source, (now - 10, now - 10))
    assert native.stale_extensions(tmp_path) == []  # …the shared library is the build
    os.utime(source, (now + 10, now + 10))  # edited after the build
    assert native.stale_extensions(tmp_path) == ["proxy/http1.py"]
    hand_written = package / "_join.c"  # a hand-written extension's source, too
    (package / "_join.cpython-311-x86_64-linux-gnu.so").write_text("")
    hand_written.write_text("")
    os.utime(hand_written, (now + 20, now + 20))
    assert native.stale_extensions(tmp_path) == ["proxy/_join.c", "proxy/http1.py"]


def test_this_checkout_is_not_stale() -> None:
    assert native.stale_extensions(ROOT) == []



def test_the_packages_type_check(tmp_path: Path) -> None:
    # mypyc compiles only what type-checks, and enforces annotations at run time; the
    # modules it does not compile are held to the same bar, so any may join NATIVE.
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--cache-dir",
         str(tmp_path), "proxy", "routing", "tunnel"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _types_within(value: object) -> Iterator[type]:
    """The type of ``value`` and of everything inside it (dataclass fields, tuples)."""
    yield type(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _types_within(getattr(value, f.name))
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _types_within(item)


def test_worker_settings_hold_no_compiled_type() -> None:
    # Settings are pickled to every worker process, and a compiled frozen dataclass
    # does not unpickle: a type from a NATIVE module in them breaks --workers N in the
    # compiled build only. Checked on the types, so the pure build catches it too.
    settings = make_settings("--workers", "2", "--listen", "127.0.0.1:0",
                             "--tunnel-listen", "127.0.0.1:0", "--cluster-allow", "10.0.0.0/8",
                             "--max-response-header-bytes", "4096")
    listed = set(_listed())
    found = {f"{t.__module__}.{t.__qualname__}" for t in _types_within(settings)
             if t.__module__ in listed}
    assert found == set()
    assert pickle.loads(pickle.dumps(settings)) == settings
