"""The config API and health endpoints, served on their own listener (docs/config.md).

:class:`AdminApi` is a Handle (``await api(request, responder)``) that the HTTP/1.1
entrance code serves on the admin address, so this module does no socket work. Paths,
statuses, bodies and the order of checks are the anchor's wire contract:
the Go controller and kubelet probes talk to it unchanged.

A push is parsed and compiled in a worker thread (:class:`proxy.control.builds.Builds`)
so requests in flight keep being served. The swap itself happens on the event loop, and
pushes are serialised so an older push that compiled slowly can never overwrite a newer
one. With ``--workers N`` the supervisor runs this API unchanged and
hands each accepted config to a ``publish`` hook (the worker fan-out) instead of
compiling it here.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import logging
import time
from types import MappingProxyType
from typing import Awaitable, Callable, Protocol

from proxy.control import allocator
from proxy.control.attempts import ConfigAttempts
from proxy.control.builds import Builds
from proxy.control.debug import DebugQueryError, LiveState
from proxy.control.pushbody import (
    DEFAULT_MAX_BYTES, GZIP, BodyRejected, content_coding, inflate, inflated_cap)
from proxy.control.settings import Settings
from proxy.exchange.snapshot import Snapshot, SnapshotHolder
from proxy.observability.metrics import Metrics
from proxy.request import BodyError, Request, Responder
from routing.lint import unweighted_rules, wire_label
from routing.model import Config, ConfigError
from routing.pause import Pause
from routing.table import Table

log = logging.getLogger("tunnelgate.admin")

MAX_CONFIG_BYTES = DEFAULT_MAX_BYTES  # a PUT /config body's default cap (1 MiB)

OnSwap = Callable[[Snapshot], Awaitable[None] | None]
# Makes a config current wherever requests are served; raises if it could not. The
# bytes are the wire JSON the config was parsed from, when it came as such (None: the
# publisher encodes the config itself).
Publish = Callable[[Config, bytes | None], Awaitable[None]]

# Go's http.Error headers (copied into each answer: a responder owns its header list).
_TEXT = ((b"Content-Type", b"text/plain; charset=utf-8"),
         (b"X-Content-Type-Options", b"nosniff"))
_JSON = ((b"Content-Type", b"application/json"),)

# Path → methods it answers; Go's method-pattern mux lets GET routes serve HEAD too.
_ROUTES = MappingProxyType({
    "/config": ("GET", "HEAD", "PUT"),
    "/healthz": ("GET", "HEAD"),
    "/readyz": ("GET", "HEAD"),
    "/metrics": ("GET", "HEAD"),
    "/debug/routes": ("GET", "HEAD"),
    "/debug/explain": ("GET", "HEAD"),
    "/debug/config": ("GET", "HEAD"),
})
_AUTHENTICATED = frozenset(("/config", "/debug/routes", "/debug/explain", "/debug/config"))


class TunnelState(Protocol):
    """What readiness needs from the tunnel side (``tunnel.readiness.ReadyProbe``)."""

    @property
    def ever_connected(self) -> bool:
        """True once cloudflared registered with the edge at least once."""
        ...


class Readiness:
    """The one readiness definition behind ``/readyz`` and ``GET /config``.

    Ready = not draining, current version > 0, and the tunnel has connected at least
    once. The tunnel part latches: a later edge drop does not flip readiness. Without a
    tunnel (standalone) it is latched from the start.
    """

    def __init__(self, holder: SnapshotHolder, tunnel: TunnelState | None = None) -> None:
        self.holder = holder
        self.tunnel = tunnel
        self.draining = False
        self._connected = tunnel is None

    def tunnel_connected(self) -> bool:
        if not self._connected and self.tunnel is not None and self.tunnel.ever_connected:
            self._connected = True
        return self._connected

    def reason(self) -> str | None:
        """Why the process is not ready (the ``/readyz`` 503 body), or None if ready."""
        if self.draining:
            return "not ready: draining"
        if not self.holder.loaded:
            return "not ready: no config loaded"
        if self.holder.current.version <= 0:
            # Loaded and serving, but unversioned: say so, not "no config" (issue 39).
            return ("not ready: the config loaded has version 0; readiness needs a "
                    "config with version > 0")
        if not self.tunnel_connected():
            return "not ready: tunnel not connected to edge"
        return None

    @property
    def ready(self) -> bool:
        return self.reason() is None


ConfigRejected = BodyRejected
"""A config refused with HTTP ``status`` and a one-line ``message``."""


def _text(responder: Responder, status: int, message: str) -> None:
    """Answer the way Go's ``http.Error`` does: plain text, nosniff, trailing newline."""
    responder.respond(status, list(_TEXT), message.encode() + b"\n")


class AdminApi:
    """``PUT/GET /config``, ``/healthz``, ``/readyz``, ``/metrics``, and the
    live state of :mod:`proxy.control.debug` (``GET /debug/routes``, ``GET /debug/explain``),
    which needs the config API's token like ``/config``.

    ``on_swap`` runs after every accepted config is made current (pool pruning, edge
    protocol); it may be a coroutine function. Its failure is logged, never turned into
    a rejection: the swap has already happened.

    ``publish`` (``--workers N``): this process serves no requests, so instead of
    compiling, ``await publish(config, body)`` makes the config current in every worker
    and raises if any could not take it (⇒ 500; the publisher guarantees that
    nothing changed then). ``body`` is the pushed JSON itself, so the workers parse the
    very bytes validated here rather than a re-encoding of them. Only after it returns does ``holder`` record the config, with
    an empty table, for version ordering and readiness.

    ``live`` answers ``/debug/*`` (absent: 404). ``metrics.config`` counts every push
    by its answer and records each applied config, whether ``/metrics`` is served or not;
    ``attempts`` records every apply, a push's or the config file's, for ``/metrics``
    and ``GET /debug/config``.
    ``builds`` runs the parse and compile of a push off the loop (the process's one).
    """

    def __init__(self, holder: SnapshotHolder, metrics: Metrics, settings: Settings,
                 readiness: Readiness, *, builds: Builds, on_swap: OnSwap | None = None,
                 publish: Publish | None = None, live: LiveState | None = None) -> None:
        self.holder = holder
        self.builds = builds
        self.config_metrics = metrics.config
        self.attempts = ConfigAttempts(metrics.config)
        self.live = live
        self.metrics = metrics if settings.metrics_enabled else None
        self.token = settings.auth_token.encode() if settings.auth_token else None
        self.readiness = readiness
        self.on_swap = on_swap
        self.publish = publish
        self.max_body = settings.config_max_bytes
        self._counted = (0, 0)  # the holder's (validated, compiled) totals, counted
        self._push_lock = asyncio.Lock()
        if self.token is None:
            log.warning("config API is unauthenticated: set PROXY_AUTH_TOKEN or "
                        "--auth-token-file")

    async def __call__(self, request: Request, responder: Responder) -> None:
        path = request.path
        methods = _ROUTES.get(path)
        if methods is None or (path == "/metrics" and self.metrics is None) or (
                path.startswith("/debug/") and self.live is None):
            _text(responder, 404, "404 page not found")
            return
        if request.method not in methods:
            responder.respond(405, [*_TEXT, (b"Allow", ", ".join(methods).encode())],
                              b"Method Not Allowed\n")
            return
        if path in _AUTHENTICATED and not self._authorized(request):
            if request.method == "PUT":
                self._rejected(ConfigRejected(401, "unauthorized"))
            _text(responder, 401, "unauthorized")  # auth before anything else
        elif path.startswith("/debug/"):
            await self._debug(request, responder)
        elif path == "/config":
            if request.method == "PUT":
                await self._put_config(request, responder)
            else:
                body = json.dumps({"version": self.holder.current.version,  # Go's compact
                                   "ready": self.readiness.ready}, separators=(",", ":"))
                responder.respond(200, list(_JSON), body.encode() + b"\n")
        elif request.path == "/healthz":
            responder.respond(200, [], b"")
        elif request.path == "/readyz":
            reason = self.readiness.reason()
            if reason is None:
                responder.respond(200, [], b"")
            else:
                _text(responder, 503, reason)
        else:
            assert self.metrics is not None
            exposition, content_type = await self.metrics.render_all()
            responder.respond(200, [(b"Content-Type", content_type.encode())], exposition)

    async def _debug(self, request: Request, responder: Responder) -> None:
        assert self.live is not None
        try:
            if request.path == "/debug/routes":
                body = await self.live.routes()
            elif request.path == "/debug/config":
                body = json.dumps(self.attempts.state(), separators=(",", ":")).encode()
            else:
                answer = await self.live.explain(request.query)
                body = json.dumps(answer, separators=(",", ":")).encode() + b"\n"
        except DebugQueryError as exc:
            _text(responder, 400, str(exc))
            return
        responder.respond(200, list(_JSON), body)

    def _authorized(self, request: Request) -> bool:
        """``Authorization: Bearer <token>``, scheme case-insensitive, constant time."""
        if self.token is None:
            return True
        value = request.header(b"authorization")
        if value is None or len(value) <= 7 or value[:7].lower() != b"bearer ":
            return False
        return hmac.compare_digest(value[7:], self.token)

    async def _put_config(self, request: Request, responder: Responder) -> None:
        try:
            config, body = await self._read_config(request)
            await self._accept(config, body)
        except ConfigRejected as reject:
            self._rejected(reject)
            self.attempts.rejected("push", f"{reject.status} {reject.message}")
            _text(responder, reject.status, reject.message)
            return
        finally:
            self.builds.settle()  # accepted or not, its builds froze what was alive
            self._count_work()
        self.config_metrics.pushed(200)
        responder.respond(200, [], b"")

    def _count_work(self) -> None:
        """Count what the pushes since the last call decoded, validated and compiled
        (``tunnelgate_config_rules_built``)."""
        reuse = self.holder.reuse
        validated, compiled = reuse.validated, reuse.compiled
        self.config_metrics.built(validated - self._counted[0], compiled - self._counted[1])
        self._counted = (validated, compiled)

    def _rejected(self, reject: ConfigRejected) -> None:
        """A refused push: logged at warning with its status, and counted."""
        log.warning("config push rejected", extra={"status": reject.status,
                                                  "reason": reject.message})
        self.config_metrics.pushed(reject.status)

    async def _read_config(self, request: Request) -> tuple[Config, bytes]:
        """PUT /config checks 2–5: media type, size cap (of the body as sent, and of
        the JSON a gzip body inflates to), JSON, validation; the config and the JSON
        it was parsed from."""
        content_type = (request.header(b"content-type") or b"").lower()
        if not content_type.startswith(b"application/json"):
            raise ConfigRejected(415, "unsupported media type: Content-Type must be "
                               "application/json")
        coding = content_coding(request.header(b"content-encoding"))
        body = await _read_capped(request, self.max_body)
        try:
            return await self.builds.run(self._parse, body, coding)
        except ConfigError as exc:
            if exc.kind == "json":
                raise ConfigRejected(400, str(exc)) from None  # "invalid JSON: …"
            raise ConfigRejected(400, f"invalid config: {exc}") from None

    def _parse(self, body: bytes, coding: str, pause: Pause) -> tuple[Config, bytes]:
        """Inflate a gzip body (off the loop), then parse it."""
        if coding == GZIP:
            body = inflate(body, inflated_cap(self.max_body), pause)
        return self.holder.parse(body, pause), body

    async def _accept(self, config: Config, wire: bytes | None = None,
                      source: str = "push") -> None:
        """PUT /config checks 6–8 (version order, compile, swap), one push at a time."""
        async with self._push_lock:
            current = self.holder.current.version
            if 0 < config.version < current:
                raise ConfigRejected(409, "stale config version")
            await self.apply(config, wire, source=source)

    async def push(self, config: Config, path: str) -> bool:
        """Apply ``config``, read from the config file ``path``, as a ``PUT /config``
        is applied (version order, then compile). A rejection is logged at warning,
        recorded, and changes nothing. True if applied."""
        try:
            await self._accept(config, source="file")
        except ConfigRejected as reject:
            log.warning("config push rejected", extra={"status": reject.status,
                                                      "reason": reject.message,
                                                      "source": path})
            self.attempts.rejected("file", f"{path}: {reject.status} {reject.message}")
            return False
        finally:
            self._count_work()
        return True

    def file_unusable(self, message: str) -> None:
        """The config file could not be read or parsed (already logged): recorded."""
        self.attempts.rejected("file", message)

    async def apply(self, config: Config, wire: bytes | None = None, *,
                    source: str = "push") -> None:
        """Compile ``config`` off the loop and make it current (also used at start-up
        for ``--config``), then log what is accepted but answers badly (version 0,
        rules whose backends all weigh 0). Raises :class:`ConfigRejected` 500 if
        compiling fails.
        ``wire``: the JSON ``config`` was parsed from, if any (for ``publish``);
        ``source``: where it came from (:data:`proxy.control.attempts.SOURCES`)."""
        started = time.perf_counter()
        try:
            snapshot = await self._make_current(config, wire)
        except Exception:  # a compile failure is our bug, not the client's
            log.exception("config apply failed", extra={"version": config.version})
            raise ConfigRejected(500, "internal server error") from None
        if config.version == 0:
            # The version-0 trap: accepted, but readiness requires version > 0.
            log.warning("accepted an UNVERSIONED config (version 0): it bypasses version "
                        "ordering and makes this replica NOT READY until a versioned "
                        "config arrives")
        self.config_metrics.applied(config.version, len(config.rules), time.time())
        self.attempts.applied(source, config.version)
        log.info("config applied", extra={
            "version": config.version, "rules": len(config.rules),
            "compile_ms": round((time.perf_counter() - started) * 1000, 1)})
        await self._warn_unweighted(config)
        await self._notify(snapshot)

    async def _warn_unweighted(self, config: Config) -> None:
        """One warning per applied config naming its rules whose backends all weigh
        0 (the wire's absent weight): accepted, as the Go data plane accepts them, but
        each answers 500. Found off the loop: ~10 ms per 10,000 rules."""
        unweighted = await self.builds.run(unweighted_rules, config)
        if unweighted:
            log.warning("config applied with rules whose backends all weigh 0 (on the "
                        "wire an absent weight is 0, never 1): no backend is ever chosen "
                        "and every request they match is answered 500",
                        extra={"version": config.version, "count": len(unweighted),
                               "rules": ", ".join(map(wire_label, unweighted))})

    async def _make_current(self, config: Config, wire: bytes | None) -> Snapshot:
        if self.publish is not None:
            await self.publish(config, wire)
            snapshot = Snapshot(config.version, config, Table.empty())
        else:
            snapshot = await self.builds.run(self.holder.build, config)
        replaced = self.holder.swap(snapshot)
        if replaced is not None:
            # Nothing can reach the replaced table now (SnapshotHolder.swap); freeing
            # it at once would stall the loop for ~5 ms per 10,000 rules.
            await self.builds.run(replaced.release)
        # The replaced table and the decoded push are free now; give the memory back
        # (10,000 routes, RSS after a cold push: 87 MB before this and the shared rule
        # parts, 73–74 MB with both; benchmarks/RESULTS.md, 2026-12-07).
        await asyncio.to_thread(allocator.trim)
        return snapshot

    async def _notify(self, snapshot: Snapshot) -> None:
        if self.on_swap is None:
            return
        try:
            result = self.on_swap(snapshot)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_swap callback failed", extra={"version": snapshot.version})


async def _read_capped(request: Request, cap: int) -> bytes:
    """Read the body, refusing (413) and stopping as soon as it passes ``cap`` bytes."""
    too_large = ConfigRejected(413, "config body exceeds maximum size")
    body = request.body
    if body.length is not None and body.length > cap:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := await body.read():
            size += len(chunk)
            if size > cap:
                raise too_large
            chunks.append(chunk)
    except BodyError:
        raise ConfigRejected(400, "incomplete request body") from None
    return b"".join(chunks)
