"""Knative probes and the proxy's own failures, and who may claim to be a probe.

Knative's prober retries on 404 and 503 but takes 500, 502 and 504 as "abandoned",
which it counts as ready. So a Knative probe (the probe header *and* a winning
``K-Network-Hash: override`` match) gets 503 for every failure the proxy generates
itself, while ordinary requests keep their usual statuses and a status the backend
sent passes through. Real sockets throughout: closed ports, backends that hang, answer
garbage, reset, or speak no TLS.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from routing.config import parse_config
from routing.table import Table
from tests.helpers import HOST, LoopbackServer, RawClient, TestBackend
from tests.knative import (
    QueueProxy, hash_filter, probe, probe_match, revision_filter, verdict)
from tests.stack import Stack, running

KNATIVE = "hello.default.example.com"
OTHER = "admin.example.com"  # a non-Knative route sharing the Gateway
DIGEST = "a" * 64


class Misbehaving(LoopbackServer):
    """A backend that fails every request one way: ``hang`` (reads, never answers),
    ``garbage`` (non-HTTP bytes), ``reset`` (RST right after the request) or
    ``status`` (answers ``status`` itself)."""

    def __init__(self, mode: str, status: int = 500) -> None:
        super().__init__()
        self.mode = mode
        self.status = status
        self.requests = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while await reader.read(65536):
                self.requests += 1
                if self.mode == "garbage":
                    writer.write(b"\x00\x01 not http at all\r\n\r\n")
                    await writer.drain()
                    return
                if self.mode == "reset":
                    sock = writer.get_extra_info("socket")
                    # Linger on, zero seconds: close() sends RST instead of FIN.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if self.mode == "status":
                    body = b"the backend's own words\n"
                    writer.write(f"HTTP/1.1 {self.status} Backend Says\r\nContent-Length: "
                                 f"{len(body)}\r\n\r\n".encode() + body)
                    await writer.drain()
        except ConnectionError:
            return
        finally:
            self._writers.discard(writer)
            writer.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def knative_route(backend: dict[str, Any], *, timeouts: dict[str, str] | None = None,
                  unavailable: int = 0, host: str = KNATIVE) -> list[dict[str, Any]]:
    """The probe copy of ``/`` and the plain rule of one Knative route to ``backend``."""
    backends = [] if not backend else [backend]
    common: dict[str, Any] = {"hostnames": [host], "backends": backends,
                              "timeouts": timeouts or {}}
    if unavailable:
        common["unavailableStatus"] = unavailable
    return [{**common, "matches": [probe_match()], "filters": [hash_filter(DIGEST)]},
            {**common, "matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}]


def backend(url: str, **extra: Any) -> dict[str, Any]:
    return {"url": url, "weight": 100, "filters": [revision_filter("hello-00001")], **extra}


async def get(port: int, host: str, extra: str = "", path: str = "/") -> Any:
    client = await RawClient.connect(port)
    try:
        client.send(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode())
        return await client.read_response()
    finally:
        client.close()


PROBE_HEADER = "K-Network-Probe: probe\r\n"
OVERRIDE = "K-Network-Hash: override\r\n"


async def probe_and_plain(stack: Stack) -> tuple[Any, Any, Any, Any]:
    """The prober's request, then the same request as ordinary ones: no headers,
    the override match alone (wins the probe rule, is no probe), the probe header
    alone (wins the plain rule)."""
    got = await probe(stack.cluster_port, KNATIVE)
    plain = await get(stack.cluster_port, KNATIVE)
    override_only = await get(stack.cluster_port, KNATIVE, OVERRIDE)
    header_only = await get(stack.cluster_port, KNATIVE, PROBE_HEADER)
    return got, plain, override_only, header_only


def probe_failures(metrics: str) -> dict[tuple[str, str], float]:
    return {(s.labels["hostname"], s.labels["reason"]): s.value
            for family in text_string_to_metric_families(metrics)
            for s in family.samples if s.name == "tunnelgate_knative_probe_failures_total"}


async def metrics_text(stack: Stack) -> str:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{stack.admin_url}/metrics")).text


@pytest.mark.parametrize("case,status,reason", [
    ("refused", 502, "dial"),
    ("unavailable", 500, "unavailable"),
    ("unavailable-503", 503, "unavailable"),
    ("rule-unavailable", 500, "unavailable"),
    ("no-backend", 500, "no_backend"),
    ("timeout", 504, "timeout"),
    ("garbage", 502, "other"),
    ("reset", 502, "other"),
    ("tls", 502, "tls"),
])
async def test_a_probe_gets_503_for_every_failure_of_the_proxy_own(case, status, reason):
    async with Misbehaving("hang") as hang, Misbehaving("garbage") as garbage, \
            Misbehaving("reset") as reset:
        rules = {
            "refused": knative_route(backend(f"http://{HOST}:{closed_port()}")),
            "unavailable": knative_route(backend(hang.url, unavailableStatus=500)),
            "unavailable-503": knative_route(backend(hang.url, unavailableStatus=503)),
            "rule-unavailable": knative_route(backend(hang.url), unavailable=500),
            "no-backend": knative_route({}),
            "timeout": knative_route(backend(hang.url), timeouts={"request": "300ms"}),
            "garbage": knative_route(backend(garbage.url)),
            "reset": knative_route(backend(reset.url)),
            # A plain-HTTP server behind an https:// URL: the handshake fails.
            "tls": knative_route(backend(f"https://{HOST}:{garbage.port}", tls={})),
        }[case]
        async with running("--listen", f"{HOST}:0", "--cluster-scope", "all",
                           config={"version": 1, "rules": rules}) as stack:
            got, plain, override_only, header_only = await probe_and_plain(stack)
            assert got.status == 503, (got.status, got.body)
            assert got.body.startswith(b"knative probe not ready: ")
            assert verdict(got, DIGEST) == "retry"
            # Ordinary requests, and requests that only look like probes, keep the
            # usual statuses.
            for answer in (plain, override_only, header_only):
                assert answer.status == status, answer
            failures = probe_failures(await metrics_text(stack))
            assert failures == {(KNATIVE, reason): 1.0}
        if "unavailable" in case:
            assert hang.requests == 0  # answered without dialing


async def test_a_status_the_backend_sent_passes_through_unchanged():
    pod = await QueueProxy("hello-00001").start()
    try:
        async with Misbehaving("status", 500) as failing:
            rules = (knative_route(backend(pod.url))
                     + knative_route(backend(failing.url), host="broken.default.example.com"))
            async with running("--listen", f"{HOST}:0",
                               config={"version": 1, "rules": rules}) as stack:
                assert verdict(await probe(stack.cluster_port, KNATIVE), DIGEST) == "ready"
                pod.draining = True  # queue-proxy while its pod terminates: 503, retry
                drained = await probe(stack.cluster_port, KNATIVE)
                assert (drained.status, drained.body) == (503, b"shutting down")
                # A backend's own 500 is its word, not ours: the prober decides.
                said = await probe(stack.cluster_port, "broken.default.example.com")
                assert (said.status, said.body) == (500, b"the backend's own words\n")
                assert probe_failures(await metrics_text(stack)) == {}
    finally:
        await pod.close()


# --------------------------------------------------------------------------- forged


def gateway_config(pod: QueueProxy, other: TestBackend, *, other_entrances=None,
                   catch_all: str | None = None) -> dict[str, Any]:
    """A Knative route (probe copy, an endpoint-probe rule, plain rule) and an
    ordinary route sharing the Gateway; optionally a cluster-only catch-all rule."""
    knative = knative_route(backend(pod.url))
    endpoint = {"hostnames": [KNATIVE],
                "matches": [probe_match("/.well-known/knative/revision/default/hello-00001")],
                "filters": [hash_filter("ep-" + DIGEST)], "backends": [backend(pod.url)]}
    ordinary: dict[str, Any] = {"hostnames": [OTHER],
                                "backends": [{"url": other.url, "weight": 1}]}
    if other_entrances is not None:
        ordinary["entrances"] = other_entrances
    rules = [knative[0], endpoint, knative[1], ordinary]
    if catch_all is not None:
        rules.append({"entrances": ["cluster"], "backends": [{"url": catch_all, "weight": 1}]})
    return {"version": 1, "rules": rules}


FORGED = [PROBE_HEADER, PROBE_HEADER + OVERRIDE,
          PROBE_HEADER + "User-Agent: Knative-Ingress-Probe\r\n" + OVERRIDE]


async def test_probes_scope_refuses_forged_probes_and_serves_real_ones():
    pod = await QueueProxy("hello-00001").start()
    try:
        async with TestBackend() as other:
            async with running("--listen", f"{HOST}:0", "--tunnel-listen", f"{HOST}:0",
                               "--cluster-scope", "probes",
                               config=gateway_config(pod, other)) as stack:
                for headers in FORGED:
                    refused = await get(stack.cluster_port, OTHER, headers)
                    assert refused.status == 403, headers
                    assert refused.header(b"content-type") == b"application/json"
                    assert json.loads(refused.body)["error"] == "forbidden"
                # The probe header alone wins the Knative route's plain rule: no probe.
                assert (await get(stack.cluster_port, KNATIVE, PROBE_HEADER)).status == 403
                # The override match without the probe header would reach the app.
                assert (await get(stack.cluster_port, KNATIVE, OVERRIDE)).status == 403
                assert other.requests == [] and pod.app_seen == []
                # Real probes pass on the `/` copy and on the endpoint-probe rule.
                assert verdict(await probe(stack.cluster_port, KNATIVE), DIGEST) == "ready"
                endpoint = await probe(stack.cluster_port, KNATIVE,
                                       "/.well-known/knative/revision/default/hello-00001")
                assert verdict(endpoint, "ep-" + DIGEST) == "ready"
                # A probe for a host this replica does not know yet: 404, retried
                # (a 403 would be "abandoned" = ready).
                unknown = await probe(stack.cluster_port, "new.default.example.com")
                assert unknown.status == 404
                # The tunnel entrance serves the ordinary route as before.
                assert (await get(stack.tunnel_port, OTHER, PROBE_HEADER)).status == 200
                assert len(other.requests) == 1
    finally:
        await pod.close()


async def test_scoped_mode_lets_probes_reach_probe_rules_only():
    pod = await QueueProxy("hello-00001").start()
    try:
        async with TestBackend() as other, TestBackend() as catch_all:
            config = gateway_config(pod, other, other_entrances=["tunnel"],
                                    catch_all=catch_all.url)
            async with running("--listen", f"{HOST}:0", "--tunnel-listen", f"{HOST}:0",
                               "--cluster-scope", "scoped", config=config) as stack:
                # The public Knative route's probe rules win over the cluster-only
                # catch-all for a probe ...
                assert verdict(await probe(stack.cluster_port, KNATIVE), DIGEST) == "ready"
                endpoint = await probe(stack.cluster_port, KNATIVE,
                                       "/.well-known/knative/revision/default/hello-00001")
                assert verdict(endpoint, "ep-" + DIGEST) == "ready"
                # ... but a forged probe never reaches a tunnel-only rule's backend:
                # it is served like any request of this entrance (the catch-all).
                for headers in FORGED:
                    forged = await get(stack.cluster_port, OTHER, headers)
                    assert forged.status == 200
                    assert forged.json()["headers"]  # the catch-all echoed it
                assert other.requests == [] and pod.app_seen == []
                assert len(catch_all.requests) == len(FORGED)
    finally:
        await pod.close()


@pytest.mark.parametrize("header, probe_rule", [
    ({"type": "Exact", "name": "K-Network-Hash", "value": "override"}, True),
    ({"type": "Exact", "name": "k-network-hash", "value": "override"}, True),
    ({"type": "Exact", "name": "K-Network-Hash", "value": "Override"}, False),
    ({"type": "RegularExpression", "name": "K-Network-Hash", "value": "override"}, False),
    ({"type": "Exact", "name": "K-Network-Probe", "value": "probe"}, False),
])
def test_the_table_knows_its_probe_matches(header: dict[str, str], probe_rule: bool) -> None:
    config = parse_config({"version": 1, "rules": [
        {"hostnames": [KNATIVE], "matches": [
            {"path": {"type": "PathPrefix", "value": "/"}, "headers": [header]},
            {"path": {"type": "PathPrefix", "value": "/plain"}}],
         "backends": [{"url": "http://127.0.0.1:9", "weight": 1}]}]})
    table = Table.compile(config)
    headers = [(header["name"].encode(), header["value"].encode())]
    hit = table.lookup(KNATIVE, "/", "", headers, "GET", "cluster")
    assert hit is not None and hit.knative_probe is probe_rule
    # The same rule's other match is no probe match.
    other = table.lookup(KNATIVE, "/plain", "", [], "GET", "cluster")
    assert other is not None and other.knative_probe is False
