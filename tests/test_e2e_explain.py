"""Acceptance, end to end: ``tunnelgate explain`` names the rule the proxy really uses.

One config is pushed to the running proxy and written to a file for ``explain``. Every
rule tags what it serves with its own index (``X-Rule: N``, reflected by the echo
backend), so for each request the rule ``explain`` names as winner (or its 404 verdict)
is compared with the rule that actually served it through the cluster entrance.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.control.cli import main as tunnelgate
from tests.helpers import TestBackend
from tests.stack import running
from tests.test_cli import ROOT, clean_env
from tests.test_e2e_routing import LISTEN, ask, prefix, rule, served_by
from tests.test_e2e_streaming import TUNNELGATE

WINNER = re.compile(r"^result: rules\[(\d+)\]\S* wins", re.MULTILINE)
NO_ROUTE = "result: no matching route (404)"


def explained_config(url: str) -> dict[str, Any]:
    """Rules tagged with their own index, covering every bucket and matcher kind."""
    header = {"type": "Exact", "name": "X-API-Version", "value": "2"}
    env = {"type": "RegularExpression", "name": "x-env", "value": "beta|gamma"}
    specs: list[dict[str, Any]] = [
        {"hosts": ["app.example.com"], "matches": [
            {"path": {"type": "Exact", "value": "/api/v2/health"}, "method": "GET",
             "headers": [header]}]},
        {"hosts": ["*.example.com"], "matches": [prefix("/old")]},
        {"hosts": ["app.example.com"], "matches": [prefix("/static", queryParams=[
            {"type": "RegularExpression", "name": "v", "value": "[0-9]+"}])]},
        {"hosts": ["app.example.com"], "matches": [prefix("/")]},
        {"hosts": ["*.b.example.com"]},
        {"matches": [prefix("/api", headers=[env])]},
        {"matches": [{"path": {"type": "Exact", "value": "/exact"}}]},
        {"matches": [{"path": {"type": "RegularExpression", "value": r"/img/[0-9]+\.png"}}]},
        {"matches": [prefix("/deep/path", method="POST")]},
        {"hosts": ["only.example.com"], "matches": [prefix("/only")]},
        {"hosts": ["tunnel.test"], "entrances": ["tunnel"]},
    ]
    rules = []
    for index, spec in enumerate(specs):
        extra = {"entrances": spec["entrances"]} if "entrances" in spec else {}
        rules.append(rule(str(index), url, hosts=spec.get("hosts", ()),
                          matches=spec.get("matches", ()), **extra))
    return {"version": 1, "rules": rules}


# (host, path, query, headers, method)
REQUESTS: list[tuple[str, str, str, list[tuple[str, str]], str]] = [
    ("app.example.com", "/api/v2/health", "", [("X-API-Version", "2")], "GET"),
    ("app.example.com", "/api/v2/health", "", [], "GET"),
    ("app.example.com", "/api/v2/health", "", [("x-api-version", "2")], "POST"),
    ("App.Example.com:8080", "/old/x", "", [], "GET"),
    ("x.example.com", "/old/x", "", [], "GET"),
    ("x.example.com", "/new", "", [], "GET"),
    ("app.example.com", "/static/a.js", "v=3", [], "GET"),
    ("app.example.com", "/static/a.js", "v=x", [], "GET"),
    ("a.b.example.com", "/anything", "", [], "GET"),
    ("a.b.example.com", "/old", "", [], "GET"),
    ("other.test", "/api/x", "", [("X-Env", "beta")], "GET"),
    ("other.test", "/api/x", "", [("X-Env", "delta")], "GET"),
    ("x.example.com", "/api/q", "", [("X-Env", "gamma")], "GET"),
    ("other.test", "/exact", "", [], "GET"),
    ("other.test", "/%65xact", "", [], "GET"),
    ("other.test", "/exact/", "", [], "GET"),
    ("other.test", "/img/3.png", "", [], "GET"),
    ("other.test", "/img/3.pngx", "", [], "GET"),
    ("other.test", "/deep/path/x", "", [], "POST"),
    ("other.test", "/deep/path/x", "", [], "GET"),
    ("only.example.com", "/only/a", "", [], "GET"),
    ("only.example.com", "/old/z", "", [], "GET"),
    ("tunnel.test", "/", "", [], "GET"),
]


def explain_args(path: Path, host: str, target: str, query: str,
                 headers: list[tuple[str, str]], method: str) -> list[str]:
    args = ["explain", str(path), "--host", host, "--path", target, "--method", method,
            "--entrance", "cluster"]
    if query:
        args += ["--query", query]
    for name, value in headers:
        args += ["--header", f"{name}:{value}"]
    return args


def verdict(output: str) -> str:
    """The rule index of the winner ``explain`` printed as its result, or "404"."""
    found = WINNER.search(output)
    if found is not None:
        return found.group(1)
    assert NO_ROUTE in output, output
    return "404"


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    return tmp_path / "config.json"


async def test_explain_agrees_with_the_proxy(config_file: Path, capsys):
    async with TestBackend() as echo:
        config = explained_config(echo.url)
        config_file.write_text(json.dumps(config))
        async with running(*LISTEN, config=config) as stack:
            outcomes = []
            for host, path, query, headers, method in REQUESTS:
                target = f"{path}?{query}" if query else path
                response = await ask(stack.cluster_port, host, target, method=method,
                                     headers=headers, body=b"x" if method == "POST" else b"")
                capsys.readouterr()
                assert tunnelgate(explain_args(config_file, host, path, query, headers,
                                               method)) == 0
                said = verdict(capsys.readouterr().out)
                assert said == served_by(response), (host, target, headers, method)
                outcomes.append(said)
    # The cases cover winners in every bucket kind as well as misses.
    assert len(set(outcomes)) >= 10 and "404" in outcomes


def test_the_installed_command_prints_the_same_verdict(config_file: Path):
    config_file.write_text(json.dumps(explained_config("http://127.0.0.1:9")))
    for host, path, query, headers, method, expected in (
            ("x.example.com", "/api/q", "", [("X-Env", "gamma")], "GET", "5"),
            ("other.test", "/exact/", "", [], "GET", "404")):
        done = subprocess.run(
            [str(TUNNELGATE), *explain_args(config_file, host, path, query, headers, method)],
            cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert verdict(done.stdout) == expected
