"""The wire config (docs/config.md) as frozen dataclasses, and the error that rejects one.

Plain data, snake_case, lists as tuples: what :func:`routing.config.parse_config` returns
after validation (:mod:`routing.validate`) and what :func:`routing.wire.to_wire` turns
back into the controller's JSON. Nothing here does work; the constant tables are the
enumerations the validation accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

PATH_MATCH_TYPES = ("Exact", "PathPrefix", "RegularExpression")
VALUE_MATCH_TYPES = ("Exact", "RegularExpression")
PATH_MODIFIER_TYPES = ("ReplaceFullPath", "ReplacePrefixMatch")
# What a path holds unescaped: pchar and "/" (RFC 3986 §3.3), for urllib's ``quote``.
PATH_SAFE: Final = "/:@!$&'()*+,;=-._~"
REDIRECT_STATUSES = (301, 302, 303, 307, 308)
BACKEND_PROTOCOLS = ("", "h2c")
# The entrances a request can come through (``routing.decide`` says what each may serve).
TUNNEL: Final = "tunnel"
CLUSTER: Final = "cluster"
CLUSTER_TLS: Final = "cluster-tls"  # the cluster entrance over TLS (--listen-tls)
# Reachable from any pod: the same trust rules and --cluster-scope apply to both.
CLUSTER_ENTRANCES: Final = (CLUSTER, CLUSTER_TLS)
ENTRANCES: Final = (TUNNEL, CLUSTER, CLUSTER_TLS)
DEFAULT_PORTS: Final = MappingProxyType({"http": 80, "https": 443})

class ConfigError(ValueError):
    """A config that cannot be accepted; ``path`` names the field (``""`` = the root).

    ``kind`` is ``"json"`` when the bytes were not JSON at all and ``"invalid"`` when
    they were JSON but not a valid config (the config API maps both to 400).
    """

    def __init__(self, path: str, message: str, kind: str = "invalid") -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message
        self.kind = kind


@dataclass(frozen=True, slots=True)
class PathMatch:
    type: str  # Exact | PathPrefix | RegularExpression
    value: str


@dataclass(frozen=True, slots=True)
class ValueMatch:
    """A header or query-parameter match."""

    type: str  # Exact | RegularExpression
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class RouteMatch:
    path: PathMatch | None = None
    headers: tuple[ValueMatch, ...] = ()
    query_params: tuple[ValueMatch, ...] = ()
    method: str | None = None


@dataclass(frozen=True, slots=True)
class HeaderModifier:
    set: tuple[tuple[str, str], ...] = ()
    add: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PathModifier:
    """ReplaceFullPath / ReplacePrefixMatch, whichever wire spelling it came in."""

    type: str
    value: str


@dataclass(frozen=True, slots=True)
class Redirect:
    scheme: str | None = None
    hostname: str | None = None
    port: int | None = None
    status_code: int = 302
    path: PathModifier | None = None


@dataclass(frozen=True, slots=True)
class Rewrite:
    hostname: str | None = None
    path: PathModifier | None = None


@dataclass(frozen=True, slots=True)
class BackendTLS:
    ca_bundle: str = ""
    server_name: str = ""
    subject_alt_names: tuple[str, ...] = ()
    subject_alt_name_uris: tuple[str, ...] = ()
    client_cert_pem: bytes = b""
    client_key_pem: bytes = b""


@dataclass(frozen=True, slots=True)
class Mirror:
    backend_url: str
    percent: int = 100
    tls: BackendTLS | None = None
    protocol: str = ""


@dataclass(frozen=True, slots=True)
class Cors:
    allow_origins: tuple[str, ...] = ()
    allow_credentials: bool = False
    allow_methods: tuple[str, ...] = ()
    allow_headers: tuple[str, ...] = ()
    expose_headers: tuple[str, ...] = ()
    max_age: int = 0  # 0 = unset; the answer then carries the GEP-1767 default 5


@dataclass(frozen=True, slots=True)
class Filter:
    """One filter; exactly the payload named by ``type`` is set (which attribute holds
    it is the type's :attr:`routing.filters.kind.FilterKind.field`)."""

    type: str
    request_header_modifier: HeaderModifier | None = None
    response_header_modifier: HeaderModifier | None = None
    request_redirect: Redirect | None = None
    url_rewrite: Rewrite | None = None
    request_mirror: Mirror | None = None
    cors: Cors | None = None


@dataclass(frozen=True, slots=True)
class RetryConstraint:
    """GEP-3388 retry budget of a backend (the ``retryConstraint`` of an
    XBackendTrafficPolicy): retries may be at most ``percent`` of the requests sent to
    it over the last ``interval`` seconds, and ``min_retries`` per
    ``min_retry_interval`` seconds are always allowed. The defaults are the GEP's."""

    percent: int = 20
    interval: float = 10.0
    min_retries: int = 10
    min_retry_interval: float = 1.0


@dataclass(frozen=True, slots=True)
class Backend:
    url: str
    weight: int = 0
    protocol: str = ""
    tls: BackendTLS | None = None
    filters: tuple[Filter, ...] = ()
    websocket: bool = False
    unavailable_status: int = 0
    retry_constraint: RetryConstraint | None = None  # additive; None = the default budget


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds; ``None`` = unset or zero (no deadline)."""

    request: float | None = None
    backend: float | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """GEP-1731 retry policy of a rule: retry on ``codes`` (and on connection errors)
    at most ``attempts`` times (so ``attempts + 1`` tries), waiting at least
    ``backoff`` seconds before each retry (:mod:`routing.retry` has the arithmetic)."""

    codes: tuple[int, ...] = ()
    attempts: int = 1
    backoff: float = 0.025


@dataclass(frozen=True, slots=True)
class Rule:
    hostnames: tuple[str, ...] = ()
    matches: tuple[RouteMatch, ...] = ()
    filters: tuple[Filter, ...] = ()
    backends: tuple[Backend, ...] = ()
    timeouts: Timeouts | None = None
    unavailable_status: int = 0
    entrances: tuple[str, ...] | None = None  # additive extension; None = every entrance
    retry: Retry | None = None  # additive (GEP-1731); None = never retried
    # Total RE2 program size of the rule's regular expressions (validation measured
    # it; the per-config regex budget adds these up). Not part of the rule's identity.
    regex_program_size: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Config:
    version: int = 0
    rules: tuple[Rule, ...] = ()
    has_grpc_route: bool = False


@dataclass(frozen=True, slots=True)
class BackendAddress:
    """A backend URL taken apart: where to dial and what to prepend (ExternalBackends)."""

    scheme: str
    host: str
    port: int
    base_path: str
    base_query: str

