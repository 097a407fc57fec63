"""Acceptance, end to end: which rule and which backend serve a request,
and what the backend receives.

The real Runtime runs in-process (``tests.stack.running``) with a cluster entrance on a
loopback port; real :class:`~tests.helpers.TestBackend` echo servers answer. Each rule
tags the request it serves with a rule-level ``RequestHeaderModifier`` (``X-Rule: <tag>``)
that the echo backend reflects, so every assertion names the rule that actually served.

This module also holds the small client helpers the other ``test_e2e_*`` modules share.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from tests.helpers import READ_TIMEOUT, RawClient, RawResponse, ScriptBackend, TestBackend
from tests.stack import running

LISTEN = ("--listen", "127.0.0.1:0")
RULE_HEADER = "X-Rule"

HeaderPairs = Iterable[tuple[str, str]]

# ----------------------------------------------------------------------------- helpers


def tag(name: str) -> dict[str, Any]:
    """A RequestHeaderModifier filter that marks requests served by rule ``name``."""
    return {"type": "RequestHeaderModifier",
            "requestHeaderModifier": {"set": [{"name": RULE_HEADER, "value": name}]}}


def rule(name: str, url: str, *, hosts: Sequence[str] = (),
         matches: Sequence[dict[str, Any]] = (), filters: Sequence[dict[str, Any]] = (),
         **extra: Any) -> dict[str, Any]:
    """A wire rule tagged ``name`` with one backend ``url`` (weight 1)."""
    wire: dict[str, Any] = {"filters": [tag(name), *filters],
                            "backends": [{"url": url, "weight": 1}], **extra}
    if hosts:
        wire["hostnames"] = list(hosts)
    if matches:
        wire["matches"] = list(matches)
    return wire


def prefix(value: str, **more: Any) -> dict[str, Any]:
    return {"path": {"type": "PathPrefix", "value": value}, **more}


def request_bytes(method: str, target: str, host: str | None, headers: HeaderPairs = (),
                  body: bytes = b"") -> bytes:
    """An HTTP/1.1 request exactly as written here (Content-Length when a body is given)."""
    lines = [f"{method} {target} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{name}: {value}" for name, value in headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def ask(port: int, host: str | None, target: str = "/", *, method: str = "GET",
              headers: HeaderPairs = (), body: bytes = b"",
              timeout: float = READ_TIMEOUT) -> RawResponse:
    """One request on a fresh connection to the proxy; the connection is then dropped."""
    client = await RawClient.connect(port)
    try:
        client.send(request_bytes(method, target, host, headers, body))
        return await client.read_response(head=method == "HEAD", timeout=timeout)
    finally:
        client.close()


def echoed_headers(response: RawResponse) -> list[tuple[str, str]]:
    """The header lines the echo backend received, names lower-cased, in order."""
    assert response.status == 200, (response.status, response.body[:200])
    return [(name.lower(), value) for name, value in response.json()["headers"]]


def echoed(response: RawResponse, name: str) -> list[str]:
    """Every value of request header ``name`` as the echo backend received it."""
    return [value for key, value in echoed_headers(response) if key == name.lower()]


def served_by(response: RawResponse) -> str:
    """The tag of the rule that served ``response``, or ``"<status>"`` if none did."""
    if response.status != 200 or not response.body.startswith(b"{"):
        return str(response.status)
    tags = echoed(response, RULE_HEADER)
    assert len(tags) == 1, tags
    return tags[0]


# ----------------------------------------------------------------------------- hosts


async def test_host_buckets_exact_wildcard_longest_suffix_default_and_fall_through():
    async with TestBackend() as echo:
        url = echo.url
        config = {"version": 1, "rules": [
            rule("wild", url, hosts=["*.example.com"]),
            rule("exact", url, hosts=["app.example.com"]),
            rule("wild-long", url, hosts=["*.b.example.com"]),
            rule("exact-only", url, hosts=["fall.example.com"], matches=[prefix("/only")]),
            rule("default", url),
        ]}
        async with running(*LISTEN, config=config) as stack:
            cases = [
                ("app.example.com", "exact"),
                ("App.Example.COM:8443", "exact"),  # case and port folded
                ("app.example.com.", "exact"),  # one trailing dot dropped
                ("a.example.com", "wild"),
                ("a.b.c.example.com", "wild"),  # one *or more* labels
                ("x.b.example.com", "wild-long"),  # longest suffix first
                ("y.x.b.example.com", "wild-long"),
                ("b.example.com", "wild"),  # *.b.example.com never matches its apex
                ("example.com", "default"),  # nor does *.example.com
                ("other.org", "default"),
                ("fall.example.com", "wild"),  # exact bucket has no match: fall through
            ]
            for host, expected in cases:
                assert served_by(await ask(stack.cluster_port, host)) == expected, host
            only = await ask(stack.cluster_port, "fall.example.com", "/only/x")
            assert served_by(only) == "exact-only"


async def test_without_a_default_bucket_an_unknown_host_is_404():
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [rule("exact", echo.url, hosts=["a.test"])]}
        async with running(*LISTEN, config=config) as stack:
            assert served_by(await ask(stack.cluster_port, "a.test")) == "exact"
            miss = await ask(stack.cluster_port, "b.test")
            assert miss.status == 404
            assert miss.body == b"no matching route\n"
        assert len(echo.requests) == 1


# ----------------------------------------------------------------------------- paths


async def test_path_matches_exact_prefix_trailing_slash_and_regex_full_match():
    async with TestBackend() as echo:
        url = echo.url
        config = {"version": 1, "rules": [
            rule("root", url, matches=[prefix("/")]),
            rule("prefix-v2", url, matches=[prefix("/v2")]),
            rule("exact-v2", url, matches=[{"path": {"type": "Exact", "value": "/v2"}}]),
            rule("prefix-docs", url, matches=[prefix("/docs/")]),
            rule("regex", url, matches=[{"path": {"type": "RegularExpression",
                                                  "value": r"/img/[0-9]+\.png"}}]),
            rule("prefix-img", url, matches=[prefix("/img")]),
        ]}
        async with running(*LISTEN, config=config) as stack:
            cases = [
                ("/v2", "exact-v2"),
                ("/v%32", "exact-v2"),  # matched on the percent-decoded path
                ("/v2/", "prefix-v2"),
                ("/v2/x", "prefix-v2"),
                ("/v2example", "root"),  # element-wise prefix
                ("/V2", "root"),  # case-sensitive
                ("/v2?x=1", "exact-v2"),  # the query is not part of the path
                ("/docs", "prefix-docs"),  # a trailing '/' in the value is ignored
                ("/docs/", "prefix-docs"),
                ("/docs/a/b", "prefix-docs"),
                ("/docsx", "root"),
                ("/img/12.png", "regex"),  # regex outranks any prefix
                ("/img/12.png/x", "prefix-img"),  # full match, not a search
                ("/x/img/1.png", "root"),
                ("/img/a.png", "prefix-img"),
            ]
            for target, expected in cases:
                response = await ask(stack.cluster_port, "p.test", target)
                assert served_by(response) == expected, target
            # The backend receives the raw path, not the decoded one.
            assert echo.requests[1].target == "/v%32"


# ------------------------------------------------------------------------ headers, query, method


async def test_header_matches_exact_regex_and_case_insensitive_names():
    async with TestBackend() as echo:
        url = echo.url
        env = {"type": "Exact", "name": "X-Env", "value": "beta"}
        config = {"version": 1, "rules": [
            rule("base", url),
            rule("env", url, matches=[{"headers": [env]}]),
            rule("ver", url, matches=[{"headers": [
                {"type": "RegularExpression", "name": "x-ver", "value": "v[0-9]+"}]}]),
            rule("env-team", url, matches=[{"headers": [
                env, {"type": "Exact", "name": "X-Team", "value": "core"}]}]),
        ]}
        async with running(*LISTEN, config=config) as stack:
            cases: list[tuple[list[tuple[str, str]], str]] = [
                ([], "base"),
                ([("X-Env", "beta")], "env"),
                ([("x-ENV", "beta")], "env"),  # names are case-insensitive
                ([("X-Env", "Beta")], "base"),  # values are not
                ([("X-Env", "alpha"), ("X-Env", "beta")], "env"),  # any separate line
                ([("X-Env", "alpha, beta")], "base"),  # a joined line is one value
                ([("X-Env", "beta"), ("X-Team", "core")], "env-team"),  # more headers win
                ([("X-Ver", "v12")], "ver"),
                ([("X-Ver", "v12x")], "base"),  # full match
                ([("X-Ver", "xv12")], "base"),
            ]
            for headers, expected in cases:
                response = await ask(stack.cluster_port, "h.test", headers=headers)
                assert served_by(response) == expected, headers


async def test_query_matches_exact_regex_and_decoded_values():
    async with TestBackend() as echo:
        url = echo.url
        config = {"version": 1, "rules": [
            rule("base", url),
            rule("lang", url, matches=[{"queryParams": [
                {"type": "Exact", "name": "lang", "value": "en gb"}]}]),
            rule("page", url, matches=[{"queryParams": [
                {"type": "RegularExpression", "name": "page", "value": "[0-9]+"}]}]),
        ]}
        async with running(*LISTEN, config=config) as stack:
            cases = [
                ("/?lang=en+gb", "lang"),  # '+' decodes to a space
                ("/?lang=en%20gb", "lang"),
                ("/?x=1&lang=fr&lang=en%20gb", "lang"),  # any value of a repeat
                ("/?lang=en", "base"),
                ("/?Lang=en+gb", "base"),  # names are case-sensitive
                ("/?page=12", "page"),
                ("/?page=%31%32", "page"),
                ("/?page=1a", "base"),  # full match
                ("/", "base"),
            ]
            for target, expected in cases:
                response = await ask(stack.cluster_port, "q.test", target)
                assert served_by(response) == expected, target
            # The query is forwarded raw, as the client sent it.
            assert echo.requests[1].target == "/?lang=en%20gb"


async def test_method_match_is_literal():
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [
            rule("any", echo.url),
            rule("post", echo.url, matches=[prefix("/", method="POST")]),
        ]}
        async with running(*LISTEN, config=config) as stack:
            port = stack.cluster_port
            assert served_by(await ask(port, "m.test", method="POST", body=b"x")) == "post"
            assert served_by(await ask(port, "m.test")) == "any"
            assert served_by(await ask(port, "m.test", method="PUT", body=b"x")) == "any"


# ----------------------------------------------------------------------------- precedence


async def test_precedence_is_per_match_in_gateway_api_tiers():
    async with TestBackend() as echo:
        url = echo.url
        x_a = {"type": "Exact", "name": "X-A", "value": "1"}
        x_b = {"type": "Exact", "name": "X-B", "value": "1"}
        queries = [{"type": "Exact", "name": n, "value": "1"} for n in ("a", "b", "c")]
        config = {"version": 1, "rules": [
            # Scored per match: "Exact /foo OR PathPrefix /" must not beat /bar for /bar/x.
            rule("foo-or-root", url, matches=[{"path": {"type": "Exact", "value": "/foo"}},
                                              prefix("/")]),
            rule("bar", url, matches=[prefix("/bar")]),
            rule("bar-get", url, matches=[prefix("/bar", method="GET")]),
            rule("bar-header", url, matches=[prefix("/bar", headers=[x_a, x_b])]),
            rule("bar-deep", url, matches=[prefix("/bar/deep")]),
            rule("q-header", url, matches=[prefix("/q", headers=[x_a])]),
            rule("q-queries", url, matches=[prefix("/q", queryParams=queries)]),
            rule("tie-first", url, matches=[prefix("/tie")]),
            rule("tie-second", url, matches=[prefix("/tie")]),
        ]}
        both = [("X-A", "1"), ("X-B", "1")]
        async with running(*LISTEN, config=config) as stack:
            cases: list[tuple[str, str, list[tuple[str, str]], str]] = [
                ("GET", "/foo", [], "foo-or-root"),
                ("POST", "/bar/x", [], "bar"),
                ("GET", "/bar/x", [], "bar-get"),  # a method outranks no method
                ("GET", "/bar/x", both, "bar-get"),  # ...and any number of headers
                ("POST", "/bar/x", both, "bar-header"),
                ("GET", "/bar/deep/x", both, "bar-deep"),  # a longer prefix beats all
                ("GET", "/q?a=1&b=1&c=1", [("X-A", "1")], "q-header"),  # 1 header > 3 queries
                ("GET", "/q?a=1&b=1&c=1", [], "q-queries"),
                ("GET", "/other", [], "foo-or-root"),
                ("GET", "/tie", [], "tie-first"),  # equal keys: the earlier rule
            ]
            for method, target, headers, expected in cases:
                response = await ask(stack.cluster_port, "t.test", target, method=method,
                                     headers=headers, body=b"x" if method == "POST" else b"")
                assert served_by(response) == expected, (method, target, headers)


async def test_options_asterisk_is_answered_by_the_proxy_and_the_connection_goes_on():
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [{"backends": [{"url": echo.url, "weight": 1}]}]}
        async with running(*LISTEN, config=config) as stack:
            client = await RawClient.connect(stack.cluster_port)
            client.send(b"OPTIONS * HTTP/1.1\r\nHost: w.test\r\n\r\n")
            answer = await client.read_response()
            assert answer.status == 200 and answer.body == b""
            assert answer.header(b"content-length") == b"0"
            client.send(request_bytes("GET", "/echo", "w.test"))
            assert (await client.read_response()).status == 200
            client.close()
        assert [r.target for r in echo.requests] == ["/echo"]  # "*" never reached it


# ----------------------------------------------------------------------------- weights


async def test_weighted_split_is_within_five_sd_and_weight_zero_is_never_chosen():
    total, share = 2000, 0.8
    async with TestBackend() as heavy, TestBackend() as light, TestBackend() as never:
        config = {"version": 1, "rules": [{"backends": [
            {"url": heavy.url, "weight": 80}, {"url": light.url, "weight": 20},
            {"url": never.url, "weight": 0}]}]}
        async with running(*LISTEN, config=config) as stack:
            client = await RawClient.connect(stack.cluster_port)
            for _ in range(total):  # one keep-alive connection
                client.send(request_bytes("GET", "/echo", "w.test"))
                assert (await client.read_response()).status == 200
            client.close()
        bound = 5 * math.sqrt(total * share * (1 - share))  # binomial sd ≈ 17.9
        assert abs(len(heavy.requests) - total * share) <= bound, len(heavy.requests)
        assert len(heavy.requests) + len(light.requests) == total
        assert never.connections == 0


# ----------------------------------------------------------------------------- forwarding


async def test_request_headers_forwarded_hop_by_hop_dropped_and_x_forwarded_set():
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [{"backends": [{"url": echo.url, "weight": 1}]}]}
        async with running(*LISTEN, config=config) as stack:
            headers = [
                ("Connection", "keep-alive, X-Hop-Named"), ("X-Hop-Named", "1"),
                ("Keep-Alive", "timeout=5"), ("Proxy-Connection", "keep-alive"),
                ("Proxy-Authorization", "Basic Zm9vOmJhcg=="), ("TE", "gzip"),
                ("Trailer", "X-T"), ("X-Forwarded-For", "203.0.113.7"),
                ("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "forged.test"),
                ("X-Custom", "kept"), ("Cookie", "a=1"),
            ]
            response = await ask(stack.cluster_port, "App.Example.com:8443", "/echo",
                                 headers=headers)
            seen = echoed_headers(response)
            names = {name for name, _ in seen}
            for dropped in ("x-hop-named", "keep-alive", "proxy-connection",
                            "proxy-authorization", "te", "trailer"):
                assert dropped not in names, dropped
            assert all("x-hop-named" not in v.lower() for n, v in seen if n == "connection")
            assert echoed(response, "host") == ["App.Example.com:8443"]  # unchanged
            assert echoed(response, "x-forwarded-for") == ["203.0.113.7, 127.0.0.1"]
            assert echoed(response, "x-forwarded-proto") == ["http"]
            assert echoed(response, "x-forwarded-host") == ["App.Example.com:8443"]
            assert echoed(response, "x-custom") == ["kept"]
            assert echoed(response, "cookie") == ["a=1"]
            assert "user-agent" not in names  # none sent, none added

            with_agent = await ask(stack.cluster_port, "a.test", "/echo",
                                   headers=[("User-Agent", "probe/1.0"),
                                            ("TE", "trailers, deflate")])
            assert echoed(with_agent, "user-agent") == ["probe/1.0"]
            # TE is hop-by-hop (RFC 9110 §10.1.4): only "trailers" is sent on, which this
            # hop accepts too (it relays them to the client).
            assert echoed(with_agent, "te") == ["trailers"]


async def test_response_hop_by_hop_headers_are_removed():
    reply = (b"HTTP/1.1 200 OK\r\nConnection: X-Backend-Hop, close\r\nX-Backend-Hop: 1\r\n"
             b"Keep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n"
             b"Proxy-Authenticate: Basic\r\nTrailer: X-T\r\nUpgrade: h2c\r\n"
             b"X-End-To-End: kept\r\nContent-Length: 2\r\n\r\nok")
    async with ScriptBackend.replying(reply) as backend:
        config = {"version": 1, "rules": [{"backends": [{"url": backend.url, "weight": 1}]}]}
        async with running(*LISTEN, config=config) as stack:
            response = await ask(stack.cluster_port, "a.test", "/")
        assert (response.status, response.body) == (200, b"ok")
        names = {name.lower() for name, _ in response.headers}
        for dropped in (b"x-backend-hop", b"keep-alive", b"proxy-connection",
                        b"proxy-authenticate", b"trailer", b"upgrade"):
            assert dropped not in names, dropped
        assert b"x-backend-hop" not in (response.header(b"connection") or b"").lower()
        assert response.header(b"x-end-to-end") == b"kept"


async def test_x_forwarded_for_lines_are_joined_and_absolute_form_routes_by_authority():
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [rule("abs", echo.url, hosts=["abs.test"]),
                                          rule("default", echo.url)]}
        async with running(*LISTEN, config=config) as stack:
            port = stack.cluster_port
            joined = await ask(port, "x.test", "/echo", headers=[
                ("X-Forwarded-For", "198.51.100.1"), ("X-Forwarded-For", "198.51.100.2")])
            assert echoed(joined, "x-forwarded-for") == [
                "198.51.100.1, 198.51.100.2, 127.0.0.1"]
            # RFC 9112 §3.2.2: the authority of an absolute-form target replaces Host.
            absolute = await ask(port, "ignored.test", "http://abs.test/p?q=1")
            assert served_by(absolute) == "abs"
            assert echo.requests[-1].target == "/p?q=1"
            assert echoed(absolute, "host") == ["abs.test"]


async def test_backend_url_base_path_and_query_are_merged():
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [
            {"backends": [{"url": f"{echo.url}/base?k=1&q=base", "weight": 1}]}]}
        async with running(*LISTEN, config=config) as stack:
            await ask(stack.cluster_port, "b.test", "/x/y?q=2")
            assert echo.requests[-1].target == "/base/x/y?q=2&k=1"


async def test_framing_survives_a_keepalive_sequence_of_awkward_responses():
    """HEAD, 204, a chunked request body, trailers, interim 1xx and a close-delimited
    response, one after the other on one client connection: each answer is framed so
    the next one parses."""
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [{"backends": [{"url": echo.url, "weight": 1}]}]}
        async with running(*LISTEN, config=config) as stack:
            client = await RawClient.connect(stack.cluster_port)
            client.send(request_bytes("HEAD", "/fixed?size=10", "f.test"))
            head = await client.read_response(head=True)
            assert (head.status, head.header(b"content-length")) == (200, b"10")
            client.send(request_bytes("GET", "/status/204", "f.test"))
            assert (await client.read_response()).status == 204
            body = bytes(range(256)) * 8
            client.send(request_bytes("POST", "/echo", "f.test", body=body))
            assert (await client.read_response()).json()["body"].encode("latin-1") == body
            client.send(b"POST /echo HTTP/1.1\r\nHost: f.test\r\nTransfer-Encoding: chunked"
                        b"\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            assert (await client.read_response()).json()["body"] == "abcde"
            client.send(request_bytes("GET", "/trailers", "f.test", [("TE", "trailers")]))
            trailers = await client.read_response()
            assert (trailers.body, trailers.trailers) == (b"ok", [(b"Grpc-Status", b"0")])
            client.send(request_bytes("GET", "/interim", "f.test"))
            interim = await client.read_response()
            while interim.status < 200:  # 1xx may be relayed; they never end the exchange
                interim = await client.read_response()
            assert interim.json()["path"] == "/interim"
            client.send(request_bytes("GET", "/eof?size=5000", "f.test"))
            eof = await client.read_response()
            assert eof.body == b"x" * 5000
            client.send(request_bytes("GET", "/echo", "f.test"))
            assert (await client.read_response()).json()["path"] == "/echo"
            client.close()
        assert len(echo.requests) == 8


async def test_pooled_backend_connection_is_reusable_after_a_large_response():
    """A response larger than the upstream read buffer completes while still buffered;
    its connection must go back to the pool able to read the next answer (a94e126)."""
    async with TestBackend() as echo:
        config = {"version": 1, "rules": [{"backends": [{"url": echo.url, "weight": 1}]}]}
        async with running(*LISTEN, config=config) as stack:
            for size, target in ((1_000_000, "/fixed?size=1000000"),
                                 (200_000, "/chunked?size=200000&chunk=65536")):
                large = await ask(stack.cluster_port, "l.test", target)
                assert (large.status, len(large.body)) == (200, size)
                after = await ask(stack.cluster_port, "l.test", "/echo", timeout=1.0)
                assert after.status == 200
            assert echo.connections == 1  # both times the pooled connection was reused
