"""routing.filters: header edits, redirect Location, URL rewrite; the filter registry."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

from routing.config import parse_config
from routing.filters.headers import HeaderEdit, apply_header_modifier
from routing.filters.paths import replace_prefix
from routing.filters.redirect import redirect_location, split_host_port
from routing.filters.rewrite import rewrite_host, rewrite_path
from routing.model import Filter, HeaderModifier, PathModifier, Redirect, Rewrite
from routing.table import Table
from tests.test_routing_config import EXAMPLE_JSON

ROOT = Path(__file__).resolve().parent.parent
FILTERS = ROOT / "routing" / "filters"

# ------------------------------------------------------------------ header modifier


def test_set_then_add_then_remove() -> None:
    headers = [(b"Host", b"a"), (b"X-A", b"1"), (b"x-a", b"2"), (b"X-B", b"b"), (b"X-C", b"c")]
    mod = HeaderModifier(set=(("x-A", "new"), ("X-New", "n")), add=(("X-B", "b2"),),
                         remove=("x-c",))
    assert apply_header_modifier(headers, HeaderEdit(mod)) == [
        (b"Host", b"a"), (b"x-A", b"new"), (b"X-B", b"b"), (b"X-New", b"n"), (b"X-B", b"b2")]
    assert headers[1] == (b"X-A", b"1")  # input untouched


def test_add_appends_a_line_not_a_comma_join() -> None:
    result = apply_header_modifier([(b"Accept", b"a")],
                                   HeaderEdit(HeaderModifier(add=(("accept", "b"),))))
    assert result == [(b"Accept", b"a"), (b"accept", b"b")]


def test_remove_wins_over_set_and_add_in_the_same_modifier() -> None:
    mod = HeaderModifier(set=(("X", "1"),), add=(("X", "2"),), remove=("x",))
    assert apply_header_modifier([(b"X", b"0")], HeaderEdit(mod)) == []


def test_set_replaces_override_with_the_knative_hash() -> None:
    mod = HeaderModifier(set=(("K-Network-Hash", "abc"),))
    headers = [(b"k-network-hash", b"override"), (b"K-Network-Probe", b"probe")]
    result = apply_header_modifier(headers, HeaderEdit(mod))
    assert result == [(b"K-Network-Hash", b"abc"), (b"K-Network-Probe", b"probe")]


def test_empty_modifier_copies() -> None:
    headers = [(b"A", b"1")]
    result = apply_header_modifier(headers, HeaderEdit(HeaderModifier()))
    assert result == headers and result is not headers


def test_non_ascii_values_are_utf8() -> None:
    result = apply_header_modifier([], HeaderEdit(HeaderModifier(set=(("X", "caf\u00e9"),))))
    assert result == [(b"X", "caf\u00e9".encode())]


# ------------------------------------------------------------------ ReplacePrefixMatch

# Gateway API's ReplacePrefixMatch table: (request, prefix, replacement, spec result).
PREFIX_TABLE = [
    ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
    ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
    ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
    ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
    ("/foo", "/foo", "/xyz", "/xyz"),
    ("/foo/", "/foo", "/xyz", "/xyz/"),
    ("/foo/bar", "/foo", "", "/bar"),
    ("/foo/", "/foo", "", "/"),
    ("/foo", "/foo", "", "/"),
    ("/foo/", "/foo", "/", "/"),
    ("/foo", "/foo", "/", "/"),
    ("/foo", "/", "/xyz", "/xyz/foo"),          # the prefix "/" case ([G] #4660)
    ("/v2", "/v2/", "/api", "/api"),            # prefix with "/" matched the bare path
    ("/foo%2Fbar", "/foo", "/x", "/x%2Fbar"),   # raw encoding kept after the prefix
    ("/caf%C3%A9/x", "/caf\u00e9", "/menu", "/menu/x"),
]


@pytest.mark.parametrize(("path", "prefix", "replacement", "expected"), PREFIX_TABLE)
def test_replace_prefix_spec_table(path: str, prefix: str, replacement: str,
                                   expected: str) -> None:
    assert replace_prefix(path, prefix, replacement) == expected
    modifier = PathModifier("ReplacePrefixMatch", replacement)
    assert rewrite_path(path, prefix, modifier) == expected


def test_rewrite_full_path() -> None:
    assert rewrite_path("/any/thing", "/any", PathModifier("ReplaceFullPath", "/one")) == "/one"
    assert rewrite_path("/any", "", PathModifier("ReplaceFullPath", "")) == "/"


def test_rewrite_prefix_without_matched_prefix_leaves_path() -> None:
    assert rewrite_path("/exact", "", PathModifier("ReplacePrefixMatch", "/x")) == "/exact"


def test_rewrite_host() -> None:
    assert rewrite_host(Rewrite(hostname="assets.internal"), "app.example.com:8080") == \
        "assets.internal"
    assert rewrite_host(Rewrite(), "App.Example.com:8080") == "App.Example.com:8080"


# ------------------------------------------------------------------ redirects


@pytest.mark.parametrize(("host", "expected"), [
    ("a.example.com", ("a.example.com", None)),
    ("a.example.com:8080", ("a.example.com", 8080)),
    ("[::1]:8443", ("[::1]", 8443)),
    ("[::1]", ("[::1]", None)),
    ("a:bad", ("a", None)),
])
def test_split_host_port(host: str, expected: tuple) -> None:
    assert split_host_port(host) == expected


# (redirect fields, request scheme, request Host, expected Location) for GET /p?q=1
PORT_CASES = [
    ({}, "http", "a.example.com", "http://a.example.com/p?q=1"),
    ({}, "http", "a.example.com:8080", "http://a.example.com:8080/p?q=1"),
    ({}, "http", "a.example.com:80", "http://a.example.com/p?q=1"),
    ({}, "https", "a.example.com:443", "https://a.example.com/p?q=1"),
    ({}, "https", "a.example.com:80", "https://a.example.com:80/p?q=1"),
    ({"scheme": "https"}, "http", "a.example.com:8080", "https://a.example.com/p?q=1"),
    ({"scheme": "http"}, "https", "a.example.com:8443", "http://a.example.com/p?q=1"),
    ({"port": 8443}, "http", "a.example.com:8080", "http://a.example.com:8443/p?q=1"),
    ({"port": 80}, "http", "a.example.com:8080", "http://a.example.com/p?q=1"),
    ({"port": 443}, "http", "a.example.com", "http://a.example.com:443/p?q=1"),
    ({"scheme": "https", "port": 443}, "http", "a.example.com", "https://a.example.com/p?q=1"),
    ({"scheme": "https", "port": 8443}, "http", "a", "https://a:8443/p?q=1"),
    ({"hostname": "b.example.com"}, "http", "a.example.com:8080",
     "http://b.example.com:8080/p?q=1"),
    ({"hostname": "b.example.com", "scheme": "https"}, "http", "a.example.com:8080",
     "https://b.example.com/p?q=1"),
    ({}, "http", "[::1]:8080", "http://[::1]:8080/p?q=1"),
]


@pytest.mark.parametrize(("fields", "scheme", "host", "expected"), PORT_CASES)
def test_redirect_scheme_host_port(fields: dict, scheme: str, host: str,
                                   expected: str) -> None:
    assert redirect_location(Redirect(**fields), scheme, host, "/p", "q=1", "") == expected


def test_redirect_example_from_the_spec() -> None:
    # PathPrefix /old, {https, new.example.com, ReplacePrefixMatch /new, 301}
    redirect = Redirect(scheme="https", hostname="new.example.com", status_code=301,
                        path=PathModifier("ReplacePrefixMatch", "/new"))
    assert redirect_location(redirect, "http", "x.example.com", "/old/page", "a=1",
                             "/old") == "https://new.example.com/new/page?a=1"


@pytest.mark.parametrize(("path", "prefix", "replacement", "expected"), PREFIX_TABLE)
def test_redirect_prefix_uses_the_same_join(path: str, prefix: str, replacement: str,
                                            expected: str) -> None:
    redirect = Redirect(path=PathModifier("ReplacePrefixMatch", replacement))
    assert redirect_location(redirect, "http", "h", path, "", prefix) == f"http://h{expected}"


@pytest.mark.parametrize(("modifier", "matched_prefix", "expected"), [
    (None, "/a", "http://h/a/b"),
    (PathModifier("ReplaceFullPath", "/full"), "/a", "http://h/full"),
    (PathModifier("ReplaceFullPath", ""), "/a", "http://h/"),
    (PathModifier("ReplacePrefixMatch", "/z"), "", "http://h/z"),  # no prefix: the value
])
def test_redirect_paths(modifier: PathModifier | None, matched_prefix: str,
                        expected: str) -> None:
    redirect = Redirect(path=modifier)
    assert redirect_location(redirect, "http", "h", "/a/b", "", matched_prefix) == expected


def test_redirect_keeps_raw_query() -> None:
    location = redirect_location(Redirect(hostname="n.example.com"), "https", "o", "/a%20b",
                                 "x=%2F&y=a+b", "")
    assert location == "https://n.example.com/a%20b?x=%2F&y=a+b"


def test_example_redirect_end_to_end() -> None:
    # GET app.example.com/old/a?x=1 ⇒ https://new.example.com/new/a?x=1
    table = Table.compile(parse_config(EXAMPLE_JSON))
    hit = table.lookup("app.example.com", "/old/a", "x=1", [], "GET", "tunnel")
    redirect = hit.route.request_filters[0].filter.request_redirect
    assert redirect.status_code == 301
    assert redirect_location(redirect, "http", "app.example.com", "/old/a", "x=1",
                             hit.matched_prefix) == "https://new.example.com/new/a?x=1"
    static = table.lookup("app.example.com", "/static/app.js", "v=3", [], "GET", "tunnel")
    rewrite = static.route.request_filters[0].filter.url_rewrite
    assert rewrite_path("/static/app.js", static.matched_prefix, rewrite.path) == \
        "/assets/app.js"
    assert rewrite_host(rewrite, "app.example.com") == "assets.internal"


# ------------------------------------------------------------------ the filter registry


def test_every_filter_type_has_one_registry_entry_and_one_step() -> None:
    # A type the wire accepts but the table or the request path does not know would
    # fail only when a request met it.
    from proxy.exchange.steps import STEPS
    from routing.filterkinds import KINDS
    assert set(KINDS) == set(STEPS)
    assert all(kind.type == name for name, kind in KINDS.items())
    payload_fields = {f.name for f in dataclasses.fields(Filter)} - {"type"}
    assert sorted(kind.field for kind in KINDS.values()) == sorted(payload_fields)
    assert [t for t, kind in KINDS.items() if kind.response] == [
        "ResponseHeaderModifier", "CORS"]
    assert [t for t, kind in KINDS.items() if kind.waits] == ["RequestMirror"]


def test_every_filter_module_kind_is_registered() -> None:
    # A filter module whose registry line is missing would be dead code that looks
    # live; a registered kind from anywhere else would be a filter outside its module.
    from routing.filterkinds import KINDS
    from routing.filters.kind import FilterKind
    defined = []
    for path in sorted(FILTERS.glob("*.py")):
        module = importlib.import_module(f"routing.filters.{path.stem}")
        defined += [value for value in vars(module).values()
                    if isinstance(value, FilterKind)]
    assert sorted(kind.type for kind in defined) == sorted(KINDS)
    assert all(KINDS[kind.type] is kind for kind in defined)


def _type_tables(path: Path, types: frozenset[str]) -> list[str]:
    """Literal dicts, sets, lists and tuples in ``path`` that name two or more of
    ``types`` among their own keys or elements."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            parts = [*node.keys, *node.values]
        elif isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            parts = list(node.elts)
        else:
            continue
        named = {part.value for part in parts
                 if isinstance(part, ast.Constant) and part.value in types}
        if len(named) > 1:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {sorted(named)}")
    return found


def test_no_table_by_filter_type_outside_the_registry() -> None:
    # A new filter type is its module and one registry line: no other table keyed
    # by the types (a parser's, a writer's, the YAML conversion's) may need a line too.
    from routing.filterkinds import KINDS
    types = frozenset(KINDS)
    sources = sorted(p for top in ("routing", "proxy", "tunnel")
                     for p in (ROOT / top).rglob("*.py"))
    assert [line for path in sources for line in _type_tables(path, types)] == []
    sample = ROOT / "tests" / "test_routing_filters.py"  # (the check finds one)
    assert _type_tables(sample, types) != []


@pytest.mark.parametrize(("wire", "request_types", "response_types", "compiled"), [
    ({"type": "RequestHeaderModifier",
      "requestHeaderModifier": {"set": [{"name": "X", "value": "1"}]}},
     ["RequestHeaderModifier"], [], "HeaderEdit"),
    ({"type": "ResponseHeaderModifier", "responseHeaderModifier": {"remove": ["X"]}},
     [], ["ResponseHeaderModifier"], "HeaderEdit"),
    ({"type": "RequestRedirect", "requestRedirect": {"statusCode": 301}},
     ["RequestRedirect"], [], "Redirect"),
    ({"type": "URLRewrite", "urlRewrite": {"hostname": "x.test"}},
     ["URLRewrite"], [], "Rewrite"),
    ({"type": "RequestMirror", "requestMirror": {"backendUrl": "http://m:80"}},
     ["RequestMirror"], [], "Mirror"),
    ({"type": "CORS", "cors": {"allowOrigins": ["https://a.test"]}},
     ["CORS"], ["CORS"], "CorsPolicy"),
])
def test_each_filter_is_compiled_once_into_its_phases(
        wire: dict, request_types: list, response_types: list, compiled: str) -> None:
    from routing.filterkinds import split_filters
    rule = parse_config({"version": 1, "rules": [{"filters": [wire]}]}).rules[0]
    early, late = split_filters(rule.filters)
    assert [c.type for c in early] == request_types
    assert [c.type for c in late] == response_types

    assert type((early + late)[0].compiled).__name__ == compiled
    assert len({id(c.compiled) for c in early + late}) == 1  # both phases share it
