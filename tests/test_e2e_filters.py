"""Acceptance, end to end: every filter of docs/config.md through the whole stack.

The real Runtime serves a cluster entrance on loopback; real echo backends report what
they received. Includes a full wire example with its backend URLs swapped for
local test servers (TLS backend included).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from routing.filters.cors import PREFLIGHT_STATUS
from tests.helpers import RawClient, TestBackend, make_tls
from tests.stack import running
from tests.test_e2e_routing import LISTEN, ask, echoed, prefix

SETTLE = 3.0  # longest wait for a detached mirror copy to arrive


async def eventually(condition: Callable[[], bool], timeout: float = SETTLE) -> bool:
    """Poll ``condition`` every 10 ms until it holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def one(url: str, weight: int = 1, **extra: Any) -> list[dict[str, Any]]:
    return [{"url": url, "weight": weight, **extra}]


def header_mod(kind: str, *, set: list[tuple[str, str]] = (),  # noqa: A002 (wire name)
               add: list[tuple[str, str]] = (), remove: list[str] = ()) -> dict[str, Any]:
    """A Request/ResponseHeaderModifier filter (``kind`` = "Request" or "Response")."""
    key = kind[0].lower() + kind[1:] + "HeaderModifier"
    body = {"set": [{"name": n, "value": v} for n, v in set],
            "add": [{"name": n, "value": v} for n, v in add], "remove": list(remove)}
    return {"type": f"{kind}HeaderModifier", key: body}


def redirect(**payload: Any) -> dict[str, Any]:
    return {"type": "RequestRedirect", "requestRedirect": payload}


def rewrite(**payload: Any) -> dict[str, Any]:
    return {"type": "URLRewrite", "urlRewrite": payload}


def mirror(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "RequestMirror", "requestMirror": {"backendUrl": url, **extra}}


def values(response: Any, name: bytes) -> list[bytes]:
    return [v for n, v in response.headers if n.lower() == name.lower()]


# ----------------------------------------------------------------------------- header modifiers


async def test_request_header_modifier_set_add_remove():
    async with TestBackend() as echo:
        # Host cannot be set this way: only URLRewrite changes the upstream Host.
        mod = header_mod("Request", set=[("X-Set", "new"), ("Host", "evil.test")],
                         add=[("X-Add", "2")], remove=["X-Drop"])
        config = {"version": 1, "rules": [{"filters": [mod], "backends": one(echo.url)}]}
        async with running(*LISTEN, config=config) as stack:
            response = await ask(stack.cluster_port, "hm.test", "/echo", headers=[
                ("x-set", "old-1"), ("X-Set", "old-2"), ("X-Add", "1"), ("x-drop", "a"),
                ("X-Drop", "b"), ("X-Keep", "k")])
            assert echoed(response, "x-set") == ["new"]  # every old line replaced
            assert echoed(response, "x-add") == ["1", "2"]  # a new line appended
            assert echoed(response, "x-drop") == []
            assert echoed(response, "x-keep") == ["k"]
            assert echoed(response, "host") == ["hm.test"]
            bare = await ask(stack.cluster_port, "hm.test", "/echo")
            assert echoed(bare, "x-set") == ["new"] and echoed(bare, "x-add") == ["2"]


async def test_response_header_modifier_set_add_remove():
    async with TestBackend() as echo:
        edit = header_mod("Response", set=[("Content-Type", "text/x-test"), ("X-Set", "s")],
                          add=[("X-Added", "1")])
        strip = header_mod("Response", remove=["content-type"])
        config = {"version": 1, "rules": [
            {"hostnames": ["edit.test"], "filters": [edit], "backends": one(echo.url)},
            {"hostnames": ["strip.test"], "filters": [strip], "backends": one(echo.url)}]}
        async with running(*LISTEN, config=config) as stack:
            edited = await ask(stack.cluster_port, "edit.test", "/echo")
            assert edited.status == 200
            assert values(edited, b"content-type") == [b"text/x-test"]
            assert values(edited, b"x-set") == [b"s"]
            assert values(edited, b"x-added") == [b"1"]
            assert edited.json()["path"] == "/echo"  # body intact
            stripped = await ask(stack.cluster_port, "strip.test", "/echo")
            assert stripped.status == 200
            assert values(stripped, b"content-type") == []


# ----------------------------------------------------------------------------- redirect


async def test_request_redirect_location_statuses_and_ports():
    async with TestBackend() as echo:
        statuses = [301, 302, 303, 307, 308]
        rules: list[dict[str, Any]] = [
            {"matches": [prefix(f"/s{code}")], "filters": [redirect(statusCode=code)]}
            for code in statuses]
        rules += [
            {"matches": [prefix("/old")], "filters": [redirect(
                scheme="https", hostname="new.example.com", statusCode=301,
                path={"type": "ReplacePrefixMatch", "value": "/new"})]},
            {"matches": [prefix("/full")], "filters": [redirect(
                path={"type": "ReplaceFullPath", "value": "/elsewhere"})]},
            {"matches": [prefix("/to-https")], "filters": [redirect(scheme="https")]},
            {"matches": [prefix("/http-80")], "filters": [redirect(scheme="http", port=80)]},
            {"matches": [prefix("/https-443")],
             "filters": [redirect(scheme="https", port=443)]},
            {"matches": [prefix("/https-8443")],
             "filters": [redirect(scheme="https", port=8443)]},
            {"matches": [prefix("/host")], "filters": [redirect(hostname="b.test")]},
            # Response filters never apply to a redirect, and the
            # backend of a redirecting rule is never called.
            {"matches": [prefix("/with-backend")],
             "filters": [header_mod("Response", set=[("X-Leak", "1")]),
                         redirect(path={"type": "ReplaceFullPath", "value": "/x"})],
             "backends": one(echo.url)},
        ]
        async with running(*LISTEN, config={"version": 1, "rules": rules}) as stack:
            port = stack.cluster_port
            for code in statuses:
                response = await ask(port, "r.test:8080", f"/s{code}/p?q=1")
                assert response.status == code
                # No scheme set: the request's scheme and port (not a default one) stay.
                assert response.header(b"location") == b"http://r.test:8080/s%d/p?q=1" % code
                assert response.body == b""
            cases = [
                ("x.example.com", "/old/a?x=1", 301, "https://new.example.com/new/a?x=1"),
                ("x.example.com", "/old", 301, "https://new.example.com/new"),
                ("r.test", "/full/deep?k=v", 302, "http://r.test/elsewhere?k=v"),
                ("r.test:8080", "/to-https/a", 302, "https://r.test/to-https/a"),
                ("r.test:8080", "/http-80", 302, "http://r.test/http-80"),
                ("r.test", "/https-443", 302, "https://r.test/https-443"),
                ("r.test", "/https-8443", 302, "https://r.test:8443/https-8443"),
                ("a.test:8080", "/host/p", 302, "http://b.test:8080/host/p"),
                ("r.test", "/with-backend/y", 302, "http://r.test/x"),
            ]
            for host, target, status, location in cases:
                response = await ask(port, host, target)
                assert (response.status, response.header(b"location")) == (
                    status, location.encode()), target
                assert response.header(b"x-leak") is None
        assert echo.requests == []


# ----------------------------------------------------------------------------- rewrite


async def test_url_rewrite_hostname_and_full_path():
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [
            {"hostnames": ["host.test"], "filters": [rewrite(hostname="assets.internal")],
             "backends": one(echo.url)},
            {"hostnames": ["full.test"], "filters": [rewrite(
                path={"type": "ReplaceFullPath", "replaceFullPath": "/replaced"})],
             "backends": one(echo.url)}]}
        async with running(*LISTEN, config=config) as stack:
            moved = await ask(stack.cluster_port, "host.test:8080", "/a?b=c")
            assert echoed(moved, "host") == ["assets.internal"]
            assert echoed(moved, "x-forwarded-host") == ["host.test:8080"]  # the original
            assert echo.requests[-1].target == "/a?b=c"
            full = await ask(stack.cluster_port, "full.test", "/any/thing?k=v")
            assert echo.requests[-1].target == "/replaced?k=v"  # query untouched
            assert echoed(full, "host") == ["full.test"]  # no hostname: Host unchanged


async def test_url_rewrite_replace_prefix_match_trailing_slashes():
    # (matched prefix, replacement, request path, upstream path): Gateway API's table,
    # spec column (the anchor loses the trailing '/' of "/foo/").
    cases = [
        ("/foo", "/xyz", "/foo/bar", "/xyz/bar"),
        ("/foo", "/xyz/", "/foo/bar", "/xyz/bar"),
        ("/foo/", "/xyz", "/foo/bar", "/xyz/bar"),
        ("/foo/", "/xyz/", "/foo/bar", "/xyz/bar"),
        ("/foo", "/xyz", "/foo", "/xyz"),
        ("/foo", "/xyz", "/foo/", "/xyz/"),
        ("/foo", "", "/foo/bar", "/bar"),
        ("/foo", "", "/foo/", "/"),
        ("/foo", "", "/foo", "/"),
        ("/foo", "/", "/foo/", "/"),
        ("/foo", "/", "/foo", "/"),
        ("/", "/xyz", "/foo", "/xyz/foo"),
    ]
    async with TestBackend() as echo:
        rules = [
            {"hostnames": [f"rw{i}.test"], "matches": [prefix(match)],
             "filters": [rewrite(path={"type": "ReplacePrefixMatch",
                                       "replacePrefixMatch": replacement})],
             "backends": one(echo.url)}
            for i, (match, replacement, _, _) in enumerate(cases)]
        async with running(*LISTEN, config={"version": 1, "rules": rules}) as stack:
            for i, (match, replacement, path, expected) in enumerate(cases):
                response = await ask(stack.cluster_port, f"rw{i}.test", path + "?q=1")
                assert response.status == 200
                assert echo.requests[-1].target == expected + "?q=1", (match, replacement,
                                                                        path)


async def test_prefix_replacements_keep_the_request_percent_encoding():
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [
            {"hostnames": ["rd.test"], "matches": [prefix("/old")], "filters": [redirect(
                path={"type": "ReplacePrefixMatch", "value": "/new"})]},
            {"hostnames": ["rw.test"], "matches": [prefix("/foo")], "filters": [rewrite(
                path={"type": "ReplacePrefixMatch", "replacePrefixMatch": "/xyz"})],
             "backends": one(echo.url)}]}
        async with running(*LISTEN, config=config) as stack:
            port = stack.cluster_port
            for target, location in (("/old/a%20b?x=%2F", "http://rd.test/new/a%20b?x=%2F"),
                                     ("/ol%64/a", "http://rd.test/new/a")):
                response = await ask(port, "rd.test", target)
                assert response.header(b"location") == location.encode(), target
            for target, upstream in (("/foo/a%20b?k=%20", "/xyz/a%20b?k=%20"),
                                     ("/fo%6F/bar", "/xyz/bar")):
                assert (await ask(port, "rw.test", target)).status == 200
                assert echo.requests[-1].target == upstream, target


# ----------------------------------------------------------------------------- mirror


async def test_request_mirror_copies_rewritten_request_with_body_and_mirror_host():
    async with TestBackend() as primary, TestBackend() as shadow:
        config = {"version": 1, "rules": [{
            "matches": [prefix("/m")],
            "filters": [rewrite(path={"type": "ReplacePrefixMatch",
                                      "replacePrefixMatch": "/mirrored"}),
                        header_mod("Request", set=[("X-Before", "1")]),
                        mirror(shadow.url)],
            "backends": one(primary.url)}]}
        async with running(*LISTEN, config=config) as stack:
            response = await ask(stack.cluster_port, "mi.test", "/m/x?q=1", method="POST",
                                 headers=[("Content-Type", "text/plain")], body=b"hello")
            assert response.status == 200
            assert response.json()["body"] == "hello"
            assert await eventually(lambda: len(shadow.requests) == 1)
            copy = shadow.requests[0]
            assert (copy.method, copy.target, copy.body) == ("POST", "/mirrored/x?q=1",
                                                             b"hello")
            assert copy.header(b"host") == f"127.0.0.1:{shadow.port}".encode()
            assert copy.header(b"x-before") == b"1"  # earlier header edits included
            assert primary.requests[0].target == "/mirrored/x?q=1"
            assert primary.requests[0].header(b"host") == b"mi.test"

            # A chunked body (length unknown) is mirrored too.
            client = await RawClient.connect(stack.cluster_port)
            client.send(b"PUT /m/c HTTP/1.1\r\nHost: mi.test\r\nTransfer-Encoding: chunked"
                        b"\r\n\r\n6\r\nchunk-\r\n4\r\nbody\r\n0\r\n\r\n")
            assert (await client.read_response()).json()["body"] == "chunk-body"
            client.close()
            assert await eventually(lambda: len(shadow.requests) == 2)
            assert shadow.requests[1].body == b"chunk-body"
            # Buffering for the copy still counts as reading the body.
            async with httpx.AsyncClient() as admin:
                metrics = (await admin.get(f"{stack.admin_url}/metrics")).text
            assert 'cftunnel_proxy_request_bytes_total{hostname=""} 15.0' in metrics


async def test_mirror_never_affects_the_primary():
    async with TestBackend() as primary, TestBackend() as shadow:
        with_closed_port = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead = with_closed_port.sockets[0].getsockname()[1]
        with_closed_port.close()
        await with_closed_port.wait_closed()
        config = {"version": 1, "rules": [
            {"hostnames": ["down.test"], "filters": [mirror(f"http://127.0.0.1:{dead}")],
             "backends": one(primary.url)},
            # The copy is taken before the rewrite: the shadow gets /hang and never
            # answers, while the primary gets /echo.
            {"hostnames": ["hang.test"],
             "filters": [mirror(shadow.url), rewrite(
                 path={"type": "ReplaceFullPath", "replaceFullPath": "/echo"})],
             "backends": one(primary.url)},
            {"hostnames": ["big.test"], "filters": [mirror(shadow.url)],
             "backends": one(primary.url)},
        ]}
        async with running(*LISTEN, config=config) as stack:
            port = stack.cluster_port
            for host, target in (("down.test", "/a"), ("hang.test", "/hang")):
                started = time.monotonic()
                response = await ask(port, host, target)
                assert response.status == 200
                assert time.monotonic() - started < 1.0, host
            assert primary.requests[-1].target == "/echo"
            assert await eventually(lambda: len(shadow.requests) == 1)
            assert shadow.requests[0].target == "/hang"

            # Past 1 MiB the copy is skipped, and the primary still gets every byte.
            big = b"b" * (3 << 19)
            response = await ask(port, "big.test", "/status/200", method="POST", body=big)
            assert response.status == 200
            assert primary.requests[-1].body == big
            await ask(port, "big.test", "/small", method="POST", body=b"s")
            assert await eventually(lambda: len(shadow.requests) == 2)
            assert [seen.target for seen in shadow.requests] == ["/hang", "/small"]


async def test_mirror_percent_zero_never_copies_and_mirrors_may_repeat():
    async with TestBackend() as primary, TestBackend() as never, TestBackend() as always:
        config = {"version": 1, "rules": [{
            "filters": [mirror(never.url, percent=0), mirror(always.url, percent=100),
                        mirror(always.url)],
            "backends": one(primary.url)}]}
        async with running(*LISTEN, config=config) as stack:
            for i in range(5):
                assert (await ask(stack.cluster_port, "m.test", f"/{i}")).status == 200
            assert await eventually(lambda: len(always.requests) == 10)
        assert sorted(seen.target for seen in always.requests) == sorted(
            [f"/{i}" for i in range(5)] * 2)
        assert never.connections == 0


# ----------------------------------------------------------------------------- CORS


async def test_cors_preflight_is_answered_by_the_proxy_and_actual_requests_get_headers():
    async with TestBackend() as echo:
        cors = {"type": "CORS", "cors": {
            "allowOrigins": ["https://*.example.com"], "allowMethods": ["GET", "PUT"],
            "allowHeaders": ["*"], "exposeHeaders": ["ETag"], "maxAge": 600}}
        config = {"version": 1, "rules": [{"filters": [cors], "backends": one(echo.url)}]}
        async with running(*LISTEN, config=config) as stack:
            port = stack.cluster_port
            origin = "https://app.example.com"
            preflight = await ask(port, "c.test", "/api", method="OPTIONS", headers=[
                ("Origin", origin), ("Access-Control-Request-Method", "PUT"),
                ("Access-Control-Request-Headers", "X-Custom")])
            assert preflight.status == PREFLIGHT_STATUS
            assert preflight.header(b"access-control-allow-origin") == origin.encode()
            assert b"PUT" in preflight.header(b"access-control-allow-methods")
            assert preflight.header(b"access-control-allow-headers").lower() == b"x-custom"
            assert preflight.header(b"access-control-max-age") == b"600"
            vary = b", ".join(values(preflight, b"vary")).lower()
            assert b"origin" in vary and b"access-control-request-method" in vary

            refused = await ask(port, "c.test", "/api", method="OPTIONS", headers=[
                ("Origin", "https://example.org"), ("Access-Control-Request-Method", "GET")])
            assert refused.header(b"access-control-allow-origin") is None
            assert echo.requests == []  # no preflight ever reached the backend

            actual = await ask(port, "c.test", "/api", headers=[("Origin", origin)])
            assert actual.status == 200 and echo.requests[-1].target == "/api"
            assert actual.header(b"access-control-allow-origin") == origin.encode()
            assert actual.header(b"access-control-expose-headers") == b"ETag"
            assert b"origin" in b", ".join(values(actual, b"vary")).lower()

            # OPTIONS without Access-Control-Request-Method is not a preflight.
            plain = await ask(port, "c.test", "/opt", method="OPTIONS",
                              headers=[("Origin", origin)])
            assert plain.status == 200 and echo.requests[-1].method == "OPTIONS"


# ----------------------------------------------------------------------------- backend filters


async def test_backend_filters_run_only_for_the_chosen_backend_after_rule_filters():
    async with TestBackend() as stable, TestBackend() as canary:
        def backend(url: str, name: str) -> dict[str, Any]:
            filters = [header_mod("Response", set=[("X-From", name), ("X-Order", name)])]
            if name == "canary":
                filters.append(header_mod("Request", set=[("X-Canary", "1")]))
            return {"url": url, "weight": 1, "filters": filters}

        config = {"version": 1, "rules": [{
            "filters": [header_mod("Response", set=[("X-Order", "rule")],
                                   add=[("X-Rule-Level", "1")])],
            "backends": [backend(stable.url, "stable"), backend(canary.url, "canary")]}]}
        async with running(*LISTEN, config=config) as stack:
            for _ in range(60):
                response = await ask(stack.cluster_port, "bf.test", "/echo")
                name = response.header(b"x-from").decode()
                assert echoed(response, "x-canary") == (["1"] if name == "canary" else [])
                # Rule-level response filters run first, the backend's after them.
                assert values(response, b"x-order") == [name.encode()]
                assert response.header(b"x-rule-level") == b"1"
        assert stable.requests and canary.requests
        assert all(seen.header(b"x-canary") is None for seen in stable.requests)
        assert all(seen.header(b"x-canary") == b"1" for seen in canary.requests)


# ----------------------------------------------------------------------------- full example


def reference_example(urls: dict[str, str], ca_pem: str) -> dict[str, Any]:
    """The full example config with every backend URL replaced from ``urls``."""
    return {"version": 1767225600123, "hasGrpcRoute": True, "rules": [
        {"hostnames": ["app.example.com"],
         "matches": [{"path": {"type": "Exact", "value": "/api/v2/health"}, "method": "GET",
                      "headers": [{"type": "Exact", "name": "X-API-Version", "value": "2"}]}],
         "filters": [header_mod("Response", add=[("X-Proxy", "tunnel")])],
         "backends": [
             {"url": urls["api"], "weight": 80},
             {"url": urls["canary"], "weight": 20,
              "filters": [header_mod("Request", set=[("X-Canary", "1")])]}],
         "timeouts": {"request": "10s", "backend": "2s"}},
        {"hostnames": ["*.example.com"],
         "matches": [prefix("/old")],
         "filters": [redirect(scheme="https", hostname="new.example.com", statusCode=301,
                              path={"type": "ReplacePrefixMatch", "value": "/new"})],
         "backends": None},
        {"hostnames": ["app.example.com"],
         "matches": [prefix("/static", queryParams=[
             {"type": "RegularExpression", "name": "v", "value": "^[0-9]+$"}])],
         "filters": [
             rewrite(hostname="assets.internal",
                     path={"type": "ReplacePrefixMatch", "replacePrefixMatch": "/assets"}),
             mirror(urls["shadow"], percent=10),
             {"type": "CORS", "cors": {"allowOrigins": ["https://*.example.com"],
                                       "allowMethods": ["GET"], "allowHeaders": ["*"],
                                       "exposeHeaders": ["ETag"], "maxAge": 600}}],
         "backends": one(urls["static"])},
        {"hostnames": ["ws.example.com"], "backends": one(urls["chat"], websocket=True)},
        {"hostnames": ["grpc.example.com"],
         "matches": [{"path": {"type": "Exact", "value": "/helloworld.Greeter/SayHello"}}],
         "backends": one(urls["greeter"], protocol="h2c")},
        {"hostnames": ["secure.example.com"],
         "backends": [
             {"url": urls["vault"], "weight": 1,
              "tls": {"caBundle": ca_pem, "serverName": "vault.prod.svc",
                      "subjectAltNameUris": ["spiffe://cluster.local/ns/prod/sa/vault"]}},
             {"url": urls["gone"], "weight": 1, "unavailableStatus": 500}]},
        {"hostnames": ["legacy.example.com"], "unavailableStatus": 500,
         "backends": one(urls["legacy"])},
    ]}


async def test_reference_full_example_outcomes(tmp_path: Path):
    files = make_tls(str(tmp_path), "DNS:vault.prod.svc,"
                                    "URI:spiffe://cluster.local/ns/prod/sa/vault")
    names = ["api", "canary", "shadow", "static", "chat", "legacy", "gone"]
    servers = {name: await TestBackend().start() for name in names}
    servers["vault"] = await TestBackend(tls=files.server_context()).start()
    urls = {name: server.url for name, server in servers.items()}
    urls["greeter"] = "http://127.0.0.1:9"  # the gRPC rule is only looked up, never dialed
    try:
        async with running(*LISTEN, config=reference_example(urls, files.ca_pem)) as stack:
            await _reference_outcomes(stack.cluster_port, servers)
    finally:
        for server in servers.values():
            await server.close()


async def _reference_outcomes(port: int, servers: dict[str, TestBackend]) -> None:
    api, canary = servers["api"], servers["canary"]
    for _ in range(100):
        response = await ask(port, "app.example.com", "/api/v2/health",
                             headers=[("X-API-Version", "2")])
        assert response.status == 200 and response.header(b"x-proxy") == b"tunnel"
    assert len(api.requests) + len(canary.requests) == 100
    assert 0 < len(canary.requests) <= 40  # 20 ± 5 sd (sd = 4)
    assert all(seen.header(b"x-canary") == b"1" for seen in canary.requests)
    assert all(seen.header(b"x-canary") is None for seen in api.requests)
    for method, headers in (("GET", []), ("POST", [("X-API-Version", "2")])):
        assert (await ask(port, "app.example.com", "/api/v2/health", method=method,
                          headers=headers, body=b"x" if method == "POST" else b"")
                ).status == 404

    moved = await ask(port, "app.example.com", "/old/a?x=1")
    assert moved.status == 301
    assert moved.header(b"location") == b"https://new.example.com/new/a?x=1"

    static, shadow = servers["static"], servers["shadow"]
    for _ in range(100):
        response = await ask(port, "app.example.com", "/static/app.js?v=3")
        assert response.status == 200
        assert response.header(b"access-control-allow-origin") is None  # no Origin sent
    assert {(s.target, s.header(b"host")) for s in static.requests} == {
        ("/assets/app.js?v=3", b"assets.internal")}
    settled = await _settled(lambda: len(shadow.requests))
    assert 0 < settled <= 25  # 10 % of 100, 5 sd = 15
    assert {(s.target, s.header(b"host")) for s in shadow.requests} == {
        ("/assets/app.js?v=3", f"127.0.0.1:{shadow.port}".encode())}
    assert (await ask(port, "app.example.com", "/static/app.js?v=x")).status == 404
    preflight = await ask(port, "app.example.com", "/static/app.js?v=3", method="OPTIONS",
                          headers=[("Origin", "https://a.example.com"),
                                   ("Access-Control-Request-Method", "GET")])
    assert preflight.status == PREFLIGHT_STATUS
    assert preflight.header(b"access-control-allow-origin") == b"https://a.example.com"
    assert len(static.requests) == 100

    assert (await ask(port, "ws.example.com", "/chat")).status == 200
    assert servers["chat"].requests[-1].target == "/chat"
    assert (await ask(port, "grpc.example.com", "/other")).status == 404

    statuses = [(await ask(port, "secure.example.com", "/")).status for _ in range(40)]
    assert set(statuses) == {200, 500}  # half TLS to the vault, half 500
    assert len(servers["vault"].requests) == statuses.count(200)
    assert servers["gone"].connections == 0

    legacy = await ask(port, "legacy.example.com", "/x")
    assert legacy.status == 500 and servers["legacy"].connections == 0
    assert (await ask(port, "other.example.org", "/")).status == 404


async def _settled(count: Callable[[], int], quiet: float = 0.3) -> int:
    """``count()`` once it has not changed for ``quiet`` seconds (bounded by SETTLE)."""
    deadline = time.monotonic() + SETTLE
    last, since = count(), time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last

