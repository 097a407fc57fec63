"""routing.gateway_api: HTTPRoute YAML → wire config."""

from __future__ import annotations

import textwrap

import pytest

from routing.gateway_api import convert, httproutes_to_config, httproutes_to_wire
from routing.lint import lint
from routing.model import Config, ConfigError
from routing.table import Table

# --------------------------------------------------------------------------- Knative

H = "3f6c0a1b9d2e4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c"
assert len(H) == 64

def _refs(*splits: tuple[str, int]) -> str:
    """backendRefs of one KIngress rule, as net-gateway-api writes them."""
    return "[" + ", ".join(
        f'{{group: "", kind: Service, name: {rev}, port: 80, weight: {weight}, filters: '
        f"[{{type: RequestHeaderModifier, requestHeaderModifier: {{set: ["
        f"{{name: Knative-Serving-Namespace, value: default}}, "
        f"{{name: Knative-Serving-Revision, value: {rev}}}]}}}}]}}"
        for rev, weight in splits) + "]"


def _knative_route(name: str, labels: str, hostnames: str, refs: str) -> str:
    """One HTTPRoute per KIngress rule: the probe copy first, then real traffic."""
    return textwrap.dedent(f"""\
        apiVersion: gateway.networking.k8s.io/v1
        kind: HTTPRoute
        metadata:
          name: {name}
          namespace: default
          labels: {{{labels}}}
        spec:
          parentRefs: [{{group: gateway.networking.k8s.io, kind: Gateway, namespace: tunnelgate, name: tunnel}}]
          hostnames: {hostnames}
          rules:
          - matches:                                     # 1) probe copy
            - path: {{type: PathPrefix, value: /}}
              headers: [{{type: Exact, name: K-Network-Hash, value: override}}]
            filters:
            - {{type: RequestHeaderModifier, requestHeaderModifier: {{set: [{{name: K-Network-Hash, value: {H}}}]}}}}
            backendRefs: &refs {refs}
            timeouts: {{request: 0s}}
          - matches: [{{path: {{type: PathPrefix, value: /}}}}]   # 2) real traffic
            backendRefs: *refs
            timeouts: {{request: 0s}}
        """)


_SPLIT = _refs(("hello-00001", 80), ("hello-00002", 20))
_CANARY = _refs(("hello-00002", 100))
KNATIVE_ROUTES = "---\n".join([
    _knative_route("hello.default.example.com",
                   'networking.internal.knative.dev/ingress: hello, '
                   'networking.knative.dev/visibility: ""',
                   "[hello.default.example.com]", _SPLIT),
    _knative_route("hello.default.svc.cluster.local",
                   "networking.internal.knative.dev/ingress: hello, "
                   "networking.knative.dev/visibility: cluster-local",
                   "[hello.default, hello.default.svc, hello.default.svc.cluster.local]",
                   _SPLIT),
    _knative_route("canary-hello.default.example.com",
                   'networking.knative.dev/tag: canary, networking.knative.dev/visibility: ""',
                   "[canary-hello.default.example.com]", _CANARY),
    _knative_route("canary-hello.default.svc.cluster.local",
                   "networking.knative.dev/tag: canary, "
                   "networking.knative.dev/visibility: cluster-local",
                   "[canary-hello.default, canary-hello.default.svc, "
                   "canary-hello.default.svc.cluster.local]", _CANARY),
])


def _rev(name: str) -> dict:
    return {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [
        {"name": "Knative-Serving-Namespace", "value": "default"},
        {"name": "Knative-Serving-Revision", "value": name}]}}


PROBE = {"path": {"type": "PathPrefix", "value": "/"},
         "headers": [{"type": "Exact", "name": "K-Network-Hash", "value": "override"}]}
ROOT = {"path": {"type": "PathPrefix", "value": "/"}}
HASH = {"type": "RequestHeaderModifier",
        "requestHeaderModifier": {"set": [{"name": "K-Network-Hash", "value": H}]}}
SPLIT = [{"url": "http://hello-00001.default.svc.cluster.local:80", "weight": 80,
          "filters": [_rev("hello-00001")]},
         {"url": "http://hello-00002.default.svc.cluster.local:80", "weight": 20,
          "filters": [_rev("hello-00002")]}]
CANARY = [{"url": "http://hello-00002.default.svc.cluster.local:80", "weight": 100,
           "filters": [_rev("hello-00002")]}]
LOCAL = ["hello.default", "hello.default.svc", "hello.default.svc.cluster.local"]
CANARY_LOCAL = ["canary-hello.default", "canary-hello.default.svc",
                "canary-hello.default.svc.cluster.local"]


def _pair(hosts: list[str], backends: list[dict]) -> list[dict]:
    return [{"hostnames": hosts, "matches": [PROBE], "filters": [HASH], "backends": backends,
             "timeouts": {}},
            {"hostnames": hosts, "matches": [ROOT], "backends": backends, "timeouts": {}}]


def test_knative_routes_convert_to_the_reference_wire_rules() -> None:
    wire = httproutes_to_wire(KNATIVE_ROUTES, version=1767225600200)
    # No creationTimestamp: the routes come in order of namespace/name.
    assert wire == {"version": 1767225600200, "rules": [
        *_pair(["canary-hello.default.example.com"], CANARY),
        *_pair(CANARY_LOCAL, CANARY),
        *_pair(["hello.default.example.com"], SPLIT),
        *_pair(LOCAL, SPLIT),
    ]}


def test_knative_probe_wins_over_plain_rule_after_compiling() -> None:
    table = Table.compile(httproutes_to_config(KNATIVE_ROUTES))
    probe = table.lookup("hello.default.example.com", "/", "",
                         [(b"K-Network-Hash", b"override")], "GET", "cluster")
    plain = table.lookup("hello.default.example.com", "/", "", [], "GET", "tunnel")
    local = table.lookup("hello.default.svc.cluster.local", "/", "",
                         [(b"K-Network-Hash", b"override")], "GET", "cluster")
    assert probe is not None and plain is not None and local is not None
    assert probe.route.index == 4 and plain.route.index == 5 and local.route.index == 6
    assert probe.route.rule.filters[0].request_header_modifier.set == (("K-Network-Hash", H),)
    assert [b.weight for b in probe.route.rule.backends] == [80, 20]
    assert probe.route.rule.timeouts is not None
    assert probe.route.rule.timeouts.request is None  # 0s = no timeout


def test_config_result_is_a_validated_config() -> None:
    config = httproutes_to_config(KNATIVE_ROUTES, version=7)
    assert isinstance(config, Config)
    assert config.version == 7 and len(config.rules) == 8
    assert config.rules[0].backends[0].url == "http://hello-00002.default.svc.cluster.local:80"


# --------------------------------------------------------------------------- helpers


def _route(spec: str, *, namespace: str | None = "apps",
           api_version: str = "gateway.networking.k8s.io/v1", kind: str = "HTTPRoute") -> str:
    meta = "metadata: {name: r" + (f", namespace: {namespace}" if namespace else "") + "}"
    return (f"apiVersion: {api_version}\nkind: {kind}\n{meta}\nspec:\n"
            + textwrap.indent(textwrap.dedent(spec), "  "))


def _rules(spec: str, **kwargs: object) -> list[dict]:
    return httproutes_to_wire(_route(spec), **kwargs)["rules"]  # type: ignore[arg-type]


def _error(text: str, **kwargs: object) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        httproutes_to_config(text, **kwargs)  # type: ignore[arg-type]
    return caught.value


# --------------------------------------------------------------------------- defaults


def test_route_without_rules_gets_the_gateway_api_default_rule() -> None:
    assert _rules("hostnames: [a.example.com]\n") == [
        {"hostnames": ["a.example.com"], "matches": [ROOT], "backends": None}]


def test_match_defaults() -> None:
    rules = _rules("""\
        rules:
        - matches:
          - {}
          - path: {value: /v2}
          - path: {type: Exact}
          - headers: [{name: X-A, value: "1"}]
            queryParams: [{name: q, value: v}, {type: RegularExpression, name: r, value: "^[0-9]+$"}]
            method: POST
          backendRefs: [{name: svc, port: 8080}]
        """)
    assert rules[0]["matches"] == [
        ROOT,
        {"path": {"type": "PathPrefix", "value": "/v2"}},
        {"path": {"type": "Exact", "value": "/"}},
        {"path": {"type": "PathPrefix", "value": "/"},
         "headers": [{"type": "Exact", "name": "X-A", "value": "1"}],
         "queryParams": [{"type": "Exact", "name": "q", "value": "v"},
                         {"type": "RegularExpression", "name": "r", "value": "^[0-9]+$"}],
         "method": "POST"},
    ]
    assert "hostnames" not in rules[0]


def test_rule_without_matches_matches_everything() -> None:
    rules = _rules("rules:\n- matches: []\n- {}\n")
    assert [r["matches"] for r in rules] == [[ROOT], [ROOT]]


def test_backend_defaults_and_service_urls() -> None:
    rules = _rules("""\
        rules:
        - backendRefs:
          - {name: web, port: 8080}
          - {name: api, namespace: other, port: 443, weight: 3}
          - {group: core, kind: Service, name: idle, port: 80, weight: 0}
        """)
    assert rules[0]["backends"] == [
        {"url": "http://web.apps.svc.cluster.local:8080", "weight": 1},
        {"url": "https://api.other.svc.cluster.local:443", "weight": 3},
        {"url": "http://idle.apps.svc.cluster.local:80", "weight": 0},
    ]


def test_namespace_defaults_to_default() -> None:
    wire = httproutes_to_wire(_route("rules: [{backendRefs: [{name: web, port: 80}]}]\n",
                                     namespace=None))
    assert wire["rules"][0]["backends"][0]["url"] == "http://web.default.svc.cluster.local:80"


def test_backends_mapping_overrides_service_dns() -> None:
    rules = _rules("""\
        rules:
        - backendRefs: [{name: web, port: 8080}, {name: api, port: 9000}]
          filters:
          - type: RequestMirror
            requestMirror: {backendRef: {name: shadow, namespace: qa, port: 80}}
        """, backends={"web.apps": "http://127.0.0.1:18080", "shadow.qa": "http://127.0.0.1:9"})
    assert [b["url"] for b in rules[0]["backends"]] == [
        "http://127.0.0.1:18080", "http://api.apps.svc.cluster.local:9000"]
    assert rules[0]["filters"][0]["requestMirror"] == {
        "backendUrl": "http://127.0.0.1:9", "percent": 100}


# --------------------------------------------------------------------------- route order


def _dated(name: str, created: str | None, namespace: str = "apps", rules: int = 1) -> str:
    """An HTTPRoute whose rule ``i`` sends to Service ``NAME-i`` (``created`` is the
    YAML text of its creationTimestamp; None leaves it out)."""
    stamp = "" if created is None else f", creationTimestamp: {created}"
    refs = ", ".join(f"{{backendRefs: [{{name: {name}-{i}, port: 80}}]}}" for i in range(rules))
    return (f"apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n"
            f"metadata: {{name: {name}, namespace: {namespace}{stamp}}}\n"
            f"spec: {{rules: [{refs}]}}\n")


def _order(*routes: str) -> list[str]:
    """``NAMESPACE/SERVICE`` of each wire rule's backend, in wire order."""
    wire = httproutes_to_wire("---\n".join(routes))
    hosts = [rule["backends"][0]["url"].split("//")[1].split(".")[:2] for rule in wire["rules"]]
    return [f"{namespace}/{name}" for name, namespace in hosts]


T1, T2, T3 = "2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", "2024-01-03T00:00:00Z"


# Gateway API: among routes whose matches tie, the oldest creationTimestamp wins, then
# "{namespace}/{name}" in alphabetical order; within a route, list order.
@pytest.mark.parametrize("routes, order", [
    ([_dated("b", T2), _dated("a", T3), _dated("c", T1)], ["apps/c-0", "apps/b-0", "apps/a-0"]),
    ([_dated("b", T1), _dated("a", T1, "zoo"), _dated("a", T1)],
     ["apps/a-0", "apps/b-0", "zoo/a-0"]),
    # One "{namespace}/{name}" string: "-" sorts before "/".
    ([_dated("x", T1, "a"), _dated("x", T1, "a-b")], ["a-b/x-0", "a/x-0"]),
    # Times compare as instants: 01:00+02:00 is 23:00 the day before.
    ([_dated("a", T1), _dated("b", "2024-01-01T01:00:00+02:00")], ["apps/b-0", "apps/a-0"]),
    ([_dated("a", "2024-01-01T00:00:00.5Z"), _dated("b", T1)], ["apps/b-0", "apps/a-0"]),
    # A quoted timestamp is a string to YAML, an unquoted one a datetime: either works.
    ([_dated("a", f"'{T2}'"), _dated("b", T1), _dated("c", "'2024-01-01t12:00:00z'")],
     ["apps/b-0", "apps/c-0", "apps/a-0"]),
    # Without a timestamp: after every route that has one, then by name.
    ([_dated("a", None), _dated("z", T2), _dated("b", "null"), _dated("m", T1)],
     ["apps/m-0", "apps/z-0", "apps/a-0", "apps/b-0"]),
    ([_dated("z", None, "a"), _dated("a", None, "z")], ["a/z-0", "z/a-0"]),
    ([_dated("late", T2, rules=2), _dated("early", T1, rules=2)],
     ["apps/early-0", "apps/early-1", "apps/late-0", "apps/late-1"]),
], ids=["by-timestamp", "tie-by-name", "name-is-one-string", "utc-offset", "fraction",
        "string-or-datetime", "missing-last", "missing-by-name", "rules-in-list-order"])
def test_routes_are_ordered_by_creation_then_name(routes: list[str], order: list[str]) -> None:
    assert _order(*routes) == order


def test_routes_equal_in_time_and_name_keep_file_order() -> None:
    twin = _dated("r", T1).replace("name: r-0", "name: twin-0")
    assert _order(_dated("r", T1), twin, _dated("r", None)) == [
        "apps/r-0", "apps/twin-0", "apps/r-0"]
    assert _order(twin, _dated("r", T1)) == ["apps/twin-0", "apps/r-0"]


def test_rule_paths_and_errors_follow_the_sorted_order() -> None:
    text = "---\n".join([_dated("new", T2), _dated("old", T1)])
    assert convert(text).rule_paths == ("documents[1].spec.rules[0]",
                                        "documents[0].spec.rules[0]")
    err = _error(text.replace("name: new-0, port: 80", "name: new-0, port: 80, weight: -1"))
    assert err.path == "documents[0].spec.rules[0].backendRefs[0].weight"


def test_check_names_the_older_route_as_the_shadowing_one() -> None:
    """The route later in the file is older, so its equal match comes first; the
    shadow warning names it, with the YAML paths check prints."""
    conversion = convert("---\n".join([_dated("new", T2), _dated("old", T1)]))
    paths = conversion.rule_paths
    findings = lint(conversion.config, Table.compile(conversion.config),
                    lambda i: paths[i], statuses=False)
    assert [f.message for f in findings] == [
        "documents[0].spec.rules[0]: can never match: each of its matches is shadowed by "
        "an earlier match that covers it (documents[1].spec.rules[0].matches[0])"]


@pytest.mark.parametrize("created", [
    "2024-01-01",                    # a date (YAML makes it one): no time
    "2024-01-01T00:00:00",           # a datetime without a UTC offset
    "'2024-01-01T00:00:00'",         # the same as a string
    "'2024-13-01T00:00:00Z'",        # month 13
    "'2024-01-01T24:00:00Z'",
    "'2024-01-01T00:00Z'",           # no seconds
    "'yesterday'",
    "1704067200",                    # a Unix time is not RFC 3339
    "[2024]",
])
def test_invalid_creation_timestamp_is_an_error(created: str) -> None:
    err = _error(OTHER + _dated("r", created))
    assert err.path == "documents[1].metadata.creationTimestamp", str(err)
    assert "invalid timestamp" in err.message and "RFC 3339" in err.message


# --------------------------------------------------------------------------- filters


def test_header_modifiers_and_cors_keep_their_shape() -> None:
    rules = _rules("""\
        rules:
        - filters:
          - type: RequestHeaderModifier
            requestHeaderModifier: {set: [{name: X-A, value: a}], add: [{name: X-B, value: b}], remove: [X-C]}
          - type: ResponseHeaderModifier
            responseHeaderModifier: {add: [{name: X-Proxy, value: tunnel}]}
          - type: CORS
            cors: {allowOrigins: ["https://*.example.com"], allowMethods: [GET], allowCredentials: true, maxAge: 600}
          backendRefs: [{name: web, port: 80}]
        """)
    assert rules[0]["filters"] == [
        {"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "set": [{"name": "X-A", "value": "a"}], "add": [{"name": "X-B", "value": "b"}],
            "remove": ["X-C"]}},
        {"type": "ResponseHeaderModifier",
         "responseHeaderModifier": {"add": [{"name": "X-Proxy", "value": "tunnel"}]}},
        {"type": "CORS", "cors": {"allowOrigins": ["https://*.example.com"],
                                  "allowMethods": ["GET"], "allowCredentials": True,
                                  "maxAge": 600}},
    ]


@pytest.mark.parametrize("kind,key", [("ReplaceFullPath", "replaceFullPath"),
                                      ("ReplacePrefixMatch", "replacePrefixMatch")])
def test_redirect_path_uses_value_and_rewrite_keeps_gateway_keys(kind: str, key: str) -> None:
    rules = _rules(f"""\
        rules:
        - matches: [{{path: {{type: PathPrefix, value: /old}}}}]
          filters:
          - type: RequestRedirect
            requestRedirect: {{scheme: https, hostname: new.example.com, port: 8443, statusCode: 301,
                              path: {{type: {kind}, {key}: /new}}}}
        - matches: [{{path: {{type: PathPrefix, value: /static}}}}]
          filters:
          - type: URLRewrite
            urlRewrite: {{hostname: assets.internal, path: {{type: {kind}, {key}: /assets}}}}
          backendRefs: [{{name: web, port: 80}}]
        """)
    assert rules[0]["filters"] == [{"type": "RequestRedirect", "requestRedirect": {
        "scheme": "https", "hostname": "new.example.com", "port": 8443, "statusCode": 301,
        "path": {"type": kind, "value": "/new"}}}]
    assert rules[0]["backends"] is None
    assert rules[1]["filters"] == [{"type": "URLRewrite", "urlRewrite": {
        "hostname": "assets.internal", "path": {"type": kind, key: "/assets"}}}]


@pytest.mark.parametrize("mirror,percent", [
    ("{}", 100),
    ("{percent: 10}", 10),
    ("{percent: 0}", 0),
    ("{fraction: {numerator: 5}}", 5),
    ("{fraction: {numerator: 1, denominator: 3}}", 33),
    ("{fraction: {numerator: 1, denominator: 1000}}", 0),
    ("{fraction: {numerator: 7, denominator: 7}}", 100),
    ("{fraction: {numerator: 9, denominator: 4}}", 100),  # clamped
])
def test_mirror_percent_and_fraction(mirror: str, percent: int) -> None:
    rules = _rules(f"""\
        rules:
        - filters:
          - type: RequestMirror
            requestMirror: {{backendRef: {{name: shadow, port: 8080}}, {mirror[1:-1]}}}
          backendRefs: [{{name: web, port: 80}}]
        """.replace(", }", "}"))
    assert rules[0]["filters"] == [{"type": "RequestMirror", "requestMirror": {
        "backendUrl": "http://shadow.apps.svc.cluster.local:8080", "percent": percent}}]


def test_mirror_to_a_non_service_is_dropped() -> None:
    rules = _rules("""\
        rules:
        - filters:
          - {type: RequestMirror, requestMirror: {backendRef: {group: example.io, kind: Bucket, name: b}}}
          - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: X-A, value: a}]}}
          backendRefs: [{name: web, port: 80}]
        """)
    assert [f["type"] for f in rules[0]["filters"]] == ["ResponseHeaderModifier"]
    assert "unavailableStatus" not in rules[0]


@pytest.mark.parametrize("unsupported", [
    "{type: ExtensionRef, extensionRef: {group: example.io, kind: Auth, name: a}}",
    "{type: ExternalAuth, externalAuth: {protocol: HTTP}}",
])
def test_unsupported_rule_filter_fails_the_rule_closed(unsupported: str) -> None:
    rules = _rules(f"""\
        rules:
        - filters:
          - {unsupported}
          - {{type: RequestHeaderModifier, requestHeaderModifier: {{set: [{{name: X-A, value: a}}]}}}}
          backendRefs: [{{name: web, port: 80}}]
        - backendRefs: [{{name: web, port: 80}}]
        """)
    assert rules[0]["unavailableStatus"] == 500
    assert [f["type"] for f in rules[0]["filters"]] == ["RequestHeaderModifier"]
    assert "unavailableStatus" not in rules[1]


def _service(name: str, namespace: str, ports: str = "[{port: 8080}]") -> str:
    return (f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: "
            f"{namespace}}}\nspec: {{ports: {ports}}}\n---\n")


def _grant(namespace: str, from_namespace: str, to: str) -> str:
    return (f"apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\n"
            f"metadata: {{name: g, namespace: {namespace}}}\nspec:\n"
            f"  from: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, "
            f"namespace: {from_namespace}}}]\n  to: [{to}]\n---\n")


_CLUSTER = _service("web", "apps") + _service("other", "backends")
_ANY_SERVICE = '{group: "", kind: Service}'


# The Gateway API conformance cases about invalid backendRefs (a ref to a missing
# Service, an ungranted cross-namespace ref, a grant for another Service) and their
# valid neighbours; the route lives in namespace "apps".
@pytest.mark.parametrize("objects, ref, problem", [
    ("", "{name: gone, port: 8080}", None),  # no Service in the file: unknowable
    (_CLUSTER, "{name: web, port: 8080}", None),
    (_CLUSTER, "{name: gone, port: 8080}", "Service apps/gone is not in the file"),
    (_CLUSTER, "{name: web, port: 9999}", "Service apps/web has no port 9999"),
    (_service("web", "apps", "[]"), "{name: web, port: 9999}", None),  # ports unlisted
    (_CLUSTER, "{name: other, namespace: backends, port: 8080}",
     "no ReferenceGrant in namespace 'backends' lets HTTPRoutes of namespace 'apps' "
     "refer to Service 'other'"),
    (_CLUSTER + _grant("backends", "apps", _ANY_SERVICE),
     "{name: other, namespace: backends, port: 8080}", None),
    (_CLUSTER + _grant("backends", "apps", '{group: "", kind: Service, name: other}'),
     "{name: other, namespace: backends, port: 8080}", None),
    (_CLUSTER + _grant("backends", "apps", '{group: "", kind: Service, name: else}'),
     "{name: other, namespace: backends, port: 8080}", "no ReferenceGrant"),
    (_CLUSTER + _grant("backends", "elsewhere", _ANY_SERVICE),
     "{name: other, namespace: backends, port: 8080}", "no ReferenceGrant"),
    (_CLUSTER + _grant("apps", "apps", _ANY_SERVICE),  # a grant in the wrong namespace
     "{name: other, namespace: backends, port: 8080}", "no ReferenceGrant"),
    (_grant("backends", "apps", _ANY_SERVICE),  # grants alone: no existence check
     "{name: other, namespace: backends, port: 1}", None),
    (_grant("x", "y", _ANY_SERVICE), "{name: other, namespace: backends, port: 1}",
     "no ReferenceGrant"),
], ids=["no-services", "valid", "missing", "bad-port", "ports-unlisted", "ungranted",
        "granted-all", "granted-by-name", "granted-other-name", "granted-other-source",
        "grant-misplaced", "grants-only", "grants-only-ungranted"])
def test_refs_are_checked_against_the_files_services_and_grants(
        objects: str, ref: str, problem: str | None) -> None:
    """An invalid ref answers 500 for its share (and a mirror to it is dropped); its
    valid neighbour keeps serving."""
    text = objects + _route(f"""\
        rules:
        - backendRefs: [{ref}, {{name: web, port: 8080}}]
          filters: [{{type: RequestMirror, requestMirror: {{backendRef: {ref}}}}}]
        """)
    conversion = convert(text)
    invalid, valid = conversion.wire["rules"][0]["backends"]
    assert "unavailableStatus" not in valid
    mirrored = "filters" in conversion.wire["rules"][0]
    messages = [note.message for note in conversion.notes]
    if problem is None:
        assert "unavailableStatus" not in invalid and mirrored and messages == []
    else:
        assert invalid["unavailableStatus"] == 500 and not mirrored
        assert [m.split(":")[0].startswith(problem) for m in messages] == [True, True]


_H2C = "{port: 8080, appProtocol: kubernetes.io/h2c}"
_H2C_AND_PLAIN = f"[{_H2C}, {{port: 9090}}]"


# HTTPRouteBackendProtocolH2C (extended conformance): a Service port with appProtocol
# kubernetes.io/h2c is spoken to in HTTP/2 with prior knowledge.
@pytest.mark.parametrize("objects, ref, fields", [
    (_service("web", "apps", f"[{_H2C}]"), "{name: web, port: 8080}", {"protocol": "h2c"}),
    (_service("web", "apps", _H2C_AND_PLAIN), "{name: web, port: 9090}", {}),  # other port
    (_service("web", "apps", "[{port: 8080}]"), "{name: web, port: 8080}", {}),  # none set
    (_service("web", "apps", "[{port: 8080, appProtocol: http}]"), "{name: web, port: 8080}",
     {}),
    (_service("web", "apps", "[{port: 8080, appProtocol: kubernetes.io/ws}]"),
     "{name: web, port: 8080}", {"websocket": True}),
    (_service("web", "backends", f"[{_H2C}]") + _grant("backends", "apps", _ANY_SERVICE),
     "{name: web, namespace: backends, port: 8080}", {"protocol": "h2c"}),
    # An invalid ref answers 500 whatever its port says.
    (_service("web", "backends", f"[{_H2C}]"), "{name: web, namespace: backends, port: 8080}",
     {"unavailableStatus": 500}),
    (_service("web", "apps", f"[{_H2C}]"), "{name: web, port: 8081}",
     {"unavailableStatus": 500}),
    ("", "{name: web, port: 8080}", {}),  # no Service in the file: unknowable
], ids=["h2c", "port-mismatch", "absent", "other-protocol", "ws", "granted", "ungranted",
        "unlisted-port", "no-services"])
def test_service_port_app_protocol(objects: str, ref: str, fields: dict) -> None:
    text = objects + _route(f"rules: [{{backendRefs: [{ref}]}}]\n")
    backend = httproutes_to_wire(text)["rules"][0]["backends"][0]
    assert {k: v for k, v in backend.items() if k not in ("url", "weight")} == fields
    assert httproutes_to_config(text).rules[0].backends[0].protocol == fields.get(
        "protocol", "")


def test_app_protocol_h2c_reaches_mirrors_and_mapped_backends() -> None:
    text = _service("grpc", "apps", _H2C_AND_PLAIN) + _route("""\
        rules:
        - filters:
          - {type: RequestMirror, requestMirror: {backendRef: {name: grpc, port: 8080}}}
          - {type: RequestMirror, requestMirror: {backendRef: {name: grpc, port: 9090}}}
          backendRefs: [{name: grpc, port: 8080}]
        """)
    rule = httproutes_to_wire(text, backends={"grpc.apps": "http://127.0.0.1:50051"})["rules"][0]
    assert rule["backends"] == [{"url": "http://127.0.0.1:50051", "weight": 1,
                                 "protocol": "h2c"}]
    assert [f["requestMirror"] for f in rule["filters"]] == [
        {"backendUrl": "http://127.0.0.1:50051", "percent": 100, "protocol": "h2c"},
        {"backendUrl": "http://127.0.0.1:50051", "percent": 100}]


def test_unsupported_backend_filter_and_kind_fail_that_backend_only() -> None:
    rules = _rules("""\
        rules:
        - backendRefs:
          - name: web
            port: 80
            weight: 2
            filters: [{type: ExtensionRef, extensionRef: {group: example.io, kind: F, name: f}}]
          - {group: example.io, kind: Bucket, name: b, weight: 3}
          - {name: ok, port: 80}
        """)
    web, bucket, ok = rules[0]["backends"]
    assert web == {"url": "http://web.apps.svc.cluster.local:80", "weight": 2,
                   "unavailableStatus": 500}
    assert bucket["weight"] == 3 and bucket["unavailableStatus"] == 500
    assert ok == {"url": "http://ok.apps.svc.cluster.local:80", "weight": 1}
    assert "unavailableStatus" not in rules[0]
    # The unavailable backend keeps its share of the weighted pool.
    compiled = Table.compile(httproutes_to_config(_route("""\
        rules:
        - backendRefs: [{group: example.io, kind: Bucket, name: b}, {name: ok, port: 80}]
        """))).rules[0]
    assert compiled.pick_backend(0.25).unavailable_status == 500
    assert compiled.pick_backend(0.75).unavailable_status == 0


# --------------------------------------------------------------------------- CRD filter rules

_PREFIX_REWRITE = "{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}"
_PREFIX_REDIRECT = ("{type: RequestRedirect, requestRedirect: {path: {type: ReplacePrefixMatch, "
                    "replacePrefixMatch: /new}}}")
_FULL_REWRITE = "{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /new}}}"
_ADD_HEADER = "{type: %s, %s: {add: [{name: X-A, value: a}]}}"
_REQUEST_HEADERS = _ADD_HEADER % ("RequestHeaderModifier", "requestHeaderModifier")
_RESPONSE_HEADERS = _ADD_HEADER % ("ResponseHeaderModifier", "responseHeaderModifier")
_CORS = '{type: CORS, cors: {allowOrigins: ["*"]}}'
_MIRROR = "{type: RequestMirror, requestMirror: {backendRef: {name: shadow, port: 80}}}"
_EXTENSION = "{type: ExtensionRef, extensionRef: {group: example.io, kind: F, name: f}}"
_EXACT = "{path: {type: Exact, value: /old}}"
_PREFIX = "{path: {type: PathPrefix, value: /old}}"
RULE = "documents[0].spec.rules[0]"


def _filtered(filters: str, matches: str | None = None, backend_filters: str | None = None
              ) -> str:
    """A route with one rule: these matches and filters, one backend with these filters."""
    rule = f"filters: [{filters}]" + ("" if matches is None else f", matches: {matches}")
    backend = "{name: web, port: 80" + (
        "" if backend_filters is None else f", filters: [{backend_filters}]") + "}"
    return _route(f"rules: [{{{rule}, backendRefs: [{backend}]}}]\n")


# The CEL rules of the HTTPRoute CRD (apis/v1/httproute_types.go): ReplacePrefixMatch
# needs exactly one match, a PathPrefix; CORS, RequestHeaderModifier,
# ResponseHeaderModifier, RequestRedirect and URLRewrite "cannot be repeated" in a
# rule's or a backendRef's filters; RequestRedirect and URLRewrite never together; a
# rule's RequestRedirect never with backendRefs; a path modifier holds the value its
# type names.
@pytest.mark.parametrize("text, path, fragment", [
    (_filtered(_PREFIX_REWRITE, f"[{_PREFIX}, {_PREFIX}]"),
     f"{RULE}.filters[0].urlRewrite.path.type", "exactly one match, a PathPrefix; the rule "
                                                "has 2 matches"),
    (_filtered(_PREFIX_REWRITE, f"[{_EXACT}]"),
     f"{RULE}.filters[0].urlRewrite.path.type", "its match is Exact"),
    (_filtered(_PREFIX_REWRITE, "[{path: {type: RegularExpression, value: /o.*}}]"),
     f"{RULE}.filters[0].urlRewrite.path.type", "its match is RegularExpression"),
    (_filtered(_PREFIX_REWRITE, "[]"), f"{RULE}.filters[0].urlRewrite.path.type",
     "the rule has no matches"),
    (_filtered(f"{_REQUEST_HEADERS}, {_PREFIX_REDIRECT}", f"[{_EXACT}]"),
     f"{RULE}.filters[1].requestRedirect.path.type", "its match is Exact"),
    (_filtered(_REQUEST_HEADERS, f"[{_PREFIX}, {_EXACT}]", _PREFIX_REWRITE),
     f"{RULE}.backendRefs[0].filters[0].urlRewrite.path.type", "the rule has 2 matches"),
    (_filtered(_REQUEST_HEADERS, f"[{_EXACT}]", _PREFIX_REDIRECT),
     f"{RULE}.backendRefs[0].filters[0].requestRedirect.path.type", "its match is Exact"),
    (_filtered(f"{_REQUEST_HEADERS}, {_MIRROR}, {_REQUEST_HEADERS}"),
     f"{RULE}.filters[2].type", "RequestHeaderModifier filter cannot be repeated "
                                "(filters[0] is one already)"),
    (_filtered(f"{_RESPONSE_HEADERS}, {_RESPONSE_HEADERS}"), f"{RULE}.filters[1].type",
     "ResponseHeaderModifier filter cannot be repeated"),
    (_filtered(f"{_CORS}, {_EXTENSION}, {_CORS}"), f"{RULE}.filters[2].type",
     "CORS filter cannot be repeated"),
    (_filtered(f"{_FULL_REWRITE}, {_FULL_REWRITE}"), f"{RULE}.filters[1].type",
     "URLRewrite filter cannot be repeated"),
    (_route("rules: [{filters: [{type: RequestRedirect, requestRedirect: {scheme: https}}, "
            "{type: RequestRedirect, requestRedirect: {port: 8443}}]}]\n"),
     f"{RULE}.filters[1].type", "RequestRedirect filter cannot be repeated"),
    (_filtered(_MIRROR, None, f"{_REQUEST_HEADERS}, {_REQUEST_HEADERS}"),
     f"{RULE}.backendRefs[0].filters[1].type", "RequestHeaderModifier filter cannot be "
                                               "repeated"),
    (_route("rules: [{filters: [{type: RequestRedirect, requestRedirect: {scheme: https}}, "
            f"{_FULL_REWRITE}]}}]\n"), f"{RULE}.filters[1].type",
     "RequestRedirect and URLRewrite cannot be combined in one rule (filters[0] is a "
     "RequestRedirect)"),
    (_filtered(_MIRROR, None, f"{_FULL_REWRITE}, {_EXTENSION}, "
                              "{type: RequestRedirect, requestRedirect: {scheme: https}}"),
     f"{RULE}.backendRefs[0].filters[2].type",
     "cannot be combined in one backendRef (filters[0] is a URLRewrite)"),
    (_filtered(f"{_REQUEST_HEADERS}, {{type: RequestRedirect, requestRedirect: "
               "{scheme: https}}"), f"{RULE}.filters[1].type",
     "RequestRedirect filter must not be used together with backendRefs"),
    (_route("rules: [{filters: [{type: RequestRedirect, requestRedirect: "
            "{path: {type: ReplaceFullPath}}}]}]\n"),
     f"{RULE}.filters[0].requestRedirect.path.replaceFullPath", "required field"),
    (_filtered("{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch}}}"),
     f"{RULE}.filters[0].urlRewrite.path.replacePrefixMatch", "required field"),
], ids=["prefix-two-matches", "prefix-exact", "prefix-regex", "prefix-no-matches",
        "prefix-redirect", "prefix-backend-rewrite", "prefix-backend-redirect",
        "repeat-request-headers", "repeat-response-headers", "repeat-cors",
        "repeat-rewrite", "repeat-redirect", "repeat-backend", "redirect-and-rewrite",
        "backend-redirect-and-rewrite", "redirect-with-backends", "redirect-path-value",
        "rewrite-path-value"])
def test_what_the_crd_rejects_is_an_error(text: str, path: str, fragment: str) -> None:
    err = _error(text)
    assert err.path == path, str(err)
    assert fragment in err.message
    assert str(err).startswith(path)


@pytest.mark.parametrize("text", [
    _filtered(_PREFIX_REWRITE, f"[{_PREFIX}]"),
    _filtered(_PREFIX_REWRITE),  # no matches: one PathPrefix / by default
    _filtered(_PREFIX_REWRITE, "[{}]"),  # a match without path: PathPrefix / by default
    _filtered(_PREFIX_REWRITE, "[{path: {value: /old}, method: GET}]"),  # type defaulted
    _route(f"rules: [{{matches: [{_PREFIX}], filters: [{_PREFIX_REDIRECT}]}}]\n"),
    _filtered(_REQUEST_HEADERS, f"[{_PREFIX}]", _PREFIX_REWRITE),
    _filtered(_FULL_REWRITE, f"[{_EXACT}, {_PREFIX}]"),  # ReplaceFullPath: any matches
    _filtered(f"{_MIRROR}, {_MIRROR}, {_EXTENSION}, {_EXTENSION}, {_REQUEST_HEADERS}",
              None, f"{_RESPONSE_HEADERS}, {_REQUEST_HEADERS}, {_CORS}"),
    _filtered(_REQUEST_HEADERS, None, _FULL_REWRITE),  # one of each per list is fine
], ids=["prefix-one-prefix-match", "prefix-default-match", "prefix-default-path",
        "prefix-default-type", "prefix-redirect", "prefix-backend", "full-path",
        "repeatable", "rule-and-backend-lists-apart"])
def test_what_the_crd_accepts_converts(text: str) -> None:
    assert httproutes_to_config(text).rules


# --------------------------------------------------------------------------- timeouts


@pytest.mark.parametrize("timeouts,wire", [
    ("{request: 0s}", {}),
    ("{request: 0s, backendRequest: 0ms}", {}),
    ("{request: 10s}", {"request": "10s"}),
    ("{request: 1h30m, backendRequest: 500ms}", {"request": "1h30m", "backend": "500ms"}),
    ("{request: 0s, backendRequest: 2s}", {"backend": "2s"}),
    ("{}", {}),
])
def test_timeouts(timeouts: str, wire: dict) -> None:
    rules = _rules(f"rules: [{{backendRefs: [{{name: w, port: 80}}], timeouts: {timeouts}}}]\n")
    assert rules[0]["timeouts"] == wire


def test_timeouts_reach_the_compiled_rule() -> None:
    config = httproutes_to_config(_route(
        "rules: [{backendRefs: [{name: w, port: 80}], timeouts: {request: 1m, "
        "backendRequest: 1500ms}}]\n"))
    timeouts = config.rules[0].timeouts
    assert timeouts is not None and (timeouts.request, timeouts.backend) == (60.0, 1.5)


# --------------------------------------------------------------------------- documents


def test_other_kinds_and_empty_documents_are_skipped() -> None:
    text = textwrap.dedent("""\
        ---
        apiVersion: gateway.networking.k8s.io/v1
        kind: Gateway
        metadata: {name: tunnel}
        spec: {gatewayClassName: tunnelgate, listeners: []}
        ---
        apiVersion: v1
        kind: Service
        metadata: {name: web}
        ---
        """) + _route("rules: [{backendRefs: [{name: web, port: 80}]}]\n") + "---\n"
    assert len(httproutes_to_wire(text)["rules"]) == 1
    assert httproutes_to_wire("")["rules"] == []
    assert httproutes_to_config("apiVersion: v1\nkind: ConfigMap\n").rules == ()


def test_list_documents_are_read_item_by_item() -> None:
    item = textwrap.indent(_route("hostnames: [a.example.com]\n"), "  ").lstrip()
    text = ("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n"
            f"  metadata: {{name: s}}\n- {item}")
    rules = httproutes_to_wire(text)["rules"]
    assert [r["hostnames"] for r in rules] == [["a.example.com"]]


# --------------------------------------------------------------------------- errors

OTHER = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n"


@pytest.mark.parametrize("text,path,fragment", [
    (OTHER + _route("{}", api_version="gateway.networking.k8s.io/v1beta1"),
     "documents[1].apiVersion", "must be gateway.networking.k8s.io/v1"),
    (_route("{}", kind="HttpRoute"), "documents[0].kind", "did you mean HTTPRoute"),
    ("apiVersion: v1\nmetadata: {name: x}\n", "documents[0].kind", "missing kind"),
    ("- a\n- b\n", "documents[0]", "expected a Kubernetes object"),
    ("kind: HTTPRoute\nspec: [\n", "", "invalid YAML"),
    (_route("rules: []\n"), "documents[0].spec.rules", "at least one rule"),
    (_route("hostnames: [" + ", ".join(f"h{i}.example.com" for i in range(17)) + "]\n"),
     "documents[0].spec.hostnames", "at most 16"),
    (_route("hostnames: [ok.example.com, 'bad host']\n"),
     "documents[0].spec.hostnames[1]", "invalid hostname"),
    (_route("rules: [{backendRef: [{name: w, port: 80}]}]\n"),
     "documents[0].spec.rules[0].backendRef", "unknown field"),
    (_route("rules: [{backendRefs: [{name: w}]}]\n"),
     "documents[0].spec.rules[0].backendRefs[0].port", "needs a port"),
    (_route("rules: [{backendRefs: [{name: w, port: 70000}]}]\n"),
     "documents[0].spec.rules[0].backendRefs[0].port", "out of range"),
    (_route("rules: [{backendRefs: [{name: w, port: 80, weight: -1}]}]\n"),
     "documents[0].spec.rules[0].backendRefs[0].weight", "out of range"),
    (_route("rules: [{backendRefs: [{name: 'evil.example:80/x#', port: 80}]}]\n"),
     "documents[0].spec.rules[0].backendRefs[0].name", "invalid Service name"),
    (_route("rules: [{backendRefs: [{port: 80}]}]\n"),
     "documents[0].spec.rules[0].backendRefs[0].name", "required"),
    (_route("rules: [{matches: [{path: {type: RegularExpression, value: '(?=x)'}}]}]\n"),
     "documents[0].spec.rules[0].matches[0].path.value", "invalid regular expression"),
    (_route("rules: [{matches: [{path: {type: Exact, value: api}}]}]\n"),
     "documents[0].spec.rules[0].matches[0].path.value", "must start with '/'"),
    (_route("rules: [{matches: [{path: {type: Prefix, value: /}}]}]\n"),
     "documents[0].spec.rules[0].matches[0].path.type", "unknown path match type"),
    (_route("rules: [{matches: [{headers: [{name: X-A}]}]}]\n"),
     "documents[0].spec.rules[0].matches[0].headers[0].value", "required"),
    (_route("rules: [{matches: [{queryParams: [{type: Prefix, name: q, value: v}]}]}]\n"),
     "documents[0].spec.rules[0].matches[0].queryParams[0].type", "unknown match type"),
    (_route("rules: [{filters: [{type: RequestHeaderModifier}]}]\n"),
     "documents[0].spec.rules[0].filters[0].requestHeaderModifier", "required"),
    (_route("rules: [{filters: [{type: URLRewrite, requestRedirect: {}}]}]\n"),
     "documents[0].spec.rules[0].filters[0].requestRedirect", "not allowed"),
    (_route("rules: [{filters: [{requestHeaderModifier: {}}]}]\n"),
     "documents[0].spec.rules[0].filters[0].type", "required"),
    # The source index survives an unsupported filter dropped before it.
    (_route("rules: [{filters: [{type: ExtensionRef, extensionRef: {name: x}}, "
            "{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: 'a b', value: v}]}}]}]\n"),
     "documents[0].spec.rules[0].filters[1].requestHeaderModifier.set[0].name",
     "invalid header name"),
    (_route("rules: [{backendRefs: [{name: w, port: 80, filters: [{type: ExtensionRef, "
            "extensionRef: {name: x}}, {type: ResponseHeaderModifier, "
            "responseHeaderModifier: {remove: ['a b']}}]}]}]\n"),
     "documents[0].spec.rules[0].backendRefs[0].filters[1].responseHeaderModifier.remove[0]",
     "invalid header name"),
    (_route("rules: [{filters: [{type: RequestRedirect, requestRedirect: "
            "{path: {type: ReplaceFullPath, replacePrefixMatch: /x}}}]}]\n"),
     "documents[0].spec.rules[0].filters[0].requestRedirect.path.replacePrefixMatch",
     "not used"),
    (_route("rules: [{filters: [{type: RequestRedirect, requestRedirect: "
            "{path: {type: ReplaceFullPath, replaceFullPath: x}}}]}]\n"),
     "documents[0].spec.rules[0].filters[0].requestRedirect.path", "must start with '/'"),
    (_route("rules: [{filters: [{type: URLRewrite, urlRewrite: {hostname: 'a b'}}]}]\n"),
     "documents[0].spec.rules[0].filters[0].urlRewrite.hostname", "invalid hostname"),
    (_route("rules: [{filters: [{type: RequestMirror, requestMirror: {backendRef: "
            "{name: s, port: 80}, percent: 5, fraction: {numerator: 1}}}]}]\n"),
     "documents[0].spec.rules[0].filters[0].requestMirror.fraction", "only one of"),
    (_route("rules: [{filters: [{type: RequestMirror, requestMirror: {backendRef: "
            "{name: s, port: 80}, fraction: {numerator: 1, denominator: 0}}}]}]\n"),
     "documents[0].spec.rules[0].filters[0].requestMirror.fraction.denominator",
     "out of range"),
    (_route("rules: [{filters: [{type: CORS, cors: {maxAge: -1}}]}]\n"),
     "documents[0].spec.rules[0].filters[0].cors.maxAge", "must be >= 0"),
    (_route("rules: [{timeouts: {request: 1.5s}}]\n"),
     "documents[0].spec.rules[0].timeouts.request", "invalid duration"),
    (_route("rules: [{timeouts: {request: 1s, backendRequest: 2s}}]\n"),
     "documents[0].spec.rules[0].timeouts.backendRequest", "must not be longer"),
    (_route("rules: [{timeouts: {request: 1s, idle: 2s}}]\n"),
     "documents[0].spec.rules[0].timeouts.idle", "unknown field"),
])
def test_errors_name_document_and_field(text: str, path: str, fragment: str) -> None:
    err = _error(text)
    assert err.path == path, str(err)
    assert fragment in err.message
    assert str(err).startswith(path)


def test_bad_mapped_backend_url_is_reported_at_the_backend_ref() -> None:
    err = _error(_route("rules: [{backendRefs: [{name: w, port: 80}]}]\n"),
                 backends={"w.apps": "ftp://w"})
    assert err.path == "documents[0].spec.rules[0].backendRefs[0]"
    assert "http://" in err.message


def test_version_is_validated() -> None:
    assert _error("", version=-1).path == "version"
