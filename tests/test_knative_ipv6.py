"""IPv6 and dual-stack listening, as an IPv6-primary cluster needs it.

Such a cluster lists the proxy pod's IPv6 address in its Endpoints, so both the kubelet
(admin port) and Knative's prober (cluster entrance) dial it. ``:PORT`` and
``[::]:PORT`` bind one ``::`` socket with IPV6_V6ONLY off, reachable over IPv4 and
IPv6; ``[::1]:PORT`` binds that address only. Skipped only where ``::1`` cannot be
bound at all.
"""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from proxy.control.settings import Address, parse_address
from tests.helpers import RawClient, TestBackend
from tests.knative import (
    QueueProxy, has_ipv6_loopback, hash_filter, probe, probe_match, proxy_v2_header,
    revision_filter, verdict)
from tests.stack import running
from tests.test_workers import Supervisor

pytestmark = pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no ::1")

KNATIVE = "hello.default.example.com"
DIGEST = "b" * 64


def knative_config(url: str) -> dict:
    backends = [{"url": url, "weight": 100, "filters": [revision_filter("hello-00001")]}]
    return {"version": 1, "rules": [
        {"hostnames": [KNATIVE], "matches": [probe_match()],
         "filters": [hash_filter(DIGEST)], "backends": backends},
        {"hostnames": [KNATIVE], "backends": backends}]}


def echo_config(url: str) -> dict:
    return {"version": 1, "rules": [{"backends": [{"url": url, "weight": 1}]}]}


@pytest.mark.parametrize("text, expected", [
    (":8080", Address(None, 8080)), ("[::]:8080", Address("::", 8080)),
    ("[::1]:8080", Address("::1", 8080)), ("0.0.0.0:8080", Address("0.0.0.0", 8080))])
def test_listen_addresses(text: str, expected: Address) -> None:
    assert parse_address(text, "--listen") == expected


async def forwarded_for(port: int, loopback: str, preface: bytes = b"") -> str:
    """The X-Forwarded-For the echo backend saw for one request from ``loopback``."""
    client = await RawClient.connect(port, host=loopback)
    try:
        client.send(preface + b"GET /echo HTTP/1.1\r\nHost: a.example.com\r\n\r\n")
        response = await client.read_response()
    finally:
        client.close()
    assert response.status == 200, response
    return {n.lower(): v for n, v in response.json()["headers"]}["x-forwarded-for"]


@pytest.mark.parametrize("listen", [":0", "[::]:0"])
async def test_every_interface_is_one_dual_stack_socket(listen: str) -> None:
    async with TestBackend() as backend:
        async with running("--listen", listen, "--admin", listen, "--cluster-scope", "all",
                           config=echo_config(backend.url)) as stack:
            for server in (stack.runtime.plane.servers["cluster"], stack.runtime.admin_server):
                (sock,) = server.sockets
                assert sock.family == socket.AF_INET6
                assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
            for loopback in ("127.0.0.1", "::1"):
                # IPv4 peers arrive as ::ffff:127.0.0.1 and are reported as plain IPv4.
                assert await forwarded_for(stack.cluster_port, loopback) == loopback
                url = f"http://{'[::1]' if loopback == '::1' else loopback}:" \
                      f"{stack.listening.admin.port}/healthz"
                async with httpx.AsyncClient() as client:
                    assert (await client.get(url)).status_code == 200


async def test_ipv6_loopback_only_is_not_reachable_over_ipv4() -> None:
    async with running("--listen", "[::1]:0", "--admin", "[::1]:0") as stack:
        with pytest.raises(OSError):
            await RawClient.connect(stack.cluster_port, host="127.0.0.1")
        client = await RawClient.connect(stack.cluster_port, host="::1")
        client.close()


@pytest.mark.parametrize("scope", ["all", "probes"])
@pytest.mark.parametrize("proxy_protocol", [False, True])
async def test_a_probe_over_ipv6_is_ready(scope: str, proxy_protocol: bool) -> None:
    pod = await QueueProxy("hello-00001", host="::1").start()
    flags = ["--listen", "[::1]:0", "--admin", ":0", "--cluster-scope", scope]
    if proxy_protocol:
        flags.append("--cluster-proxy-protocol")
    try:
        async with running(*flags, config=knative_config(pod.url)) as stack:
            result = await probe(stack.cluster_port, KNATIVE, loopback="::1",
                                 proxy_protocol=proxy_protocol)
            assert verdict(result, DIGEST) == "ready", result
        (seen,) = pod.seen
        assert seen.headers["k-network-hash"] == DIGEST
        assert seen.headers["knative-serving-revision"] == "hello-00001"
    finally:
        await pod.close()


@pytest.mark.parametrize("loopback", ["127.0.0.1", "::1"])
async def test_proxy_v2_tcp6_header_names_the_client(loopback: str) -> None:
    async with TestBackend() as backend:
        async with running("--listen", ":0", "--admin", ":0", "--cluster-scope", "all",
                           "--cluster-proxy-protocol", config=echo_config(backend.url)) as stack:
            header = proxy_v2_header(("2001:db8::7", 4242), ("2001:db8::1", 80))
            assert header[13] == 0x21  # TCP over IPv6
            assert await forwarded_for(stack.cluster_port, loopback, header) == "2001:db8::7"
            # The prober's form, TCP over IPv4, is read on the same dual-stack socket.
            header = proxy_v2_header(("10.1.2.3", 4242), ("10.1.2.4", 80))
            assert await forwarded_for(stack.cluster_port, loopback, header) == "10.1.2.3"


async def test_workers_bind_every_interface_dual_stack() -> None:
    supervisor = Supervisor("--cluster-scope", "all")
    port = supervisor.port
    where = supervisor.args.index(f"127.0.0.1:{port}")  # its default --listen
    supervisor.args[where] = f":{port}"
    async with TestBackend() as backend:
        async with supervisor as served:
            assert (await served.push(echo_config(backend.url))).status_code == 200
            await served.workers()
            for loopback in ("127.0.0.1", "::1"):
                for _ in range(4):  # either worker may accept
                    assert await asyncio.wait_for(forwarded_for(port, loopback), 10) == loopback
