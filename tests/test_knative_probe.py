"""net-gateway-api's readiness probe against the cluster entrance, end to end.

The wire rules are those net-gateway-api writes for ksvc ``hello``: 80 % hello-00001, 20 %
hello-00002, tag ``canary`` → hello-00002), pushed over the config API; fake
queue-proxies answer probes exactly like Knative's probe handler; the prober's exact
request is sent to the cluster entrance for every hostname and judged by its rules.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from proxy.entrances.policy import cluster_prepare, is_edge_header
from proxy.request import EMPTY_BODY, Request
from tests.helpers import RawClient, TestBackend
from tests.knative import QueueProxy, probe, verdict
from tests.stack import running

EXTERNAL = ["hello.default.example.com"]
LOCAL = ["hello.default", "hello.default.svc", "hello.default.svc.cluster.local"]
CANARY_EXTERNAL = ["canary-hello.default.example.com"]
CANARY_LOCAL = ["canary-hello.default", "canary-hello.default.svc",
                "canary-hello.default.svc.cluster.local"]
ALL_HOSTS = EXTERNAL + LOCAL + CANARY_EXTERNAL + CANARY_LOCAL


def knative_hash(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


def _rev(name: str) -> dict[str, Any]:
    return {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [
        {"name": "Knative-Serving-Namespace", "value": "default"},
        {"name": "Knative-Serving-Revision", "value": name}]}}


def _hash_filter(digest: str) -> dict[str, Any]:
    return {"type": "RequestHeaderModifier",
            "requestHeaderModifier": {"set": [{"name": "K-Network-Hash", "value": digest}]}}


PROBE_MATCH = {"path": {"type": "PathPrefix", "value": "/"},
               "headers": [{"type": "Exact", "name": "K-Network-Hash", "value": "override"}]}
ROOT_MATCH = {"path": {"type": "PathPrefix", "value": "/"}}


def knative_config(version: int, digest: str, revisions: dict[str, str]) -> dict[str, Any]:
    """The Knative wire rules; ``revisions`` maps revision name → backend URL."""
    split = [{"url": revisions["hello-00001"], "weight": 80, "filters": [_rev("hello-00001")]},
             {"url": revisions["hello-00002"], "weight": 20, "filters": [_rev("hello-00002")]}]
    canary = [{"url": revisions["hello-00002"], "weight": 100,
               "filters": [_rev("hello-00002")]}]
    rules = []
    for hosts, backends in ((EXTERNAL, split), (LOCAL, split), (CANARY_EXTERNAL, canary),
                            (CANARY_LOCAL, canary)):
        rules.append({"hostnames": hosts, "matches": [PROBE_MATCH],
                      "filters": [_hash_filter(digest)], "backends": backends,
                      "timeouts": {}})
        rules.append({"hostnames": hosts, "matches": [ROOT_MATCH], "backends": backends,
                      "timeouts": {}})
    return {"version": version, "rules": rules}


@pytest.fixture
async def revisions():
    pods = {name: await QueueProxy(name).start() for name in ("hello-00001", "hello-00002")}
    yield pods
    for pod in pods.values():
        await pod.close()


def _urls(pods: dict[str, QueueProxy]) -> dict[str, str]:
    return {name: pod.url for name, pod in pods.items()}


@pytest.mark.parametrize("proxy_protocol", [False, True])
async def test_every_hostname_is_ready_on_the_first_probe_and_sees_a_new_hash(
        revisions, proxy_protocol):
    flags = ["--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0"]
    if proxy_protocol:
        flags.append("--cluster-proxy-protocol")
    first = knative_hash("kingress-v1")
    async with running(*flags, config=knative_config(1, first, _urls(revisions))) as stack:
        for host in ALL_HOSTS:
            result = await probe(stack.cluster_port, host, proxy_protocol=proxy_protocol)
            assert verdict(result, first) == "ready", (host, result)
        # A rollout changes the hash: the very next probe must see the new one.
        second = "ep-" + knative_hash("kingress-v2")
        response = await stack.push(knative_config(2, second, _urls(revisions)))
        assert response.status_code == 200
        for host in ALL_HOSTS:
            result = await probe(stack.cluster_port, host, proxy_protocol=proxy_protocol)
            assert verdict(result, second) == "ready", (host, result)


async def test_probe_carries_revision_headers_and_follows_the_split(revisions):
    digest = knative_hash("split")
    async with running("--listen", "127.0.0.1:0",
                       config=knative_config(7, digest, _urls(revisions))) as stack:
        for _ in range(200):
            assert verdict(await probe(stack.cluster_port, EXTERNAL[0]), digest) == "ready"
        canary = revisions["hello-00002"].seen[-1]
        for pod in revisions.values():
            for seen in pod.seen:
                assert seen.headers["k-network-hash"] == digest
                assert seen.headers["knative-serving-namespace"] == "default"
                assert seen.headers["knative-serving-revision"] == pod.revision
                assert seen.host == EXTERNAL[0]  # Host forwarded unchanged
        first, second = len(revisions["hello-00001"].seen), len(revisions["hello-00002"].seen)
        assert first + second == 200
        assert 120 <= first <= 190, (first, second)  # 80 % of 200 = 160
        assert canary.path == "/"


async def test_unknown_host_answers_404_so_the_prober_keeps_waiting(revisions):
    async with running("--listen", "127.0.0.1:0",
                       config=knative_config(3, knative_hash("x"), _urls(revisions))) as stack:
        result = await probe(stack.cluster_port, "other.default.example.com")
        assert result.status == 404
        assert verdict(result, "x") == "retry"


async def test_probes_scope_refuses_ordinary_requests_on_the_cluster_entrance_only(revisions):
    digest = knative_hash("scope")
    flags = ["--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0",
             "--cluster-scope", "probes"]
    async with running(*flags, config=knative_config(4, digest, _urls(revisions))) as stack:
        assert verdict(await probe(stack.cluster_port, EXTERNAL[0]), digest) == "ready"
        ordinary = b"GET / HTTP/1.1\r\nHost: hello.default.example.com\r\n\r\n"
        client = await RawClient.connect(stack.cluster_port)
        client.send(ordinary)
        refused = await client.read_response()
        client.close()
        assert refused.status == 403
        assert json.loads(refused.body)["error"] == "forbidden"
        client = await RawClient.connect(stack.tunnel_port)
        client.send(ordinary)
        served = await client.read_response()
        client.close()
        assert served.status == 200
        assert served.body in (b"hello-00001\n", b"hello-00002\n")


async def test_probes_scope_is_the_default_when_a_tunnel_entrance_runs(revisions):
    digest = knative_hash("default-scope")
    flags = ["--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0"]
    async with running(*flags, config=knative_config(5, digest, _urls(revisions))) as stack:
        client = await RawClient.connect(stack.cluster_port)
        client.send(b"GET / HTTP/1.1\r\nHost: hello.default\r\n\r\n")
        assert (await client.read_response()).status == 403
        client.close()


async def test_scoped_mode_serves_only_rules_naming_the_cluster_entrance():
    async with TestBackend() as public, TestBackend() as internal:
        config = {"version": 9, "rules": [
            {"hostnames": ["app.example.com"], "backends": [{"url": public.url, "weight": 1}]},
            {"hostnames": ["app.example.com"], "entrances": ["cluster"],
             "matches": [{"path": {"type": "PathPrefix", "value": "/internal"}}],
             "backends": [{"url": internal.url, "weight": 1}]},
            {"hostnames": ["tunnel-only.example.com"], "entrances": ["tunnel"],
             "backends": [{"url": public.url, "weight": 1}]},
        ]}
        flags = ["--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0",
                 "--cluster-scope", "scoped"]
        async with running(*flags, config=config) as stack:
            cases = [
                (stack.cluster_port, "app.example.com", "/internal/x", 200),
                (stack.cluster_port, "app.example.com", "/public", 404),
                (stack.cluster_port, "tunnel-only.example.com", "/", 404),
                (stack.tunnel_port, "app.example.com", "/public", 200),
                # the cluster-only rule is invisible here: the public rule answers
                (stack.tunnel_port, "app.example.com", "/internal/x", 200),
                (stack.tunnel_port, "tunnel-only.example.com", "/", 200),
            ]
            for port, host, path, status in cases:
                client = await RawClient.connect(port)
                client.send(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                response = await client.read_response()
                client.close()
                assert response.status == status, (port, host, path)
        assert [seen.target for seen in internal.requests] == ["/internal/x"]


async def test_spoofed_cf_connecting_ip_on_the_cluster_entrance_never_reaches_xff():
    async with TestBackend() as backend:
        config = {"version": 1, "rules": [{"backends": [{"url": backend.url, "weight": 1}]}]}
        async with running("--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0",
                           "--cluster-scope", "all", config=config) as stack:
            request = (b"GET /echo HTTP/1.1\r\nHost: a.example.com\r\n"
                       b"CF-Connecting-IP: 203.0.113.9\r\nCF-Visitor: {\"scheme\":\"https\"}\r\n"
                       b"Cf-Access-Jwt-Assertion: forged\r\n\r\n")
            for port, trusted in ((stack.cluster_port, False), (stack.tunnel_port, True)):
                client = await RawClient.connect(port)
                client.send(request)
                response = await client.read_response()
                client.close()
                headers = {n.lower(): v for n, v in response.json()["headers"]}
                if trusted:
                    assert headers["x-forwarded-for"] == "203.0.113.9"
                    assert headers["x-forwarded-proto"] == "https"
                else:
                    assert "203.0.113.9" not in headers.get("x-forwarded-for", "")
                    assert headers["x-forwarded-for"] == "127.0.0.1"
                    assert headers["x-forwarded-proto"] == "http"
                    assert not any(name.startswith("cf-") for name in headers)


async def test_scoped_mode_still_lets_probes_reach_public_routes(revisions):
    digest = knative_hash("scoped-probe")
    flags = ["--listen", "127.0.0.1:0", "--tunnel-listen", "127.0.0.1:0",
             "--cluster-scope", "scoped"]
    async with running(*flags, config=knative_config(6, digest, _urls(revisions))) as stack:
        for host in ALL_HOSTS:
            assert verdict(await probe(stack.cluster_port, host), digest) == "ready", host
        client = await RawClient.connect(stack.cluster_port)
        client.send(b"GET / HTTP/1.1\r\nHost: hello.default.example.com\r\n\r\n")
        assert (await client.read_response()).status == 404
        client.close()


@pytest.mark.parametrize("name, edge", [
    (b"CF-Connecting-IP", True), (b"cf-visitor", True), (b"Cf-Access-Jwt-Assertion", True),
    (b"cF-", True), (b"cf", False), (b"cfx-a", False), (b"X-CF-Ray", False),
    # CGI-style servers read "_" as "-": Cf_Connecting_Ip would pass for the real one.
    (b"cf_x", True), (b"Cf_Connecting_Ip", True), (b"CF_", True), (b"X_CF_Ray", False),
    (b"Cache-Control", False), (b"", False), (b"\x03\x06-", False), (b"#&-", False),
    (b"\x03\x06\x7f", False), (b"CG-x", False), (b"GF-x", False), (b"cf.x", False),
])
def test_edge_headers_are_told_by_their_cf_prefix(name: bytes, edge: bool) -> None:
    assert is_edge_header(name) is edge
    # the plain spelling
    assert is_edge_header(name) is (name[:3].lower() in (b"cf-", b"cf_"))


def test_cluster_prepare_drops_every_edge_header_and_keeps_the_rest() -> None:
    headers = [(b"Host", b"a"), (b"CF-Connecting-IP", b"1"), (b"X", b"y"), (b"cf-ray", b"2")]
    request = Request("GET", "/", "", "a", headers, EMPTY_BODY, "cluster")
    cluster_prepare(request)
    assert request.headers == [(b"Host", b"a"), (b"X", b"y")]
    untouched = [(b"Host", b"a")]
    request = Request("GET", "/", "", "a", untouched, EMPTY_BODY, "cluster")
    cluster_prepare(request)
    assert request.headers is untouched
