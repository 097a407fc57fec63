"""Process settings: the frozen :class:`Settings` that ``serve`` runs with, its parts
(:class:`Address`, :class:`TLSSettings`), their defaults and limits, and
:class:`SettingsError`, the error that names the flag or variable to fix.

One :class:`Settings` is built at start-up from the flags (:mod:`proxy.control.flags`)
and the environment (:func:`proxy.control.resolve.from_args`) and handed to the
composition root; it is pickled to worker processes, so this module stays interpreted.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from types import MappingProxyType

from proxy.control.pushbody import DEFAULT_MAX_BYTES
from proxy.control.resilience import ResilienceSettings
from proxy.observability.settings import AccessLogSettings, TracingSettings
from proxy.wire.framing import HeadLimits

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
