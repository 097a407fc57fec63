"""What a lookup hands a request: the compiled rule, its backends, and the hit.

A :class:`CompiledRule` is a validated ``Rule`` with everything a request needs
precomputed (filter chains, backend draw); a :class:`Hit` is one bucket entry of the
table (:mod:`routing.table`): one match of one rule under one host pattern, prebuilt so
that a lookup allocates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Container, Final

from routing.filterkinds import Chain, split_filters
from routing.matchers import CompiledMatch
from routing.model import Backend, Rule
from routing.values import backend_base
from routing.weights import cumulative, pick_index


@dataclass(frozen=True, slots=True)
class CompiledBackend:
    """A backend with its own filter chains, which run only when it is picked, and
    the base path and query of its URL (:func:`routing.values.backend_base`)."""

    backend: Backend
    request_filters: Chain
    response_filters: Chain
    base_path: str
    base_query: str


class CompiledRule:
    """A rule with everything a request needs precomputed.

    ``deadline`` is the min of the non-zero request/backend timeouts in seconds,
    or ``None``. ``only`` is the backend every draw picks, when the rule has one
    backend of positive weight (no draw needed).
    """

    __slots__ = ("rule", "index", "deadline", "request_filters", "response_filters",
                 "backends", "only", "_sums")
    deadline: float | None
    request_filters: Chain
    response_filters: Chain
    backends: tuple[CompiledBackend, ...]
    only: CompiledBackend | None
    _sums: tuple[int, ...]

    def __init__(self, rule: Rule, index: int, like: "CompiledRule | None" = None) -> None:
        """``like``: a compiled rule whose parts this one shares: all of them when it
        compiled the very same ``rule`` (the rule moved to ``index``: an insert or a
        delete before it), else its compiled backends when it holds the very same
        backends tuple (routes to one Service, all with the one ``Backend`` the parse
        made them share)."""
        self.rule = rule
        self.index = index
        if like is not None and like.rule is rule:
            self.deadline = like.deadline
            self.request_filters, self.response_filters = (like.request_filters,
                                                           like.response_filters)
        else:
            timeouts = rule.timeouts
            limits = [] if timeouts is None else [
                t for t in (timeouts.request, timeouts.backend) if t]
            self.deadline = min(limits) if limits else None
            self.request_filters, self.response_filters = (
                split_filters(rule.filters) if rule.filters else ((), ()))
        if like is not None and like.rule.backends is rule.backends:
            backends, sums, only = like.backends, like._sums, like.only
        else:
            backends = tuple(
                CompiledBackend(b, *split_filters(b.filters), *backend_base(b.url))
                for b in rule.backends)
            sums = cumulative(b.weight for b in rule.backends)
            only = backends[0] if len(sums) == 1 and sums[0] > 0 else None
        self.backends, self._sums, self.only = backends, sums, only

    def pick(self, rand: float, exclude: Container[Backend] | None = None,
             ) -> CompiledBackend | None:
        """Weighted choice; ``rand`` uniform in [0, 1). ``None`` ⇒ answer 500.

        ``exclude``: backends to skip (ejected endpoints; only ``in`` is asked of it):
        their weight is spread over the others in proportion. When every backend of
        positive weight is excluded, all of them are candidates again — a rule keeps
        serving rather than failing every request.
        """
        sums = self._sums
        if exclude is not None:
            kept = cumulative(0 if b.backend in exclude else b.backend.weight
                              for b in self.backends)
            if kept and kept[-1] > 0:
                sums = kept
        index = pick_index(sums, rand)
        return None if index is None else self.backends[index]

    def pick_backend(self, rand: float, exclude: Container[Backend] | None = None,
                     ) -> Backend | None:
        """Like :meth:`pick`, returning the plain :class:`Backend`."""
        chosen = self.pick(rand, exclude)
        return None if chosen is None else chosen.backend

    def __repr__(self) -> str:
        return f"<CompiledRule rules[{self.index}]>"


@dataclass(frozen=True, slots=True)
class Hit:
    """A bucket entry of the table, and the lookup's answer: ``match`` under the
    bucket's host pattern.

    ``route`` is the match's compiled rule; ``matched_prefix`` the PathPrefix value of
    the match (``"/"`` for a rule without matches, ``""`` for Exact/RegularExpression);
    ``host_pattern`` the bucket's configured pattern, used as the metrics label;
    ``knative_probe`` whether the match is a Knative probe match
    (:func:`is_knative_probe_match`), decided when the table is compiled.
    """

    match: CompiledMatch
    route: CompiledRule
    matched_prefix: str
    host_pattern: str
    knative_probe: bool = False

    @property
    def key(self) -> tuple:
        """The winning match's precedence key (:attr:`CompiledMatch.key`)."""
        return self.match.key

    def name(self) -> str:
        """The winning match as the config names it: ``rules[3].matches[1]``, or
        ``rules[3]`` for a rule without matches (logs, traces, explain)."""
        if self.route.rule.matches:
            return f"rules[{self.route.index}].matches[{self.match.match_index}]"
        return f"rules[{self.route.index}]"

    def path_pattern(self) -> str:
        """The winning match's path value (``/api``, an exact path, a regex): the
        request's route template, bounded by the config (``http.route`` in traces)."""
        matches = self.route.rule.matches
        path = matches[self.match.match_index].path if matches else None
        return path.value if path is not None else "/"


def hit(match: CompiledMatch, pattern: str) -> Hit:
    """The bucket entry of ``match`` (owned by a :class:`CompiledRule`) under the host
    ``pattern``."""
    return Hit(match, match.owner, match.matched_prefix, pattern,
               bool(match.headers) and is_knative_probe_match(match))


# net-gateway-api marks exactly its probe rules (the copy of every path it prepends,
# and the per-revision endpoint-probe rules of a rollout) with this Exact header match;
# the prober sends the value as is and the rule's filter replaces it with the hash.
_PROBE_MATCH_NAME: Final = b"k-network-hash"
_PROBE_MATCH_VALUE: Final = b"override"


def is_knative_probe_match(match: CompiledMatch) -> bool:
    """True for a match carrying the Exact header match ``K-Network-Hash: override``
    (header names compare case-insensitively, the value exactly)."""
    return any(h.lower == _PROBE_MATCH_NAME and h.exact == _PROBE_MATCH_VALUE
               for h in match.headers)
