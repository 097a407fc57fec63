"""deploy/: every manifest validates offline, and the pieces agree with each other.

Schema validation uses kubernetes-validate's bundled OpenAPI schemas in strict mode
(unknown fields fail) for a fixed Kubernetes version. Gateway API kinds are CRDs, which
the validator does not bundle: :func:`check_gateway_api` checks them against the v1
schema's fields (names, required fields, types, patterns, limits, unknown keys). The
cross-checks encode what net-gateway-api's prober and the cloudflared sidecar require
of the Knative and sidecar setups.
"""

from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path
from typing import Any, Iterator

import kubernetes_validate
import pytest
import yaml

from proxy.control.runtime import FINISH_MARGIN
from proxy.control.flags import add_serve_arguments
from proxy.control.resolve import from_args
from routing.gateway_api import httproutes_to_config
from routing.values import parse_duration
from tunnel.cloudflared import KILL_MARGIN
from tunnel.sidecar import render_ingress

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
# Oldest Kubernetes minor the manifests promise to work on; bundled by the validator.
K8S_VERSION = "1.30.0"
# `tunnelgate serve` flags the manifests may use (the CLI contract).
VALUE_FLAGS = {"--listen", "--admin", "--config", "--auth-token-file", "--tunnel-listen",
               "--cluster-scope", "--cluster-allow", "--cloudflared-metrics-url",
               "--listen-tls", "--tls-cert-dir"}
SWITCH_FLAGS = {"--cluster-proxy-protocol", "--watch-config"}
SCOPES = {"all", "probes", "scoped"}
GATEWAY_API = "gateway.networking.k8s.io/v1"
GATEWAY_KINDS = {"Gateway", "GatewayClass"}  # CRDs: checked by check_gateway_api


def _documents() -> list[tuple[str, dict]]:
    """(``file#index``, document) for every non-empty YAML document under deploy/."""
    found = []
    for path in sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]):
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                found.append((f"{path.relative_to(DEPLOY)}#{index}", doc))
    return found


DOCUMENTS = _documents()


def _in(directory: str, kind: str, name: str | None = None) -> list[dict]:
    return [doc for ident, doc in DOCUMENTS
            if ident.startswith(f"{directory}/") and doc["kind"] == kind
            and (name is None or doc["metadata"]["name"] == name)]


def _one(directory: str, kind: str, name: str | None = None) -> dict:
    docs = _in(directory, kind, name)
    assert len(docs) == 1, f"expected one {kind} {name or ''} in deploy/{directory}"
    return docs[0]


def _container(deployment: dict, name: str) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == name)


def _deployments() -> Iterator[tuple[str, dict]]:
    return ((ident, doc) for ident, doc in DOCUMENTS if doc["kind"] == "Deployment")


def _serve_flags(args: list[str]) -> dict[str, str | bool]:
    """Parse ``serve`` args against the contract; unknown flags fail the test."""
    assert args[0] == "serve", args
    flags: dict[str, str | bool] = {}
    rest = iter(args[1:])
    for token in rest:
        name, _, inline = token.partition("=")
        if name in SWITCH_FLAGS and not inline:
            flags[name] = True
        elif name in VALUE_FLAGS:
            flags[name] = inline or next(rest)
        else:
            pytest.fail(f"{token!r} is not a flag of the tunnelgate serve contract")
    return flags


def _env(container: dict, name: str) -> dict:
    return next(e for e in container.get("env", []) if e["name"] == name)


# --------------------------------------------------------------------------- schemas


def test_the_validator_bundles_the_pinned_version() -> None:
    assert K8S_VERSION in kubernetes_validate.utils.all_versions()
    assert len(DOCUMENTS) >= 12  # the three directories are not empty


@pytest.mark.parametrize("doc", [d for _, d in DOCUMENTS], ids=[i for i, _ in DOCUMENTS])
def test_document_validates_strictly(doc: dict) -> None:
    if doc.get("apiVersion") == GATEWAY_API and doc.get("kind") in GATEWAY_KINDS:
        check_gateway_api(doc)
        return
    # Any error — schema violation or a kind without a bundled schema — fails the test.
    used = kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert used == K8S_VERSION.rsplit(".", 1)[0]  # that version's schema, no fallback


def test_strict_validation_rejects_unknown_and_mistyped_fields() -> None:
    deployment = _one("knative", "Deployment")
    typo = copy.deepcopy(deployment)
    _container(typo, "tunnelgate")["readinessprobe"] = {}
    mistyped = copy.deepcopy(deployment)
    _container(mistyped, "tunnelgate")["ports"][0]["containerPort"] = "8080"
    for broken in (typo, mistyped):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_knative_directory_has_the_whole_setup() -> None:
    kinds = sorted(doc["kind"] for ident, doc in DOCUMENTS if ident.startswith("knative/"))
    assert kinds == sorted(["Namespace", "ServiceAccount", "Deployment", "Service",
                            "Service", "NetworkPolicy", "ConfigMap", "PodDisruptionBudget",
                            "GatewayClass", "Gateway"])


def test_hpa_is_only_a_commented_example() -> None:
    text = (DEPLOY / "knative" / "hpa.example.yaml").read_text()
    assert [d for d in yaml.safe_load_all(text) if d is not None] == []
    assert "cftunnel_proxy_requests_in_flight" in text


# --------------------------------------------------------------------------- Knative


def _gateway_entries(configmap: dict) -> dict[str, list[dict]]:
    return {key: yaml.safe_load(configmap["data"][key])
            for key in ("external-gateways", "local-gateways")}


@pytest.mark.parametrize("directory", ["knative", "split-horizon"])
def test_config_gateway_entries(directory: str) -> None:
    configmap = _one(directory, "ConfigMap", "config-gateway")
    assert configmap["metadata"]["namespace"] == "knative-serving"
    for key, entries in _gateway_entries(configmap).items():
        assert isinstance(entries, list) and len(entries) <= 1, key
        for entry in entries:
            assert entry["class"].strip(), key
            assert set(entry) <= {"class", "gateway", "service", "supported-features",
                                  "proxy-protocol-enabled"}, (key, entry)
            for ref in ("gateway", "service"):
                if ref not in entry:  # `service` is optional: the Gateway address is probed
                    assert ref == "service", key
                    continue
                namespace, _, name = entry[ref].partition("/")
                assert namespace and name and "/" not in name, (key, ref)
            assert all(isinstance(f, str) for f in entry.get("supported-features", []))
            assert entry.get("proxy-protocol-enabled", False) is False


@pytest.mark.parametrize("directory,keys", [
    ("knative", ("external-gateways", "local-gateways")),
    ("split-horizon", ("external-gateways",)),
])
def test_config_gateway_points_the_prober_at_the_incluster_service(
        directory: str, keys: tuple[str, ...]) -> None:
    entries = _gateway_entries(_one(directory, "ConfigMap", "config-gateway"))
    service = _one("knative", "Service", "tunnelgate-incluster")
    for key in keys:
        entry = entries[key][0]
        assert entry["class"] == "tunnelgate"
        assert entry["service"] == f"{service['metadata']['namespace']}/tunnelgate-incluster"
        # Only claimed because tunnelgate reads `request: 0s` as "no timeout".
        assert entry["supported-features"] == ["HTTPRouteRequestTimeout"]


def test_incluster_service_reaches_the_cluster_entrance_on_a_port_named_http() -> None:
    service = _one("knative", "Service", "tunnelgate-incluster")
    deployment = _one("knative", "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"]) == ("http", 80)
    tunnelgate = _container(deployment, "tunnelgate")
    target = next(p for p in tunnelgate["ports"] if p["name"] == port["targetPort"])
    listen = _serve_flags(tunnelgate["args"])["--listen"]
    assert listen == f":{target['containerPort']}"  # every interface, IPv4 and IPv6


def test_config_pushes_reach_not_ready_pods_through_a_headless_service() -> None:
    service = _one("knative", "Service", "tunnelgate-config")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    tunnelgate = _container(_one("knative", "Deployment"), "tunnelgate")
    admin_port = int(str(_serve_flags(tunnelgate["args"])["--admin"]).rsplit(":", 1)[1])
    assert [p["port"] for p in service["spec"]["ports"]] == [admin_port]


def test_knative_entrances_and_secrets() -> None:
    deployment = _one("knative", "Deployment")
    flags = _serve_flags(_container(deployment, "tunnelgate")["args"])
    # Dual-stack: an IPv6-primary cluster's Endpoints (prober) and kubelet probes use
    # the pod's IPv6 address.
    assert flags["--listen"] == ":8080"
    assert flags["--tunnel-listen"] == "127.0.0.1:8082"  # loopback: only the sidecar
    assert flags["--admin"] == ":8081"
    assert flags["--cluster-scope"] in SCOPES
    auth = _env(_container(deployment, "tunnelgate"), "PROXY_AUTH_TOKEN")
    assert auth["valueFrom"]["secretKeyRef"]["key"] == "auth-token"
    cloudflared = _container(deployment, "cloudflared")
    assert cloudflared["image"].startswith("cloudflare/cloudflared:")
    assert cloudflared["args"] == ["tunnel", "--no-autoupdate", "--metrics",
                                   "127.0.0.1:20241", "--grace-period", "30s", "run"]
    assert "secretKeyRef" in _env(cloudflared, "TUNNEL_TOKEN")["valueFrom"]
    # Pod readiness must follow the cluster entrance, not the edge connection.
    assert "readinessProbe" not in cloudflared


def test_network_policy_scopes_each_port() -> None:
    policy = _one("knative", "NetworkPolicy")
    deployment = _one("knative", "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    peers: dict[int, list[dict]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            peers.setdefault(port["port"], []).extend(rule["from"])
    assert set(peers) == {8080, 8081}
    for port, sources in peers.items():
        # Namespace-scoped peers only: no ipBlock, no empty selector that admits all.
        assert all(list(s) == ["namespaceSelector"] and s["namespaceSelector"]["matchLabels"]
                   for s in sources), port
    names = {s["namespaceSelector"]["matchLabels"].get("kubernetes.io/metadata.name")
             for s in peers[8080]}
    assert "knative-serving" in names
    assert not names & {s["namespaceSelector"]["matchLabels"].get(
        "kubernetes.io/metadata.name") for s in peers[8081]} - {None}


def test_split_horizon_probes_the_cilium_gateway_address() -> None:
    # Cilium's Gateway Service has a placeholder endpoint (net-gateway-api #817):
    # probing its Endpoints would time out, so the local entry has no `service`.
    local = _gateway_entries(_one("split-horizon", "ConfigMap", "config-gateway"))[
        "local-gateways"][0]
    assert local["class"] == "cilium" and "service" not in local


def test_config_gateway_names_the_shipped_gateway_and_class() -> None:
    gateway = _one("knative", "Gateway")
    gateway_class = _one("knative", "GatewayClass")
    assert gateway["spec"]["gatewayClassName"] == gateway_class["metadata"]["name"]
    where = f"{gateway['metadata']['namespace']}/{gateway['metadata']['name']}"
    for directory, keys in (("knative", ("external-gateways", "local-gateways")),
                            ("split-horizon", ("external-gateways",))):
        entries = _gateway_entries(_one(directory, "ConfigMap", "config-gateway"))
        for key in keys:
            assert (entries[key][0]["gateway"], entries[key][0]["class"]) == (
                where, gateway_class["metadata"]["name"]), (directory, key)


# The hostnames net-gateway-api gives ksvc `hello` in `default` (domain example.com):
# every one must be accepted, or the route is not Accepted / loses that name.
KNATIVE_HOSTS = ["hello.default.example.com", "latest-hello.default.example.com",
                 "hello.default", "hello.default.svc", "hello.default.svc.cluster.local"]


def _accepts(listener: dict, host: str) -> bool:
    """Gateway API listener hostname matching: exact, or `*.suffix` = one or more
    labels before the suffix; no hostname accepts everything."""
    pattern = listener.get("hostname")
    if pattern is None:
        return True
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def test_gateway_listeners_accept_public_and_cluster_local_hostnames() -> None:
    listeners = _one("knative", "Gateway")["spec"]["listeners"]
    for host in KNATIVE_HOSTS:
        assert any(_accepts(listener, host) for listener in listeners), host
    assert not any(_accepts(listener, "hello.other-namespace") for listener in listeners
                   if listener.get("hostname") is not None)
    for listener in listeners:
        assert (listener["port"], listener["protocol"]) == (80, "HTTP")
        assert listener["allowedRoutes"]["namespaces"]["from"] == "All"  # ksvc namespaces


def test_structural_gateway_api_check_rejects_broken_objects() -> None:
    gateway = _one("knative", "Gateway")
    broken = []
    for mutate in (lambda g: g["spec"].pop("gatewayClassName"),
                   lambda g: g["spec"].update(listeners=[]),
                   lambda g: g["spec"]["listeners"][0].pop("port"),
                   lambda g: g["spec"]["listeners"][0].update(port="80"),
                   lambda g: g["spec"]["listeners"][0].update(hostname="*.Example.com"),
                   lambda g: g["spec"]["listeners"][0].update(protocol="http"),
                   lambda g: g["spec"]["listeners"][1].update(name="public"),
                   lambda g: g["spec"]["listeners"][0].update(allowedroutes={}),
                   lambda g: g["metadata"].pop("namespace")):
        copied = copy.deepcopy(gateway)
        mutate(copied)
        broken.append(copied)
    gateway_class = copy.deepcopy(_one("knative", "GatewayClass"))
    gateway_class["spec"]["controllerName"] = "no-domain-prefix"
    broken.append(gateway_class)
    for doc in broken:
        with pytest.raises(AssertionError):
            check_gateway_api(doc)


# --------------------------------------------------------------------------- Gateway API
# The v1 schema's fields for the two kinds shipped here (gateway-api apis/v1): keys
# allowed and required per object, string patterns and list limits.

_DNS_LABELS = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_SECTION_NAME = re.compile(f"^{_DNS_LABELS}$")
_HOSTNAME = re.compile(rf"^(\*\.)?{_DNS_LABELS}$")
_CONTROLLER = re.compile(rf"^{_DNS_LABELS}/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")
_PROTOCOLS = {"HTTP", "HTTPS", "TLS", "TCP", "UDP"}
_META_KEYS = {"name", "namespace", "labels", "annotations"}


def _keys(obj: Any, where: str, allowed: set[str], required: set[str] = frozenset()) -> dict:
    assert isinstance(obj, dict), f"{where}: must be an object"
    assert not set(obj) - allowed, f"{where}: unknown field(s) {sorted(set(obj) - allowed)}"
    assert not required - set(obj), f"{where}: missing {sorted(required - set(obj))}"
    return obj


def _name(value: Any, where: str, pattern: re.Pattern[str] = _SECTION_NAME,
          limit: int = 253) -> None:
    assert isinstance(value, str) and 1 <= len(value) <= limit and pattern.match(value), \
        f"{where}: invalid value {value!r}"


def check_gateway_api(doc: dict) -> None:
    """Assert ``doc`` (a v1 Gateway or GatewayClass) is what the v1 CRD accepts."""
    kind = doc["kind"]
    _keys(doc, kind, {"apiVersion", "kind", "metadata", "spec"},
          {"apiVersion", "kind", "metadata", "spec"})
    meta = _keys(doc["metadata"], f"{kind}.metadata", _META_KEYS,
                 {"name"} if kind == "GatewayClass" else {"name", "namespace"})
    assert kind != "GatewayClass" or "namespace" not in meta, "GatewayClass is cluster-scoped"
    _name(meta["name"], f"{kind}.metadata.name")
    if kind == "GatewayClass":
        spec = _keys(doc["spec"], "spec", {"controllerName", "description", "parametersRef"},
                     {"controllerName"})
        _name(spec["controllerName"], "spec.controllerName", _CONTROLLER)
        assert isinstance(spec.get("description", ""), str) and len(
            spec.get("description", "")) <= 64, "spec.description: at most 64 characters"
        if "parametersRef" in spec:
            _keys(spec["parametersRef"], "spec.parametersRef",
                  {"group", "kind", "name", "namespace"}, {"group", "kind", "name"})
        return
    spec = _keys(doc["spec"], "spec", {"gatewayClassName", "listeners", "addresses",
                                       "infrastructure", "backendTLS", "allowedListeners"},
                 {"gatewayClassName", "listeners"})
    _name(spec["gatewayClassName"], "spec.gatewayClassName")
    listeners = spec["listeners"]
    assert isinstance(listeners, list) and 1 <= len(listeners) <= 64, \
        "spec.listeners: 1 to 64 entries"
    for index, listener in enumerate(listeners):
        where = f"spec.listeners[{index}]"
        _keys(listener, where, {"name", "hostname", "port", "protocol", "tls",
                                "allowedRoutes"}, {"name", "port", "protocol"})
        _name(listener["name"], f"{where}.name")
        if "hostname" in listener:
            _name(listener["hostname"], f"{where}.hostname", _HOSTNAME)
        port = listener["port"]
        assert isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535, \
            f"{where}.port: integer 1..65535"
        protocol = listener["protocol"]
        assert protocol in _PROTOCOLS or _CONTROLLER.match(str(protocol)), \
            f"{where}.protocol: invalid {protocol!r}"
        if "allowedRoutes" in listener:
            routes = _keys(listener["allowedRoutes"], f"{where}.allowedRoutes",
                           {"namespaces", "kinds"})
            if "namespaces" in routes:
                namespaces = _keys(routes["namespaces"], f"{where}.allowedRoutes.namespaces",
                                   {"from", "selector"})
                assert namespaces.get("from", "Same") in {"All", "Same", "Selector"}
    names = [listener["name"] for listener in listeners]
    assert len(set(names)) == len(names), "spec.listeners: names must be unique"
    combos = [(item["port"], item["protocol"], item.get("hostname")) for item in listeners]
    assert len(set(combos)) == len(combos), "spec.listeners: port/protocol/hostname clash"


def test_pdb_selects_the_proxy_pods() -> None:
    pdb = _one("knative", "PodDisruptionBudget")
    deployment = _one("knative", "Deployment")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]


# --------------------------------------------------------------------------- all pods


@pytest.mark.parametrize("ident,deployment", list(_deployments()))
def test_tunnelgate_args_parse_with_the_real_settings(ident: str, deployment: dict) -> None:
    args = _container(deployment, "tunnelgate")["args"]
    flags = _serve_flags(args)
    assert flags.get("--cluster-scope", "probes") in SCOPES
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)  # the flags of `tunnelgate serve`
    settings = from_args(parser.parse_args(args[1:]), {"PROXY_AUTH_TOKEN": "t"})
    assert settings.tunnel_listen is not None or ident.startswith("in-cluster/")
    assert settings.admin.port == 8081


@pytest.mark.parametrize("ident,deployment", list(_deployments()))
def test_pods_are_locked_down(ident: str, deployment: dict) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    writable = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        assert "add" not in context["capabilities"], container["name"]
        assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
        assert "memory" in container["resources"]["limits"]
        assert ":" in container["image"] and not container["image"].endswith(":latest")
    tmp = next(m for m in _container(deployment, "tunnelgate")["volumeMounts"]
               if m["mountPath"] == "/tmp")
    assert tmp["name"] in writable


@pytest.mark.parametrize("ident,deployment", list(_deployments()))
def test_tunnelgate_probes(ident: str, deployment: dict) -> None:
    tunnelgate = _container(deployment, "tunnelgate")
    admin = next(p for p in tunnelgate["ports"] if p["containerPort"] == 8081)["name"]
    assert tunnelgate["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": admin}
    assert tunnelgate["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": admin}


# --------------------------------------------------------------------------- sidecar


def test_sidecar_shares_the_origin_socket() -> None:
    deployment = _one("sidecar", "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    tunnelgate, cloudflared = _container(deployment, "tunnelgate"), _container(
        deployment, "cloudflared")
    listen = str(_serve_flags(tunnelgate["args"])["--tunnel-listen"])
    assert listen == "unix:/run/tunnelgate/origin.sock"
    assert "--listen" not in tunnelgate["args"]  # tunnel only: no cluster entrance
    socket_dir = listen[len("unix:"):].rsplit("/", 1)[0]
    mounts = [{m["mountPath"]: m["name"] for m in c["volumeMounts"]}
              for c in (tunnelgate, cloudflared)]
    assert mounts[0][socket_dir] == mounts[1][socket_dir]
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[0][socket_dir])
    assert "emptyDir" in volume
    # cloudflared must be allowed to connect to a socket tunnelgate created.
    assert pod["securityContext"]["runAsUser"] == 10001
    assert all("runAsUser" not in c["securityContext"] for c in (tunnelgate, cloudflared))


def _mounted_volume(deployment: dict, container: str, directory: str) -> dict:
    """The pod volume mounted at ``directory`` in ``container``."""
    mount = next(m for m in _container(deployment, container)["volumeMounts"]
                 if m["mountPath"] == directory)
    return next(v for v in deployment["spec"]["template"]["spec"]["volumes"]
                if v["name"] == mount["name"])


def _mounted_file(deployment: dict, container: str, path: str,
                  directory: str = "sidecar") -> str:
    """The ConfigMap key text that ``path`` in ``container`` resolves to."""
    mount_path, _, key = path.rpartition("/")
    volume = _mounted_volume(deployment, container, mount_path)
    configmap = _one(directory, "ConfigMap", volume["configMap"]["name"])
    return configmap["data"][key]


def test_cloudflared_ingress_is_one_catch_all_to_the_socket() -> None:
    deployment = _one("sidecar", "Deployment")
    cloudflared = _container(deployment, "cloudflared")
    args = cloudflared["args"]
    assert args[0] == "tunnel" and args[-1] == "run" and "--no-autoupdate" in args
    config = yaml.safe_load(_mounted_file(deployment, "cloudflared",
                                          args[args.index("--config") + 1]))
    socket = str(_serve_flags(_container(deployment, "tunnelgate")["args"])["--tunnel-listen"])
    # A single catch-all (no hostname, no path): tunnelgate's table matches hosts, since
    # cloudflared's own match is case-sensitive and keeps a trailing dot.
    assert config["ingress"] == [{"service": socket}]
    assert config["credentials-file"].startswith("/etc/cloudflared/creds/")
    # The same rule `tunnelgate cloudflared-config` prints.
    assert yaml.safe_load(render_ingress(["example.com"], socket))["ingress"] == config["ingress"]
    assert cloudflared["readinessProbe"]["exec"]["command"][:2] == ["cloudflared", "tunnel"]


@pytest.mark.parametrize("directory", ["knative", "sidecar"])
def test_the_whole_drain_fits_the_termination_grace_period(directory: str) -> None:
    # SIGTERM reaches both containers together (tunnelgate after its preStop, if any).
    # cloudflared waits all of its --grace-period; tunnelgate serves what it hands over
    # until its metrics endpoint is gone (within tunnelgate's own grace), then gives
    # requests still in flight FINISH_MARGIN more.
    deployment = _one(directory, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    tunnelgate, cloudflared = (_container(deployment, n) for n in ("tunnelgate", "cloudflared"))
    flags = _serve_flags(tunnelgate["args"])
    assert flags["--cloudflared-metrics-url"] == "http://127.0.0.1:20241/metrics"
    cf_args = cloudflared["args"]
    assert cf_args[cf_args.index("--metrics") + 1] == "127.0.0.1:20241"
    cf_grace = parse_duration(cf_args[cf_args.index("--grace-period") + 1])
    grace = parse_duration(str(flags.get("--grace-period", "30s")))
    pre_stop = tunnelgate.get("lifecycle", {}).get("preStop", {}).get("exec", {})
    pause = int(pre_stop["command"][1]) if pre_stop else 0
    assert cf_grace <= pause + grace  # tunnelgate outlasts cloudflared's drain
    assert pause + grace + FINISH_MARGIN < pod["terminationGracePeriodSeconds"]
    assert cf_grace + KILL_MARGIN <= pod["terminationGracePeriodSeconds"]


def test_sidecar_routes_file_is_a_valid_httproute_config() -> None:
    deployment = _one("sidecar", "Deployment")
    path = str(_serve_flags(_container(deployment, "tunnelgate")["args"])["--config"])
    config = httproutes_to_config(_mounted_file(deployment, "tunnelgate", path))
    urls: list[Any] = [b.url for rule in config.rules for b in rule.backends]
    assert urls == ["http://api.web.svc.cluster.local:8080",
                    "http://frontend.web.svc.cluster.local:80"]


# --------------------------------------------------------------------------- in-cluster


def test_in_cluster_tls_listener_serves_the_mounted_secret() -> None:
    deployment = _one("in-cluster", "Deployment")
    tunnelgate = _container(deployment, "tunnelgate")
    flags = _serve_flags(tunnelgate["args"])
    directory = str(flags["--tls-cert-dir"])
    secret = _mounted_volume(deployment, "tunnelgate", directory)["secret"]
    # The Gateway's HTTPS listener names the Secret the pod mounts.
    text = _mounted_file(deployment, "tunnelgate", str(flags["--config"]), "in-cluster")
    gateway = next(d for d in yaml.safe_load_all(text) if d["kind"] == "Gateway")
    check_gateway_api(gateway)
    https = next(item for item in gateway["spec"]["listeners"] if item["protocol"] == "HTTPS")
    assert https["tls"]["certificateRefs"] == [{"name": secret["secretName"]}]
    # The Service's https port reaches the TLS entrance's container port.
    ports = {p["name"]: p["containerPort"] for p in tunnelgate["ports"]}
    service = next(d for d in _in("in-cluster", "Service")
                   if not d["spec"].get("clusterIP"))
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert by_name["https"]["port"] == 443 and by_name["http"]["port"] == 80
    assert ports[by_name["https"]["targetPort"]] == int(str(flags["--listen-tls"])[1:])
    assert ports[by_name["http"]["targetPort"]] == int(str(flags["--listen"])[1:])


def test_in_cluster_routes_are_placed_by_their_listeners() -> None:
    deployment = _one("in-cluster", "Deployment")
    path = str(_serve_flags(_container(deployment, "tunnelgate")["args"])["--config"])
    config = httproutes_to_config(_mounted_file(deployment, "tunnelgate", path, "in-cluster"))
    placed = {rule.hostnames[0]: rule.entrances for rule in config.rules}
    assert placed == {"catalog.shop.svc.cluster.local": None,
                      "payments.shop.svc.cluster.local": ("cluster-tls",)}
