"""``serve``'s flags resolved against the anchor's environment variables: the one
:class:`~proxy.control.settings.Settings` built at start-up (:func:`from_args`), after
which nothing reads the environment. Two kinds of bad input:

- the anchor's own durations, rates and protocol keep the anchor's leniency (an
  unparseable ``PROXY_GRACE_PERIOD`` logs a warning and falls back), so a Helm chart
  written for the Go binary never stops a pod from starting;
- our flags, boolean variables (where the anchor's silent "anything else is false"
  would hide a typo), and anything that would weaken security, fail loudly with
  :class:`~proxy.control.settings.SettingsError` naming the flag or variable (exit 2;
  exit 1 for a broken config-API auth configuration, as the anchor does).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
from types import MappingProxyType
from typing import Any, Mapping

from proxy.control import resilience
from proxy.control.pushbody import DEFAULT_MAX_BYTES
from proxy.control.settings import (
    DEFAULT_ADMIN_ADDR, DEFAULT_CLUSTER_ADDR, DEFAULT_GRACE, DEFAULT_MAX_HEADER_COUNT,
    DEFAULT_TUNNEL_ADDR, DEFAULT_WS_TIMEOUT, LOG_FORMATS, MAX_GRACE, MAX_WORKERS,
    TUNNEL_PROTOCOLS, Address, IPNetwork, Settings, SettingsError, TLSSettings,
    parse_address)
from proxy.observability.settings import AccessLogSettings, TracingSettings
from proxy.upstream.base import RESPONSE_HEADER_TIMEOUT
from proxy.wire.framing import DEFAULT_RESPONSE_HEADER_BYTES, DEFAULT_RESPONSE_HEADER_COUNT
from routing.values import parse_duration, split_backend_url

log = logging.getLogger("tunnelgate.settings")

BROKEN_AUTH = "refusing to start with a broken config-API auth configuration"


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
