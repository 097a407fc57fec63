"""Graceful drain of open client connections, in-process through the
real composition root: ``Runtime.drain()`` on a stack with a cluster and a tunnel
entrance in front of a real backend.

- cluster entrance: at the start of the drain an idle keep-alive connection is closed
  at once, and a request in flight completes, says ``Connection: close`` and then its
  connection ends;
- tunnel entrance: it keeps serving keep-alive requests while requests drain (cloudflared
  still forwards what the edge accepted), and its idle connections are closed when
  the drain closes that entrance.
"""

from __future__ import annotations

import asyncio
import time

from tests.helpers import RawClient, TestBackend
from tests.stack import HOST, running

APP = "app.example.com"
SLOW = 0.6  # seconds the backend takes for the in-flight request


def get(path: str, *extra: bytes) -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (
        path.encode(), APP.encode(), b"".join(extra))


def config(backend_url: str) -> dict:
    return {"version": 2, "rules": [{"hostnames": [APP],
                                     "backends": [{"url": backend_url, "weight": 1}]}]}


async def test_drain_closes_idle_connections_and_ends_busy_ones_after_their_response(
        ) -> None:
    async with TestBackend() as backend, running(
            "--listen", f"{HOST}:0", "--tunnel-listen", f"{HOST}:0", "--cluster-scope", "all",
            "--grace-period", "5s", config=config(backend.url)) as stack:
        idle = await RawClient.connect(stack.cluster_port)
        idle.send(get("/first"))
        assert (await idle.read_response()).status == 200  # now idle, kept alive
        tunnel = await RawClient.connect(stack.tunnel_port)
        edge = b"CF-Connecting-IP: 203.0.113.7\r\n"
        tunnel.send(get("/first", edge))
        assert (await tunnel.read_response()).status == 200
        busy = await RawClient.connect(stack.cluster_port)
        busy.send(get(f"/slow?delay={SLOW}"))
        while len(backend.requests) < 3:  # the slow request reached the backend
            await asyncio.sleep(0.01)

        started = time.monotonic()
        drain = asyncio.create_task(stack.runtime.drain())
        assert await idle.closed(timeout=1.0)
        assert time.monotonic() - started < SLOW / 2, "idle connection not closed at once"

        # While the in-flight request drains, the tunnel entrance still serves on its
        # open keep-alive connection (cloudflared forwards what the edge accepted).
        tunnel.send(get("/during-drain", edge))
        during = await tunnel.read_response()
        assert during.status == 200 and during.header(b"connection") is None

        answer = await busy.read_response()
        assert answer.status == 200 and answer.json()["path"] == "/slow"
        assert answer.header(b"connection") == b"close"
        assert await busy.closed(timeout=1.0)

        assert await asyncio.wait_for(drain, 5.0) is True
        assert await tunnel.closed(timeout=1.0), "tunnel idle connection left open"
        paths = [seen.target.partition("?")[0] for seen in backend.requests]
        assert sorted(paths) == ["/during-drain", "/first", "/first", "/slow"]
        for client in (idle, busy, tunnel):
            client.close()


async def test_a_head_arriving_during_the_drain_is_answered_with_connection_close(
        ) -> None:
    async with TestBackend() as backend, running(
            "--listen", f"{HOST}:0", "--grace-period", "5s",
            config=config(backend.url)) as stack:
        client = await RawClient.connect(stack.cluster_port)
        request = get("/partial")
        client.send(request[:10])  # part of a head: this connection is not idle
        await asyncio.sleep(0.05)
        holder = await RawClient.connect(stack.cluster_port)
        holder.send(get(f"/slow?delay={SLOW}"))  # keeps the drain waiting
        while not backend.requests:
            await asyncio.sleep(0.01)
        drain = asyncio.create_task(stack.runtime.drain())
        await asyncio.sleep(0.05)
        client.send(request[10:])
        answer = await client.read_response()
        assert answer.status == 200 and answer.json()["path"] == "/partial"
        assert answer.header(b"connection") == b"close"
        assert await client.closed(timeout=1.0)
        assert (await holder.read_response()).header(b"connection") == b"close"
        assert await asyncio.wait_for(drain, 5.0) is True
        for c in (client, holder):
            c.close()
