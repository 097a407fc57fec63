"""Process settings: ``serve`` flags with the anchor's environment variables as defaults.

One frozen :class:`Settings` is built at start-up and handed to the
composition root; nothing reads the environment after that. Two kinds of bad input:

- the anchor's own durations, rates and protocol keep the anchor's leniency (an
  unparseable ``PROXY_GRACE_PERIOD`` logs a warning and falls back), so a Helm chart
  written for the Go binary never stops a pod from starting;
- our flags, boolean variables (where the anchor's silent "anything else is false"
  would hide a typo), and anything that would weaken security, fail loudly with
  :class:`SettingsError` naming the flag or variable (exit 2; exit 1 for a broken
  config-API auth configuration, as the anchor does).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from proxy.control import resilience
from proxy.control.resilience import ResilienceSettings
from proxy.control.pushbody import DEFAULT_MAX_BYTES, MAX_INFLATED_BYTES
from proxy.observability.settings import AccessLogSettings, TracingSettings
from proxy.upstream.base import RESPONSE_HEADER_TIMEOUT
from proxy.wire.framing import (
    DEFAULT_RESPONSE_HEADER_BYTES, DEFAULT_RESPONSE_HEADER_COUNT, HeadLimits)
from routing.decide import SCOPES
from routing.values import parse_duration, split_backend_url

log = logging.getLogger("tunnelgate.settings")

DEFAULT_CLUSTER_ADDR = ":8080"
DEFAULT_ADMIN_ADDR = ":8081"
DEFAULT_TUNNEL_ADDR = "127.0.0.1:8082"
DEFAULT_GRACE = 30.0
MAX_GRACE = 180.0
DEFAULT_WS_TIMEOUT = 30.0
# Header fields per request head. cloudflared and Cloudflare's edge add a dozen or more
# of their own (Cf-Ray, Cf-Visitor, Cdn-Loop, Cf-Warp-Tag-Id, ...) before a request
# reaches the tunnel entrance; 200 leaves a client well over 150 of its own.
DEFAULT_MAX_HEADER_COUNT = 200
# Each worker is a whole interpreter (~40 MB); past a few per core they only add memory.
MAX_WORKERS = 64
# cloudflared --protocol values; settings may not import tunnel/.
TUNNEL_PROTOCOLS = ("auto", "http2", "quic")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("logfmt", "json")  # proxy.observability.logs

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class SettingsError(Exception):
    """An unusable flag or variable; ``name`` is what the user must fix."""

    def __init__(self, name: str, message: str, exit_code: int = 2) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.exit_code = exit_code


BROKEN_AUTH = "refusing to start with a broken config-API auth configuration"

# The settings that own what ``serve`` opens at start, named when opening it fails: a
# listener's flag and the environment variable it falls back to, and the cloudflared
# executable that a tunnel token makes ``serve`` run.
LISTENER_SETTINGS = MappingProxyType({"admin": "--admin/PROXY_CONFIG_ADDR",
                                      "cluster": "--listen/PROXY_ADDR",
                                      "tunnel": "--tunnel-listen",
                                      "cluster-tls": "--listen-tls/PROXY_TLS_ADDR"})
CLOUDFLARED_SETTING = "--cloudflared-bin"


def cannot_listen(listener: str, address: object, exc: OSError) -> SettingsError:
    """The start-up error for listener ``listener`` (a :data:`LISTENER_SETTINGS` key)
    that could not bind ``address``: it names the setting to change (exit 1)."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return SettingsError(LISTENER_SETTINGS.get(listener, listener),
                         f"cannot listen on {address}: {reason}", 1)


def cloudflared_missing(exc: OSError) -> SettingsError:
    """The start-up error for a cloudflared executable that cannot be run (exit 1)."""
    return SettingsError(CLOUDFLARED_SETTING, f"{exc} (cloudflared runs because a tunnel "
                         "token is set: TUNNEL_TOKEN or --tunnel-token-file)", 1)


@dataclass(frozen=True, slots=True)
class Address:
    """Where a listener binds: TCP ``host``/``port`` (``host`` None = every interface,
    Go's ``:8080``) or a unix socket ``path``."""

    host: str | None = None
    port: int | None = None
    path: str | None = None

    def __str__(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        host = self.host or ""
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


def parse_address(text: str, name: str) -> Address:
    """Parse ``HOST:PORT``, ``:PORT``, ``[V6]:PORT`` or ``unix:/PATH``."""
    if text.startswith("unix:"):
        path = text[5:]
        if not path.startswith("/"):
            raise SettingsError(name, f"unix socket path must be absolute, got {text!r}")
        return Address(path=path)
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise SettingsError(name, f"expected HOST:PORT, :PORT or unix:/PATH, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise SettingsError(name, f"write IPv6 addresses in brackets ([::1]:8080), got {text!r}")
    return Address(host=host or None, port=int(port_text))


@dataclass(frozen=True, slots=True)
class TLSSettings:
    """The cluster entrance over TLS (``--listen-tls``): where, and the certificates
    (``--tls-cert``/``--tls-key`` pairs first, then ``--tls-cert-dir`` directories;
    the first certificate found is the default)."""

    listen: Address
    pairs: tuple[tuple[str, str], ...]  # (certificate chain, key) files
    directories: tuple[str, ...]       # each holding tls.crt/tls.key, or subdirs that do


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``serve`` needs, resolved and validated."""

    listen: Address | None            # cluster entrance; None = off
    tunnel_listen: Address | None     # tunnel (cloudflared sidecar) entrance; None = off
    admin: Address
    config_file: str | None
    watch_config: bool                # re-read config_file when it changes
    backends: tuple[tuple[str, str], ...]  # --backend NAME.NAMESPACE=URL (YAML configs)
    auth_token: str | None            # None = config API unauthenticated (warned)
    metrics_enabled: bool
    grace_period: float
    ws_dial_timeout: float
    ws_handshake_timeout: float
    access_log: AccessLogSettings
    tracing: TracingSettings
    cluster_scope: str
    cluster_allow: tuple[IPNetwork, ...]   # empty = every peer
    cluster_proxy_protocol: bool
    header_timeout: float
    idle_timeout: float
    max_connections: int
    max_header_count: int             # header fields per request head, both entrances
    h2_max_streams: int               # HTTP/2: SETTINGS_MAX_CONCURRENT_STREAMS
    h2_max_requests: int              # HTTP/2: streams per connection, then GOAWAY
    # Caps on a backend's response head, as plain numbers: Settings crosses to worker
    # processes, and a compiled frozen dataclass (HeadLimits) does not unpickle.
    response_head_bytes: int
    response_head_fields: int
    backend_max_connections: int      # per backend pool; 0 = no limit
    resilience: ResilienceSettings    # outlier detection, load shedding
    response_header_timeout: float    # wait for a response head, no route timeout; 0 = none
    workers: int
    tunnel_token: str | None          # TUNNEL_TOKEN: cloudflared is supervised when set
    tunnel_protocol: str              # cloudflared edge transport: auto | http2 | quic
    cloudflared_bin: str
    cloudflared_ready_url: str | None
    cloudflared_metrics_url: str | None  # a sidecar's metrics, re-exported on /metrics
    log_level: str
    log_format: str                   # operational log lines: logfmt | json
    config_max_bytes: int = DEFAULT_MAX_BYTES  # PUT /config body cap, as sent
    tls: TLSSettings | None = None    # --listen-tls; None = no TLS entrance

    @property
    def response_head(self) -> HeadLimits:
        """The caps on a backend's response head, as the upstream pools take them."""
        return HeadLimits(max_bytes=self.response_head_bytes,
                          max_fields=self.response_head_fields)

    @property
    def tunnel_mode(self) -> bool:
        """A tunnel entrance runs (sidecar) — readiness then waits for the edge."""
        return self.tunnel_listen is not None


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the ``serve`` flags, in the groups ``--help`` shows; defaults are
    resolved later by :func:`from_args`."""
    _entrance_arguments(parser.add_argument_group("entrances").add_argument)
    _tls_arguments(parser.add_argument_group("TLS on the cluster entrance").add_argument)
    _config_arguments(parser)
    _limit_arguments(parser.add_argument_group("limits and timeouts").add_argument)
    resilience.add_arguments(parser)
    _process_arguments(parser.add_argument_group("process and tunnel").add_argument)


_Add = Callable[..., argparse.Action]  # a parser's or an argument group's add_argument


def _entrance_arguments(add: _Add) -> None:
    add("--listen", metavar="HOST:PORT",
        help="cluster entrance (in-cluster callers, Knative prober). Default "
             "$PROXY_ADDR or :8080 in standalone mode; off in tunnel mode unless given")
    add("--tunnel-listen", metavar="ADDR",
        help="tunnel entrance for a cloudflared sidecar, HOST:PORT or unix:/PATH "
             f"(default {DEFAULT_TUNNEL_ADDR} when a tunnel token is set)")
    add("--admin", metavar="HOST:PORT",
        help=f"config API, /healthz, /readyz, /metrics (default $PROXY_CONFIG_ADDR "
             f"or {DEFAULT_ADMIN_ADDR})")
    add("--cluster-scope", choices=SCOPES,
        help="what the cluster entrance serves (default: all standalone, probes with a "
             "tunnel)")
    add("--cluster-allow", metavar="CIDR,...",
        help="peers allowed on the cluster entrance (default: any)")
    add("--cluster-proxy-protocol", action="store_true",
        help="expect a PROXY protocol v2 header on the cluster entrance")


def _tls_arguments(add: _Add) -> None:
    add("--listen-tls", metavar="HOST:PORT",
        help="the cluster entrance over TLS (entrance name cluster-tls; default "
             "$PROXY_TLS_ADDR, else off)")
    add("--tls-cert", action="append", default=[], metavar="CERT.pem",
        help="certificate chain for --listen-tls, paired in order with --tls-key "
             "(repeatable; chosen by SNI, the first is the default)")
    add("--tls-key", action="append", default=[], metavar="KEY.pem",
        help="private key of the --tls-cert at the same position")
    add("--tls-cert-dir", action="append", default=[], metavar="DIR",
        help="a directory holding tls.crt and tls.key, or subdirectories that do (a "
             "mounted kubernetes.io/tls Secret); repeatable (default $PROXY_TLS_CERT_DIR)")


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--config", metavar="FILE", help="load this wire JSON or HTTPRoute YAML at start; "
                                          "SIGHUP re-reads it")
    add("--watch-config", action="store_true",
        help="re-read --config whenever the file changes (a mounted ConfigMap)")
    add_backend_argument(parser)
    add("--auth-token-file", metavar="FILE",
        help="config API bearer token (overrides $PROXY_AUTH_TOKEN)")
    add("--config-max-bytes", metavar="N",
        help="largest PUT /config body as sent, gzip-compressed or not (default "
             f"$PROXY_CONFIG_MAX_BYTES or {DEFAULT_MAX_BYTES}); a gzip body may "
             f"inflate to {MAX_INFLATED_BYTES >> 20} MiB or this cap, if larger")


def _limit_arguments(add: _Add) -> None:
    add("--header-timeout", default="10s", metavar="DURATION",
        help="time a client has to send the request head (default 10s)")
    add("--idle-timeout", default="120s", metavar="DURATION",
        help="keep-alive idle time before a client connection is closed (default "
             "120s: longer than cloudflared's 90s and Go clients' 90s, so the client "
             "side closes an idle connection first and never reuses one closing here)")
    add("--max-connections", default="10000", metavar="N",
        help="open client connections per entrance (default 10000)")
    add("--max-header-count", metavar="N",
        help="header fields allowed in a request head on the cluster and tunnel "
             f"entrances, more is a 431 (default $PROXY_MAX_HEADER_COUNT or "
             f"{DEFAULT_MAX_HEADER_COUNT})")
    add("--h2-max-concurrent-streams", default="128", metavar="N",
        help="HTTP/2 streams a client may have open at once on one connection "
             "(SETTINGS_MAX_CONCURRENT_STREAMS; default 128, nginx's)")
    add("--h2-max-requests", default="1000", metavar="N",
        help="HTTP/2 streams served on one connection before a graceful GOAWAY "
             "(default 1000, nginx's keepalive_requests)")
    add("--max-response-header-bytes", metavar="N",
        help="largest backend response head in bytes; larger ones get 502 (default "
             f"$PROXY_MAX_RESPONSE_HEADER_BYTES or {DEFAULT_RESPONSE_HEADER_BYTES})")
    add("--max-response-header-count", metavar="N",
        help="most header fields in a backend response head; more get 502 (default "
             f"$PROXY_MAX_RESPONSE_HEADER_COUNT or {DEFAULT_RESPONSE_HEADER_COUNT})")
    add("--response-header-timeout", metavar="DURATION",
        help="longest wait for a backend's response head when the route sets no "
             "timeout (a route's own timeout wins); then 504. Counted once the request "
             "was sent; a response that started is never cut by it. 0 turns it off "
             "(default $PROXY_RESPONSE_HEADER_TIMEOUT or 60s)")
    add("--backend-max-connections", metavar="N",
        help="connections open to one backend at most; requests beyond wait for one "
             "within the route timeout (default $PROXY_BACKEND_MAX_CONNECTIONS or 0: "
             "no limit)")


def _process_arguments(add: _Add) -> None:
    add("--grace-period", metavar="DURATION",
        help="drain window on SIGTERM (default $PROXY_GRACE_PERIOD or 30s, max 3m)")
    add("--workers", default="1", metavar="N",
        help="processes serving the entrances (default 1: one process, no supervisor; "
             f"N > 1: a supervisor and N workers sharing the ports; at most {MAX_WORKERS})")
    add("--tunnel-token-file", metavar="FILE",
        help="cloudflared tunnel token (overrides $TUNNEL_TOKEN); enables supervision")
    add("--cloudflared-bin", default="cloudflared", metavar="PATH",
        help="cloudflared executable to supervise (default: cloudflared on PATH)")
    add("--cloudflared-ready-url", metavar="URL",
        help="cloudflared /ready endpoint that gates /readyz (sidecar container)")
    add("--cloudflared-metrics-url", metavar="URL",
        help="cloudflared /metrics endpoint of a sidecar container, whose cloudflared_* "
             "series /metrics then includes (a supervised cloudflared's are included "
             "without it)")
    add("--log-level", choices=LOG_LEVELS, default="info")
    add_log_format_argument(add)


def add_log_format_argument(add: _Add) -> None:
    """``--log-format`` (serve and demo)."""
    add("--log-format", choices=LOG_FORMATS,
        help="operational log lines on stderr: logfmt (key=value) or json, one object "
             "per line (default $PROXY_LOG_FORMAT or logfmt)")


def log_format(flag: str | None, environ: Mapping[str, str]) -> str:
    """``--log-format``, else ``PROXY_LOG_FORMAT``, else ``logfmt``; an unknown
    variable value raises :class:`SettingsError` (the flag's are checked by argparse)."""
    if flag is not None:
        return flag
    value = environ.get("PROXY_LOG_FORMAT", "").strip().lower()
    if value and value not in LOG_FORMATS:
        raise SettingsError("PROXY_LOG_FORMAT", f"expected one of {', '.join(LOG_FORMATS)}, "
                                                f"got {value!r}")
    return value or "logfmt"


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend NAME.NAMESPACE=URL`` (repeatable), shared by serve, check, explain."""
    parser.add_argument(
        "--backend", action="append", default=[], metavar="NAME.NAMESPACE=URL",
        help="send HTTPRoute backendRefs to Service NAME in NAMESPACE to URL instead of "
             "http://NAME.NAMESPACE.svc.cluster.local:PORT (repeatable)")


def parse_backends(values: list[str]) -> dict[str, str]:
    """``--backend`` values as a ``{"NAME.NAMESPACE": URL}`` map; raises
    :class:`SettingsError` for a malformed one."""
    backends: dict[str, str] = {}
    for text in values:
        key, sep, url = text.partition("=")
        name, dot, namespace = key.partition(".")
        if not sep or not dot or not name or not namespace or "." in namespace:
            raise SettingsError("--backend", f"expected NAME.NAMESPACE=URL, got {text!r}")
        try:
            split_backend_url(url)
        except ValueError as exc:
            raise SettingsError("--backend", str(exc)) from None
        backends[key] = url
    return backends


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Resolve flags against the environment; raise :class:`SettingsError` on bad input."""
    tunnel_token = _tunnel_token(args.tunnel_token_file, environ)
    tunnel_listen = _tunnel_listen(args.tunnel_listen, tunnel_token)
    workers = _integer(args.workers, "--workers", low=1, high=MAX_WORKERS)
    return Settings(
        listen=_cluster_listen(args.listen, tunnel_listen is not None, environ),
        tunnel_listen=tunnel_listen,
        admin=_admin(args.admin, environ),
        config_file=args.config,
        watch_config=_watch_config(args),
        backends=tuple(parse_backends(args.backend).items()),
        auth_token=_auth_token(args.auth_token_file, environ),
        metrics_enabled=_env_bool(environ, "PROXY_METRICS_ENABLED", True),
        grace_period=_grace_period(args.grace_period, environ),
        ws_dial_timeout=_env_duration(environ, "PROXY_WS_DIAL_TIMEOUT", DEFAULT_WS_TIMEOUT),
        ws_handshake_timeout=_env_duration(environ, "PROXY_WS_HANDSHAKE_TIMEOUT",
                                           DEFAULT_WS_TIMEOUT),
        access_log=_access_log(environ),
        tracing=_tracing(environ),
        cluster_scope=args.cluster_scope or ("probes" if tunnel_listen else "all"),
        cluster_allow=_networks(args.cluster_allow),
        cluster_proxy_protocol=args.cluster_proxy_protocol,
        header_timeout=_duration(args.header_timeout, "--header-timeout"),
        idle_timeout=_duration(args.idle_timeout, "--idle-timeout"),
        max_connections=_integer(args.max_connections, "--max-connections", low=1),
        max_header_count=_flag_or_env(args.max_header_count, "--max-header-count",
                                      environ, "PROXY_MAX_HEADER_COUNT",
                                      DEFAULT_MAX_HEADER_COUNT, low=1),
        h2_max_streams=_integer(args.h2_max_concurrent_streams,
                                "--h2-max-concurrent-streams", low=1, high=2**31 - 1),
        h2_max_requests=_integer(args.h2_max_requests, "--h2-max-requests", low=1),
        **_backend_limits(args, environ),
        resilience=resilience.from_args(args, _integer, _duration),
        workers=workers,
        tunnel_token=tunnel_token,
        tunnel_protocol=_tunnel_protocol(environ),
        cloudflared_bin=args.cloudflared_bin,
        cloudflared_ready_url=args.cloudflared_ready_url,
        cloudflared_metrics_url=args.cloudflared_metrics_url,
        log_level=args.log_level,
        log_format=log_format(args.log_format, environ),
        config_max_bytes=_flag_or_env(args.config_max_bytes, "--config-max-bytes",
                                      environ, "PROXY_CONFIG_MAX_BYTES",
                                      DEFAULT_MAX_BYTES, low=1024),
        tls=_tls(args, environ),
    )


def _backend_limits(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """The :class:`Settings` fields that bound what a backend may send or hold: its
    response head, its connections, its wait for a response head."""
    return {
        "response_head_bytes": _flag_or_env(
            args.max_response_header_bytes, "--max-response-header-bytes", environ,
            "PROXY_MAX_RESPONSE_HEADER_BYTES", DEFAULT_RESPONSE_HEADER_BYTES, low=1024),
        "response_head_fields": _flag_or_env(
            args.max_response_header_count, "--max-response-header-count", environ,
            "PROXY_MAX_RESPONSE_HEADER_COUNT", DEFAULT_RESPONSE_HEADER_COUNT, low=1),
        "backend_max_connections": _flag_or_env(
            args.backend_max_connections, "--backend-max-connections", environ,
            "PROXY_BACKEND_MAX_CONNECTIONS", 0, low=0),
        "response_header_timeout": _wait_flag_or_env(
            args.response_header_timeout, "--response-header-timeout", environ,
            "PROXY_RESPONSE_HEADER_TIMEOUT", RESPONSE_HEADER_TIMEOUT),
    }


def _tls(args: argparse.Namespace, environ: Mapping[str, str]) -> TLSSettings | None:
    """``--listen-tls`` and its certificates; certificates without a TLS listener, or
    a listener without any, is a mistake said at start-up."""
    text = args.listen_tls or environ.get("PROXY_TLS_ADDR", "").strip() or None
    name = "--listen-tls" if args.listen_tls else "PROXY_TLS_ADDR"
    env_dir = environ.get("PROXY_TLS_CERT_DIR", "").strip()
    directories = tuple(args.tls_cert_dir) or ((env_dir,) if env_dir else ())
    if len(args.tls_cert) != len(args.tls_key):
        raise SettingsError("--tls-key", f"{len(args.tls_cert)} --tls-cert but "
                                         f"{len(args.tls_key)} --tls-key: give them in pairs")
    pairs = tuple(zip(args.tls_cert, args.tls_key))
    if text is None:
        if pairs or args.tls_cert_dir:
            raise SettingsError("--tls-cert", "certificates need --listen-tls HOST:PORT")
        return None
    if not pairs and not directories:
        raise SettingsError(name, "needs certificates: --tls-cert and --tls-key, or "
                                  "--tls-cert-dir")
    address = parse_address(text, name)
    if address.path is not None:
        raise SettingsError(name, "expected HOST:PORT (TLS is for TCP listeners)")
    return TLSSettings(address, pairs, directories)


def _admin(flag: str | None, environ: Mapping[str, str]) -> Address:
    return parse_address(flag or environ.get("PROXY_CONFIG_ADDR") or DEFAULT_ADMIN_ADDR,
                         "--admin" if flag else "PROXY_CONFIG_ADDR")


def _access_log(environ: Mapping[str, str]) -> AccessLogSettings:
    return AccessLogSettings(
        enabled=_env_bool(environ, "PROXY_ACCESS_LOG_ENABLED", False),
        sampling_rate=_rate(environ, "PROXY_ACCESS_LOG_SAMPLING_RATE"),
        strip_query=_env_bool(environ, "PROXY_ACCESS_LOG_STRIP_QUERY", False))


def _tracing(environ: Mapping[str, str]) -> TracingSettings:
    return TracingSettings(
        enabled=_env_bool(environ, "PROXY_TRACING_ENABLED", False),
        endpoint=environ.get("PROXY_TRACING_ENDPOINT", "").strip(),
        sample_rate=_rate(environ, "PROXY_TRACING_SAMPLE_RATE"))


def _watch_config(args: argparse.Namespace) -> bool:
    if args.watch_config and not args.config:
        raise SettingsError("--watch-config", "needs --config FILE")
    return bool(args.watch_config)


_BOOLEANS = MappingProxyType({"1": True, "true": True, "yes": True, "on": True,
                              "0": False, "false": False, "no": False, "off": False})


def _env_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """A boolean variable: unset or empty ⇒ ``default``; ``1/0``, ``true/false``,
    ``yes/no``, ``on/off``, trimmed and in any case. Anything else stops the start
    (exit 2): the anchor reads only ``1``/``true`` and silently takes the rest as off
    (on, for ``PROXY_METRICS_ENABLED``), so ``yes`` would switch nothing on unseen."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    value = _BOOLEANS.get(text.lower())
    if value is None:
        raise SettingsError(name, f"expected 1/0, true/false, yes/no or on/off, "
                                  f"got {text!r}")
    return value


def _read_secret(path: str, name: str, exit_code: int) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as exc:
        raise SettingsError(name, f"cannot read {path}: {exc.strerror}", exit_code) from None


def _auth_token(path: str | None, environ: Mapping[str, str]) -> str | None:
    """PROXY_AUTH_TOKEN: unset ⇒ no auth; set but empty ⇒ refuse to start (exit 1)."""
    if path is not None:
        token = _read_secret(path, "--auth-token-file", 1)
        if not token:
            raise SettingsError("--auth-token-file", f"{BROKEN_AUTH}: {path} is empty", 1)
        return token
    if "PROXY_AUTH_TOKEN" not in environ:
        return None
    token = environ["PROXY_AUTH_TOKEN"].strip()
    if not token:
        raise SettingsError("PROXY_AUTH_TOKEN",
                            f"{BROKEN_AUTH}: PROXY_AUTH_TOKEN is set but empty", 1)
    return token


def _tunnel_token(path: str | None, environ: Mapping[str, str]) -> str | None:
    if path is not None:
        token = _read_secret(path, "--tunnel-token-file", 2)
        if not token:
            raise SettingsError("--tunnel-token-file", f"{path} is empty")
        return token
    return environ.get("TUNNEL_TOKEN", "").strip() or None


def _tunnel_listen(text: str | None, tunnel_token: str | None) -> Address | None:
    if text is None:
        return parse_address(DEFAULT_TUNNEL_ADDR, "--tunnel-listen") if tunnel_token else None
    address = parse_address(text, "--tunnel-listen")
    if not _loopback_only(address):
        # It believes CF-Connecting-IP and CF-Visitor: whoever else can reach it may
        # claim any client address and scheme. Allowed (a pod network policy may
        # guard it), but said.
        log.warning("--tunnel-listen %s is reachable from other hosts, and the tunnel "
                    "entrance trusts Cloudflare's headers: keep it on loopback or a "
                    "unix socket", address)
    return address


def _loopback_only(address: Address) -> bool:
    """Whether only this host can reach ``address`` (a unix socket, ``localhost`` or a
    loopback IP; every interface, another IP or a host name are not)."""
    if address.path is not None or address.host == "localhost":
        return True
    try:
        return address.host is not None and ipaddress.ip_address(address.host).is_loopback
    except ValueError:
        return False


def _tunnel_protocol(environ: Mapping[str, str]) -> str:
    """``PROXY_TUNNEL_PROTOCOL``; like the anchor, any unknown value means ``auto``."""
    value = environ.get("PROXY_TUNNEL_PROTOCOL", "").strip().lower()
    if value in TUNNEL_PROTOCOLS:
        return value
    if value:
        log.warning("unknown PROXY_TUNNEL_PROTOCOL=%r, using auto", value)
    return "auto"


def _cluster_listen(text: str | None, tunnel: bool,
                    environ: Mapping[str, str]) -> Address | None:
    """Standalone: the cluster entrance is the data listener (``PROXY_ADDR``).
    Tunnel mode: it bypasses Cloudflare Access/WAF, so it is opt-in via ``--listen``
    only."""
    if text is not None:
        return parse_address(text, "--listen")
    if tunnel:
        return None
    env = environ.get("PROXY_ADDR")
    return parse_address(env or DEFAULT_CLUSTER_ADDR, "PROXY_ADDR")


def _duration(text: str, name: str, zero: bool = False) -> float:
    """A flag duration: Go syntax (``10s``, ``1m30s``) or plain seconds; must be > 0
    (or ``zero`` allows 0 too)."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text)
        except ValueError:
            raise SettingsError(name, f"invalid duration {text!r} "
                                      "(use Go syntax like 10s, 1m30s)") from None
    if not (seconds > 0 or (zero and seconds == 0)):
        raise SettingsError(name, f"must be greater than zero, got {text!r}")
    return seconds


def _env_duration(environ: Mapping[str, str], name: str, default: float) -> float:
    """An anchor duration variable: unset, invalid or ≤ 0 ⇒ ``default`` (warned)."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        seconds = parse_duration(text)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        log.warning("ignoring invalid %s=%r, using %ss", name, text, default)
        return default
    return seconds


def _grace_period(flag: str | None, environ: Mapping[str, str]) -> float:
    seconds = (_duration(flag, "--grace-period") if flag is not None
               else _env_duration(environ, "PROXY_GRACE_PERIOD", DEFAULT_GRACE))
    if seconds > MAX_GRACE:
        log.warning("grace period %ss capped at %ss", seconds, MAX_GRACE)
    return min(seconds, MAX_GRACE)


def _rate(environ: Mapping[str, str], name: str) -> float:
    """A fraction variable (sampling rates): unset, invalid or NaN ⇒ 1.0 (invalid is
    warned), else clamped to [0, 1] as the anchor does."""
    text = environ.get(name, "").strip()
    if not text:
        return 1.0
    try:
        rate = float(text)
    except ValueError:
        log.warning("ignoring invalid %s=%r, using 1.0", name, text)
        return 1.0
    return min(1.0, max(0.0, rate)) if rate == rate else 1.0  # NaN ⇒ default


def _flag_or_env(flag: str | None, flag_name: str, environ: Mapping[str, str],
                 env_name: str, default: int, low: int) -> int:
    """An integer from its flag, else its environment variable, else ``default``; a
    bad value of either fails loudly (a limit silently replaced is a surprise)."""
    if flag is not None:
        return _integer(flag, flag_name, low=low)
    text = environ.get(env_name, "").strip()
    return _integer(text, env_name, low=low) if text else default


def _wait_flag_or_env(flag: str | None, flag_name: str, environ: Mapping[str, str],
                      env_name: str, default: float) -> float:
    """A wait from its flag, else its environment variable, else ``default``: a
    duration as :func:`_duration` reads it, 0 for none; a bad value of either fails
    loudly (tunnelgate's own setting, not one the anchor had)."""
    if flag is not None:
        return _duration(flag, flag_name, zero=True)
    text = environ.get(env_name, "").strip()
    return _duration(text, env_name, zero=True) if text else default


def _integer(text: str, name: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise SettingsError(name, f"expected an integer, got {text!r}") from None
    if value < low:
        raise SettingsError(name, f"must be at least {low}, got {value}")
    if high is not None and value > high:
        raise SettingsError(name, f"must be at most {high}, got {value}")
    return value


def _networks(text: str | None) -> tuple[IPNetwork, ...]:
    if not text:
        return ()
    networks = []
    for item in text.split(","):
        try:
            networks.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise SettingsError("--cluster-allow", f"invalid CIDR {item.strip()!r}") from None
    return tuple(networks)
