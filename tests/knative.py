"""Knative's side of the readiness probe, played for real over loopback sockets.

- :class:`QueueProxy` answers like the probe handler of Knative's queue-proxy (and the
  activator) in front of a revision: a request with ``K-Network-Probe: probe`` gets 503
  while the pod drains, 400 when ``K-Network-Hash`` is empty, else 200 echoing the hash;
  anything else is the app's answer, and ``K-Network-Hash`` never reaches the app.
- :class:`GoProber` sends net-gateway-api's probe the way its Go client does: a fresh
  connection per probe that is left open afterwards, ``Accept-Encoding: gzip``, a 1 s
  budget, and with PROXY protocol the v2 header in its own segment before the request;
  with ``tls``, over TLS, as it probes an HTTPS listener.
  :func:`verdict` judges an answer with the prober's rules.
- :class:`IngressRule` / :func:`rollout` build what net-gateway-api generates for a
  KIngress: one HTTPRoute per rule with the probe copy of ``/`` first, and the four
  staged probe versions of a rollout (plain hash, ``ep-`` with endpoint probes for
  the new and old revisions, ``tr-`` with the new splits, plain hash again).
  :meth:`Phase.probe_urls` derives the probe URLs from the generated rules the way the
  reconciler does.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import socket
import ssl
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import h11

from tests.helpers import HOST, LoopbackServer

PROXY_V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
NAMESPACE = "default"
ENDPOINT_PROBE_PREFIX = f"/.well-known/knative/revision/{NAMESPACE}/"
PROBE_BUDGET = 1.0  # the prober's dial timeout and whole-probe timeout, seconds


def has_ipv6_loopback() -> bool:
    """True when ``::1`` can be bound here (some CI containers have no IPv6)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def listen_address(loopback: str, port: int = 0) -> str:
    """``HOST:PORT`` for a ``--listen``-style flag, brackets around IPv6."""
    return f"[{loopback}]:{port}" if ":" in loopback else f"{loopback}:{port}"


# --------------------------------------------------------------------------- revision


@dataclass
class ProbeSeen:
    """What the queue-proxy saw of one request."""

    host: str
    path: str
    headers: dict[str, str]


class QueueProxy(LoopbackServer):
    """A fake revision pod: the queue-proxy's probe handler plus a trivial app.

    ``draining`` makes it answer probes 503 as a terminating pod does. ``app_seen``
    holds the header sets that reached the app (``K-Network-Hash`` removed first).
    """

    def __init__(self, revision: str, host: str = HOST) -> None:
        super().__init__()
        self.revision = revision
        self.host = host
        self.draining = False
        self.seen: list[ProbeSeen] = []
        self.app_seen: list[dict[str, str]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://{listen_address(self.host, self.port)}"

    async def start(self) -> QueueProxy:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stop, and wait until every connection's task has seen its end (a task still
        pending when the test's loop closes would be cancelled noisily)."""
        await super().close()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            while True:
                request = await _read_request(conn, reader)
                if request is None:
                    return
                status, headers, body = self._answer(request)
                headers = headers + [("Content-Type", "text/plain"),
                                     ("Content-Length", str(len(body)))]
                writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
                writer.write(conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
                await writer.drain()
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    def _answer(self, request: h11.Request) -> tuple[int, list[tuple[str, str]], bytes]:
        # Go's Header.Get: the first value of a repeated header counts, so an appended
        # (not replaced) K-Network-Hash still reads "override".
        headers: dict[str, str] = {}
        for name, value in request.headers:
            headers.setdefault(name.decode().lower(), value.decode())
        self.seen.append(ProbeSeen(headers.get("host", ""), request.target.decode(),
                                   headers))
        if headers.get("k-network-probe") == "probe":
            if self.draining:
                return 503, [], b"shutting down"
            digest = headers.get("k-network-hash", "")
            if not digest:
                return 400, [], b"no K-Network-Hash set"
            return 200, [("K-Network-Hash", digest)], b""
        headers.pop("k-network-hash", None)
        self.app_seen.append(headers)
        return 200, [], f"{self.revision}\n".encode()


async def _read_request(conn: h11.Connection,
                        reader: asyncio.StreamReader) -> h11.Request | None:
    request = None
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.EndOfMessage):
            return request
        elif isinstance(event, h11.ConnectionClosed):
            return None


# --------------------------------------------------------------------------- prober


def proxy_v2_header(source: tuple[str, int], destination: tuple[str, int]) -> bytes:
    """A PROXY v2 ``PROXY`` header: TCP over IPv4 (family byte 0x11, what
    net-gateway-api writes) for IPv4 addresses, TCP over IPv6 (0x21) for IPv6 ones."""
    src, dst = ipaddress.ip_address(source[0]), ipaddress.ip_address(destination[0])
    family = b"\x11" if src.version == 4 else b"\x21"
    addresses = src.packed + dst.packed + struct.pack("!HH", source[1], destination[1])
    return PROXY_V2_SIGNATURE + b"\x21" + family + struct.pack("!H", len(addresses)) \
        + addresses


@dataclass
class ProbeResult:
    status: int  # 0 = dial error / timeout
    headers: dict[str, str]
    body: bytes = b""
    seconds: float = 0.0


def probe_request(hostname: str, path: str) -> bytes:
    """net-gateway-api's probe request as Go's client writes it."""
    return (f"GET {path} HTTP/1.1\r\nHost: {hostname}\r\n"
            "User-Agent: Knative-Ingress-Probe\r\nK-Network-Hash: override\r\n"
            "K-Network-Probe: probe\r\nAccept-Encoding: gzip\r\n\r\n").encode()


@dataclass
class GoProber:
    """net-gateway-api's prober client against one loopback address.

    Every probe dials a new connection (a cloned Go transport) and leaves it open after
    the answer, as Go's idle pool does until the server closes it; :meth:`close` ends
    them. ``durations`` records every probe's time, dial included.
    """

    loopback: str = HOST
    proxy_protocol: bool = False
    # An HTTPS listener: the prober dials TLS with the probed hostname as SNI and does
    # not verify the certificate (net-gateway-api does not), which this context says.
    tls: ssl.SSLContext | None = None
    open: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(
        default_factory=list)
    durations: list[float] = field(default_factory=list)

    async def probe(self, port: int, hostname: str, path: str = "/") -> ProbeResult:
        """One probe; a dial error, a closed connection or the budget running out is
        status 0 (the prober retries those)."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(PROBE_BUDGET):
                reader, writer = await asyncio.open_connection(
                    self.loopback, port, ssl=self.tls,
                    server_hostname=hostname if self.tls is not None else None)
                self.open.append((reader, writer))
                if self.proxy_protocol:
                    # Written at dial time, before the HTTP client has the request:
                    # a segment of its own. Yielding lets the server read it alone.
                    local = writer.get_extra_info("sockname")[:2]
                    writer.write(proxy_v2_header(local, (self.loopback, port)))
                    await writer.drain()
                    await asyncio.sleep(0.001)
                writer.write(probe_request(hostname, path))
                result = await read_response(reader)
        except (OSError, TimeoutError, h11.ProtocolError):
            result = ProbeResult(0, {})
        result.seconds = time.monotonic() - started
        self.durations.append(result.seconds)
        return result

    async def until_ready(self, port: int, hostname: str, path: str, expected: str,
                          *, give_up: float = 5.0) -> tuple[float, list[str]]:
        """Probe until ``ready`` with the prober's backoff (50 ms, doubling); returns
        the time it took and every verdict seen. Fails after ``give_up`` seconds."""
        started, delay, verdicts = time.monotonic(), 0.05, []
        while True:
            verdicts.append(verdict(await self.probe(port, hostname, path), expected))
            if verdicts[-1] == "ready":
                return time.monotonic() - started, verdicts
            assert verdicts[-1] == "retry", (hostname, path, verdicts)
            assert time.monotonic() - started < give_up, (hostname, path, verdicts)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def still_open(self) -> int:
        """How many of the connections left open the server has not closed."""
        return sum(1 for reader, _ in self.open if not reader.at_eof())

    def close(self) -> None:
        for _, writer in self.open:
            writer.transport.abort()
        self.open.clear()


async def read_response(reader: asyncio.StreamReader) -> ProbeResult:
    """Read one whole response (the connection stays usable and is left open)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    response: h11.Response | None = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert response is not None
            return ProbeResult(response.status_code,
                               {n.decode().lower(): v.decode() for n, v in response.headers},
                               body)
        elif isinstance(event, h11.ConnectionClosed):
            return ProbeResult(0, {})


async def probe(port: int, hostname: str, path: str = "/", *, loopback: str = HOST,
                proxy_protocol: bool = False) -> ProbeResult:
    """One probe on a connection of its own, closed afterwards."""
    prober = GoProber(loopback, proxy_protocol)
    try:
        return await prober.probe(port, hostname, path)
    finally:
        prober.close()


def verdict(result: ProbeResult, expected_hash: str) -> str:
    """The prober's conclusion: ``"ready"``, ``"retry"`` or ``"abandoned"``.

    ``abandoned`` is counted as success by Knative (it stops probing that URL); the tests
    require ``ready``, and ``retry`` from a replica that has not got a push yet.
    """
    if result.status == 0 or result.status in (404, 503):
        return "retry"
    if result.status != 200:
        return "abandoned"
    got = result.headers.get("k-network-hash")
    if got is None:
        return "abandoned"
    return "ready" if got == expected_hash else "retry"


# --------------------------------------------------------------------------- KIngress


def knative_hash(*parts: Any) -> str:
    """A 64-hex probe hash (net-gateway-api hashes the KIngress spec the same way)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class IngressRule:
    """One KIngress rule, which becomes one HTTPRoute: its hosts and traffic split
    (revision → percent)."""

    visibility: str  # "external" or "cluster-local"
    hosts: tuple[str, ...]
    splits: tuple[tuple[str, int], ...]

    @property
    def probed_hosts(self) -> tuple[str, ...]:
        """Every host of an external route; only the longest of a cluster-local one."""
        if self.visibility == "external":
            return self.hosts
        return (max(self.hosts, key=lambda h: (len(h), h)),)


def revision_filter(revision: str) -> dict[str, Any]:
    return {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [
        {"name": "Knative-Serving-Namespace", "value": NAMESPACE},
        {"name": "Knative-Serving-Revision", "value": revision}]}}


def hash_filter(digest: str) -> dict[str, Any]:
    return {"type": "RequestHeaderModifier",
            "requestHeaderModifier": {"set": [{"name": "K-Network-Hash", "value": digest}]}}


def probe_match(path: str = "/") -> dict[str, Any]:
    return {"path": {"type": "PathPrefix", "value": path},
            "headers": [{"type": "Exact", "name": "K-Network-Hash", "value": "override"}]}


def httproute_rules(rule: IngressRule, digest: str, backends: Mapping[str, str],
                    endpoint_probes: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The wire rules of the HTTPRoute made for ``rule`` at probe version ``digest``:
    the probe copy of ``/`` (one more header match, hash set by its filter), one
    endpoint-probe rule per revision in ``endpoint_probes`` (weight 100 to that
    revision), then the plain rule. ``backends`` maps revision → URL."""
    hosts = list(rule.hosts)
    split = [{"url": backends[revision], "weight": percent,
              "filters": [revision_filter(revision)]} for revision, percent in rule.splits]
    rules = [{"hostnames": hosts, "matches": [probe_match()], "filters": [hash_filter(digest)],
              "backends": split, "timeouts": {}}]
    for revision in endpoint_probes:
        rules.append({"hostnames": hosts,
                      "matches": [probe_match(ENDPOINT_PROBE_PREFIX + revision)],
                      "filters": [hash_filter(digest)],
                      "backends": [{"url": backends[revision], "weight": 100,
                                    "filters": [revision_filter(revision)]}],
                      "timeouts": {}})
    rules.append({"hostnames": hosts, "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                  "backends": split, "timeouts": {}})
    return rules


def is_probe_rule(rule: Mapping[str, Any]) -> bool:
    """A rule the reconciler probes: one of its matches has a K-Network-Hash match."""
    return any(h["name"].lower() == "k-network-hash"
               for m in rule.get("matches", ()) for h in m.get("headers", ()))


@dataclass(frozen=True)
class Phase:
    """One probe version of a KIngress: its hash and, per route, the rule it serves
    plus the revisions that get endpoint probes."""

    name: str
    digest: str
    routes: tuple[tuple[IngressRule, tuple[str, ...]], ...]

    def rules(self, backends: Mapping[str, str]) -> list[dict[str, Any]]:
        return [r for rule, probes in self.routes
                for r in httproute_rules(rule, self.digest, backends, probes)]

    def probe_urls(self, backends: Mapping[str, str]) -> list[tuple[str, str]]:
        """(host, path) of every probe: each probe rule's path on each probed host of
        its route, derived from the generated rules as the reconciler derives them."""
        urls = []
        for rule, probes in self.routes:
            for wire in httproute_rules(rule, self.digest, backends, probes):
                if is_probe_rule(wire):
                    urls += [(host, m["path"]["value"]) for m in wire["matches"]
                             for host in rule.probed_hosts]
        return urls


def rollout(old: Sequence[IngressRule], new: Sequence[IngressRule]) -> list[Phase]:
    """The four probe versions a rollout from ``old`` to ``new`` goes through (the
    routes pair up by position): the old spec probed at its plain hash; ``ep-<new>``
    with the old splits plus endpoint probes for every revision of the old and new
    splits; ``tr-<new>`` with the new splits and the endpoint probes; ``<new>``."""
    old_hash, new_hash = knative_hash([repr(r) for r in old]), knative_hash(
        [repr(r) for r in new])
    endpoint = [tuple(sorted({rev for rev, _ in (*before.splits, *after.splits)}))
                for before, after in zip(old, new)]
    return [
        Phase("initial", old_hash, tuple((rule, ()) for rule in old)),
        Phase("ep", "ep-" + new_hash, tuple(zip(old, endpoint))),
        Phase("tr", "tr-" + new_hash, tuple(zip(new, endpoint))),
        Phase("final", new_hash, tuple((rule, ()) for rule in new)),
    ]
