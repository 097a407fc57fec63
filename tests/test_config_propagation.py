"""A push costs what changed, a big config can be pushed gzip-compressed, and pushes are
hitless (issue 43).

- what a push decodes, validates and compiles is counted
  (``tunnelgate_config_rules_built_total``): a rule the previous push had costs nothing;
- the table a push builds from the previous one equals a table compiled from scratch,
  whatever the pushes add, remove, change or move;
- ``Content-Encoding: gzip``: the body cap applies to the compressed body, the inflated
  JSON has its own cap (a zip bomb gets 413), a broken stream 400, another coding 415;
  ``check`` warns when a config must be pushed compressed;
- a WebSocket and an SSE stream opened before the first of 100 pushes live through
  all of them, a request in flight completes on its snapshot even when its route is
  removed, traffic on an unchanged route sees no error, and a route switched between
  backend A and B under traffic answers from A or B only.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import os
import random
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.control.runtime import Listening, serve
from proxy.control.pushbody import MAX_INFLATED_BYTES, BodyRejected, inflate, size_advice
from routing.config import parse_config
from routing.model import Config, ConfigError
from routing.reuse import RuleReuse
from routing.table import Table
from tests.helpers import RawClient, TestBackend
from tests.stack import Stack, make_settings, running
from tests.test_cli import cli
from tests.test_e2e_routing import LISTEN, ask, prefix, request_bytes, rule, served_by
from tests.wsutil import EchoServer, connect

BUILT = 'tunnelgate_config_rules_built_total{step="%s"}'


def routes(count: int, url: str) -> list[dict[str, Any]]:
    """``count`` one-host routes tagged ``r<i>``."""
    return [rule(f"r{i}", url, hosts=[f"r{i}.test"]) for i in range(count)]


async def built(stack: Stack) -> tuple[float, float]:
    """(rules validated, rules compiled) so far, from /metrics."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{stack.admin_url}/metrics")).text
    samples = dict(line.rpartition(" ")[::2] for line in text.splitlines()
                   if line.startswith("tunnelgate_config_rules_built_total"))
    return (float(samples.get(BUILT % "validated", 0)),
            float(samples.get(BUILT % "compiled", 0)))


def _changed(wire: list[dict[str, Any]], url: str) -> list[dict[str, Any]]:
    wire[7] = rule("r7-new", url, hosts=["r7.test"])
    return wire


# (case, how the second push differs from the first, (validated, compiled) it costs)
COSTS = [
    ("the same rules again", lambda wire, url: wire, (0, 0)),
    ("one rule changed", _changed, (1, 1)),
    ("one route added at the end", lambda wire, url: wire + routes(41, url)[40:], (1, 1)),
    ("the last route removed", lambda wire, url: wire[:-1], (0, 0)),
    ("an earlier rule repeated at the end", lambda wire, url: wire + wire[3:4], (1, 1)),
    ("one route inserted in the middle",
     lambda wire, url: wire[:20] + routes(41, url)[40:] + wire[20:], (1, 1)),
    ("a route in the middle removed", lambda wire, url: wire[:20] + wire[21:], (0, 0)),
]


@pytest.mark.parametrize("case, change, cost", COSTS, ids=[c[0] for c in COSTS])
async def test_a_push_validates_and_compiles_only_the_rules_that_changed(
        case: str, change: Any, cost: tuple[int, int]) -> None:
    async with TestBackend() as echo:
        first = routes(40, echo.url)
        async with running(*LISTEN, config={"version": 1, "rules": first}) as stack:
            before = await built(stack)
            assert before == (40, 40)
            second = change(json.loads(json.dumps(first)), echo.url)
            response = await stack.push({"version": 2, "rules": second})
            assert response.status_code == 200, response.text
            after = await built(stack)
            assert (after[0] - before[0], after[1] - before[1]) == cost
            # What serves is what the pushed config says.
            for index in (0, 7, len(second) - 1):
                host = second[index]["hostnames"][0]
                tag = second[index]["filters"][0]["requestHeaderModifier"]["set"][0]
                assert served_by(await ask(stack.cluster_port, host)) == tag["value"]


def _wire(rules: list[dict[str, Any]], version: int) -> str:
    return json.dumps({"version": version, "rules": rules})


def _random_rule(rng: random.Random, serial: int) -> dict[str, Any]:
    hosts = rng.choice([[], [f"h{rng.randrange(6)}.test"], ["*.w.test"],
                        [f"h{rng.randrange(6)}.test", "*.w.test"]])
    match = rng.choice([{"path": {"type": "PathPrefix", "value": f"/p{serial % 5}"}},
                        {"path": {"type": "Exact", "value": "/x"}},
                        {"path": {"type": "RegularExpression", "value": f"/r{serial}/[0-9]+"}}])
    wire: dict[str, Any] = {"matches": [match], "backends": [
        {"url": f"http://127.0.0.1:{9000 + serial % 3}", "weight": 1}]}
    if hosts:
        wire["hostnames"] = hosts
    return wire


def test_a_table_built_from_the_previous_one_equals_one_compiled_from_scratch() -> None:
    rng = random.Random(43)
    wire = [_random_rule(rng, i) for i in range(30)]
    reuse = RuleReuse()
    for version in range(1, 80):
        edit = rng.randrange(5)
        spot = rng.randrange(len(wire) + 1)
        if edit == 0:
            wire.insert(spot, _random_rule(rng, 100 + version))
        elif edit == 1 and len(wire) > 1:
            del wire[min(spot, len(wire) - 1)]
        elif edit == 2:
            wire[min(spot, len(wire) - 1)] = _random_rule(rng, 200 + version)
        elif edit == 3:
            wire.append(wire.pop(min(spot, len(wire) - 1)))  # moved to the end
        text = _wire(wire, version)
        table = Table.compile(parse_config(text, None, reuse), None, None, reuse)
        fresh = Table.compile(parse_config(text))
        assert table.describe() == fresh.describe(), version
        for host in ("h1.test", "a.w.test", "other.test"):
            for path in ("/p1/a", "/x", f"/r{version}/7"):
                got = table.lookup(host, path, "", [], "GET", "tunnel")
                want = fresh.lookup(host, path, "", [], "GET", "tunnel")
                assert (got and (got.route.index, got.host_pattern, got.key)) == \
                    (want and (want.route.index, want.host_pattern, want.key))


# (case, where the edit is, how many rules it adds) on a table of 1,000 routes
MIDDLE_EDITS = [
    ("a rule inserted in the middle", 500, 1),
    ("a rule inserted first", 0, 1),
    ("a rule removed from the middle", 500, 0),
]


@pytest.mark.parametrize("case, spot, added", MIDDLE_EDITS, ids=[c[0] for c in MIDDLE_EDITS])
def test_an_edit_in_the_middle_compiles_only_the_changed_rule(case: str, spot: int,
                                                                added: int) -> None:
    wire = [dict(_random_rule(random.Random(i), i), hostnames=[f"r{i}.test"])
            for i in range(1_000)]
    reuse = RuleReuse()
    before = Table.compile(parse_config(_wire(wire, 1), None, reuse), None, None, reuse)
    counts = (reuse.validated, reuse.compiled)
    new_rule = {"hostnames": ["new.test"], "matches": [{"path": {"type": "Exact",
                                                              "value": "/new"}}]}
    edited = wire[:spot] + [new_rule] * added + wire[spot + 1 - added:]
    text = _wire(edited, 2)
    table = Table.compile(parse_config(text, None, reuse), None, None, reuse)
    assert (reuse.validated - counts[0], reuse.compiled - counts[1]) == (added, added)
    assert table.describe() == Table.compile(parse_config(text)).describe()
    # The rules after the edit moved: their compiled parts are the ones they had.
    old, new = before.rules[spot + 1], table.rules[spot + 2 * added]
    assert new is not old and new.rule is old.rule and new.index == old.index + 2 * added - 1
    assert new.backends is old.backends and new.request_filters is old.request_filters


def _host_rule(*hosts: str) -> dict[str, Any]:
    return {"hostnames": list(hosts), "matches": [{"path": {"type": "PathPrefix",
                                                           "value": "/api"}}],
            "filters": [{"type": "RequestHeaderModifier",
                         "requestHeaderModifier": {"set": [{"name": "X-A", "value": "1"}]}}],
            "backends": [{"url": "http://127.0.0.1:9", "weight": 1}],
            "timeouts": {"request": "5s"}}


def test_rules_that_differ_only_in_their_hostnames_share_every_other_part() -> None:
    config = parse_config(_wire([_host_rule("a.test"), _host_rule("b.test", "c.test"),
                                 _host_rule()], 1))
    first, second, third = config.rules
    assert (second.hostnames, third.hostnames) == (("b.test", "c.test"), ())
    for rule in (second, third):
        assert rule == replace(first, hostnames=rule.hostnames)
        assert all(getattr(rule, part) is getattr(first, part)
                   for part in ("matches", "filters", "backends", "timeouts"))


# (case, the hostnames of the second rule, the error's path)
BAD_HOSTNAMES = [
    ("an invalid hostname", '["a..test"]', "rules[1].hostnames[0]"),
    ("not a string", '["b.test", 7]', "rules[1].hostnames[1]"),
    ("not an array", '"b.test"', "rules[1].hostnames"),
]


@pytest.mark.parametrize("case, hostnames, path", BAD_HOSTNAMES,
                         ids=[c[0] for c in BAD_HOSTNAMES])
def test_a_bad_hostname_of_a_rule_shaped_like_an_earlier_one_is_refused(
        case: str, hostnames: str, path: str) -> None:
    good = json.dumps(_host_rule("a.test"))
    bad = good.replace('["a.test"]', hostnames)
    with pytest.raises(ConfigError) as refused:
        parse_config('{"version": 1, "rules": [%s, %s]}' % (good, bad))
    assert refused.value.path == path
    with pytest.raises(ConfigError) as alone:  # what the rule alone is refused for
        parse_config('{"version": 1, "rules": [%s, %s]}' % (bad, good))
    assert str(alone.value).replace("rules[0]", "rules[1]") == str(refused.value)


# ------------------------------------------------------------------------------ gzip


async def put(stack: Stack, body: bytes, encoding: str | None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    async with httpx.AsyncClient(timeout=30.0) as client:
        return await client.put(f"{stack.admin_url}/config", content=body, headers=headers)


def _large(url: str, version: int) -> bytes:
    """A config whose JSON is over 1 MiB (about 1.3 MB)."""
    body = _wire(routes(9_000, url), version).encode()
    assert len(body) > 1 << 20
    return body


async def test_a_config_over_the_cap_is_pushed_gzip_compressed() -> None:
    async with TestBackend() as echo:
        async with running(*LISTEN, config={"version": 1, "rules": routes(1, echo.url)}) \
                as stack:
            large = _large(echo.url, 2)
            assert (await put(stack, large, None)).status_code == 413
            response = await put(stack, gzip.compress(large), "gzip")
            assert response.status_code == 200, response.text
            assert served_by(await ask(stack.cluster_port, "r8999.test")) == "r8999"


BOMB = gzip.compress(b" " * (MAX_INFLATED_BYTES + 1), compresslevel=9)

# (case, body, Content-Encoding, status, start of the answer)
REFUSED = [
    ("zip bomb", BOMB, "gzip", 413, "config body exceeds maximum size once decompressed"),
    ("truncated stream", gzip.compress(b'{"version":5,"rules":[]}')[:-9], "gzip", 400,
     "invalid gzip body"),
    ("not gzip at all", b'{"version":5,"rules":[]}', "gzip", 400, "invalid gzip body"),
    ("bytes after the stream", gzip.compress(b'{"version":5,"rules":[]}') + b"x", "gzip",
     400, "invalid gzip body: data after the end of the stream"),
    ("brotli", b'{"version":5,"rules":[]}', "br", 415, "unsupported Content-Encoding"),
    ("gzip then deflate", b'{"version":5,"rules":[]}', "gzip, deflate", 415,
     "unsupported Content-Encoding"),
    ("invalid JSON inside", gzip.compress(b'{"version":5,'), "gzip", 400, "invalid JSON"),
]


@pytest.mark.parametrize("case, body, encoding, status, message", REFUSED,
                         ids=[r[0] for r in REFUSED])
async def test_a_refused_gzip_push_changes_nothing(case: str, body: bytes, encoding: str,
                                                   status: int, message: str) -> None:
    async with TestBackend() as echo:
        async with running(*LISTEN, config={"version": 1, "rules": routes(2, echo.url)}) \
                as stack:
            response = await put(stack, body, encoding)
            assert response.status_code == status, response.text
            assert response.text.startswith(message)
            assert served_by(await ask(stack.cluster_port, "r1.test")) == "r1"
            again = await put(stack, gzip.compress(_wire(routes(3, echo.url), 2).encode()),
                              "x-gzip")
            assert again.status_code == 200  # and the API still takes a good push


def test_inflating_takes_the_cap_and_stops_just_past_it() -> None:
    cap = 1 << 20
    assert inflate(gzip.compress(b"x" * cap), cap) == b"x" * cap
    with pytest.raises(BodyRejected) as refused:
        inflate(gzip.compress(b"x" * (cap + 1)), cap)
    assert refused.value.status == 413
    with pytest.raises(BodyRejected) as bomb:
        inflate(BOMB, cap)
    assert bomb.value.status == 413


@pytest.mark.parametrize("flags, environ", [
    (("--config-max-bytes", "2000000"), {}),
    ((), {"PROXY_CONFIG_MAX_BYTES": "2000000"}),
])
async def test_the_body_cap_can_be_raised(flags: tuple[str, ...],
                                          environ: dict[str, str]) -> None:
    async with TestBackend() as echo:
        async with running(*LISTEN, *flags, environ=environ) as stack:
            response = await put(stack, _large(echo.url, 2), None)
            assert response.status_code == 200, response.text
            assert served_by(await ask(stack.cluster_port, "r5.test")) == "r5"


def test_size_advice_says_gzip_or_a_raised_cap() -> None:
    small = b'{"version":1,"rules":[]}'
    assert size_advice(small) is None
    repetitive = b'{"rules":[' + b'{"hostnames":["a.test"]},' * 60_000 + b'{}]}'
    assert "push it with Content-Encoding: gzip" in (size_advice(repetitive) or "")
    noise = random.Random(1).randbytes(2 << 20).hex().encode()
    assert "raise the cap (--config-max-bytes" in (size_advice(noise) or "")
    assert size_advice(noise, body_cap=len(noise)) is None


# ------------------------------------------------------------------------- hitless


class EventSource:
    """A server-sent-events backend on 127.0.0.1 whose stream the test drives: every
    :meth:`emit` writes one event to every open stream."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> "EventSource":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self.writers:
            writer.transport.abort()
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        self.writers.append(writer)

    def emit(self, data: str) -> None:
        event = f"data: {data}\n\n".encode()
        for writer in self.writers:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))


async def _read_event(reader: asyncio.StreamReader) -> bytes:
    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
    event = await reader.readexactly(size + 2)
    return event[:-2]


def hitless_config(version: int, a: str, b: str, ws: str, sse: str) -> dict[str, Any]:
    """Fixed routes (stable, stream, slow, ws) and ``version`` added routes; the host
    ``flip.test`` goes to backend A on odd versions, B on even ones."""
    fixed = [rule("stable", a, hosts=["stable.test"]),
             rule("sse", sse, hosts=["sse.test"]),
             {"hostnames": ["ws.test"], "backends": [{"url": ws, "weight": 1,
                                                      "websocket": True}]},
             rule("A" if version % 2 else "B", a if version % 2 else b,
                  hosts=["flip.test"])]
    if version < 3:  # removed by push 3, while a request on it is still in flight
        fixed.append(rule("slow", a, hosts=["slow.test"]))
    added = [rule(f"n{i}", a, hosts=[f"n{i}.test"]) for i in range(version)]
    return {"version": version, "rules": fixed + added}


async def _traffic(port: int, host: str, done: asyncio.Event) -> list[str]:
    """Requests on one kept-alive connection until ``done``; who served each."""
    client = await RawClient.connect(port)
    seen = []
    try:
        for index in range(100_000):  # bounded; ends with the pushes
            if done.is_set():
                break
            client.send(request_bytes("GET", f"/t/{index}", host))
            seen.append(served_by(await client.read_response()))
    finally:
        client.close()
    return seen


async def test_streams_in_flight_requests_and_traffic_live_through_100_pushes() -> None:
    async with TestBackend() as a, TestBackend() as b, EchoServer() as ws_server, \
            EventSource() as sse:
        urls = (a.url, b.url, ws_server.url, sse.url)
        async with running(*LISTEN, config=hitless_config(1, *urls)) as stack:
            port = stack.cluster_port
            _, ws = await connect(port, "/chat", [(b"Host", b"ws.test"),
                                                  (b"Connection", b"Upgrade"),
                                                  (b"Upgrade", b"websocket"),
                                                  (b"Sec-WebSocket-Version", b"13")])
            assert ws is not None
            stream = await RawClient.connect(port)
            stream.send(request_bytes("GET", "/events", "sse.test"))
            head = await stream.reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"event-stream" in head
            slow = asyncio.ensure_future(ask(port, "slow.test", "/slow?delay=0.5"))
            await asyncio.sleep(0.1)  # the slow request reaches its backend
            done = asyncio.Event()
            runs = [asyncio.ensure_future(_traffic(port, host, done))
                    for host in ("stable.test", "flip.test")]
            for version in range(2, 102):
                response = await stack.push(hitless_config(version, *urls))
                assert response.status_code == 200, response.text
                await ws.send(f"after push {version}")
                echoed = await asyncio.wait_for(ws.recv(), 5)
                assert echoed is not None and echoed.data == f"after push {version}".encode()
                sse.emit(f"push {version}")
                assert await asyncio.wait_for(_read_event(stream.reader), 5) == \
                    f"data: push {version}\n\n".encode()
            done.set()
            stable, flip = await asyncio.gather(*runs)
            assert served_by(await slow) == "slow"  # its route was removed by push 3
            assert served_by(await ask(port, "slow.test")) == "404"
            stream.close()
            ws.close()
        assert stable and set(stable) == {"stable"}
        assert flip and set(flip) <= {"A", "B"}


@pytest.mark.parametrize("count, warned", [
    (100, None),
    (9_000, "push it with Content-Encoding: gzip"),
])
def test_check_says_when_a_config_needs_gzip_to_be_pushed(
        tmp_path: Path, count: int, warned: str | None) -> None:
    path = tmp_path / "routes.json"
    path.write_text(_wire(routes(count, "http://127.0.0.1:9"), 1))
    done = cli("check", "--strict", str(path))
    lines = [line for line in done.stderr.splitlines() if "PUT /config" in line]
    if warned is None:
        assert done.returncode == 0 and lines == []
    else:
        assert done.returncode == 1 and len(lines) == 1 and warned in lines[0]
        assert lines[0].startswith(f"{path}: warning: the wire JSON is ")


async def test_the_start_config_is_freed_once_a_push_replaces_it(tmp_path: Path) -> None:
    """``serve --config``: the file's config serves until the first push replaces it,
    and then nothing holds it (it once stayed referenced for the life of the process:
    at 10,000 routes, ~4 MB of rules that nothing served)."""
    url = "http://127.0.0.1:9"
    path = tmp_path / "config.json"
    start, pushed = 640_001, 640_002  # versions no other test's configs have
    path.write_text(json.dumps({"version": start, "rules": routes(5, url)}))
    settings = make_settings(*LISTEN, "--admin", "127.0.0.1:0", "--config", str(path))
    ready: asyncio.Future[Listening] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(settings, on_listening=ready.set_result))
    admin = (await ready).admin
    try:
        assert start in live_config_versions()
        async with httpx.AsyncClient() as client:
            response = await client.put(f"http://{admin.host}:{admin.port}/config",
                                        json={"version": pushed, "rules": routes(5, url)})
        assert response.status_code == 200, response.text
        versions = live_config_versions()
        assert pushed in versions and start not in versions
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # serve's own stop signal: it drains
        assert await asyncio.wait_for(task, 30) == 0


def live_config_versions() -> list[int]:
    """The versions of every config object alive in this process (frozen objects
    included: a swap freezes the new table out of the collector's reach,
    ``proxy.control.builds``); other tests' configs may be among them."""
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    try:
        gc.collect()
        return [obj.version for obj in gc.get_objects() if isinstance(obj, Config)]
    finally:
        if frozen:
            gc.freeze()
