"""The ``serve`` flags, in the groups ``--help`` shows, and the flags other commands
share (``--backend``, ``--log-format``). Only declared here, with their help; what
they and the environment resolve to is :func:`proxy.control.resolve.from_args`'s.
"""

from __future__ import annotations

import argparse
from typing import Callable

from proxy.control import resilience
from proxy.control.pushbody import DEFAULT_MAX_BYTES, MAX_INFLATED_BYTES
from proxy.control.settings import (
    DEFAULT_ADMIN_ADDR, DEFAULT_MAX_HEADER_COUNT, DEFAULT_TUNNEL_ADDR, LOG_FORMATS,
    LOG_LEVELS, MAX_WORKERS)
from proxy.wire.framing import DEFAULT_RESPONSE_HEADER_BYTES, DEFAULT_RESPONSE_HEADER_COUNT
from routing.decide import SCOPES


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the ``serve`` flags, in the groups ``--help`` shows; defaults are
    resolved later by
    :func:`proxy.control.resolve.from_args`."""
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


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend NAME.NAMESPACE=URL`` (repeatable), shared by serve, check, explain."""
    parser.add_argument(
        "--backend", action="append", default=[], metavar="NAME.NAMESPACE=URL",
        help="send HTTPRoute backendRefs to Service NAME in NAMESPACE to URL instead of "
             "http://NAME.NAMESPACE.svc.cluster.local:PORT (repeatable)")
