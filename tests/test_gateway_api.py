"""routing.gateway_api: HTTPRoute YAML → wire config."""

from __future__ import annotations

import textwrap

import pytest

from routing.gateway_api import convert, httproutes_to_config, httproutes_to_wire
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
    assert wire == {"version": 1767225600200, "rules": [
        *_pair(["hello.default.example.com"], SPLIT),
        *_pair(LOCAL, SPLIT),
        *_pair(["canary-hello.default.example.com"], CANARY),
        *_pair(CANARY_LOCAL, CANARY),
    ]}


def test_knative_probe_wins_over_plain_rule_after_compiling() -> None:
    table = Table.compile(httproutes_to_config(KNATIVE_ROUTES))
    probe = table.lookup("hello.default.example.com", "/", "",
                         [(b"K-Network-Hash", b"override")], "GET", "cluster")
    plain = table.lookup("hello.default.example.com", "/", "", [], "GET", "tunnel")
    local = table.lookup("hello.default.svc.cluster.local", "/", "",
                         [(b"K-Network-Hash", b"override")], "GET", "cluster")
    assert probe is not None and plain is not None and local is not None
    assert probe.route.index == 0 and plain.route.index == 1 and local.route.index == 2
    assert probe.route.rule.filters[0].request_header_modifier.set == (("K-Network-Hash", H),)
    assert [b.weight for b in probe.route.rule.backends] == [80, 20]
    assert probe.route.rule.timeouts is not None
    assert probe.route.rule.timeouts.request is None  # 0s = no timeout


def test_config_result_is_a_validated_config() -> None:
    config = httproutes_to_config(KNATIVE_ROUTES, version=7)
    assert isinstance(config, Config)
    assert config.version == 7 and len(config.rules) == 8
    assert config.rules[4].backends[0].url == "http://hello-00002.default.svc.cluster.local:80"


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


def test_route_and_rule_order_is_file_order() -> None:
    text = "\n---\n".join(
        _route(f"hostnames: [{host}]\nrules: [{{backendRefs: [{{name: {host[0]}1, port: 80}}]}},"
               f" {{backendRefs: [{{name: {host[0]}2, port: 80}}]}}]\n")
        for host in ("z.example.com", "a.example.com"))
    urls = [r["backends"][0]["url"] for r in httproutes_to_wire(text)["rules"]]
    assert [u.split("//")[1].split(".")[0] for u in urls] == ["z1", "z2", "a1", "a2"]


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
