"""``explain`` says what is true about the entrance: a file alone does not know how the
proxy runs, a running proxy does (``explain FILE`` in process, ``/debug/explain`` and
``explain --admin`` against a real Runtime on loopback)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from proxy.control.cli import main as tunnelgate
from tests.stack import running

OPEN = {"hostnames": ["a.example.com"], "backends": [{"url": "http://127.0.0.1:9", "weight": 1}]}
TUNNEL_ONLY = {**OPEN, "entrances": ["tunnel"]}


def first_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    capsys.readouterr()
    assert tunnelgate(argv) == 0
    return capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("rules, flags, via", [
    ([OPEN], [], "via any entrance (no rule names entrances)"),
    ([OPEN, TUNNEL_ONLY], [], "via the tunnel entrance (the default; --entrance cluster for "
                              "a standalone proxy or in-cluster callers)"),
    ([OPEN, TUNNEL_ONLY], ["--entrance", "cluster"], "via the cluster entrance"),
    ([OPEN], ["--entrance", "tunnel"], "via the tunnel entrance"),
])
def test_explain_file_says_what_the_file_can_tell(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], rules: list[dict],
        flags: list[str], via: str) -> None:
    path = tmp_path / "routes.json"
    path.write_text(json.dumps({"version": 1, "rules": rules}))
    line = first_line(capsys, ["explain", str(path), "--host", "a.example.com",
                               "--path", "/", *flags])
    assert f"query '' {via} (cluster scope " in line, line


# Flags of the running proxy, the entrance asked for (None: not given), and the line.
LIVE = [
    (["--listen", "127.0.0.1:0"], None, "via the cluster entrance"),
    (["--listen", "127.0.0.1:0"], "tunnel",
     "via the tunnel entrance (this proxy has none: it listens on cluster)"),
    (["--tunnel-listen", "127.0.0.1:0"], None, "via the tunnel entrance"),
    (["--tunnel-listen", "127.0.0.1:0"], "cluster",
     "via the cluster entrance (this proxy has none: it listens on tunnel)"),
    (["--tunnel-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"], "cluster",
     "via the cluster entrance"),
]


@pytest.mark.parametrize("flags, entrance, via", LIVE)
async def test_a_running_proxy_explains_by_the_entrances_it_has(
        capsys: pytest.CaptureFixture[str], flags: list[str], entrance: str | None,
        via: str) -> None:
    config = {"version": 1, "rules": [OPEN]}
    async with running(*flags, config=config) as stack:
        params = {"host": "a.example.com", "path": "/"}
        if entrance is not None:
            params["entrance"] = entrance
        async with httpx.AsyncClient(base_url=stack.admin_url) as admin:
            answer = (await admin.get("/debug/explain", params=params)).json()
        assert f"query '' {via} (cluster scope " in answer["lines"][0], answer["lines"][0]
        assert answer["entrance"] == (entrance or via.split()[2])
        argv = ["explain", "--admin", stack.admin_url, "--host", "a.example.com",
                "--path", "/"] + (["--entrance", entrance] if entrance else [])
        capsys.readouterr()
        status = await asyncio.to_thread(tunnelgate, argv)  # blocking: off the loop
        assert status == 0
        assert capsys.readouterr().out.splitlines() == answer["lines"]
