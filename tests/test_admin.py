"""The config API over a real listener: every PUT /config status, order of checks, readiness."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import AsyncIterator

import httpx
import pytest

from proxy.control.admin import MAX_CONFIG_BYTES, AdminApi, Readiness
from proxy.control.builds import Builds
from proxy.control.flags import add_serve_arguments
from proxy.control.resolve import from_args
from proxy.control.settings import Settings
from proxy.exchange.snapshot import Snapshot, SnapshotHolder
from proxy.entrances.listener import EntranceSettings, serve_entrance
from proxy.observability.metrics import Metrics
from routing.config import parse_config
from routing.model import Config
from routing.table import Table

TOKEN = "s3cret-token"
JSON = {"Content-Type": "application/json"}


def make_settings(env: dict[str, str]) -> Settings:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return from_args(parser.parse_args([]), env)


def wire(version: int, host: str = "app.example.com") -> dict:
    return {"version": version, "rules": [
        {"hostnames": [host], "backends": [{"url": "http://127.0.0.1:9", "weight": 1}]}]}


class Tunnel:
    """A stand-in for the cloudflared readiness source (only the latch is read)."""

    def __init__(self) -> None:
        self.ever_connected = False


class Admin:
    """An AdminApi on a real 127.0.0.1 listener, with an httpx client pointed at it."""

    def __init__(self, env: dict[str, str], tunnel: Tunnel | None = None) -> None:
        self.holder = SnapshotHolder(Snapshot(0, Config(0, (), False), Table.empty()))
        self.metrics = Metrics()
        self.readiness = Readiness(self.holder, tunnel)
        self.swapped: list[Snapshot] = []
        self.api = AdminApi(self.holder, self.metrics, make_settings(env), self.readiness,
                            builds=Builds(), on_swap=self._record)
        self.server: asyncio.AbstractServer | None = None
        self.client: httpx.AsyncClient | None = None

    async def _record(self, snapshot: Snapshot) -> None:
        self.swapped.append(snapshot)

    async def __aenter__(self) -> "Admin":
        self.server = await serve_entrance(self.api, EntranceSettings(name="admin"),
                                           host="127.0.0.1", port=0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}",
                                        timeout=5.0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.client is not None and self.server is not None
        await self.client.aclose()
        self.server.close()

    async def put(self, body: bytes | dict, token: str | None = TOKEN,
                  headers: dict[str, str] | None = None) -> httpx.Response:
        assert self.client is not None
        sent = dict(JSON if headers is None else headers)
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        content = json.dumps(body).encode() if isinstance(body, dict) else body
        return await self.client.put("/config", content=content, headers=sent)

    async def get(self, path: str, **kwargs: object) -> httpx.Response:
        assert self.client is not None
        return await self.client.get(path, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    async with Admin({"PROXY_AUTH_TOKEN": TOKEN}) as api:
        yield api


VERSION_ZERO = ("not ready: the config loaded has version 0; readiness needs a config "
                "with version > 0")


def assert_go_error(response: httpx.Response, status: int, message: str) -> None:
    """Go ``http.Error`` shape."""
    assert response.status_code == status
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.text == message + "\n"


async def test_push_then_get_config_and_swap_hook(admin: Admin) -> None:
    response = await admin.put(wire(7))
    assert response.status_code == 200 and response.content == b""
    got = await admin.get("/config", headers={"Authorization": f"Bearer {TOKEN}"})
    assert got.status_code == 200
    assert got.headers["content-type"] == "application/json"
    assert got.json() == {"version": 7, "ready": True}
    assert admin.holder.current.version == 7
    assert [s.version for s in admin.swapped] == [7]
    assert admin.holder.current.table.lookup(
        "app.example.com", "/", "", [], "GET", "tunnel") is not None


@pytest.mark.parametrize("authorization", [
    None, "Bearer wrong-token", "Bearer " + TOKEN + "x", "Basic " + TOKEN, "Bearer",
    TOKEN])
async def test_401_for_missing_or_wrong_token(admin: Admin,
                                              authorization: str | None) -> None:
    headers = dict(JSON)
    if authorization is not None:
        headers["Authorization"] = authorization
    response = await admin.put(wire(3), token=None, headers=headers)
    assert_go_error(response, 401, "unauthorized")
    get = await admin.get("/config", headers=headers)
    assert_go_error(get, 401, "unauthorized")
    assert admin.holder.current.version == 0


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer", "bEaReR"])
async def test_bearer_scheme_is_case_insensitive(admin: Admin, scheme: str) -> None:
    headers = {**JSON, "Authorization": f"{scheme} {TOKEN}"}
    response = await admin.put(wire(4), token=None, headers=headers)
    assert response.status_code == 200


async def test_401_is_checked_before_everything_else(admin: Admin) -> None:
    # Wrong media type, oversize and invalid body: still 401 first.
    response = await admin.put(b"x" * (MAX_CONFIG_BYTES + 1), token="nope",
                               headers={"Content-Type": "text/plain"})
    assert_go_error(response, 401, "unauthorized")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "json", "text/json"])
async def test_415_unless_content_type_is_json(admin: Admin, content_type: str | None) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = await admin.put(wire(5), headers=headers)
    assert response.status_code == 415
    assert response.text.endswith("\n")
    assert admin.holder.current.version == 0


async def test_content_type_with_parameters_is_accepted(admin: Admin) -> None:
    response = await admin.put(wire(5), headers={"Content-Type": "application/json; charset=utf-8"})
    assert response.status_code == 200


async def test_413_over_one_mebibyte_and_exactly_one_is_fine(admin: Admin) -> None:
    await admin.put(wire(2))
    body = json.dumps(wire(3)).encode()
    exact = body + b" " * (MAX_CONFIG_BYTES - len(body))
    assert len(exact) == MAX_CONFIG_BYTES
    assert (await admin.put(exact)).status_code == 200
    over = json.dumps(wire(4)).encode() + b" " * (MAX_CONFIG_BYTES - len(body) + 1)
    assert len(over) == MAX_CONFIG_BYTES + 1
    assert_go_error(await admin.put(over), 413, "config body exceeds maximum size")
    assert admin.holder.current.version == 3


async def test_413_for_a_chunked_body_stops_reading_past_the_cap(admin: Admin) -> None:
    """No Content-Length: the cap is enforced while streaming, and the rest of the
    body is never read (the client gets its answer before it finished sending)."""
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(64):  # 16 MiB at most, far past the cap
            sent += 256 * 1024
            yield b" " * (256 * 1024)

    assert admin.client is not None
    headers = {**JSON, "Authorization": f"Bearer {TOKEN}"}
    try:
        response = await admin.client.put("/config", content=endless(), headers=headers)
    except httpx.TransportError:
        response = None  # the server may close while we are still sending
    if response is not None:
        assert_go_error(response, 413, "config body exceeds maximum size")
    assert sent < 16 * 1024 * 1024
    assert admin.holder.current.version == 0


async def test_413_answered_from_content_length_alone(admin: Admin) -> None:
    """A declared length over the cap is refused before any body byte is read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", admin.port)
    writer.write(b"PUT /config HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
                 b"Content-Length: %d\r\n\r\n" % (MAX_CONFIG_BYTES + 1))
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 413 ")
    writer.close()


async def test_400_invalid_json(admin: Admin) -> None:
    response = await admin.put(b'{"version": 1, "rules": [')
    assert response.status_code == 400
    assert response.text.startswith("invalid JSON")


async def test_400_invalid_config_names_the_field(admin: Admin) -> None:
    bad = wire(9)
    bad["rules"][0]["matches"] = [{"path": {"type": "Foo", "value": "/"}}]
    response = await admin.put(bad)
    assert response.status_code == 400
    assert response.text.startswith("invalid config: rules[0].matches[0].path.type")
    bad_regex = wire(9)
    bad_regex["rules"][0]["matches"] = [{"path": {"type": "RegularExpression",
                                                  "value": "(unclosed"}}]
    response = await admin.put(bad_regex)
    assert response.status_code == 400  # RE2 compile during validation, not a 500
    assert "rules[0].matches[0].path" in response.text


async def test_409_stale_equal_reapplied_and_version_zero_trap(admin: Admin) -> None:
    assert (await admin.put(wire(10))).status_code == 200
    assert_go_error(await admin.put(wire(9)), 409, "stale config version")
    assert admin.holder.current.version == 10
    assert (await admin.put(wire(10, host="again.example.com"))).status_code == 200
    assert admin.holder.current.table.lookup(
        "again.example.com", "/", "", [], "GET", "tunnel") is not None
    # version 0 is accepted over a versioned table and un-readies the replica; /readyz
    # says why (a config is loaded: its version is the problem)
    assert (await admin.put(wire(0))).status_code == 200
    assert_go_error(await admin.get("/readyz"), 503, VERSION_ZERO)
    body = (await admin.get("/config", headers={"Authorization": f"Bearer {TOKEN}"})).json()
    assert body == {"version": 0, "ready": False}
    assert (await admin.put(wire(1))).status_code == 200  # any version ≥ 0 now wins
    assert [s.version for s in admin.swapped] == [10, 10, 0, 1]


async def test_old_config_keeps_serving_after_every_rejection(admin: Admin) -> None:
    assert (await admin.put(wire(20))).status_code == 200
    serving = admin.holder.current
    bad_config = wire(21)
    bad_config["rules"][0]["backends"][0]["weight"] = -1
    rejections = [
        (await admin.put(wire(21), token="wrong")).status_code,
        (await admin.put(wire(21), headers={"Content-Type": "text/plain"})).status_code,
        (await admin.put(b" " * (MAX_CONFIG_BYTES + 1))).status_code,
        (await admin.put(b"{nope")).status_code,
        (await admin.put(bad_config)).status_code,
        (await admin.put(wire(19))).status_code,
    ]
    assert rejections == [401, 415, 413, 400, 400, 409]
    assert admin.holder.current is serving
    assert [s.version for s in admin.swapped] == [20]
    assert admin.holder.current.table.lookup(
        "app.example.com", "/", "", [], "GET", "tunnel") is not None


async def test_healthz_and_readyz_transitions(admin: Admin) -> None:
    health = await admin.get("/healthz")
    assert health.status_code == 200 and health.content == b""
    assert_go_error(await admin.get("/readyz"), 503, "not ready: no config loaded")
    await admin.put(wire(0))
    assert_go_error(await admin.get("/readyz"), 503, VERSION_ZERO)
    await admin.put(wire(1))
    ready = await admin.get("/readyz")
    assert ready.status_code == 200 and ready.content == b""
    admin.readiness.draining = True
    assert_go_error(await admin.get("/readyz"), 503, "not ready: draining")
    assert (await admin.get("/healthz")).status_code == 200  # liveness is unaffected


def _weights(version: int, *weights: list[int | None]) -> dict:
    """A config with one rule per list, one backend per weight (None: no weight key)."""
    return {"version": version, "rules": [
        {"hostnames": [f"r{i}.example.com"],
         "backends": [{"url": "http://127.0.0.1:9", **({} if w is None else {"weight": w})}
                      for w in rule]} for i, rule in enumerate(weights)]}


def _unweighted_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [getattr(r, "rules") for r in caplog.records
            if r.levelname == "WARNING" and "backends all weigh 0" in r.getMessage()]


async def test_a_push_warns_once_naming_the_rules_whose_backends_all_weigh_0(
        admin: Admin, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        # rules[0] and rules[2] never pick a backend; rules[1] has one with weight
        pushed = _weights(1, [None], [0, 1], [0, None])
        assert (await admin.put(pushed)).status_code == 200  # accepted, as in Go
        assert _unweighted_warnings(caplog) == ["rules[0], rules[2]"]
        caplog.clear()
        assert (await admin.put(_weights(2, [1], [0, 1]))).status_code == 200
        assert _unweighted_warnings(caplog) == []
        # a config that did not come over HTTP (a file load) is warned about alike
        config = admin.holder.parse(json.dumps(_weights(3, [1], [None, None])))
        assert await admin.api.push(config, "routes.json")
        assert _unweighted_warnings(caplog) == ["rules[1]"]


@pytest.mark.parametrize("field, rule", [
    ("rules[0].hostnames[0]: invalid hostname 'aaaa",
     {"hostnames": ["a" * 1_000_000]}),
    ("rules[0].hostnames[0]: invalid hostname 'aaaa",
     {"hostnames": [".".join(["a" * 63] * 15_625)]}),
    ("rules[0].filters[0].requestHeaderModifier.set[0].value: header value is 1000000 "
     "characters long, more than the limit of 4096",
     {"filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {
         "set": [{"name": "X-Big", "value": "v" * 1_000_000}]}}]}),
    ("rules[0].matches[0].path.type: unknown path match type \"TTTT",
     {"matches": [{"path": {"type": "T" * 1_000_000, "value": "/"}}]}),
], ids=["hostname", "labels", "header-value", "echoed-type"])
async def test_a_huge_value_gets_a_short_400_naming_the_field(
        admin: Admin, field: str, rule: dict) -> None:
    assert (await admin.put(wire(1))).status_code == 200
    serving = admin.holder.current
    bad = {"version": 2, "rules": [
        {"backends": [{"url": "http://127.0.0.1:9", "weight": 1}], **rule}]}
    response = await admin.put(bad)
    assert response.status_code == 400
    assert response.text.startswith(f"invalid config: {field}")
    assert len(response.content) < 1000  # the value is clipped, never echoed whole
    assert admin.holder.current is serving


async def test_readyz_waits_for_the_tunnel_and_latches() -> None:
    tunnel = Tunnel()
    async with Admin({}, tunnel=tunnel) as api:
        await api.put(wire(5), token=None)
        assert_go_error(await api.get("/readyz"), 503,
                        "not ready: tunnel not connected to edge")
        assert (await api.get("/config")).json() == {"version": 5, "ready": False}
        tunnel.ever_connected = True
        assert (await api.get("/readyz")).status_code == 200
        tunnel.ever_connected = False  # the latch holds
        assert (await api.get("/readyz")).status_code == 200
        assert (await api.get("/config")).json() == {"version": 5, "ready": True}


async def test_without_token_the_api_is_open() -> None:
    async with Admin({}) as api:
        assert (await api.put(wire(2), token=None)).status_code == 200
        assert (await api.get("/config")).json()["version"] == 2


async def test_405_with_allow_and_404(admin: Admin) -> None:
    assert admin.client is not None
    response = await admin.client.post("/config", content=b"{}", headers=JSON)
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD, PUT"
    response = await admin.client.delete("/healthz")
    assert response.status_code == 405 and response.headers["allow"] == "GET, HEAD"
    response = await admin.client.put("/readyz")
    assert response.status_code == 405
    assert (await admin.get("/nope")).status_code == 404
    assert (await admin.get("/config/")).status_code == 404
    head = await admin.client.head("/healthz")
    assert head.status_code == 200


async def test_metrics_is_unauthenticated_and_can_be_disabled(admin: Admin) -> None:
    admin.metrics.request_started()
    admin.metrics.request_finished("app.example.com", 200, 0.01, 0, 5)
    response = await admin.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'cftunnel_proxy_requests_total{hostname="app.example.com",status_class="2xx"} 1.0' \
        in response.text
    async with Admin({"PROXY_METRICS_ENABLED": "false"}) as off:
        assert (await off.get("/metrics")).status_code == 404


async def test_concurrent_pushes_never_go_backwards(admin: Admin) -> None:
    """Pushes are serialised: whatever order they land in, the newest version wins and
    every loser got 409."""
    results = await asyncio.gather(*(admin.put(wire(v)) for v in (5, 3, 8, 6, 2)))
    codes = {v: r.status_code for v, r in zip((5, 3, 8, 6, 2), results)}
    assert admin.holder.current.version == 8
    assert codes[8] == 200
    assert set(codes.values()) <= {200, 409}
    versions = [s.version for s in admin.swapped]
    assert versions == sorted(versions)


def test_readiness_without_tunnel_is_latched_from_start() -> None:
    holder = SnapshotHolder(Snapshot(0, Config(0, (), False), Table.empty()))
    readiness = Readiness(holder)
    assert readiness.reason() == "not ready: no config loaded"
    holder.swap(Snapshot.build(Config(3, (), False)))
    assert readiness.ready


@pytest.mark.parametrize("opening, closing", [(b"[", b"]"), (b'{"a":', b"}")])
async def test_400_for_json_nested_100000_levels_and_no_error_logged(
        admin: Admin, caplog: pytest.LogCaptureFixture, opening: bytes,
        closing: bytes) -> None:
    depth = 100_000
    with caplog.at_level("INFO"):
        response = await admin.put(opening * depth + b"1" + closing * depth)
    assert_go_error(response, 400,
                    "invalid JSON: nested too deeply (arrays or objects inside each other)")
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert admin.holder.current.version == 0  # nothing changed


async def test_a_push_never_takes_apart_a_table_a_reader_still_walks(admin: Admin) -> None:
    # /debug/routes walks the served table in a worker thread (SnapshotHolder.lend);
    # a push meanwhile must leave that table whole, and release the next one it replaces.
    assert (await admin.put(wire(1, "one.example.com"))).status_code == 200
    walked = admin.holder.lend()
    assert (await admin.put(wire(2, "two.example.com"))).status_code == 200
    assert walked.table.rules_count == 1
    assert walked.table.lookup("one.example.com", "/", "", [], "GET", "tunnel") is not None
    admin.holder.give_back(walked)
    second = admin.holder.current.table
    assert (await admin.put(wire(3, "three.example.com"))).status_code == 200
    assert second.rules_count == 0  # nobody read it: released in steps as before
    assert walked.table.rules_count == 1  # freed whole by its reader, never emptied


def test_swap_hands_back_only_a_table_nobody_borrowed() -> None:
    first = Snapshot.build(parse_config(wire(1)))
    holder = SnapshotHolder(first)
    lent, again = holder.lend(), holder.lend()
    assert lent is again is first
    assert holder.swap(Snapshot.build(parse_config(wire(2)))) is None
    holder.give_back(lent)
    third = Snapshot.build(parse_config(wire(3)))
    replaced = holder.swap(third)
    assert replaced is not None and replaced is not first.table  # the second's table
    holder.give_back(again)
    assert holder.swap(third) is None  # the same snapshot again: nothing replaced
