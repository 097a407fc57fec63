"""routing.matchers: the per-match predicates and precedence keys on their own."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing.matchers import (
    EXACT,
    PREFIX,
    REGEX,
    CompiledMatch,
    FullMatch,
    HeaderMatcher,
    QueryMatcher,
    parse_query,
    utf8,
)
from routing.model import PathMatch, RouteMatch, ValueMatch


def compiled(match: RouteMatch, rule: int = 0, index: int = 0,
             entrances: tuple[str, ...] | None = None) -> CompiledMatch:
    return CompiledMatch(object(), rule, index, match, entrances)


def check(match: CompiledMatch, path: str = "/", *, query: str = "",
          headers: list[tuple[bytes, bytes]] | None = None, method: str = "GET",
          entrance: str = "tunnel") -> str | None:
    return match.mismatch(path, query, headers or [], method, entrance, [])


# ------------------------------------------------------------------ FullMatch


@pytest.mark.parametrize(("pattern", "text", "matches"), [
    ("abc", b"abc", True), ("abc", b"xabc", False), ("abc", b"abcx", False),
    ("a.*", b"a\xff", False),             # UTF-8 dialect: a stray byte is no character
    ("caf\u00e9", "caf\u00e9".encode(), True), ("", b"", True), ("", b"x", False),
    ("^/v2$", b"/v2", True), ("(a|ab)", b"ab", True),
])
def test_full_match(pattern: str, text: bytes, matches: bool) -> None:
    assert FullMatch(pattern).matches(text) is matches


RANGE_PATTERNS = ["/?(a|b)+/?", "(?i)/AB.*", "/a[b-z]{2,3}", "b|/a", "[^/]*", "/(ab)*$",
                  "^/a/[0-9]+$", "\\/a\\.b", "(?s).", "/\u00e9+"]


@pytest.mark.parametrize("pattern", RANGE_PATTERNS)
@given(text=st.text(alphabet="ab/AB.1\u00e9", max_size=10))
def test_full_match_agrees_with_the_public_api(pattern: str, text: str) -> None:
    # The match-range prefilter and the direct C++ call must decide exactly like
    # google-re2's own fullmatch.
    matcher = FullMatch(pattern)
    data = text.encode()
    assert matcher.matches(data) is (matcher._public.fullmatch(data) is not None)


def test_utf8_passes_lone_surrogates() -> None:
    assert utf8("a\udcff") == "a\udcff".encode("utf-8", "surrogatepass")
    assert utf8("caf\u00e9") == b"caf\xc3\xa9"


# ------------------------------------------------------------------ headers and query


def test_header_matcher_scans_every_line() -> None:
    matcher = HeaderMatcher(ValueMatch("Exact", "X-Env", "prod"))
    assert matcher.matches([(b"x-env", b"dev"), (b"X-ENV", b"prod")])
    assert not matcher.matches([(b"x-env", b"dev, prod")])
    assert not matcher.matches([(b"x-en", b"prod"), (b"x-envv", b"prod")])


def test_query_matcher_parses_once_per_lookup() -> None:
    cache: list = []
    first = QueryMatcher(ValueMatch("Exact", "a", "1"))
    second = QueryMatcher(ValueMatch("RegularExpression", "b", "[0-9]+"))
    assert first.matches("a=1&b=22", cache) and second.matches("a=1&b=22", cache)
    assert len(cache) == 1 and cache[0] == {"a": ["1"], "b": ["22"]}


@pytest.mark.parametrize(("query", "parsed"), [
    ("", {}), ("a=1&a=2", {"a": ["1", "2"]}), ("a+b=c+d", {"a b": ["c d"]}),
    ("x=%2F%20", {"x": ["/ "]}), ("flag", {"flag": [""]}), ("&&a=1&", {"a": ["1"]}),
])
def test_parse_query(query: str, parsed: dict) -> None:
    assert parse_query(query) == parsed


# ------------------------------------------------------------------ CompiledMatch


def test_keys_are_lexicographic_in_the_documented_order() -> None:
    match = RouteMatch(path=PathMatch("PathPrefix", "/api"), method="GET",
                       headers=(ValueMatch("Exact", "A", "1"), ValueMatch("Exact", "a", "2"),
                                ValueMatch("Exact", "B", "1")),
                       query_params=(ValueMatch("Exact", "q", "1"),))
    # Duplicate header name (case-insensitive) counts once.
    assert compiled(match, rule=4, index=2).key == (PREFIX, 4, True, 2, 1, -4, -2)


@pytest.mark.parametrize(("kind", "rank"), [("Exact", EXACT), ("RegularExpression", REGEX),
                                            ("PathPrefix", PREFIX)])
def test_path_type_rank(kind: str, rank: int) -> None:
    assert compiled(RouteMatch(path=PathMatch(kind, "/x"))).key[0] == rank


def test_empty_match_is_root_prefix() -> None:
    match = compiled(RouteMatch())
    assert (match.kind, match.value, match.matched_prefix) == (PREFIX, "/", "/")
    assert check(match, "/anything") is None


def test_mismatch_reasons_in_check_order() -> None:
    match = compiled(RouteMatch(path=PathMatch("Exact", "/a"), method="POST",
                                headers=(ValueMatch("Exact", "X", "1"),),
                                query_params=(ValueMatch("Exact", "q", "1"),)),
                     entrances=("cluster",))
    assert check(match, entrance="tunnel") == "entrance"
    assert check(match, entrance="cluster") == "method"
    assert check(match, entrance="cluster", method="POST") == "path"
    assert check(match, "/a", entrance="cluster", method="POST") == "header X Exact '1'"
    assert check(match, "/a", entrance="cluster", method="POST",
                 headers=[(b"x", b"1")]) == "query q Exact '1'"
    assert check(match, "/a", entrance="cluster", method="POST", headers=[(b"x", b"1")],
                 query="q=1") is None


@given(st.text(alphabet="/ab", max_size=10), st.text(alphabet="/ab", min_size=1, max_size=6))
def test_prefix_is_element_wise(path: str, value: str) -> None:
    path, value = "/" + path, "/" + value
    match = compiled(RouteMatch(path=PathMatch("PathPrefix", value)))
    # Oracle: split both at "/"; the value's elements (trailing "/" ignored) must be
    # the path's leading elements.
    elements = value.rstrip("/").split("/")
    expected = path.split("/")[:len(elements)] == elements
    assert (check(match, path) is None) is expected


def test_describe_mentions_every_condition() -> None:
    match = compiled(RouteMatch(path=PathMatch("RegularExpression", "/r.*"), method="PUT",
                                headers=(ValueMatch("Exact", "X", "1"),)))
    assert match.describe() == "RegularExpression '/r.*', PUT, header X Exact '1'"
