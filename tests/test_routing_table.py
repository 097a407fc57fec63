"""routing.table + routing.weights: host buckets, per-match precedence, backend choice."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing.config import parse_config
from routing.filters.cors import CorsPolicy
from routing.decide import EntranceScope, explain
from routing.table import Table, request_host
from routing.weights import cumulative, pick_index
from tests.test_routing_config import EXAMPLE_JSON

BACKEND = [{"url": "http://b.ns.svc:80", "weight": 1}]


def build(*rules: dict) -> Table:
    """A table from rule dicts (each gets a backend unless it names its own)."""
    return Table.compile(parse_config({"version": 1, "rules": [
        {"backends": BACKEND, **rule} for rule in rules]}))


def winner(table: Table, path: str = "/", host: str = "h.example.com", *,
           headers: list[tuple[bytes, bytes]] | None = None, method: str = "GET",
           query: str = "", entrance: str = "tunnel") -> int | None:
    """Index of the winning rule, or None."""
    hit = table.lookup(host, path, query, headers or [], method, entrance)
    return None if hit is None else hit.route.index


def path_rule(kind: str, value: str) -> dict:
    return {"matches": [{"path": {"type": kind, "value": value}}]}


# ------------------------------------------------------------------ path cases

REQUEST_PATHS = ["/v2", "/v2/", "/v2/x", "/v2example", "/V2"]
# Gateway API's answers. Regex rows use our documented dialect, RE2 *full*
# match (as Envoy): the unanchored pattern "/v2" therefore matches only "/v2".
PATH_CASES = [
    ("PathPrefix", "/v2", [True, True, True, False, False]),
    ("PathPrefix", "/v2/", [True, True, True, False, False]),  # spec ✔ for /v2
    ("Exact", "/v2", [True, False, False, False, False]),
    ("Exact", "/v2/", [False, True, False, False, False]),
    ("PathPrefix", "/", [True, True, True, True, True]),
    ("RegularExpression", "/v2", [True, False, False, False, False]),
    ("RegularExpression", "^/v2$", [True, False, False, False, False]),
    ("RegularExpression", "/v2.*", [True, True, True, True, False]),
    ("RegularExpression", "/v2(/.*)?", [True, True, True, False, False]),
]


@pytest.mark.parametrize(("kind", "value", "expected"), PATH_CASES)
@pytest.mark.parametrize("column", range(len(REQUEST_PATHS)))
def test_path_matching_table(kind: str, value: str, expected: list[bool], column: int) -> None:
    table = build(path_rule(kind, value))
    assert (winner(table, REQUEST_PATHS[column]) == 0) is expected[column]


@pytest.mark.parametrize(("prefix", "path", "matches"), [
    ("/foo/bar", "/foo/bar/baz", True),
    ("/foo/bar", "/foo/barbaz", False),
    ("/foo//", "/foo", True),
    ("/", "", True),
    ("/api", "/api%2Fv1", True),   # %2F decoded before matching, like the anchor
    ("/caf\u00e9", "/caf%C3%A9/menu", True),
    ("/a b", "/a%20b", True),
])
def test_prefix_edge_cases(prefix: str, path: str, matches: bool) -> None:
    assert (winner(build(path_rule("PathPrefix", prefix)), path) == 0) is matches


def test_exact_matches_the_decoded_path() -> None:
    table = build(path_rule("Exact", "/a/b"))
    assert winner(table, "/a%2Fb") == 0
    assert winner(table, "/a%2fb") == 0
    assert winner(table, "/a/b/") is None


def test_grpc_anchored_regex() -> None:
    table = build(path_rule("RegularExpression", "^/helloworld\\.Greeter/Say.*$"))
    assert winner(table, "/helloworld.Greeter/SayHello") == 0
    assert winner(table, "/x/helloworld.Greeter/SayHello") is None


# ------------------------------------------------------------------ hosts


@pytest.mark.parametrize(("host", "key"), [
    ("App.Example.COM:8443", "app.example.com"),
    ("app.example.com.", "app.example.com"),
    ("APP.example.com.:80", "app.example.com"),
    ("[::1]:8080", "[::1]"),
    ("[FD00::1]", "[fd00::1]"),
    ("10.0.0.1:80", "10.0.0.1"),
    ("", ""),
])
def test_request_host_normalisation(host: str, key: str) -> None:
    assert request_host(host) == key


def test_port_case_and_trailing_dot_are_folded() -> None:
    table = build({"hostnames": ["app.example.com"]})
    for host in ("app.example.com", "App.Example.COM:8443", "app.example.com.",
                 "APP.EXAMPLE.COM.:80"):
        assert winner(table, host=host) == 0, host
    assert winner(table, host="app.example.com..") is None


def test_config_hostnames_are_case_folded() -> None:
    assert winner(build({"hostnames": ["App.Example.com"]}), host="app.example.com") == 0


@pytest.mark.parametrize(("host", "matches"), [
    ("a.example.com", True), ("a.b.example.com", True), ("example.com", False),
    (".example.com", False), ("aexample.com", False), ("a.example.com.evil", False),
])
def test_wildcard_matches_one_or_more_labels_never_the_apex(host: str, matches: bool) -> None:
    assert (winner(build({"hostnames": ["*.example.com"]}), host=host) == 0) is matches


def test_longest_wildcard_suffix_first() -> None:
    table = build({"hostnames": ["*.example.com"]}, {"hostnames": ["*.b.example.com"]})
    assert winner(table, host="a.b.example.com") == 1
    assert winner(table, host="a.c.example.com") == 0


def test_exact_host_beats_wildcard_beats_default() -> None:
    table = build({}, {"hostnames": ["*.example.com"]}, {"hostnames": ["a.example.com"]})
    assert winner(table, host="a.example.com") == 2
    assert winner(table, host="b.example.com") == 1
    assert winner(table, host="other.org") == 0


def test_bucket_falls_through_when_no_rule_matches() -> None:
    table = build({"hostnames": ["a.example.com"], **path_rule("PathPrefix", "/api")},
                  {"hostnames": ["*.example.com"], **path_rule("PathPrefix", "/web")},
                  path_rule("PathPrefix", "/"))
    assert winner(table, "/api/x", "a.example.com") == 0
    assert winner(table, "/web/x", "a.example.com") == 1
    assert winner(table, "/other", "a.example.com") == 2


def test_no_rule_no_hit() -> None:
    assert winner(build({"hostnames": ["a.example.com"]}), host="b.example.com") is None
    assert Table.empty().lookup("a", "/", "", [], "GET", "tunnel") is None


def test_host_pattern_label() -> None:
    table = build({"hostnames": ["a.example.com"]}, {"hostnames": ["*.example.com"]}, {})
    labels = [table.lookup(h, "/", "", [], "GET", "tunnel").host_pattern
              for h in ("A.example.com:1", "x.y.example.com", "other")]
    assert labels == ["a.example.com", "*.example.com", ""]


def test_x_original_host_is_ignored() -> None:
    table = build({"hostnames": ["private.example.com"]}, {"hostnames": ["public.example.com"]})
    headers = [(b"X-Original-Host", b"private.example.com")]
    assert winner(table, host="public.example.com", headers=headers) == 1


# ------------------------------------------------------------------ precedence


def test_exact_beats_longer_prefix() -> None:
    table = build(path_rule("PathPrefix", "/foo/bar/baz"), path_rule("Exact", "/foo/bar/baz"))
    assert winner(table, "/foo/bar/baz") == 1


def test_regex_sits_between_exact_and_prefix() -> None:
    table = build(path_rule("PathPrefix", "/a/long/prefix"),
                  path_rule("RegularExpression", "/a/.*"), path_rule("Exact", "/a/long/prefix"))
    assert winner(table, "/a/long/prefix") == 2
    assert winner(table, "/a/long/prefix/x") == 1


def test_longer_prefix_wins() -> None:
    table = build(path_rule("PathPrefix", "/a"), path_rule("PathPrefix", "/a/b"))
    assert winner(table, "/a/b/c") == 1
    assert winner(table, "/a/c") == 0


def test_precedence_is_per_match_not_per_rule() -> None:
    # Per match, not per rule: the anchor scores the whole rule by its best Exact.
    table = build({"matches": [{"path": {"type": "Exact", "value": "/foo"}},
                               {"path": {"type": "PathPrefix", "value": "/"}}]},
                  path_rule("PathPrefix", "/bar"))
    assert winner(table, "/bar/x") == 1
    assert winner(table, "/foo") == 0
    assert winner(table, "/baz") == 0


def test_one_method_beats_ten_headers() -> None:
    # Tiers must not overlap.
    headers = [{"type": "Exact", "name": f"X-H{i}", "value": "1"} for i in range(10)]
    table = build({"matches": [{"path": {"type": "PathPrefix", "value": "/"},
                                "headers": headers}]},
                  {"matches": [{"path": {"type": "PathPrefix", "value": "/"}, "method": "GET"}]})
    request = [(f"x-h{i}".encode(), b"1") for i in range(10)]
    assert winner(table, headers=request) == 1
    assert winner(table, headers=request, method="POST") == 0


def test_one_header_beats_ten_query_params() -> None:
    queries = [{"type": "Exact", "name": f"q{i}", "value": "1"} for i in range(10)]
    table = build({"matches": [{"path": {"type": "PathPrefix", "value": "/"},
                                "queryParams": queries}]},
                  {"matches": [{"path": {"type": "PathPrefix", "value": "/"},
                                "headers": [{"type": "Exact", "name": "X", "value": "1"}]}]})
    query = "&".join(f"q{i}=1" for i in range(10))
    assert winner(table, query=query, headers=[(b"x", b"1")]) == 1
    assert winner(table, query=query) == 0


def test_longer_path_beats_method() -> None:
    table = build({"matches": [{"path": {"type": "PathPrefix", "value": "/a"}, "method": "GET"}]},
                  path_rule("PathPrefix", "/a/b"))
    assert winner(table, "/a/b") == 1


def test_more_headers_win_then_more_queries() -> None:
    one = [{"type": "Exact", "name": "A", "value": "1"}]
    two = one + [{"type": "Exact", "name": "B", "value": "1"}]
    table = build({"matches": [{"headers": one, "queryParams": [
        {"type": "Exact", "name": "q", "value": "1"}]}]}, {"matches": [{"headers": two}]})
    assert winner(table, query="q=1", headers=[(b"a", b"1"), (b"b", b"1")]) == 1


def test_config_order_breaks_ties() -> None:
    table = build(path_rule("PathPrefix", "/a"), path_rule("PathPrefix", "/a"))
    assert winner(table, "/a") == 0
    hit = build({"matches": [{"path": {"type": "PathPrefix", "value": "/x"}},
                             {"path": {"type": "PathPrefix", "value": "/x"}}]}).lookup(
        "h", "/x", "", [], "GET", "tunnel")
    assert hit.key[-1] == 0  # first match of the rule


def test_rule_without_matches_is_an_implicit_root_prefix() -> None:
    table = build({}, path_rule("PathPrefix", "/a"))
    assert winner(table, "/a/b") == 1
    hit = table.lookup("h", "/z", "", [], "GET", "tunnel")
    assert (hit.route.index, hit.matched_prefix) == (0, "/")


def test_empty_match_object_is_an_implicit_root_prefix() -> None:
    assert winner(build({"matches": [{}]}), "/anything") == 0


def test_matched_prefix_only_for_prefix_matches() -> None:
    table = build(path_rule("PathPrefix", "/p/"), path_rule("Exact", "/e"),
                  path_rule("RegularExpression", "/r.*"))
    assert [table.lookup("h", p, "", [], "GET", "tunnel").matched_prefix
            for p in ("/p/x", "/e", "/rx")] == ["/p/", "", ""]


# ------------------------------------------------------------------ headers, query, method


def header_rule(kind: str, name: str, value: str) -> dict:
    return {"matches": [{"headers": [{"type": kind, "name": name, "value": value}]}]}


@pytest.mark.parametrize(("rule", "headers", "matches"), [
    (("Exact", "X-Env", "prod"), [(b"x-env", b"prod")], True),
    (("Exact", "X-Env", "prod"), [(b"X-ENV", b"prod")], True),
    (("Exact", "X-Env", "prod"), [(b"X-Env", b"Prod")], False),
    (("Exact", "X-Env", "prod"), [(b"X-Env", b"dev"), (b"X-Env", b"prod")], True),
    (("Exact", "X-Env", "prod"), [(b"X-Env", b"prod, dev")], False),
    (("Exact", "X-Env", "prod"), [(b"X-Envy", b"prod")], False),
    (("Exact", "X-Env", ""), [(b"X-Env", b"")], True),
    (("Exact", "X-Env", ""), [], False),
    (("RegularExpression", "X-Env", "pr.d"), [(b"x-env", b"prod")], True),
    (("RegularExpression", "X-Env", "pr"), [(b"x-env", b"prod")], False),   # full match
    (("RegularExpression", "X-Env", "d.*"), [(b"x-env", b"prod"), (b"x-env", b"dev")], True),
])
def test_header_matching(rule: tuple, headers: list, matches: bool) -> None:
    assert (winner(build(header_rule(*rule)), headers=headers) == 0) is matches


def test_duplicate_header_names_in_a_match_only_the_first_counts() -> None:
    table = build({"matches": [{"headers": [{"type": "Exact", "name": "X", "value": "1"},
                                            {"type": "Exact", "name": "x", "value": "2"}]}]})
    assert winner(table, headers=[(b"X", b"1")]) == 0
    assert winner(table, headers=[(b"X", b"2")]) is None


def query_rule(kind: str, name: str, value: str) -> dict:
    return {"matches": [{"queryParams": [{"type": kind, "name": name, "value": value}]}]}


@pytest.mark.parametrize(("rule", "query", "matches"), [
    (("Exact", "q", "a b"), "q=a+b", True),
    (("Exact", "q", "a b"), "q=a%20b", True),
    (("Exact", "q", "x"), "q=y&q=x", True),
    (("Exact", "q", "x"), "Q=x", False),
    (("Exact", "q", "x"), "q=X", False),
    (("Exact", "q", ""), "q=", True),
    (("Exact", "q", ""), "q", True),
    (("Exact", "q", "x"), "", False),
    (("Exact", "a&b", "1"), "a%26b=1", True),
    (("RegularExpression", "v", "^[0-9]+$"), "v=3", True),
    (("RegularExpression", "v", "[0-9]"), "v=33", False),   # full match
    (("RegularExpression", "v", "[0-9]+"), "v=a&v=12", True),
])
def test_query_matching(rule: tuple, query: str, matches: bool) -> None:
    assert (winner(build(query_rule(*rule)), query=query) == 0) is matches


def test_method_is_literal() -> None:
    table = build({"matches": [{"method": "PATCH"}]})
    assert winner(table, method="PATCH") == 0
    assert winner(table, method="patch") is None


def test_all_conditions_of_a_match_are_anded() -> None:
    table = build({"matches": [{"path": {"type": "PathPrefix", "value": "/a"}, "method": "POST",
                                "headers": [{"type": "Exact", "name": "X", "value": "1"}],
                                "queryParams": [{"type": "Exact", "name": "q", "value": "1"}]}]})
    good = {"path": "/a", "method": "POST", "headers": [(b"x", b"1")], "query": "q=1"}
    assert winner(table, **good) == 0
    for field, bad in (("path", "/b"), ("method", "GET"), ("headers", []), ("query", "")):
        assert winner(table, **{**good, field: bad}) is None, field


# ------------------------------------------------------------------ entrances


def test_entrances_filter_rules() -> None:
    table = build({"entrances": ["cluster"], **path_rule("PathPrefix", "/internal")},
                  {"entrances": ["tunnel", "cluster"]})
    assert winner(table, "/internal/x", entrance="cluster") == 0
    assert winner(table, "/internal/x", entrance="tunnel") == 1
    assert winner(build({"entrances": []}), entrance="tunnel") is None


def test_unavailable_status_rules_still_match() -> None:
    table = build({"hostnames": ["legacy.example.com"], "unavailableStatus": 500})
    hit = table.lookup("legacy.example.com", "/x", "", [], "GET", "tunnel")
    assert hit.route.rule.unavailable_status == 500


# ------------------------------------------------------------------ full example outcomes


@pytest.fixture(scope="module")
def example_table() -> Table:
    return Table.compile(parse_config(EXAMPLE_JSON))


def test_example_api_health(example_table: Table) -> None:
    hit = example_table.lookup("app.example.com", "/api/v2/health", "",
                               [(b"X-API-Version", b"2")], "GET", "tunnel")
    assert hit.route.index == 0
    assert hit.route.deadline == 2.0
    assert [f.type for f in hit.route.response_filters] == ["ResponseHeaderModifier"]
    assert hit.route.request_filters == ()
    picks = Counter(hit.route.pick_backend(i / 100).url for i in range(100))
    assert picks == {"http://api-v2.prod.svc.cluster.local:8080": 80,
                     "http://api-v2-canary.prod.svc.cluster.local:8080": 20}
    canary = hit.route.pick(0.99)
    assert [f.type for f in canary.request_filters] == ["RequestHeaderModifier"]


def test_example_old_falls_through_to_wildcard(example_table: Table) -> None:
    hit = example_table.lookup("app.example.com", "/old/a", "x=1", [], "GET", "tunnel")
    assert (hit.route.index, hit.host_pattern, hit.matched_prefix) == (
        1, "*.example.com", "/old")
    assert hit.route.pick_backend(0.5) is None


def test_example_static(example_table: Table) -> None:
    hit = example_table.lookup("app.example.com", "/static/app.js", "v=3", [], "GET",
                               "tunnel")
    assert (hit.route.index, hit.matched_prefix) == (2, "/static")
    assert [f.type for f in hit.route.request_filters] == ["URLRewrite", "RequestMirror",
                                                          "CORS"]
    assert [f.type for f in hit.route.response_filters] == ["CORS"]
    policy = hit.route.request_filters[2].compiled
    assert isinstance(policy, CorsPolicy) and policy.max_age == 600
    assert example_table.lookup("app.example.com", "/static/app.js", "v=x", [], "GET",
                                "tunnel") is None


def test_example_secure_split_and_legacy(example_table: Table) -> None:
    hit = example_table.lookup("secure.example.com", "/", "", [], "GET", "tunnel")
    statuses = Counter(hit.route.pick_backend(i / 10).unavailable_status for i in range(10))
    assert statuses == {0: 5, 500: 5}
    legacy = example_table.lookup("legacy.example.com", "/x", "", [], "GET", "tunnel")
    assert legacy.route.rule.unavailable_status == 500
    assert example_table.lookup("other.example.org", "/", "", [], "GET", "tunnel") is None


def test_example_grpc_and_websocket(example_table: Table) -> None:
    grpc = example_table.lookup("grpc.example.com", "/helloworld.Greeter/SayHello", "", [],
                                "POST", "tunnel")
    assert grpc.route.pick_backend(0).protocol == "h2c"
    assert example_table.lookup("grpc.example.com", "/helloworld.Greeter/Other", "", [],
                                "POST", "tunnel") is None
    ws = example_table.lookup("ws.example.com", "/chat", "", [], "GET", "tunnel")
    assert ws.route.pick_backend(0).websocket


# ------------------------------------------------------------------ Knative


def _knative_config(hash_value: str) -> dict:
    def rev(name: str) -> dict:
        return {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [
            {"name": "Knative-Serving-Namespace", "value": "default"},
            {"name": "Knative-Serving-Revision", "value": name}]}}

    probe = {"path": {"type": "PathPrefix", "value": "/"},
             "headers": [{"type": "Exact", "name": "K-Network-Hash", "value": "override"}]}
    root = {"path": {"type": "PathPrefix", "value": "/"}}
    set_hash = {"type": "RequestHeaderModifier", "requestHeaderModifier": {
        "set": [{"name": "K-Network-Hash", "value": hash_value}]}}
    split = [{"url": "http://hello-00001.default.svc.cluster.local:80", "weight": 80,
              "filters": [rev("hello-00001")]},
             {"url": "http://hello-00002.default.svc.cluster.local:80", "weight": 20,
              "filters": [rev("hello-00002")]}]
    canary = [{"url": "http://hello-00002.default.svc.cluster.local:80", "weight": 100,
               "filters": [rev("hello-00002")]}]
    local = ["hello.default", "hello.default.svc", "hello.default.svc.cluster.local"]
    canary_local = ["canary-" + h for h in local]
    rules = []
    for hosts, backends in ((["hello.default.example.com"], split), (local, split),
                            (["canary-hello.default.example.com"], canary),
                            (canary_local, canary)):
        rules.append({"hostnames": hosts, "matches": [probe], "filters": [set_hash],
                      "backends": backends, "timeouts": {}})
        rules.append({"hostnames": hosts, "matches": [root], "backends": backends,
                      "timeouts": {}})
    return {"version": 1767225600200, "rules": rules}


@pytest.mark.parametrize(("host", "probe_rule", "plain_rule"), [
    ("hello.default.example.com", 0, 1),
    ("hello.default", 2, 3),
    ("hello.default.svc.cluster.local:80", 2, 3),
    ("canary-hello.default.example.com", 4, 5),
    ("canary-hello.default.svc", 6, 7),
])
def test_knative_probe_rule_beats_plain_root(host: str, probe_rule: int,
                                             plain_rule: int) -> None:
    table = Table.compile(parse_config(json.dumps(_knative_config("a" * 64))))
    probe_headers = [(b"User-Agent", b"Knative-Ingress-Probe"), (b"K-Network-Probe", b"probe"),
                     (b"K-Network-Hash", b"override"), (b"Accept-Encoding", b"gzip")]
    hit = table.lookup(host, "/", "", probe_headers, "GET", "cluster")
    assert hit.route.index == probe_rule
    assert hit.route.request_filters[0].filter.request_header_modifier.set == (
        ("K-Network-Hash", "a" * 64),)
    assert hit.route.deadline is None
    assert table.lookup(host, "/", "", [], "GET", "tunnel").route.index == plain_rule
    # A stale hash value does not select the probe copy.
    assert table.lookup(host, "/", "", [(b"K-Network-Hash", b"other")], "GET",
                        "cluster").route.index == plain_rule


def test_knative_unknown_host_is_404() -> None:
    table = Table.compile(parse_config(_knative_config("b" * 64)))
    assert table.lookup("bye.default.example.com", "/", "", [(b"K-Network-Hash", b"override")],
                        "GET", "cluster") is None


# ------------------------------------------------------------------ weights


@pytest.mark.parametrize(("weights", "rand", "index"), [
    ([1], 0.0, 0), ([1], 0.999999, 0), ([80, 20], 0.79, 0), ([80, 20], 0.8, 1),
    ([0, 5], 0.0, 1), ([5, 0], 0.999999999, 0), ([0, 0], 0.3, None), ([], 0.3, None),
    ([3, 0, 1], 0.75, 2), ([2**31 - 1, 1], 1 - 2**-53, 1),
])
def test_pick_index(weights: list[int], rand: float, index: int | None) -> None:
    assert pick_index(cumulative(weights), rand) == index


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=8),
       st.floats(0, 1, exclude_max=True))
def test_picks_only_positive_weights(weights: list[int], rand: float) -> None:
    index = pick_index(cumulative(weights), rand)
    if sum(weights) == 0:
        assert index is None
    else:
        assert index is not None and weights[index] > 0


@given(st.lists(st.integers(0, 50), min_size=1, max_size=6))
def test_distribution_follows_cumulative_sums(weights: list[int]) -> None:
    total = sum(weights)
    sums = cumulative(weights)
    # Midpoints of the total draw slots: each slot belongs to exactly one backend.
    counts = Counter(pick_index(sums, (k + 0.5) / total) for k in range(total))
    assert counts == Counter({i: w for i, w in enumerate(weights) if w > 0})


def test_rule_without_backends_picks_none() -> None:
    table = Table.compile(parse_config({"rules": [{"backends": None}]}))
    assert table.rules[0].pick(0.1) is None


def test_deadline_is_min_of_nonzero_timeouts() -> None:
    table = build({"timeouts": {"request": "10s", "backend": "0s"}},
                  {"timeouts": {"request": "1m", "backend": "2.5s"}},
                  {"timeouts": {}}, {})
    assert [r.deadline for r in table.rules] == [10.0, 2.5, None, None]


# ------------------------------------------------------------------ explain / describe


def explain_lines(table: Table, host: str, path: str, query: str, headers: list,
                  method: str, entrance: str) -> list[str]:
    """What ``tunnelgate explain`` prints (every entrance serving every rule)."""
    return explain(table, EntranceScope(), method, host, path, query, headers, entrance,
                   lambda: 0.5)[1]


def test_explain_agrees_with_lookup_and_says_why(example_table: Table) -> None:
    lines = explain_lines(example_table, "App.Example.com:443", "/old/a", "x=1", [], "GET", "tunnel")
    text = "\n".join(lines)
    assert "host key 'app.example.com'" in text
    assert "bucket exact 'app.example.com'" in text and "falling through" in text
    assert "winner: rules[1].matches[0] in bucket wildcard '*.example.com'" in text
    assert "matched prefix '/old'" in text
    assert "filter RequestRedirect" in text


def test_explain_lists_backends_with_weights(example_table: Table) -> None:
    lines = explain_lines(example_table, "app.example.com", "/api/v2/health", "",
                                  [(b"x-api-version", b"2")], "GET", "tunnel")
    assert any("api-v2.prod" in line and "weight 80 (80.0%)" in line for line in lines)
    assert any("deadline 2s" in line for line in lines)


def test_explain_reports_each_failed_condition() -> None:
    table = build({"matches": [{"path": {"type": "PathPrefix", "value": "/"},
                                "headers": [{"type": "Exact", "name": "X", "value": "1"}]}],
                   "entrances": ["cluster"]},
                  {"matches": [{"method": "POST"}]})
    text = "\n".join(explain_lines(table, "h", "/", "", [(b"x", b"2")], "GET", "tunnel"))
    assert "-> no (entrance)" in text and "-> no (method)" in text
    assert "result: no matching route (404)" in text
    text = "\n".join(explain_lines(table, "h", "/", "", [(b"x", b"2")], "GET", "cluster"))
    assert "-> no (header X Exact '1')" in text


@pytest.mark.parametrize(("host", "path", "query", "headers"), [
    ("app.example.com", "/api/v2/health", "", [(b"X-API-Version", b"2")]),
    ("app.example.com", "/api/v2/health", "", []),
    ("App.Example.com:8443", "/old/x", "", []),
    ("app.example.com", "/static/a%2Fb", "v=12", []),
    ("x.y.example.com", "/old", "", []),
    ("secure.example.com", "/", "", []),
    ("nowhere.example.org", "/", "", []),
])
def test_explain_and_lookup_pick_the_same_winner(example_table: Table, host: str, path: str,
                                                 query: str, headers: list) -> None:
    hit = example_table.lookup(host, path, query, headers, "GET", "tunnel")
    lines = explain_lines(example_table, host, path, query, headers, "GET", "tunnel")
    winners = [line for line in lines if line.startswith("winner: ")]
    if hit is None:
        assert winners == [] and lines[-1] == "result: no matching route (404)"
    else:
        assert len(winners) == 1
        assert winners[0].startswith(f"winner: rules[{hit.route.index}]")


def test_explain_without_any_bucket() -> None:
    lines = explain_lines(Table.empty(), "h", "/", "", [], "GET", "tunnel")
    assert "no bucket for this host and no default bucket" in lines


def test_describe_lists_buckets_in_lookup_order(example_table: Table) -> None:
    lines = example_table.describe()
    assert lines[0].startswith("7 rule(s); 5 exact host(s), 1 wildcard(s)")
    buckets = [line for line in lines if line.startswith("bucket ")]
    assert buckets[-1] == "bucket wildcard '*.example.com':"
    assert any("status 500" in line for line in lines)
    assert example_table.rules_count == 7


ENCODED_VALUES = {"version": 1, "rules": [
    {"matches": [{"path": {"type": "Exact", "value": "/caf%C3%A9"}}], "backends": []},
    {"matches": [{"path": {"type": "PathPrefix", "value": "/a%20b"}}], "backends": []},
    {"matches": [{"path": {"type": "Exact", "value": "/%7Euser"}}], "backends": []},
    {"backends": []},  # the catch-all
]}


@pytest.mark.parametrize("path, rule", [
    ("/caf%C3%A9", 0), ("/caf%c3%a9", 0), ("/a%20b", 1), ("/a%20b/x", 1),
    ("/%7Euser", 2), ("/~user", 2),
    ("/a%2520b/x", 3),  # "%25" is a literal "%": not the rule's space
    ("/a%20bc", 3), ("/cafe", 3),
])
def test_percent_encoded_path_values_match_the_path_they_name(path: str, rule: int) -> None:
    # Gateway API allows "%XX" in Exact and PathPrefix values; both they and the request
    # path are compared decoded.
    table = Table.compile(parse_config(ENCODED_VALUES))
    hit = table.lookup("h.test", path, "", [], "GET", "tunnel")
    assert hit is not None and hit.route.index == rule
