"""Every config apply is visible: counted by source and result, the last attempt's
outcome as gauges, and the last rejection's message in ``GET /debug/config``
(``tunnelgate serve`` as a real subprocess; reloads by SIGHUP and ``--watch-config``,
pushes over the config API)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_cli import Served, backend_config
from tests.test_reload import write

TOKEN = "attempts-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# A path match type no parser knows, its name long enough that an unclipped message
# would carry all of it.
BROKEN = {"version": 9, "rules": [{"matches": [{"path": {"type": "Foo" + "x" * 20_000}}]}]}


async def scrape(served: Served) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = (await served.admin.get("/metrics")).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("tunnelgate_config_")}


def applies(source: str, result: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return ("tunnelgate_config_applies_total", (("result", result), ("source", source)))


SUCCESSFUL = ("tunnelgate_config_last_attempt_successful", ())


async def until_counted(served: Served, key: tuple, count: float,
                        timeout: float = 15) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples = await scrape(served)
        if samples.get(key, 0) >= count:
            return samples
        await asyncio.sleep(0.1)
    raise AssertionError(f"{key} never reached {count}: {await scrape(served)}")


async def debug_config(served: Served) -> dict:
    response = await served.admin.get("/debug/config", headers=AUTH)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize("trigger", ["sighup", "watch"])
async def test_a_rejected_file_reload_is_counted_and_explained(tmp_path: Path,
                                                               trigger: str) -> None:
    path = tmp_path / "routes.json"
    write(path, 9000, version=1)
    extra = ["--watch-config"] if trigger == "watch" else []
    async with Served("--config", str(path), *extra,
                      env={"PROXY_AUTH_TOKEN": TOKEN}) as served:
        samples = await scrape(served)
        assert samples[applies("file", "applied")] == 1 and samples[SUCCESSFUL] == 1
        assert (await served.admin.get("/debug/config")).status_code == 401
        state = await debug_config(served)
        assert state["serving"]["source"] == "file" and state["serving"]["version"] == 1
        assert state["last_rejection"] is None

        path.write_text(json.dumps(BROKEN))
        if trigger == "sighup":
            served.signal(signal.SIGHUP)
        samples = await until_counted(served, applies("file", "rejected"), 1)
        assert samples[SUCCESSFUL] == 0
        assert samples[("tunnelgate_config_version", ())] == 1  # the old one serves
        assert samples.get(("tunnelgate_config_pushes_total",
                            (("result", "rejected"), ("status", "400")))) is None
        state = await debug_config(served)
        rejection = state["last_rejection"]
        assert state["last_attempt"] == rejection and rejection["source"] == "file"
        assert rejection["result"] == "rejected" and rejection["at"].endswith("Z")
        message = rejection["message"]
        assert message.startswith(f"{path}: rules[0].matches[0].path.type: "), message
        assert len(message) < 700 and "more characters" in message  # clipped
        assert state["serving"]["version"] == 1

        write(path, 9000, version=2)  # fixed: the next reload applies and says so
        if trigger == "sighup":
            served.signal(signal.SIGHUP)
        samples = await until_counted(served, applies("file", "applied"), 2)
        assert samples[SUCCESSFUL] == 1
        state = await debug_config(served)
        assert state["serving"]["version"] == 2 and state["last_rejection"] == rejection


async def test_pushes_are_counted_beside_the_pushes_total_they_keep(tmp_path: Path) -> None:
    async with Served(env={"PROXY_AUTH_TOKEN": TOKEN}) as served:
        assert (await scrape(served))[SUCCESSFUL] == 1  # nothing has failed yet
        assert (await served.push(backend_config(9000, 3), TOKEN)).status_code == 200
        assert (await served.push(BROKEN, TOKEN)).status_code == 400
        samples = await scrape(served)
        assert samples[applies("push", "applied")] == 1
        assert samples[applies("push", "rejected")] == 1
        assert samples[SUCCESSFUL] == 0
        assert samples[("tunnelgate_config_pushes_total",
                        (("result", "applied"), ("status", "200")))] == 1
        assert samples[("tunnelgate_config_pushes_total",
                        (("result", "rejected"), ("status", "400")))] == 1
        assert (await served.push(backend_config(9000, 2), TOKEN)).status_code == 409
        assert (await served.push(backend_config(9000, 4), "wrong")).status_code == 401
        samples = await scrape(served)
        # A stale push is an attempt; an unauthenticated request is not one.
        assert samples[applies("push", "rejected")] == 2
        state = await debug_config(served)
        assert state["last_attempt"]["message"] == "409 stale config version"
        assert state["serving"] == {"source": "push", "version": 3, "result": "applied",
                                    "at": state["serving"]["at"]}
        assert samples[("tunnelgate_config_last_attempt_timestamp_seconds", ())] >= (
            samples[("tunnelgate_config_last_applied_timestamp_seconds", ())])
