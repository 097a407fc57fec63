"""The compiled routing table: which rule serves a request (docs/config.md).

Compiled once per config, Envoy-style, so a lookup is a few dict probes plus a short
scan:

1. The request host is case-folded, its ``:port`` dropped (not inside IPv6 brackets) and
   one trailing dot removed. ``X-Original-Host`` is deliberately ignored (any client can send it).
2. Buckets are tried in order: the **exact** host, then **wildcard** suffixes
   longest first (``*.example.com`` matches one or more labels before
   ``.example.com``, never the apex), then the **default** bucket (rules without
   hostnames). A bucket with no matching rule falls through to the next.
3. Inside a bucket every *match* (not rule) is pre-sorted by its precedence key
   (:mod:`routing.matchers`); the first one the request satisfies wins.

Each bucket entry is a prebuilt :class:`~routing.compiled.Hit`, so a lookup allocates
almost nothing. How a compile reuses the previous table: :mod:`routing.rebuild`; the
table in words: :mod:`routing.tabletext`.
"""

from __future__ import annotations

from typing import Iterator
from urllib.parse import unquote

from routing.compiled import CompiledRule, Hit
from routing.matchers import CompiledMatch, Headers, QueryCache
from routing.model import Config
from routing.pause import Pause, paced
from routing.rebuild import Bucket, Buckets, Rebuild
from routing.reuse import RuleReuse
from routing.tabletext import bucket_name, format_key, match_name, targets_text

Entry = tuple[CompiledMatch, Hit]
"""A bucket entry as :meth:`Table.buckets` lists it: the match and its hit."""


def request_host(host: str) -> str:
    """The bucket key for a request host: port dropped, lower-cased, one trailing dot off."""
    if ":" in host:
        if host.startswith("["):
            end = host.find("]")
            if end != -1:
                host = host[:end + 1]
        elif host.count(":") == 1:
            host = host[:host.index(":")]
    host = host.lower()
    return host[:-1] if host.endswith(".") else host


class Table:
    """Immutable compiled routes; safe to share between concurrent requests."""

    __slots__ = ("rules", "_exact", "_wildcard", "_default")

    def __init__(self, rules: tuple[CompiledRule, ...], exact: dict[str, Bucket],
                 wildcard: dict[str, Bucket], default: Bucket) -> None:
        self.rules = rules
        self._exact = exact
        self._wildcard = wildcard  # keyed by suffix: "*.example.com" -> ".example.com"
        self._default = default

    @classmethod
    def empty(cls) -> "Table":
        return cls((), {}, {}, ())

    @classmethod
    def compile(cls, config: Config, default_entrances: frozenset[str] | None = None,
                pause: Pause | None = None, reuse: RuleReuse | None = None) -> "Table":
        """Build the table; never raises for a config ``parse_config`` accepted.

        ``default_entrances`` is where rules *without* an ``entrances`` list are served
        (``None`` = every entrance); the cluster entrance's ``scoped`` policy passes
        ``{"tunnel"}`` so that only rules naming ``cluster`` are reachable there.
        ``pause``: see :data:`routing.pause.Pause`. ``reuse``: the previous compile's
        table, whose compiled rules and buckets are kept where the rules did not change
        (see :mod:`routing.rebuild`; this compile's table is kept there for the next).
        """
        base = reuse.table if reuse is not None else None
        if base is None or base[0] != default_entrances or \
                len(base[1]) != len(base[2].rules):  # another policy, or released
            base = (default_entrances, (), cls.empty(), {})
        _, base_rules, base_table, targets = base
        likes = reuse.likes if reuse is not None else {}
        build = Rebuild(config.rules, base_rules, base_table, default_entrances, pause,
                        likes)
        table = cls(build.rules(), *build.buckets())
        if reuse is not None:
            reuse.compiled += build.compiled
            if len(likes) > 2 * len(config.rules) + 64:  # rules long gone: forget them
                reuse.likes = {}
            reuse.table = (default_entrances, config.rules, table, build.targets(targets))
        return table

    def release(self, pause: Pause) -> None:
        """Empty a table that was replaced and that nothing reads any more, in steps
        with ``pause()`` between them: freeing the ~10^5 objects of a large table at
        once holds the interpreter for milliseconds. The table is empty after. The one
        mutation of a table: only its owner may call it, once no reader can hold it
        (``proxy.exchange.snapshot.SnapshotHolder.swap`` says when).
        """
        for buckets in (self._exact, self._wildcard):
            for _ in paced(range(len(buckets)), pause):
                buckets.popitem()
        self._default = ()
        rules = list(self.rules)  # the compiled rules go last, a few at a time
        self.rules = ()
        for _ in paced(range(len(rules)), pause):
            rules.pop()

    @property
    def rules_count(self) -> int:
        return len(self.rules)

    def lookup(self, host: str, path: str, query: str, headers: Headers, method: str,
               entrance: str) -> Hit | None:
        """The rule serving this request, or ``None`` (⇒ 404).

        ``host`` as the client sent it; ``path`` raw (percent-decoded here, only when it
        contains ``%``); ``query`` raw without ``?``; ``headers`` the request's lines.
        """
        key = request_host(host)
        if "%" in path:
            path = unquote(path)
        cache: QueryCache = []
        # _buckets() spelled out inline: this is the per-request hot path.
        bucket = self._exact.get(key)
        if bucket is not None:
            for hit in bucket:
                if hit.match.mismatch(path, query, headers, method, entrance,
                                      cache) is None:
                    return hit
        wildcard = self._wildcard
        if wildcard:
            dot = key.find(".", 1)
            while dot != -1:
                bucket = wildcard.get(key[dot:])
                if bucket is not None:
                    for hit in bucket:
                        if hit.match.mismatch(path, query, headers, method, entrance,
                                              cache) is None:
                            return hit
                dot = key.find(".", dot + 1)
        for hit in self._default:
            if hit.match.mismatch(path, query, headers, method, entrance, cache) is None:
                return hit
        return None

    def _buckets(self, host: str) -> Iterator[tuple[str, Bucket]]:
        """Candidate buckets in lookup order, each with its pattern."""
        bucket = self._exact.get(host)
        if bucket is not None:
            yield host, bucket
        if self._wildcard:
            # Suffixes starting at each dot, left to right = longest first; a dot at
            # index 0 is skipped so at least one label precedes the suffix.
            dot = host.find(".", 1)
            while dot != -1:
                bucket = self._wildcard.get(host[dot:])
                if bucket is not None:
                    yield "*" + host[dot:], bucket
                dot = host.find(".", dot + 1)
        if self._default:
            yield "", self._default

    # ------------------------------------------------------------- human-readable

    def trace(self, host: str, path: str, query: str, headers: Headers, method: str,
              entrance: str, lines: list[str]) -> Hit | None:
        """:meth:`lookup`, saying why in ``lines``: which buckets were tried, each
        candidate match in precedence order with its key and verdict, which won. The
        answer is :meth:`lookup`'s (the same walk); :func:`routing.decide.explain`
        adds what happens next."""
        key = request_host(host)
        decoded = unquote(path) if "%" in path else path
        lines.append(f"lookup via the {entrance} entrance: host key {key!r}; "
                     f"path matched as {decoded!r}")
        cache: QueryCache = []
        tried = False
        for pattern, bucket in self._buckets(key):
            tried = True
            lines.append(f"bucket {bucket_name(pattern)}: {len(bucket)} candidate "
                         "match(es) in precedence order")
            for position, hit in enumerate(bucket, 1):
                match = hit.match
                reason = match.mismatch(decoded, query, headers, method, entrance, cache)
                verdict = "MATCH" if reason is None else f"no ({reason})"
                lines.append(f"  {position}. {match_name(match)} {match.describe()} "
                             f"[{format_key(match.key)}] -> {verdict}")
                if reason is None:
                    lines.append(f"winner: {match_name(match)} in bucket "
                                 f"{bucket_name(pattern)}: first satisfied match in "
                                 f"precedence order; matched prefix {hit.matched_prefix!r}"
                                 + ("; a Knative probe match" if hit.knative_probe else ""))
                    return hit
            lines.append("  no candidate matched; falling through")
        if not tried:
            lines.append("no bucket for this host and no default bucket")
        return None

    def buckets(self) -> list[tuple[str, list[Entry]]]:
        """Every bucket as (host pattern, entries in precedence order): exact hosts,
        then wildcards longest first, then the default bucket (pattern ``""``)."""
        buckets = [(host, self._exact[host]) for host in sorted(self._exact)]
        buckets += [("*" + suffix, self._wildcard[suffix])
                    for suffix in sorted(self._wildcard, key=lambda s: (-len(s), s))]
        if self._default:
            buckets.append(("", self._default))
        return [(pattern, [(hit.match, hit) for hit in bucket])
                for pattern, bucket in buckets]

    def bucket(self, pattern: str) -> Bucket:
        """The bucket of a host pattern (``""``: the default bucket), or an empty one."""
        if not pattern:
            return self._default
        if pattern.startswith("*."):
            return self._wildcard.get(pattern[1:], ())
        return self._exact.get(pattern, ())

    def parts(self) -> Buckets:
        """The exact, wildcard and default buckets, for :class:`~routing.rebuild.Rebuild`
        to build the next table from (it never changes them)."""
        return self._exact, self._wildcard, self._default

    def describe(self) -> list[str]:
        """The compiled table, bucket by bucket in lookup order (for ``check``)."""
        lines = [f"{len(self.rules)} rule(s); {len(self._exact)} exact host(s), "
                 f"{len(self._wildcard)} wildcard(s), default bucket "
                 f"{len(self._default)} match(es)"]
        for pattern, bucket in self.buckets():
            lines.append(f"bucket {bucket_name(pattern)}:")
            for match, _ in bucket:
                lines.append(f"  {match_name(match)} {match.describe()} "
                             f"[{format_key(match.key)}] -> {targets_text(match.owner)}")
        return lines
