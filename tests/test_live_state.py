"""Live state on the admin port: ``/debug/routes`` and ``/debug/explain`` (token as for
``/config``), ``tunnelgate explain --admin`` against a running proxy, and the answers
agreeing with ``tunnelgate explain FILE`` on the same config."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from proxy.control.cli import main as tunnelgate
from tests.helpers import TestBackend
from tests.stack import running
from tests.test_e2e_explain import REQUESTS, explain_args, explained_config
from tests.test_e2e_routing import LISTEN, ask
from tests.test_workers import Supervisor

TOKEN = "debug-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENV = {"PROXY_AUTH_TOKEN": TOKEN}


def explain_params(host: str, path: str, query: str, headers: list[tuple[str, str]],
                   method: str) -> list[tuple[str, str]]:
    params = [("host", host), ("path", path), ("method", method), ("entrance", "cluster")]
    if query:
        params.append(("query", query))
    return params + [("header", f"{name}:{value}") for name, value in headers]


def printed(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[str]:
    capsys.readouterr()
    assert tunnelgate(argv) == 0
    return capsys.readouterr().out.splitlines()


async def test_debug_explain_and_explain_admin_agree_with_explain_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = explained_config("http://127.0.0.1:9")
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    monkeypatch.setenv("PROXY_AUTH_TOKEN", TOKEN)  # read by explain --admin
    assert len(REQUESTS) >= 20
    async with running(*LISTEN, environ=ENV) as stack:
        assert (await stack.push(config, token=TOKEN)).status_code == 200
        async with httpx.AsyncClient(base_url=stack.admin_url, headers=AUTH) as admin:
            for host, path, query, headers, method in REQUESTS:
                from_file = printed(capsys, explain_args(config_file, host, path, query,
                                                         headers, method))
                answer = (await admin.get("/debug/explain", params=explain_params(
                    host, path, query, headers, method))).json()
                assert answer["lines"] == from_file, (host, path)
                assert answer["version"] == 1
                winner = answer["winner"]
                if winner is None:
                    assert from_file[-1] == "result: no matching route (404)"
                else:
                    assert any(line.startswith(f"winner: {winner['match']} ")
                               for line in from_file)
                argv = explain_args(config_file, host, path, query, headers, method)
                argv[1:2] = ["--admin", stack.admin_url]  # no FILE: ask the proxy
                # The CLI is blocking: run it off the loop serving the admin API.
                from_admin = await asyncio.to_thread(_run_cli, argv)
                assert from_admin == (0, "\n".join(from_file) + "\n")


def _run_cli(argv: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = tunnelgate(argv)
    return status, out.getvalue()


async def test_debug_endpoints_refuse_without_the_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROXY_AUTH_TOKEN", raising=False)
    async with running(*LISTEN, environ=ENV) as stack:
        async with httpx.AsyncClient(base_url=stack.admin_url) as admin:
            for path in ("/debug/routes", "/debug/explain?host=a&path=/"):
                for headers in ({}, {"Authorization": "Bearer wrong"},
                                {"Authorization": "Basic " + TOKEN}):
                    refused = await admin.get(path, headers=headers)
                    # The very answer PUT /config gives (Go http.Error shape).
                    assert refused.status_code == 401
                    assert refused.text == "unauthorized\n"
                    assert refused.headers["content-type"] == "text/plain; charset=utf-8"
                    assert refused.headers["x-content-type-options"] == "nosniff"
            assert (await admin.post("/debug/routes", headers=AUTH)).status_code == 405
            bad = await admin.get("/debug/explain?host=a", headers=AUTH)
            assert bad.status_code == 400 and "path" in bad.text
        status = await asyncio.to_thread(
            _run_cli, ["explain", "--admin", stack.admin_url, "--host", "a", "--path", "/"])
        assert status[0] == 1


async def test_debug_routes_is_the_live_table_with_pool_state() -> None:
    async with TestBackend() as echo:
        config = {"version": 7, "rules": [
            {"hostnames": ["app.example.com"],
             "matches": [{"path": {"type": "PathPrefix", "value": "/api"}},
                         {"path": {"type": "Exact", "value": "/api/v1"}}],
             "backends": [{"url": echo.url, "weight": 3},
                          {"url": "http://127.0.0.1:9", "weight": 0}]},
            {"hostnames": ["*.example.com"], "backends": [{"url": echo.url, "weight": 1}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/"}, "method": "GET"}],
             "unavailableStatus": 503},
        ]}
        async with running(*LISTEN, environ=ENV) as stack:
            assert (await stack.push(config, token=TOKEN)).status_code == 200
            assert (await ask(stack.cluster_port, "app.example.com", "/api/x")).status == 200
            async with httpx.AsyncClient(base_url=stack.admin_url, headers=AUTH) as admin:
                routes = (await admin.get("/debug/routes")).json()
    assert routes["version"] == 7
    assert [b["bucket"] for b in routes["buckets"]] == [
        "exact 'app.example.com'", "wildcard '*.example.com'", "default (no hostnames)"]
    exact = routes["buckets"][0]["matches"]
    # Precedence order: Exact /api/v1 before PathPrefix /api, whatever the list order.
    assert [m["name"] for m in exact] == ["rules[0].matches[1]", "rules[0].matches[0]"]
    assert exact[0]["precedence"].startswith("Exact, length 7")
    assert exact[1]["matched_prefix"] == "/api" and not exact[1]["knative_probe"]
    first = routes["rules"][0]
    assert first["name"] == "rules[0]" and first["hostnames"] == ["app.example.com"]
    live, unused = first["backends"]
    assert (live["url"], live["weight"]) == (echo.url, 3)
    # The request above left one kept-alive connection in the pool.
    assert live["pool"] == {"idle": 1, "busy": 0}
    assert unused["weight"] == 0 and unused["pool"] is None
    assert routes["rules"][2]["unavailable_status"] == 503


async def test_workers_answer_debug_and_explain_from_the_supervisor(tmp_path: Path) -> None:
    config = explained_config("http://127.0.0.1:9")
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    async with Supervisor(env=ENV) as served:
        pushed = await served.admin.put("/config", content=json.dumps(config),
                                        headers={**AUTH, "Content-Type": "application/json"})
        assert pushed.status_code == 200
        assert (await served.admin.get("/debug/routes")).status_code == 401
        routes = (await served.admin.get("/debug/routes", headers=AUTH)).json()
        assert len(routes["rules"]) == len(config["rules"])
        assert all(b["pool"] is None for r in routes["rules"] for b in r["backends"])
        for host, path, query, headers, method in REQUESTS[:5]:
            answer = (await served.admin.get("/debug/explain", headers=AUTH, params=explain_params(
                host, path, query, headers, method))).json()
            expected = await asyncio.to_thread(
                _run_cli, explain_args(config_file, host, path, query, headers, method))
            assert "\n".join(answer["lines"]) + "\n" == expected[1]

