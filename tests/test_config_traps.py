"""Config traps a new user hit (issue 39), through the CLI as a subprocess: weight-0
backends, a ConfigMap manifest given to ``check``, ``check -``, hostnames for the
cloudflared ingress, and Gateway API length limits on HTTPRoute YAML. (The config API's
side of these is in tests/test_admin.py and tests/test_routing_config.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import AsyncIterator

import pytest

from proxy.control.demo import start_backend
from tests.test_cli import ROOT, Served, clean_env, cli

NO_WEIGHT = '{"version":1,"rules":[{"hostnames":["a.example.com"],' \
            '"backends":[{"url":"http://127.0.0.1:9000"}]}]}'
UNWEIGHTED = ("every backend has weight 0 (on the wire an absent weight is 0, never 1), "
              "so none is ever chosen: every request the rule matches is answered 500")
BACKENDLESS = ("no backends and no filter that answers by itself, so every request the "
               "rule matches is answered 500 (Gateway API: a rule that forwards nowhere)")


def _route(rules: str) -> str:
    return ("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n"
            "metadata: {name: web, namespace: shop}\nspec:\n  hostnames: [shop.example.com]\n"
            "  rules:\n" + textwrap.indent(textwrap.dedent(rules), "  "))


def _configmap(data: dict[str, str], name: str = "routes") -> str:
    """A ConfigMap manifest whose data values are literal blocks, as kubectl writes."""
    lines = ["apiVersion: v1", "kind: ConfigMap",
             f"metadata: {{name: {name}, namespace: edge}}", "data:"]
    for key, value in data.items():
        lines.append(f"  {key}: |")
        lines += [f"    {line}" for line in value.splitlines()]
    return "\n".join(lines) + "\n"


def _line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


# --------------------------------------------------------------------------- weight 0

@pytest.mark.parametrize("name, content, warnings", [
    pytest.param("nw.json", NO_WEIGHT, [f"{{f}}: warning: rules[0]: {UNWEIGHTED}"],
                 id="absent-weight"),
    pytest.param("zeros.json", json.dumps({"version": 1, "rules": [
        {"hostnames": ["a.example.com"], "backends": [
            {"url": "http://127.0.0.1:9", "weight": 1}]},
        {"hostnames": ["b.example.com"], "backends": [
            {"url": "http://127.0.0.1:9", "weight": 0},
            {"url": "http://127.0.0.1:9"}]}]}),
        [f"{{f}}: warning: rules[1]: {UNWEIGHTED}"], id="all-zero-of-two"),
    pytest.param("zero.yaml", _route("- backendRefs: [{name: cart, port: 80, weight: 0}]\n"),
                 [f"{{f}}:7: warning: HTTPRoute shop/web: documents[0].spec.rules[0]: "
                  f"{UNWEIGHTED}"], id="yaml-weight-0"),
    pytest.param("half.yaml", _route("- backendRefs:\n  - {name: a, port: 80, weight: 0}\n"
                                     "  - {name: b, port: 80}\n"), [], id="yaml-one-weighs"),
    pytest.param("none.json", json.dumps({"version": 1, "rules": [
        {"hostnames": ["a.example.com"], "backends": []},
        {"hostnames": ["b.example.com"], "filters": [{
            "type": "RequestRedirect",
            "requestRedirect": {"statusCode": 301, "hostname": "c.example.com"}}]}]}),
        [f"{{f}}: warning: rules[0]: {BACKENDLESS}"], id="no-backends"),
    pytest.param("status.json", json.dumps({"version": 1, "rules": [{
        "unavailableStatus": 503, "backends": [{"url": "http://127.0.0.1:9"}]}]}),
        ["{f}: warning: rules[0]: unavailableStatus 503: every request it matches is "
         "answered with that status"], id="own-status-not-500"),
])
def test_check_strict_fails_on_rules_whose_backends_all_weigh_0(
        tmp_path: Path, name: str, content: str, warnings: list[str]) -> None:
    path = tmp_path / name
    path.write_text(content)
    done = cli("check", "--strict", str(path))
    expected = [w.format(f=path) for w in warnings]
    assert done.stderr.splitlines()[:len(expected)] == expected
    assert done.returncode == (1 if warnings else 0), done.stderr
    assert done.stdout.startswith(f"{path}: valid")  # accepted: only a warning


@pytest.fixture
async def backend() -> AsyncIterator[int]:
    server, port = await start_backend("blue")
    yield port
    server.close()


async def test_serve_logs_one_warning_per_config_naming_the_unweighted_rules(
        tmp_path: Path, backend: int) -> None:
    url = f"http://127.0.0.1:{backend}"
    path = tmp_path / "start.json"
    path.write_text(json.dumps({"version": 1, "rules": [
        {"hostnames": ["a.example.com"], "backends": [{"url": url}]},
        {"hostnames": ["b.example.com"], "backends": [{"url": url, "weight": 1}]},
        {"hostnames": ["c.example.com"], "backends": [{"url": url, "weight": 0}]}]}))
    async with Served("--config", str(path)) as served:
        answer = await served.data.get("/", headers={"Host": "a.example.com"})
        assert (answer.status_code, answer.text) == (
            500, "no backend available for this route\n")
        assert (await served.data.get("/", headers={"Host": "b.example.com"})).json()[
            "backend"] == "blue"
        weighted = {"version": 2, "rules": [
            {"hostnames": ["a.example.com"], "backends": [{"url": url, "weight": 1}]}]}
        assert (await served.push(weighted)).status_code == 200
        served.signal(signal.SIGTERM)
        assert await served.wait() == 0
        assert served.proc is not None
        lines = [line for line in served.proc.stderr.read().splitlines()
                 if "backends all weigh 0" in line]
    assert len(lines) == 1  # the file's config; the weighted push says nothing
    assert "level=warning" in lines[0] and 'rules="rules[0], rules[2]"' in lines[0]
    assert "count=2" in lines[0] and "version=1" in lines[0]


# --------------------------------------------------------------------------- ConfigMaps

def test_check_reads_the_routes_inside_the_shipped_configmap() -> None:
    done = cli("check", "--strict", "deploy/sidecar/routes.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "deploy/sidecar/routes.yaml: valid (ConfigMap tunnelgate/tunnelgate-routes, "
        "data key routes.yaml); version 1\n2 rule(s)")
    assert "http://api.web.svc.cluster.local:8080" in done.stdout


def test_an_error_inside_a_configmap_names_the_manifest_line(tmp_path: Path) -> None:
    manifest = _configmap({"routes.yaml": _route(
        "- backendRefs: [{name: cart, port: 80}]\n"
        "  matches: [{path: {type: Exact, value: cart}}]\n")})
    path = tmp_path / "cm.yaml"
    path.write_text(manifest)
    done = cli("check", str(path))
    assert done.returncode == 1
    assert done.stderr == (
        f"tunnelgate: {path}:{_line_of(manifest, 'value: cart')}: HTTPRoute shop/web: "
        "documents[0].spec.rules[0].matches[0].path.value: path 'cart' must start "
        "with '/'\n")


def test_wire_json_inside_a_configmap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "cm.yaml"
    path.write_text(_configmap({"config.json": NO_WEIGHT, "note.txt": "hello"}))
    done = cli("check", str(path))
    assert done.returncode == 0, done.stderr
    assert "(ConfigMap edge/routes, data key config.json); version 1" in done.stdout
    assert f"{path}: warning: rules[0]: {UNWEIGHTED}" in done.stderr


@pytest.mark.parametrize("manifest, needles", [
    pytest.param(None, ["deploy/sidecar/cloudflared-config.yaml:12: documents[0]: "
                        "ConfigMap tunnelgate/cloudflared: no data key holds HTTPRoute "
                        "YAML or wire JSON", "pass the routes file itself"],
                 id="no-routes"),
    pytest.param(_configmap({"a.yaml": _route("- backendRefs: [{name: a, port: 80}]\n"),
                             "b.json": NO_WEIGHT}),
                 ["documents[0].data: more than one data key holds routes "
                  "(ConfigMap edge/routes, data key a.yaml; ConfigMap edge/routes, data "
                  "key b.json)", "| tunnelgate check -"], id="two-configs"),
])
def test_a_configmap_without_one_config_fails_loudly(
        tmp_path: Path, manifest: str | None, needles: list[str]) -> None:
    path = "deploy/sidecar/cloudflared-config.yaml"
    if manifest is not None:
        path = str(tmp_path / "cm.yaml")
        Path(path).write_text(manifest)
    done = cli("check", path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"tunnelgate: {path}:")
    assert all(needle in done.stderr for needle in needles), done.stderr


# --------------------------------------------------------------------------- check -

@pytest.mark.parametrize("text, rc, needle", [
    (NO_WEIGHT, 0, "<stdin>: valid; version 1\n1 rule(s)"),
    (_route("- backendRefs: [{name: cart, port: 80}]\n"), 0, "<stdin>: valid; version 1"),
    ('{"version": 1, "rules": [{"hostnames": ["a b"]}]}', 1,
     "tunnelgate: <stdin>: rules[0].hostnames[0]: invalid hostname 'a b'"),
], ids=["json", "yaml-by-content", "error-names-stdin"])
def test_check_dash_reads_standard_input(text: str, rc: int, needle: str) -> None:
    done = subprocess.run([sys.executable, "-m", "proxy", "check", "-"], cwd=ROOT,
                          env=clean_env(), input=text, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == rc, done.stderr
    assert needle in (done.stdout if rc == 0 else done.stderr)


# --------------------------------------------------------------------------- hostnames

@pytest.mark.parametrize("hostname, reason", [
    ("bad_host", "not an RFC 1123 name"),
    ("hello.default.svc.cluster.local", "a cluster-local name"),
    ("*.svc.cluster.local", "a cluster-local name"),
    ("hello.default.svc", "a cluster-local name"),
    ("localhost", "a single label is no public name"),
    ("a" * 64 + ".example.com", f"label '{'a' * 64}' is 64 characters long, more than "
                                "the limit of 63"),
])
def test_cloudflared_config_refuses_hostnames_it_must_not_publish(
        hostname: str, reason: str) -> None:
    done = cli("cloudflared-config", "--hostname", "app.example.com", "--hostname", hostname)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"tunnelgate: ingress hostname {hostname!r}: {reason}")


def test_cloudflared_config_hostname_has_help() -> None:
    done = cli("cloudflared-config", "--help")
    assert done.returncode == 0
    assert "--hostname HOST  a public hostname to route to the tunnel" in done.stdout
    assert "cluster-local" in done.stdout


# --------------------------------------------------------------------------- lengths

def test_httproute_yaml_keeps_the_crd_length_limits(tmp_path: Path) -> None:
    text = _route("- backendRefs: [{name: cart, port: 80}]\n  filters:\n"
                  "  - type: RequestHeaderModifier\n    requestHeaderModifier:\n"
                  f"      set: [{{name: X-Big, value: {'v' * 4097}}}]\n")
    path = tmp_path / "big.yaml"
    path.write_text(text)
    done = cli("check", str(path))
    assert done.returncode == 1
    assert done.stderr == (
        f"tunnelgate: {path}:{_line_of(text, 'X-Big')}: HTTPRoute shop/web: "
        "documents[0].spec.rules[0].filters[0].requestHeaderModifier.set[0].value: "
        "header value is 4097 characters long, more than the limit of 4096\n")
