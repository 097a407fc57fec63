"""Entrance policy: what each entrance may serve and which client headers it may believe.

Two entrances share one table (DESIGN.md, "One Handler, several entrances"):

- ``tunnel`` — only cloudflared reaches it (loopback / unix socket). Its trust rules
  live in ``tunnel/sidecar.py``.
- ``cluster`` — the pod-IP listener other pods and Knative's prober dial. Anything in
  the cluster can reach it, bypassing Cloudflare Access and WAF, so it is scoped:

  ``all``     every rule (standalone mode: this listener *is* the product);
  ``probes``  only Knative readiness probes (REFERENCE §8.2); anything else is 403;
  ``scoped``  only rules whose ``entrances`` list names ``cluster`` — plus Knative
              probes, which may reach any rule (else a public route's probe would 404
              forever and its KIngress never become Ready).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from proxy.request import Request

CLUSTER = "cluster"
TUNNEL = "tunnel"
SCOPES = ("all", "probes", "scoped")

# Knative's prober marks every probe with this header (REFERENCE §8.2 step 3). The
# queue-proxy/activator answers such requests itself (step 5), so a forged probe reaches
# the probe handler only, never the application: admitting by header alone is safe.
_PROBE_HEADER = b"k-network-probe"
_PROBE_VALUE = b"probe"


def is_knative_probe(request: Request) -> bool:
    """True for a request carrying ``K-Network-Probe: probe``."""
    return request.header(_PROBE_HEADER) == _PROBE_VALUE


def cluster_prepare(request: Request) -> None:
    """Trust rules of the cluster entrance, run before routing.

    Edge headers (``CF-Connecting-IP``, ``CF-Visitor``, ``Cf-Access-*``,
    ``cf-cloudflared-*`` …) only mean something when Cloudflare's edge set them; a pod
    dialing us directly could forge them to impersonate an edge-authenticated client,
    so every ``cf-*`` request header is dropped here (REFERENCE §7.3).
    """
    headers = request.headers
    for name, _ in headers:  # a plain loop: this runs on every cluster request
        if name[:3].lower() == b"cf-":
            request.headers = [(n, v) for n, v in headers if n[:3].lower() != b"cf-"]
            return


@dataclass(frozen=True, slots=True)
class EntrancePolicy:
    """Per-entrance admission, decided before the table lookup."""

    cluster_scope: str = "all"

    def __post_init__(self) -> None:
        if self.cluster_scope not in SCOPES:
            raise ValueError(f"cluster scope must be one of {', '.join(SCOPES)}, "
                             f"not {self.cluster_scope!r}")

    @property
    def default_entrances(self) -> frozenset[str] | None:
        """Entrances that serve rules without an ``entrances`` list (``None`` = all).

        In ``scoped`` mode such rules stay off the cluster entrance: only rules that
        name it explicitly are served there.
        """
        return frozenset({TUNNEL}) if self.cluster_scope == "scoped" else None

    def probe_sees_all(self, request: Request) -> bool:
        """True when a probe on the scoped cluster entrance may fall back to the rules
        the tunnel serves. Safe because the revision's probe handler answers probes
        itself; the application behind it is never reached (REFERENCE §8.2 step 5)."""
        return (self.cluster_scope == "scoped" and request.entrance == CLUSTER
                and is_knative_probe(request))

    def refusal(self, request: Request) -> bytes | None:
        """A JSON 403 body if ``request`` may not be served at its entrance, else None."""
        if (request.entrance != CLUSTER or self.cluster_scope != "probes"
                or is_knative_probe(request)):
            return None
        return json.dumps({
            "error": "forbidden",
            "message": "the cluster entrance only serves Knative readiness probes "
                       "(--cluster-scope probes)",
            "entrance": CLUSTER,
        }).encode()
