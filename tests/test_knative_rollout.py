"""A whole Knative rollout against two tunnelgate replicas, as net-gateway-api runs it.

ksvc ``hello`` rolls out from ``hello-1`` (100 %, tag ``latest``) to a 50/50 split
with ``hello-10`` (tag ``latest`` → ``hello-10``). The two revision names are chosen so
that one is a prefix of the other: the endpoint probe of ``hello-1`` must never reach
``hello-10`` (Gateway API path prefixes match whole segments). The KIngress has four
rules (external and cluster-local, for the service and for the tag), so four
HTTPRoutes; the rollout goes through four probe versions (:func:`tests.knative.rollout`):
plain hash, ``ep-`` (endpoint probes for the new and old revisions, old splits),
``tr-`` (new splits), plain hash.

For every version the config is pushed to one replica first. The other, stale one must
answer each new probe URL so that the prober retries (200 with its old hash, 404 or
503), never with an answer the prober takes as "abandoned" (= ready). Then it gets the
push too and every URL on every replica must become ready. Probe URLs are derived from
the pushed rules as the reconciler derives them (``/`` and each
``/.well-known/knative/revision/<ns>/<rev>`` path, on every external hostname and the
longest cluster-local one). Before the last version a few hundred idle prober
connections are left open on a replica, and the last probes must still answer within
the prober's 1 s budget.

Push-to-ready latency per version is printed (``pytest -s``): from the start of the PUT
to a replica until every probe URL on it answered ready, probing immediately (the real
prober waits 200 ms before its first probe and backs off from 50 ms).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Mapping, Sequence

import pytest

from tests.helpers import RawClient
from tests.knative import (
    ENDPOINT_PROBE_PREFIX, PROBE_BUDGET, GoProber, IngressRule, Phase, QueueProxy,
    has_ipv6_loopback, listen_address, proxy_v2_header, rollout, verdict)
from tests.stack import Stack, running

EXTERNAL = ("hello.default.example.com",)
LOCAL = ("hello.default", "hello.default.svc", "hello.default.svc.cluster.local")
TAG_EXTERNAL = ("latest-hello.default.example.com",)
TAG_LOCAL = ("latest-hello.default", "latest-hello.default.svc",
             "latest-hello.default.svc.cluster.local")
REVISIONS = ("hello-1", "hello-10")
IDLE_CONNECTIONS = 300
# Retry answers a replica without the push may give (the prober's retry statuses).
RETRY_STATUSES = {200, 404, 503}


def spec(split: tuple[tuple[str, int], ...], latest: str) -> list[IngressRule]:
    tag = ((latest, 100),)
    return [IngressRule("external", EXTERNAL, split), IngressRule("cluster-local", LOCAL, split),
            IngressRule("external", TAG_EXTERNAL, tag),
            IngressRule("cluster-local", TAG_LOCAL, tag)]


PHASES = rollout(spec((("hello-1", 100),), "hello-1"),
                 spec((("hello-1", 50), ("hello-10", 50)), "hello-10"))


def base_rules(url: str) -> list[dict[str, Any]]:
    """What the Gateway serves before ``hello`` exists: an ordinary route, so both
    replicas are loaded (Ready) when the rollout starts."""
    return [{"hostnames": ["intranet.example.com"], "backends": [{"url": url, "weight": 1}]}]


@pytest.fixture
async def pods(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, QueueProxy]]:
    loopback = request.node.callspec.params["loopback"]
    started = {rev: await QueueProxy(rev, host=loopback).start()
               for rev in (*REVISIONS, "intranet")}
    yield started
    for pod in started.values():
        await pod.close()


async def push(stack: Stack, config: Mapping[str, Any]) -> None:
    """PUT /config on a fresh connection (no HTTP client set-up in the timing)."""
    body = json.dumps(config).encode()
    client = await RawClient.connect(stack.listening.admin.port)
    try:
        client.send(b"PUT /config HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json"
                    b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        response = await client.read_response()
    finally:
        client.close()
    assert response.status == 200, response


async def all_ready(prober: GoProber, stack: Stack, urls: Sequence[tuple[str, str]],
                    digest: str, started: float) -> float:
    """Probe every URL until ready; seconds from ``started`` until the last one was."""
    tries = await asyncio.gather(*(prober.until_ready(stack.cluster_port, host, path, digest)
                                   for host, path in urls))
    elapsed = time.monotonic() - started
    # A replica that has the push is ready on the first probe of every URL.
    assert all(verdicts == ["ready"] for _, verdicts in tries), tries
    return elapsed


async def check_stale(prober: GoProber, stack: Stack, urls: Sequence[tuple[str, str]],
                      digest: str, old_digest: str | None) -> None:
    """A replica without the push answers every new probe URL with a retry answer:
    200 with the hash it has, or 404 for a host it does not know yet."""
    results = await asyncio.gather(*(prober.probe(stack.cluster_port, host, path)
                                     for host, path in urls))
    for (host, path), result in zip(urls, results):
        assert verdict(result, digest) == "retry", (host, path, result)
        assert result.status in RETRY_STATUSES, (host, path, result)
        if result.status == 200:
            assert result.headers["k-network-hash"] == old_digest, (host, path, result)
        else:
            assert old_digest is None and result.status == 404, (host, path, result)


def check_endpoint_probes(pods: Mapping[str, QueueProxy], phases: Sequence[Phase]) -> None:
    """Every probe an endpoint-probe rule served (it carries a staged ``ep-``/``tr-``
    hash) reached the revision it names, with that revision's headers. (A stale
    replica serves an endpoint-probe path with its probe copy of ``/``, at its plain
    hash, to the old split: that is the retry answer the prober needs.)"""
    staged = {p.digest for p in phases if p.digest[:3] in ("ep-", "tr-")}
    served = 0
    for pod in pods.values():
        for seen in pod.seen:
            if (seen.path.startswith(ENDPOINT_PROBE_PREFIX)
                    and seen.headers["k-network-hash"] in staged):
                served += 1
                assert seen.path == ENDPOINT_PROBE_PREFIX + pod.revision, (pod.revision, seen)
                assert seen.headers["knative-serving-revision"] == pod.revision
    assert served or not any(p.routes[0][1] for p in phases), "no endpoint probe served"


async def leave_idle_connections(prober: GoProber, stack: Stack, phase: Phase,
                                 backends: Mapping[str, str]) -> None:
    """``IDLE_CONNECTIONS`` answered probes whose connections stay open (Go keeps an
    unused connection of a cloned transport for up to 90 s)."""
    host, path = phase.probe_urls(backends)[0]
    for _ in range(IDLE_CONNECTIONS // 50):
        results = await asyncio.gather(*(prober.probe(stack.cluster_port, host, path)
                                         for _ in range(50)))
        assert {verdict(r, phase.digest) for r in results} == {"ready"}


async def ordinary(port: int, loopback: str, host: str,
                   proxy_protocol: bool) -> tuple[int, bytes]:
    client = await RawClient.connect(port, host=loopback)
    try:
        local = client.writer.get_extra_info("sockname")[:2]
        preface = proxy_v2_header(local, (loopback, port)) if proxy_protocol else b""
        client.send(preface + f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        response = await client.read_response()
    finally:
        client.close()
    return response.status, response.body


@pytest.mark.parametrize("loopback", ["127.0.0.1", "::1"])
@pytest.mark.parametrize("scope", ["all", "probes"])
@pytest.mark.parametrize("proxy_protocol", [False, True])
async def test_rollout_becomes_ready_only_when_every_replica_serves_it(
        pods: dict[str, QueueProxy], loopback: str, scope: str, proxy_protocol: bool) -> None:
    if loopback == "::1" and not has_ipv6_loopback():
        pytest.skip("this machine has no ::1")
    backends = {rev: pods[rev].url for rev in REVISIONS}
    base = base_rules(pods["intranet"].url)
    flags = ["--listen", listen_address(loopback), "--admin", ":0", "--cluster-scope", scope]
    if proxy_protocol:
        flags.append("--cluster-proxy-protocol")
    prober = GoProber(loopback, proxy_protocol)
    report = []
    try:
        async with running(*flags, config={"version": 1, "rules": base}) as first, \
                running(*flags, config={"version": 1, "rules": base}) as second:
            old_digest = None
            for version, phase in enumerate(PHASES, start=2):
                if phase.name == "final":
                    await leave_idle_connections(prober, first, PHASES[version - 3], backends)
                    before_final = len(prober.durations)
                config = {"version": version, "rules": base + phase.rules(backends)}
                urls = phase.probe_urls(backends)
                started = time.monotonic()
                await push(first, config)
                first_ready = asyncio.create_task(
                    all_ready(prober, first, urls, phase.digest, started))
                await check_stale(prober, second, urls, phase.digest, old_digest)
                pushed = time.monotonic()
                await push(second, config)
                second_ready = await all_ready(prober, second, urls, phase.digest, pushed)
                report.append((phase.name, len(urls), await first_ready, second_ready))
                check_endpoint_probes(pods, PHASES[:version - 1])
                old_digest = phase.digest
            # The idle connections did not slow the last version's probes down.
            assert max(prober.durations[before_final:]) < PROBE_BUDGET
            assert prober.still_open() >= IDLE_CONNECTIONS
            await check_ordinary_traffic(first, loopback, scope, proxy_protocol)
    finally:
        prober.close()
    assert all(pods[rev].seen for rev in REVISIONS)
    print(f"\nrollout push-to-ready ({loopback}, scope {scope}, PROXY v2 {proxy_protocol}):")
    for name, count, first_s, second_s in report:
        print(f"  {name:8} {count:2} probe URLs  replica 1 {first_s * 1000:6.1f} ms  "
              f"replica 2 {second_s * 1000:6.1f} ms")


async def check_ordinary_traffic(stack: Stack, loopback: str, scope: str,
                                 proxy_protocol: bool) -> None:
    """The rolled-out split serves real requests (``all``), or the probes-only door
    refuses them (``probes``)."""
    port = stack.cluster_port
    status, body = await ordinary(port, loopback, "latest-hello.default", proxy_protocol)
    if scope == "probes":
        assert status == 403
        return
    assert (status, body) == (200, b"hello-10\n")
    seen = {(await ordinary(port, loopback, EXTERNAL[0], proxy_protocol))[1]
            for _ in range(40)}
    assert seen == {b"hello-1\n", b"hello-10\n"}
