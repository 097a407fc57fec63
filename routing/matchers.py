"""Per-match predicates, compiled once per config (Gateway API HTTPRouteMatch semantics).

A :class:`CompiledMatch` is one ``RouteMatch`` of one rule (a rule without matches gets
one implicit ``PathPrefix /``). Its :attr:`CompiledMatch.key` is the precedence key the
table sorts by (Gateway API precedence, per match and lexicographic, never one score per rule):

    (path type rank, path length, has method, header matches, query matches,
     -rule index, -match index)

Path type rank: Exact 3 > RegularExpression 2 > PathPrefix 1. Larger keys win.

Semantics (Gateway API's where it and the Go data plane differ):

- Paths are matched on the percent-decoded path (``%2F`` decoded too), decoded by the
  caller; no other normalisation. ``Exact`` and ``PathPrefix`` values are decoded the
  same way when compiled (``/caf%C3%A9`` matches what a client sends for ``/café``).
- ``PathPrefix`` is element-wise and ignores a trailing ``/`` in the value:
  ``/v2/`` matches ``/v2``, ``/v2/`` and ``/v2/x``, never ``/v2example``.
- ``RegularExpression`` (paths, header and query values) is an RE2 **full match**, as
  in Envoy: the pattern must match the whole path/value. gRPC regexes arrive already
  anchored (``^…$``), which full-match treats the same.
- Header names are case-insensitive; any one of the request's separate header lines may
  match (a single ``a, b`` line does not match ``a``); values are case-sensitive.
  When one match lists the same header name twice only the first entry counts.
- Query parameter names are exact; values are URL-decoded (``+`` is a space); any value
  of a repeated parameter may match.
- Method is a literal comparison.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Collection, Final
from urllib.parse import parse_qsl, unquote

from routing.model import PathMatch, RouteMatch, ValueMatch
from routing.regex import MAX_SUBJECT_BYTES, compile_regex

Headers = list[tuple[bytes, ...]]  # pairs; see proxy.request.Header
QueryCache = list[dict[str, list[str]]]
"""Empty until a query matcher first needs the parsed query; then holds it (per lookup)."""

EXACT: Final = 3
REGEX: Final = 2
PREFIX: Final = 1
RANKS: Final = MappingProxyType({"Exact": EXACT, "RegularExpression": REGEX, "PathPrefix": PREFIX})
IMPLICIT_MATCH: Final = RouteMatch(path=PathMatch("PathPrefix", "/"))


class FullMatch:
    """An RE2 pattern tested as a whole-string match against ``bytes``.

    Two things keep this cheap on the lookup path. First, RE2's ``PossibleMatchRange``
    gives byte strings ``low``/``high`` bounding every string the pattern can match, so
    most non-matching subjects are rejected by two byte comparisons. Second, the
    compiled RE2 object is called directly with ``ANCHOR_BOTH``: google-re2's public
    ``fullmatch`` goes through a Python generator and costs ~3× more per call. Both
    fall back to the public API if the binding ever lacks them.

    A subject longer than :data:`~routing.regex.MAX_SUBJECT_BYTES` never matches: it
    bounds the work one request can make a config's regexes do.
    """

    __slots__ = ("pattern", "_match", "_anchor", "_public", "_low", "_high")

    def __init__(self, pattern: str) -> None:
        compiled = compile_regex(pattern)  # the dialect parse_config validated
        self.pattern = pattern
        native = getattr(compiled, "_regexp", None)
        anchor = getattr(getattr(native, "Anchor", None), "ANCHOR_BOTH", None)
        self._match = getattr(native, "Match", None) if anchor is not None else None
        self._anchor = anchor
        self._public = compiled
        self._low: bytes | None = None
        self._high = b""
        bounds = getattr(native, "PossibleMatchRange", None)
        if bounds is not None:
            ok, low, high = bounds(_RANGE_PREFIX)
            if ok:
                self._low, self._high = low, high

    def matches(self, data: bytes) -> bool:
        """Whether the pattern matches the whole of ``data``. (A method, not
        ``__call__``: the compiled build calls a method directly, an instance through
        the interpreter's call protocol — ~280 instructions per regex path match;
        callgrind, 2026-12-07.)"""
        if len(data) > MAX_SUBJECT_BYTES:
            return False
        if self._low is not None and not self._low <= data <= self._high:
            return False
        if self._match is not None:
            return self._match(self._anchor, data, 0, len(data))[0][0] >= 0
        return self._public.fullmatch(data) is not None


_RANGE_PREFIX: Final = 64  # bytes of literal prefix RE2 may use for the match range


class HeaderMatcher:
    """One header condition; scans the request's header lines (names lowered lazily)."""

    __slots__ = ("name", "lower", "exact", "regex", "text")

    def __init__(self, match: ValueMatch) -> None:
        self.name = match.name
        self.lower = match.name.lower().encode("latin-1", "replace")
        self.exact = match.value.encode() if match.type == "Exact" else None
        self.regex = FullMatch(match.value) if match.type == "RegularExpression" else None
        self.text = f"header {match.name} {match.type} {match.value!r}"

    def matches(self, headers: Headers) -> bool:
        # (A method, not __call__: the compiled build calls a method directly and
        # ``__call__`` by name.)
        lower, size = self.lower, len(self.lower)
        for name, value in headers:
            if len(name) == size and name.lower() == lower:
                if self.exact is not None:
                    if value == self.exact:
                        return True
                elif self.regex is not None and self.regex.matches(value):
                    return True
        return False


class QueryMatcher:
    """One query-parameter condition over the decoded query (parsed once per lookup)."""

    __slots__ = ("name", "exact", "regex", "text")

    def __init__(self, match: ValueMatch) -> None:
        self.name = match.name
        self.exact = match.value if match.type == "Exact" else None
        self.regex = FullMatch(match.value) if match.type == "RegularExpression" else None
        self.text = f"query {match.name} {match.type} {match.value!r}"

    def matches(self, query: str, cache: QueryCache) -> bool:
        if not cache:
            cache.append(parse_query(query))
        values = cache[0].get(self.name)
        if not values:
            return False
        if self.exact is not None:
            return self.exact in values
        regex = self.regex
        return regex is not None and any(regex.matches(utf8(v)) for v in values)


def first_value(headers: Headers, lower_name: bytes) -> bytes | None:
    """The value of the first header line named ``lower_name`` (compared
    case-insensitively), or None."""
    size = len(lower_name)
    for name, value in headers:
        if len(name) == size and name.lower() == lower_name:
            return value
    return None


def utf8(text: str) -> bytes:
    """UTF-8 bytes of ``text``; lone surrogates (from a lenient decode) pass through."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def parse_query(query: str) -> dict[str, list[str]]:
    """Decoded query parameters, every value of a repeated name kept in order."""
    parsed: dict[str, list[str]] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        parsed.setdefault(name, []).append(value)
    return parsed


def _first_per_name(matches: tuple[ValueMatch, ...], fold: bool) -> list[ValueMatch]:
    """Drop later entries repeating a name (only the first counts, as Gateway API says)."""
    seen: set[str] = set()
    kept = []
    for match in matches:
        key = match.name.lower() if fold else match.name
        if key not in seen:
            seen.add(key)
            kept.append(match)
    return kept


class CompiledMatch:
    """One match of one rule, ready to test against a request.

    ``owner`` is whatever the table attaches (its compiled rule); ``entrances`` is the
    rule's entrance list (``None`` = every entrance).
    """

    __slots__ = ("owner", "rule_index", "match_index", "kind", "value", "stem", "regex",
                 "method", "headers", "queries", "entrances", "matched_prefix")
    kind: int
    value: str
    stem: str
    regex: FullMatch | None
    method: str | None
    headers: tuple[HeaderMatcher, ...]
    queries: tuple[QueryMatcher, ...]
    entrances: frozenset[str] | None
    matched_prefix: str

    def __init__(self, owner: Any, rule_index: int, match_index: int, match: RouteMatch,
                 entrances: Collection[str] | None,
                 like: "CompiledMatch | None" = None) -> None:
        """``like``: the same ``match`` compiled before for the same ``entrances`` (its
        rule at another index, or another rule sharing the match): its compiled parts
        are shared."""
        self.owner = owner
        self.rule_index = rule_index
        self.match_index = match_index
        if like is not None:
            self.kind, self.value, self.stem, self.regex = (like.kind, like.value,
                                                            like.stem, like.regex)
            self.method, self.headers, self.queries = like.method, like.headers, like.queries
            self.entrances, self.matched_prefix = like.entrances, like.matched_prefix
            return
        path = match.path or IMPLICIT_MATCH.path
        assert path is not None
        self.kind = RANKS[path.type]
        # Compared with the decoded request path, so decoded too: Gateway API allows
        # "%XX" in Exact and PathPrefix values, the one way to name a path with a
        # space or a non-ASCII character. (A regex is written for the decoded path.)
        self.value = path.value if self.kind == REGEX else unquote(path.value)
        self.stem = self.value.rstrip("/")  # element-wise prefix: trailing "/" ignored
        self.regex = FullMatch(path.value) if self.kind == REGEX else None
        self.method = match.method
        self.headers = tuple(HeaderMatcher(h) for h in _first_per_name(match.headers, True))
        self.queries = tuple(QueryMatcher(q)
                             for q in _first_per_name(match.query_params, False))
        self.entrances = None if entrances is None else frozenset(entrances)
        self.matched_prefix = self.value if self.kind == PREFIX else ""

    @property
    def key(self) -> tuple:
        """The precedence key (module doc). Made when asked (sorting a bucket, explain)
        rather than kept: a kept tuple cost ~130 bytes per match."""
        return (self.kind, len(self.value), self.method is not None, len(self.headers),
                len(self.queries), -self.rule_index, -self.match_index)

    def mismatch(self, path: str, query: str, headers: Headers, method: str,
                 entrance: str, cache: QueryCache) -> str | None:
        """``None`` if the request satisfies this match, else a short reason.

        ``path`` is already percent-decoded. Checks run cheapest first; reasons are
        precomputed strings, so a miss allocates nothing.
        """
        if self.entrances is not None and entrance not in self.entrances:
            return "entrance"
        if self.method is not None and self.method != method:
            return "method"
        kind = self.kind
        if kind == PREFIX:
            stem = self.stem
            if not path.startswith(stem) or (len(path) != len(stem)
                                             and path[len(stem)] != "/"):
                return "path"
        elif kind == EXACT:
            if path != self.value:
                return "path"
        elif self.regex is None or not self.regex.matches(utf8(path)):
            return "path"
        for header in self.headers:
            if not header.matches(headers):
                return header.text
        for param in self.queries:
            if not param.matches(query, cache):
                return param.text
        return None

    def describe(self) -> str:
        """``PathPrefix "/api" GET +1 header +0 query`` — for explain/describe output."""
        kind = {EXACT: "Exact", REGEX: "RegularExpression", PREFIX: "PathPrefix"}[self.kind]
        parts = [f"{kind} {self.value!r}"]
        if self.method:
            parts.append(self.method)
        parts.extend(h.text for h in self.headers)
        parts.extend(q.text for q in self.queries)
        return ", ".join(parts)
