"""Acceptance, end to end: config pushes over the real admin listener while the proxy
serves.

Every rejected push must leave the previous table serving; accepted pushes swap
atomically under concurrent keep-alive traffic without a single failed request; and
backend keep-alive connections outlive a push that keeps their backend.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from tests.helpers import RawClient, TestBackend
from tests.stack import Stack, running
from tests.test_e2e_routing import LISTEN, ask, prefix, request_bytes, rule, served_by

TOKEN = "e2e-secret-token"


async def admin_put(stack: Stack, body: bytes, *, token: str | None = TOKEN,
                    content_type: str = "application/json") -> httpx.Response:
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with httpx.AsyncClient() as client:
        return await client.put(f"{stack.admin_url}/config", content=body, headers=headers)


async def current_version(stack: Stack) -> int:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{stack.admin_url}/config",
                                    headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    return response.json()["version"]


def tagged_config(version: int, name: str, url: str) -> dict[str, Any]:
    return {"version": version, "rules": [rule(name, url)]}


async def test_every_rejected_push_leaves_the_old_config_serving():
    async with TestBackend() as echo:
        async with running(*LISTEN, environ={"PROXY_AUTH_TOKEN": TOKEN}) as stack:
            valid = json.dumps(tagged_config(5, "old", echo.url)).encode()
            assert (await admin_put(stack, valid)).status_code == 200
            negative = tagged_config(9, "bad", echo.url)
            negative["rules"][0]["backends"][0]["weight"] = -1
            bad_regex = tagged_config(9, "bad", echo.url)
            bad_regex["rules"][0]["matches"] = [
                {"path": {"type": "RegularExpression", "value": "/(unclosed"}}]
            newer = json.dumps(tagged_config(9, "new", echo.url)).encode()
            rejections = [
                ({"token": None}, newer, 401, "unauthorized"),
                ({"token": "wrong-token"}, newer, 401, "unauthorized"),
                ({"content_type": "text/plain"}, newer, 415, ""),
                ({}, newer[:-1] + b" " * (1 << 20) + b"}", 413, "exceeds maximum size"),
                ({}, b'{"version": 9, "rules": [', 400, "invalid JSON"),
                ({}, json.dumps(negative).encode(), 400, "rules[0].backends[0].weight"),
                ({}, json.dumps(bad_regex).encode(), 400, "rules[0].matches[0].path.value"),
                ({}, json.dumps(tagged_config(4, "stale", echo.url)).encode(), 409,
                 "stale config version"),
            ]
            for options, body, status, needle in rejections:
                response = await admin_put(stack, body, **options)
                assert response.status_code == status, (status, response.text)
                assert needle in response.text, response.text
                assert served_by(await ask(stack.cluster_port, "c.test")) == "old", status
                assert await current_version(stack) == 5
            assert (await admin_put(stack, newer)).status_code == 200
            assert served_by(await ask(stack.cluster_port, "c.test")) == "new"
            assert await current_version(stack) == 9


def generation(version: int, url: str) -> dict[str, Any]:
    """Config ``version``: ``/stream`` still routed (tagged with the version), amid a
    table that changes shape from push to push."""
    others = [rule(f"other-{version}-{i}", url, hosts=[f"h{i}.test"],
                   matches=[prefix(f"/p{version}")]) for i in range(version % 4)]
    return {"version": version, "rules": [
        *others, rule(str(version), url, matches=[prefix("/stream")])]}


async def test_pushes_during_keepalive_traffic_never_fail_a_request():
    clients, per_client, pushes = 4, 500, 20
    async with TestBackend() as echo:
        async with running(*LISTEN, config=generation(1, echo.url)) as stack:
            async def client_run() -> list[int]:
                client = await RawClient.connect(stack.cluster_port)
                seen = []
                for i in range(per_client):
                    client.send(request_bytes("GET", f"/stream/{i}", "s.test"))
                    seen.append(int(served_by(await client.read_response())))
                client.close()
                return seen

            async def push_run() -> None:
                for version in range(2, pushes + 2):
                    assert (await stack.push(generation(version, echo.url))).status_code == 200
                    await asyncio.sleep(0.01)

            *seen, _ = await asyncio.gather(*(client_run() for _ in range(clients)),
                                            push_run())
            final = served_by(await ask(stack.cluster_port, "s.test", "/stream/last"))
        assert final == str(pushes + 1)
        for versions in seen:
            assert len(versions) == per_client
            assert versions == sorted(versions)  # a client never goes back in time
        assert len({v for versions in seen for v in versions}) > 2  # swaps hit traffic


async def test_backend_keepalive_survives_a_push_and_is_pruned_with_its_backend():
    async with TestBackend() as echo, TestBackend() as other:
        async with running(*LISTEN, config=tagged_config(1, "a", echo.url)) as stack:
            port = stack.cluster_port
            for _ in range(5):
                assert served_by(await ask(port, "k.test")) == "a"
            assert (await stack.push(tagged_config(2, "b", echo.url))).status_code == 200
            for _ in range(5):
                assert served_by(await ask(port, "k.test")) == "b"
            assert echo.connections == 1  # one upstream connection across the push
            assert {seen.connection for seen in echo.requests} == {1}
            # A push without this backend closes its idle connections...
            assert (await stack.push(tagged_config(3, "c", other.url))).status_code == 200
            assert served_by(await ask(port, "k.test")) == "c"
            # ...so bringing it back dials afresh.
            assert (await stack.push(tagged_config(4, "d", echo.url))).status_code == 200
            assert served_by(await ask(port, "k.test")) == "d"
            assert echo.requests[-1].connection == 2


async def test_in_flight_exchanges_finish_when_a_push_removes_their_backend():
    async with TestBackend() as old, TestBackend() as new:
        async with running(*LISTEN, config=tagged_config(1, "old", old.url)) as stack:
            port = stack.cluster_port
            streaming = asyncio.ensure_future(
                ask(port, "s.test", "/chunked?size=20000&chunk=1000&delay=0.02"))
            waiting = asyncio.ensure_future(ask(port, "s.test", "/slow?delay=0.3"))
            await asyncio.sleep(0.1)  # both are now inside the proxy
            assert (await stack.push(tagged_config(2, "new", new.url))).status_code == 200
            streamed, answered = await streaming, await waiting
            assert (streamed.status, streamed.body) == (200, b"x" * 20000)
            assert served_by(answered) == "old"  # the snapshot it started with
            assert served_by(await ask(port, "s.test")) == "new"
