"""The routing decision: which rule serves a request, which backend, or why none.

One pure function, :func:`decide`, serves every request in the Handler and, with a
trace (:func:`explain`), answers ``GET /debug/explain`` and ``tunnelgate explain``: what
is explained is what is served. It takes the compiled table, what the entrance may
serve (:class:`EntranceScope`) and the request's facts, and decides, in this order:

1. **Entrance scope.** The tunnel entrance serves every rule. The cluster entrance
   (the pod-IP listener: anything in the cluster reaches it, bypassing Cloudflare
   Access and WAF) is scoped by ``--cluster-scope``:

   ``all``     every rule (standalone mode: this listener *is* the product);
   ``probes``  only Knative readiness probes; anything else is 403 — before the
               lookup without the probe header, after it when the match that won is
               no probe match (the header was forged onto an ordinary route);
   ``scoped``  only rules whose ``entrances`` list names ``cluster`` (the table is
               compiled with :attr:`EntranceScope.default_entrances`) — plus Knative
               probes, which may win the probe match of any rule the tunnel serves
               (else a public route's probe would 404 forever and its KIngress never
               become Ready).
2. ``OPTIONS *`` asks about the server, not a resource (RFC 9110 §9.3.7; the entrance
   admits ``*`` with OPTIONS only): 200 from the proxy itself, no route involved.
3. The table lookup (:meth:`routing.table.Table.lookup`); no match ⇒ 404.
4. A rule's ``unavailableStatus`` ⇒ that status, nothing else runs.
5. The weighted pick, drawn before any filter runs so that filters cannot influence
   it; ``exclude`` names backends to skip (ejected endpoints).

What a Knative probe is (docs/knative.md). ``K-Network-Probe: probe`` is an ordinary
header any pod can send, so it proves nothing by itself. net-gateway-api marks its
probe rules: each has a match with the Exact header match ``K-Network-Hash: override``
(:attr:`routing.compiled.Hit.knative_probe`, decided when the table is compiled). A
request is a probe only when it carries the probe header *and* the match that won is
a probe match; then the revision's queue-proxy or the activator answers it, never the
application, and every failure the proxy generates itself is answered 503 so that the
prober retries instead of declaring the revision ready.

Pure: the random source is passed in (``rand``), nothing is kept between calls.
"""

from __future__ import annotations

from typing import Callable, Container, Final

from routing.matchers import Headers, first_value
from routing.model import CLUSTER_ENTRANCES, TUNNEL, Backend
from routing.compiled import CompiledBackend, Hit
from routing.table import Table
from routing.tabletext import describe_rule

SCOPES: Final = ("all", "probes", "scoped")

# The kinds of decision; :attr:`Decision.status` gives the status each answers with.
FORBIDDEN: Final = "forbidden"  # the entrance's scope refuses the request (403)
SERVER: Final = "server"  # OPTIONS *: the proxy answers for itself (200)
NO_ROUTE: Final = "no_route"  # no rule matches (404)
UNAVAILABLE: Final = "unavailable"  # the rule's unavailableStatus (503 for a probe)
ROUTE: Final = "route"  # filters run, then the chosen backend (or 500 without one)

# Knative's prober sets this header on every probe; its queue-proxy and activator
# answer a request carrying it themselves.
_PROBE_HEADER: Final = b"k-network-probe"
_PROBE_VALUE: Final = b"probe"
PROBE_STATUS: Final = 503  # what a probe gets for a failure of the proxy's own


class EntranceScope:
    """What each entrance may serve: every rule on the tunnel entrance; on the cluster
    entrance what ``cluster`` (one of :data:`SCOPES`) allows."""

    __slots__ = ("cluster", "probes_only", "scoped")

    def __init__(self, cluster: str = "all") -> None:
        if cluster not in SCOPES:
            raise ValueError(f"cluster scope must be one of {', '.join(SCOPES)}, "
                             f"not {cluster!r}")
        self.cluster = cluster
        self.probes_only = cluster == "probes"
        self.scoped = cluster == "scoped"

    @property
    def default_entrances(self) -> frozenset[str] | None:
        """Entrances that serve rules without an ``entrances`` list (``None`` = all),
        for :meth:`routing.table.Table.compile`: in ``scoped`` mode such rules stay off
        the cluster entrance."""
        return frozenset({TUNNEL}) if self.scoped else None

    def __repr__(self) -> str:
        return f"EntranceScope(cluster={self.cluster!r})"


class Decision:
    """What to do with a request: its ``kind``, the ``hit`` that won (if any), the
    ``backend`` drawn (``ROUTE`` only; ``None`` = none selectable), whether it is a
    Knative ``probe``, and for ``FORBIDDEN`` the ``detail`` the 403 says."""

    __slots__ = ("kind", "hit", "backend", "probe", "detail")

    def __init__(self, kind: str, hit: Hit | None = None,
                 backend: CompiledBackend | None = None, probe: bool = False,
                 detail: str = "") -> None:
        self.kind = kind
        self.hit = hit
        self.backend = backend
        self.probe = probe
        self.detail = detail

    @property
    def status(self) -> int:
        """The status the proxy answers with itself, 0 when the request is forwarded.
        For ``ROUTE`` a request filter may answer first (a redirect, a CORS
        preflight); only then does a missing or unavailable backend answer."""
        kind = self.kind
        if kind == ROUTE:
            backend = self.backend
            if backend is None:
                return PROBE_STATUS if self.probe else 500
            status = backend.backend.unavailable_status
            return PROBE_STATUS if status and self.probe else status
        if kind == UNAVAILABLE:
            assert self.hit is not None
            return PROBE_STATUS if self.probe else self.hit.route.rule.unavailable_status
        return {FORBIDDEN: 403, SERVER: 200}.get(kind, 404)

    def __repr__(self) -> str:
        where = "" if self.hit is None else f" {self.hit.name()}"
        backend = "" if self.backend is None else f" -> {self.backend.backend.url}"
        return f"<Decision {self.kind}{where}{backend}{' probe' if self.probe else ''}>"


# The decisions that carry nothing of the request: made once, never per request.
_NOT_A_PROBE: Final = Decision(
    FORBIDDEN, detail="the cluster entrance only serves Knative readiness probes "
                      "(--cluster-scope probes)")
_OPTIONS_STAR: Final = Decision(SERVER)
_NO_ROUTE: Final = Decision(NO_ROUTE)
_NO_PROBE_RULE: Final = (
    "the cluster entrance only serves Knative readiness probes (--cluster-scope probes); "
    "this request matches no Knative probe rule (K-Network-Hash: override)")


def claims_probe(headers: Headers) -> bool:
    """True for a request carrying ``K-Network-Probe: probe`` (a claim, not a proof)."""
    return first_value(headers, _PROBE_HEADER) == _PROBE_VALUE


def decide(table: Table, scope: EntranceScope, method: str, host: str, path: str,
           query: str, headers: Headers, entrance: str, rand: Callable[[], float],
           exclude: Container[Backend] | None = None,
           trace: list[str] | None = None) -> Decision:
    """The decision for one request (see the module docstring for the order).

    ``host`` as the client sent it; ``path`` and ``query`` raw (the ``?`` excluded);
    ``headers`` the request's lines; ``entrance`` one of
    :data:`routing.model.ENTRANCES`; ``rand`` returns a float uniform in [0, 1), called
    at most once, and only for a rule with more than one backend; ``exclude``: see
    :meth:`routing.compiled.CompiledRule.pick`. ``trace``, when given, receives the
    lookup's reasoning (:func:`explain`).
    """
    cluster = entrance in CLUSTER_ENTRANCES
    if cluster and scope.probes_only and not claims_probe(headers):
        return _NOT_A_PROBE
    if path == "*":
        return _OPTIONS_STAR
    hit = _lookup(table, scope, method, host, path, query, headers, entrance, trace)
    if hit is None:
        return _NO_ROUTE
    probe = hit.knative_probe and claims_probe(headers)
    if cluster and scope.probes_only and not probe:
        return Decision(FORBIDDEN, hit, None, False, _NO_PROBE_RULE)
    route = hit.route
    if route.rule.unavailable_status:
        return Decision(UNAVAILABLE, hit, None, probe)
    chosen = route.only  # a rule with one backend needs no draw
    if chosen is None:
        chosen = route.pick(rand(), exclude)
    return Decision(ROUTE, hit, chosen, probe)


def _lookup(table: Table, scope: EntranceScope, method: str, host: str, path: str,
            query: str, headers: Headers, entrance: str,
            trace: list[str] | None) -> Hit | None:
    """The lookup at ``entrance``; on the scoped cluster entrance a request claiming to
    be a probe that won no probe match gets a second lookup among the rules the tunnel
    serves, and takes its hit only if that is a probe match (a forged probe header
    never reaches another rule's application)."""
    if trace is None:
        hit = table.lookup(host, path, query, headers, method, entrance)
    else:
        hit = table.trace(host, path, query, headers, method, entrance, trace)
    if (not scope.scoped or entrance not in CLUSTER_ENTRANCES
            or (hit is not None and hit.knative_probe)
            or not claims_probe(headers)):
        return hit
    if trace is None:
        other = table.lookup(host, path, query, headers, method, TUNNEL)
    else:
        trace.append("K-Network-Probe on the scoped cluster entrance without a probe "
                     "match: looking for one among the rules the tunnel serves")
        other = table.trace(host, path, query, headers, method, TUNNEL, trace)
    if other is not None and other.knative_probe:
        return other
    if trace is not None:
        trace.append("no Knative probe match there: the cluster entrance's lookup stands")
    return hit


def explain(table: Table, scope: EntranceScope, method: str, host: str, path: str,
            query: str, headers: Headers, entrance: str, rand: Callable[[], float],
            exclude: Container[Backend] | None = None,
            via: str | None = None) -> tuple[Decision, list[str]]:
    """:func:`decide` with its reasoning as lines for a person: the request, the
    lookup(s), the winning rule and what happens to the request (the last line starts
    with ``result:``). ``via``: what the first line says about the entrance (default
    ``"the <entrance> entrance"``), for a caller that knows more about it."""
    lines = [f"request: {method} host {host!r} path {path!r} query {query!r} via "
             f"{via or 'the ' + entrance + ' entrance'} (cluster scope {scope.cluster})"]
    decision = decide(table, scope, method, host, path, query, headers, entrance, rand,
                      exclude, lines)
    hit = decision.hit
    if hit is not None:
        lines += describe_rule(hit.route, indent="  ")
    if decision.probe:
        lines.append(f"a Knative probe (K-Network-Probe: probe on a probe match): a "
                     f"failure of the proxy's own is answered {PROBE_STATUS}")
    lines.append("result: " + outcome(decision))
    return decision, lines


def outcome(decision: Decision) -> str:
    """What happens to the request, in one sentence."""
    kind, status, hit = decision.kind, decision.status, decision.hit
    if kind == FORBIDDEN:
        return f"refused {status}: {decision.detail}"
    if kind == SERVER:
        return f"OPTIONS * answered {status} by the proxy itself; no route is involved"
    if hit is None:
        return f"no matching route ({status})"
    if kind == UNAVAILABLE:
        return f"{hit.name()} wins; the rule answers {status} (unavailableStatus)"
    backend = decision.backend
    if backend is None:
        return (f"{hit.name()} wins; no selectable backend: a request filter may answer "
                f"(a redirect), else {status}")
    if status:
        return (f"{hit.name()} wins; backend {backend.backend.url} drawn, which answers "
                f"{status} (unavailableStatus)")
    return f"{hit.name()} wins; forwarded to backend {backend.backend.url} (this draw)"
