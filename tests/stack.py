"""A whole tunnelgate running in the test's event loop, built by the real composition
root (``proxy.control.runtime.Runtime``) from real CLI flags, listening on loopback ports."""

from __future__ import annotations

import argparse
import json
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Mapping

import httpx

from proxy.control.runtime import Listening, Runtime
from proxy.control.flags import add_serve_arguments
from proxy.control.resolve import from_args
from proxy.control.settings import Settings

HOST = "127.0.0.1"


def make_settings(*flags: str, environ: Mapping[str, str] | None = None) -> Settings:
    """Settings exactly as ``tunnelgate serve <flags>`` would resolve them."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return from_args(parser.parse_args(list(flags)), environ or {})


class Stack:
    """A started Runtime plus helpers to push configs and reach its entrances."""

    def __init__(self, runtime: Runtime, listening: Listening) -> None:
        self.runtime = runtime
        self.listening = listening

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.listening.admin.port}"

    @property
    def cluster_port(self) -> int:
        cluster = self.listening.cluster
        assert cluster is not None and cluster.port is not None, "no cluster entrance"
        return cluster.port

    @property
    def tls_port(self) -> int:
        tls = self.listening.tls
        assert tls is not None and tls.port is not None, "no TLS entrance"
        return tls.port

    @property
    def tunnel_port(self) -> int:
        tunnel = self.listening.tunnel
        assert tunnel is not None and tunnel.port is not None, "no tunnel entrance"
        return tunnel.port

    async def push(self, config: Mapping[str, Any] | bytes, *,
                   token: str | None = None) -> httpx.Response:
        """PUT /config over the real admin listener."""
        body = config if isinstance(config, bytes) else json.dumps(config).encode()
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        async with httpx.AsyncClient() as client:
            return await client.put(f"{self.admin_url}/config", content=body,
                                    headers=headers)


@asynccontextmanager
async def running(*flags: str, config: Mapping[str, Any] | None = None,
                  environ: Mapping[str, str] | None = None) -> AsyncIterator[Stack]:
    """Run tunnelgate with ``flags`` (admin on a free port unless given); push
    ``config`` first if given (asserting it was accepted)."""
    if "--admin" not in flags:
        flags = (*flags, "--admin", f"{HOST}:0")
    runtime = Runtime(make_settings(*flags, environ=environ))
    listening = await runtime.start()
    stack = Stack(runtime, listening)
    try:
        if config is not None:
            response = await stack.push(config)
            assert response.status_code == 200, response.text
        yield stack
    finally:
        await runtime.close()
