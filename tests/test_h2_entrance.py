"""HTTP/2 on the entrances (issue 41): prior knowledge on the same port as HTTP/1.1,
the same Handler behind it, to HTTP/1.1 and h2c backends, over real loopback sockets."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.h2client import H2Client
from tests.helpers import HOST, RawClient, TestBackend, on_uvloop
from tests.stack import running

LISTEN = ("--listen", f"{HOST}:0")


def _config(url: str, protocol: str | None = None) -> dict:
    backend: dict = {"url": url, "weight": 1}
    if protocol:
        backend["protocol"] = protocol
    return {"version": 1, "rules": [{"backends": [backend]}]}


@on_uvloop
async def test_prior_knowledge_and_http1_share_the_port() -> None:
    async with TestBackend() as backend, running(*LISTEN, config=_config(backend.url)) as stack:
        client = await H2Client.connect(stack.cluster_port)
        try:
            reply = await client.request("POST", "/echo?a=1", [(b"x-test", b"yes")], b"hello")
        finally:
            client.close()
        assert reply.status == 200
        seen = json.loads(bytes(reply.body))
        assert seen["path"] == "/echo" and seen["query"] == "a=1" and seen["body"] == "hello"
        assert ["x-test", "yes"] in seen["headers"]
        raw = await RawClient.connect(stack.cluster_port)
        raw.send(b"GET /echo HTTP/1.1\r\nHost: example.test\r\n\r\n")
        response = await raw.read_response()
        raw.close()
        assert response.status == 200
