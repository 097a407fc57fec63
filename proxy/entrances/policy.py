"""Entrance policy: what each entrance may serve and which client headers it may believe.

Two entrances share one table and one Handler:

- ``tunnel`` — only cloudflared reaches it (loopback / unix socket). Its trust rules
  live in ``tunnel/sidecar.py``.
- ``cluster`` — the pod-IP listener other pods and Knative's prober dial, and
  ``cluster-tls``, the same over TLS (its own name, so that rules can be served on
  one and not the other, as Gateway API's HTTP and HTTPS listeners are). Anything in
  the cluster can reach them, bypassing Cloudflare Access and WAF, so they are scoped
  (one ``--cluster-scope`` for both):

  ``all``     every rule (standalone mode: this listener *is* the product);
  ``probes``  only Knative readiness probes; anything else is 403;
  ``scoped``  only rules whose ``entrances`` list names the entrance — plus Knative
              probes, which may reach the probe rules of any route (else a public
              route's probe would 404 forever and its KIngress never become Ready).

What a Knative probe is. ``K-Network-Probe: probe`` is an ordinary header any pod can
send, so it proves nothing by itself. net-gateway-api marks its probe rules in the
table: each has a match with the Exact header match ``K-Network-Hash: override``
(``routing.table.Hit.knative_probe``, decided at compile time). A request is a probe
only when it carries the probe header *and* the match that won is such a probe match.
Such a request reaches a revision's queue-proxy or the activator with
``K-Network-Probe: probe``, and both answer it themselves: the application never sees
it. A request with the header that wins any other rule would reach that rule's
application, so the ``probes`` scope refuses it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from proxy.request import Request
from routing.table import Hit

CLUSTER: Final = "cluster"
CLUSTER_TLS: Final = "cluster-tls"  # the cluster entrance over TLS (--listen-tls)
TUNNEL: Final = "tunnel"
# Reachable from any pod: the same trust rules and --cluster-scope apply to both.
CLUSTER_ENTRANCES: Final = (CLUSTER, CLUSTER_TLS)
SCOPES = ("all", "probes", "scoped")

# Knative's prober sets this header on every probe; its queue-proxy and activator
# answer a request carrying it themselves.
_PROBE_HEADER: Final = b"k-network-probe"
_PROBE_VALUE: Final = b"probe"


def has_probe_header(request: Request) -> bool:
    """True for a request carrying ``K-Network-Probe: probe`` (a claim, not a proof)."""
    return request.header(_PROBE_HEADER) == _PROBE_VALUE


def is_knative_probe(request: Request, hit: Hit) -> bool:
    """True when ``request`` is a Knative probe: the probe header *and* a probe match."""
    return hit.knative_probe and has_probe_header(request)


def cluster_prepare(request: Request) -> None:
    """Trust rules of the cluster entrance, run before routing.

    Edge headers (``CF-Connecting-IP``, ``CF-Visitor``, ``Cf-Access-*``,
    ``cf-cloudflared-*`` …) only mean something when Cloudflare's edge set them; a pod
    dialing us directly could forge them to impersonate an edge-authenticated client,
    so every ``cf-*`` request header is dropped here.
    """
    headers = request.headers
    for name, _ in headers:  # a plain loop: this runs on every cluster request
        if is_edge_header(name):
            request.headers = [pair for pair in headers if not is_edge_header(pair[0])]
            return


def is_edge_header(name: bytes) -> bool:
    """``name`` starts with ``cf-`` or ``cf_`` in any case (CGI-style servers read
    ``Cf_Connecting_Ip`` as ``CF-Connecting-IP``). Byte by byte, with no slice or
    lowered copy: it is asked of every header of every cluster request (``| 0x20``
    lowers an ASCII letter and maps no other byte onto ``c`` or ``f``)."""
    return len(name) >= 3 and (name[2] == 45 or name[2] == 95) \
        and (name[0] | 0x20) == 99 and (name[1] | 0x20) == 102


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

    def probe_sees_all(self, request: Request, hit: Hit | None) -> bool:
        """True when a request on the scoped cluster entrance that did not win a probe
        match claims to be a probe: it may then be served by a Knative probe match of
        the rules the tunnel serves (the caller checks the second lookup's hit is one).
        Only probe matches: a forged probe header never reaches another rule's
        application."""
        return (self.cluster_scope == "scoped" and request.entrance in CLUSTER_ENTRANCES
                and (hit is None or not hit.knative_probe) and has_probe_header(request))

    def refusal(self, request: Request) -> bytes | None:
        """A JSON 403 body if ``request`` may not even be looked up at its entrance
        (the ``probes`` scope without the probe header), else None."""
        if (request.entrance not in CLUSTER_ENTRANCES or self.cluster_scope != "probes"
                or has_probe_header(request)):
            return None
        return _forbidden("the cluster entrance only serves Knative readiness probes "
                          "(--cluster-scope probes)", request.entrance)

    def probe_refusal(self, request: Request, probe: bool) -> bytes | None:
        """After the lookup: a JSON 403 body for a request of the ``probes`` scope that
        is not a Knative probe (its header was forged onto a rule that is no probe
        match), else None."""
        if (probe or request.entrance not in CLUSTER_ENTRANCES
                or self.cluster_scope != "probes"):
            return None
        return _forbidden("the cluster entrance only serves Knative readiness probes "
                          "(--cluster-scope probes); this request matches no Knative "
                          "probe rule (K-Network-Hash: override)", request.entrance)


def _forbidden(message: str, entrance: str) -> bytes:
    return json.dumps({"error": "forbidden", "message": message,
                       "entrance": entrance}).encode()
