"""Acceptance, end to end: ``/debug/explain`` and ``tunnelgate explain --admin`` say what
the proxy serves, on every entrance and in every cluster scope, Knative probes included.

A running tunnelgate (tunnel and cluster entrances) gets one config whose rules each
tag what they forward (``X-Rule: N``, echoed by the backend). Every request of
:data:`REQUESTS` is sent through each entrance; the status and the serving rule are
compared with the decision ``/debug/explain`` reports for the same request and with
what ``tunnelgate explain --admin`` prints (the probe cases as docs/knative.md describes them).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest

from proxy.control.cli import main as tunnelgate
from tests.helpers import TestBackend
from tests.stack import running
from tests.test_e2e_routing import ask, prefix, rule, served_by

PROBE = [("K-Network-Probe", "probe"), ("K-Network-Hash", "override")]
FORGED = [("K-Network-Probe", "probe")]  # the header without a probe match
PROBE_MATCH = prefix("/", headers=[{"type": "Exact", "name": "K-Network-Hash",
                                    "value": "override"}])
RESULT = re.compile(r"^result: rules\[(\d+)\]", re.MULTILINE)


def decision_config(url: str) -> dict[str, Any]:
    """Rule N is tagged ``N``: a Knative route (probe copy first), a cluster-only and a
    tunnel-only rule, a rule that is down, one without backends."""
    rules = [
        rule("0", url, hosts=["app.example.com"], matches=[PROBE_MATCH]),
        rule("1", url, hosts=["app.example.com"], matches=[prefix("/")]),
        rule("2", url, hosts=["app.example.com"], matches=[prefix("/internal")],
             entrances=["cluster"]),
        rule("3", url, hosts=["tunnel.example.com"], entrances=["tunnel"]),
        rule("4", url, hosts=["down.example.com"], matches=[PROBE_MATCH],
             unavailableStatus=500),
        rule("5", url, hosts=["down.example.com"], unavailableStatus=502),
        {**rule("6", url, hosts=["empty.example.com"], matches=[PROBE_MATCH]),
         "backends": []},
    ]
    return {"version": 7, "rules": rules}


# (method, host, target, headers)
REQUESTS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("GET", "app.example.com", "/", []),
    ("GET", "app.example.com", "/", PROBE),
    ("GET", "app.example.com", "/", FORGED),
    ("GET", "app.example.com", "/internal/x", []),
    ("GET", "app.example.com", "/internal/x", PROBE),
    ("GET", "app.example.com", "/internal/x", FORGED),
    ("GET", "tunnel.example.com", "/", []),
    ("GET", "tunnel.example.com", "/", PROBE),
    ("GET", "down.example.com", "/", []),
    ("GET", "down.example.com", "/", PROBE),
    ("GET", "empty.example.com", "/", PROBE),
    ("GET", "empty.example.com", "/", [("K-Network-Hash", "override")]),
    ("GET", "nowhere.example.org", "/", PROBE),
    ("OPTIONS", "app.example.com", "*", []),
    ("OPTIONS", "app.example.com", "*", PROBE),
]


def rule_index(match: str) -> str:
    """``"3"`` for ``rules[3].matches[0]``."""
    return match.split("]")[0].split("[")[1]


async def explained(admin: str, method: str, host: str, target: str,
                    headers: list[tuple[str, str]], entrance: str) -> dict[str, Any]:
    params = [("host", host), ("path", target), ("method", method),
              ("entrance", entrance)] + [("header", f"{n}:{v}") for n, v in headers]
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{admin}/debug/explain", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def printed(admin: str, method: str, host: str, target: str,
            headers: list[tuple[str, str]], entrance: str,
            capsys: pytest.CaptureFixture[str]) -> str:
    """``tunnelgate explain --admin`` (run in a thread: the proxy shares this loop)."""
    args = ["explain", "--admin", admin, "--host", host, "--path", target,
            "--method", method, "--entrance", entrance]
    args += [f"--header={name}:{value}" for name, value in headers]
    assert tunnelgate(args) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("scope", ["all", "probes", "scoped"])
async def test_explain_agrees_with_what_each_entrance_serves(scope: str, capsys) -> None:
    async with TestBackend() as echo:
        flags = ("--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0",
                 "--cluster-scope", scope)
        async with running(*flags, config=decision_config(echo.url)) as stack:
            ports = {"tunnel": stack.tunnel_port, "cluster": stack.cluster_port}
            outcomes = set()
            for method, host, target, headers in REQUESTS:
                for entrance, port in ports.items():
                    case = (scope, entrance, method, host, target, headers)
                    response = await ask(port, host, target, method=method,
                                         headers=headers)
                    served = served_by(response)
                    answer = await explained(stack.admin_url, method, host, target,
                                             headers, entrance)
                    decision = answer["decision"]
                    if decision["status"] == 0:  # forwarded: by the rule that won
                        said = rule_index(answer["winner"]["match"])
                    else:
                        said = str(decision["status"])
                    assert said == served, (case, answer["lines"])
                    capsys.readouterr()
                    text = await asyncio.to_thread(printed, stack.admin_url, method,
                                                   host, target, headers, entrance, capsys)
                    assert text.splitlines() == answer["lines"], case
                    found = RESULT.search(text)
                    if decision["kind"] in ("route", "unavailable"):
                        assert found is not None, text
                        assert found.group(1) == rule_index(answer["winner"]["match"])
                    outcomes.add((decision["kind"], decision["knative_probe"], served))
    # The table reaches every kind of decision in each scope it can.
    kinds = {kind for kind, _, _ in outcomes}
    assert {"route", "unavailable", "no_route", "server"} <= kinds
    assert ("forbidden" in kinds) is (scope == "probes")
    assert any(probe for _, probe, _ in outcomes)
