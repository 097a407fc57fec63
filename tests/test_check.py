"""``tunnelgate check`` warnings (exact messages), ``--strict``, ``--backend``, ``convert``,
YAML error locations, and ``check``/``explain`` into a closed pipe."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from proxy.control.cli import main
from tests.test_cli import ROOT, clean_env, cli


def _route(rules: str, name: str = "web", namespace: str = "shop",
           hostnames: str = "[shop.example.com]") -> str:
    """One HTTPRoute document; ``rules`` is the YAML list under spec.rules."""
    return (f"apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n"
            f"metadata: {{name: {name}, namespace: {namespace}}}\n"
            f"spec:\n  hostnames: {hostnames}\n  rules:\n"
            + textwrap.indent(textwrap.dedent(rules), "  "))


def _wire(*rules: dict, version: int | None = 1) -> str:
    config: dict = {"rules": list(rules)}
    if version is not None:
        config["version"] = version
    return json.dumps(config)


def _rule(path: str = "/", kind: str = "PathPrefix", host: str | None = "a.example.com",
          **match: object) -> dict:
    rule: dict = {"matches": [{"path": {"type": kind, "value": path}, **match}],
                  "backends": [{"url": "http://127.0.0.1:9", "weight": 1}]}
    if host is not None:
        rule["hostnames"] = [host]
    return rule


H = [{"type": "Exact", "name": "X-Env", "value": "beta"}]
CART = "- backendRefs: [{name: cart, port: 8080}]\n"

# (file name, content, the exact warnings on stderr; {f} is the file's path)
CASES = [
    pytest.param("clean.json", _wire(_rule("/api"), _rule("/")), [], id="clean-json"),
    pytest.param("clean.yaml", _route(CART), [], id="clean-yaml"),
    pytest.param("empty.json", _wire(), [
        "{f}: warning: no routes: every request is answered 404"], id="zero-routes-json"),
    # Beside routes of the file's own, a ConfigMap is just another skipped document.
    pytest.param("cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
                 "---\n" + _route(CART), [
        '{f}:2: warning: documents[0].kind: skipped: kind "ConfigMap" is not an HTTPRoute'],
        id="skipped-configmap"),
    pytest.param("typo.yaml", _route(CART).replace("kind: HTTPRoute", "kind: HTTPRoutes")
                 + "---\n" + _route(CART, name="other"), [
        '{f}:2: warning: documents[0].kind: skipped: kind "HTTPRoutes" is not an '
        "HTTPRoute (did you mean HTTPRoute?)"], id="skipped-httproutes"),
    pytest.param("noversion.json", _wire(_rule(), version=None), [
        "{f}: warning: version is missing or 0: the config is accepted, but the proxy "
        "reports not ready while it serves it"], id="missing-version"),
    pytest.param("status.json", _wire({**_rule(), "unavailableStatus": 503}), [
        "{f}: warning: rules[0]: unavailableStatus 503: every request it matches is "
        "answered with that status"], id="unavailable-rule-json"),
    pytest.param("bstatus.json", _wire({**_rule(), "backends": [
        {"url": "http://127.0.0.1:9", "weight": 1},
        {"url": "http://127.0.0.1:9", "weight": 1, "unavailableStatus": 500}]}), [
        "{f}: warning: rules[0].backends[1]: unavailableStatus 500: its share of the "
        "requests is answered with that status"], id="unavailable-backend-json"),
    pytest.param("ext.yaml", _route("""\
        - filters:
          - {type: ExtensionRef, extensionRef: {group: example.io, kind: Auth, name: a}}
          backendRefs: [{name: cart, port: 8080}]
        """), [
        '{f}:8: warning: HTTPRoute shop/web: documents[0].spec.rules[0].filters[0].type: '
        'filter type "ExtensionRef" is not supported: the rule answers 500'],
        id="unsupported-rule-filter"),
    pytest.param("bext.yaml", _route("""\
        - backendRefs:
          - name: cart
            port: 8080
            filters: [{type: ExternalAuth, externalAuth: {protocol: HTTP}}]
        """), [
        "{f}:10: warning: HTTPRoute shop/web: documents[0].spec.rules[0].backendRefs[0]"
        '.filters[0].type: filter type "ExternalAuth" is not supported: this backend '
        "answers 500"], id="unsupported-backend-filter"),
    pytest.param("kind.yaml", _route("""\
        - backendRefs:
          - {name: cart, port: 8080}
          - {group: example.io, kind: Bucket, name: b}
        """), [
        "{f}:9: warning: HTTPRoute shop/web: documents[0].spec.rules[0].backendRefs[1]: "
        'kind "Bucket" (group "example.io") is not a Service: this backend answers 500'],
        id="non-service-backend"),
    pytest.param("retry.yaml", _route("""\
        - backendRefs: [{name: cart, port: 8080}]
          retry: {attempts: 2}
          sessionPersistence: {sessionName: s}
        """), [
        "{f}:9: warning: HTTPRoute shop/web: documents[0].spec.rules[0]."
        "sessionPersistence: ignored: tunnelgate has no session affinity"],
        id="dropped-retry-session"),
    pytest.param("mirror.yaml", _route("""\
        - backendRefs: [{name: cart, port: 8080}]
          filters:
          - type: RequestMirror
            requestMirror:
              backendRef: {kind: Bucket, group: example.io, name: b}
        """), [
        "{f}:11: warning: HTTPRoute shop/web: documents[0].spec.rules[0].filters[0]."
        'requestMirror.backendRef: kind "Bucket" (group "example.io") is not a Service: '
        "the mirror is dropped"], id="dropped-mirror"),
    # Shadowing: certain cases are reported, with the rule (or YAML rule) and its cover.
    pytest.param("same.json", _wire(_rule("/api"), _rule("/api")), [
        "{f}: warning: rules[1]: can never match: each of its matches is shadowed by an "
        "earlier match that covers it (rules[0].matches[0])"], id="shadow-duplicate"),
    # "/api/" sorts first (longer) and accepts exactly what "/api" does.
    pytest.param("slash.json", _wire(_rule("/api"), _rule("/api/")), [
        "{f}: warning: rules[0]: can never match: each of its matches is shadowed by an "
        "earlier match that covers it (rules[1].matches[0])"], id="shadow-trailing-slash"),
    pytest.param("longer.json", _wire(_rule("/api"), _rule("/api/v1")), [],
                 id="longer-prefix-first-is-no-shadow"),
    pytest.param("exact.json", _wire(
        _rule("/a", kind="Exact"), _rule("/a", kind="Exact", method="GET"),
        _rule("/a", kind="Exact", method="GET")), [
        "{f}: warning: rules[2]: can never match: each of its matches is shadowed by an "
        "earlier match that covers it (rules[1].matches[0])"], id="shadow-exact-method"),
    pytest.param("regex.json", _wire(
        _rule("/v[0-9]+", kind="RegularExpression"),
        _rule("/v[0-9]+", kind="RegularExpression", method="GET"),
        _rule("/v[0-9]+", kind="RegularExpression"),
        _rule("/v[0-9]*", kind="RegularExpression")), [
        "{f}: warning: rules[2]: can never match: each of its matches is shadowed by an "
        "earlier match that covers it (rules[0].matches[0])"], id="shadow-same-regex"),
    pytest.param("hdr.json", _wire(
        _rule("/", headers=[{"type": "RegularExpression", "name": "x-env", "value": "b.*"}]),
        _rule("/", headers=H + [{"type": "Exact", "name": "X-B", "value": "1"}]),
        _rule("/", headers=H)), [
        "{f}: warning: rules[2]: can never match: each of its matches is shadowed by an "
        "earlier match that covers it (rules[0].matches[0])"], id="shadow-header-regex"),
    pytest.param("multi.json", _wire(
        {**_rule("/a"), "matches": [{"path": {"type": "PathPrefix", "value": "/a"}},
                                     {"path": {"type": "Exact", "value": "/b/c"}}]},
        {**_rule("/a/x"), "matches": [{"path": {"type": "PathPrefix", "value": "/a"},
                                        "method": "GET"}]},
        {**_rule(), "matches": [{"path": {"type": "PathPrefix", "value": "/a"}},
                                {"path": {"type": "Exact", "value": "/b/c"}}]},
        {**_rule(), "matches": [{"path": {"type": "PathPrefix", "value": "/a"}},
                                {"path": {"type": "Exact", "value": "/b/d"}}]}), [
        "{f}: warning: rules[2]: can never match: each of its matches is shadowed by an "
        "earlier match that covers it (rules[0].matches[1], rules[0].matches[0])"],
        id="shadow-every-match-or-none"),
    pytest.param("hosts.json", _wire(_rule("/"), {**_rule("/"), "hostnames": [
        "a.example.com", "b.example.com"]}, _rule("/", host=None)), [],
        id="other-bucket-keeps-it-alive"),
    pytest.param("entrance.json", _wire({**_rule(), "entrances": ["tunnel"]}, _rule(),
                                        {**_rule(), "entrances": ["tunnel"]}), [
        "{f}: warning: rules[2]: can never match: each of its matches is shadowed by an "
        "earlier match that covers it (rules[0].matches[0])"], id="shadow-entrances"),
    pytest.param("shadow.yaml", _route(CART + CART), [
        "{f}:8: warning: HTTPRoute shop/web: documents[0].spec.rules[1]: can never match: "
        "each of its matches is shadowed by an earlier match that covers it "
        "(documents[0].spec.rules[0].matches[0])"], id="shadow-yaml"),
]


@pytest.mark.parametrize("name,content,expected", CASES)
def test_check_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                        content: str, expected: list[str]) -> None:
    path = tmp_path / name
    path.write_text(content)
    assert main(["check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{path}: valid")
    assert err.splitlines() == [line.format(f=path) for line in expected]
    strict = main(["check", "--strict", str(path)])
    assert strict == (1 if expected else 0)
    if expected:
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"tunnelgate: {path}: {len(expected)} warning(s) and --strict")


def test_strict_exit_status_of_the_command(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_text(_wire())
    assert cli("check", str(path)).returncode == 0
    done = cli("check", "--strict", str(path))
    assert done.returncode == 1
    assert "no routes" in done.stderr


# --------------------------------------------------------------------------- YAML errors


@pytest.mark.parametrize("content,expected", [
    pytest.param(_route(CART + "- filters: [{type: RequestHeaderModifer, "
                        "requestHeaderModifier: {}}]\n"), '{f}:8: HTTPRoute shop/web: documents[0].spec.rules[1].filters[0].type: '
              'unknown filter type "RequestHeaderModifer" (did you mean '
              '"RequestHeaderModifier"?)', id="mistyped-filter-type"),
    pytest.param(_route("- filters: [{type: Frobnicate, frobnicate: {}}]\n"),
                 '{f}:7: HTTPRoute shop/web: documents[0].spec.rules[0].filters[0].type: '
                 'unknown filter type "Frobnicate"', id="unknown-filter-type"),
    pytest.param("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n" + _route("""\
        - backendRefs:
          - name: cart
        """, name="second", namespace="apps"),
        "{f}:12: HTTPRoute apps/second: documents[1].spec.rules[0].backendRefs[0].port: "
        "a Service reference needs a port", id="error-in-second-document"),
    pytest.param("kind: HTTPRoute\nspec: [\n", "{f}:3: invalid YAML: while parsing a flow node "
                 "expected the node content, but found '<stream end>'", id="syntax"),
])
def test_yaml_errors_name_file_line_and_route(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              content: str, expected: str) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(content)
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == ["tunnelgate: " + expected.format(f=path)]


def test_unknown_filter_type_in_json_is_rejected_the_same_way(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    path = tmp_path / "c.json"
    path.write_text(_wire({**_rule(), "filters": [{"type": "Frobnicate"}]}))
    assert main(["check", str(path)]) == 1
    assert capsys.readouterr().err.strip() == (
        f'tunnelgate: {path}: rules[0].filters[0].type: unknown filter type "Frobnicate"')


# --------------------------------------------------------------------------- --backend, convert


def test_backend_flag_maps_service_refs(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(_route(CART))
    assert main(["convert", str(path), "--backend", "cart.shop=http://127.0.0.1:9000"]) == 0
    wire = json.loads(capsys.readouterr().out)
    assert wire == {"version": 1, "rules": [{
        "hostnames": ["shop.example.com"],
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backends": [{"url": "http://127.0.0.1:9000", "weight": 1}]}]}
    assert main(["explain", str(path), "--host", "shop.example.com", "--path", "/",
                 "--backend", "cart.shop=http://127.0.0.1:9000"]) == 0
    assert "backend http://127.0.0.1:9000 weight 1" in capsys.readouterr().out
    assert main(["check", str(path), "--backend", "cart.shop=http://127.0.0.1:9000",
                 "--backend", "cart.other=http://127.0.0.1:9001"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"{path}: warning: --backend cart.other matches no Service reference"]


@pytest.mark.parametrize("value", ["cart=http://x", "cart.shop", "cart.shop=ftp://x",
                                   ".shop=http://x", "a.b.c=http://x"])
def test_bad_backend_flag_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  value: str) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(_route(CART))
    assert main(["check", str(path), "--backend", value]) == 2
    assert capsys.readouterr().err.startswith("tunnelgate: --backend: ")


def test_convert_of_wire_json_normalises_it(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    path.write_text(_wire(_rule("/api"), version=7))
    assert main(["convert", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"version": 7, "rules": [_rule("/api")]}


# --------------------------------------------------------------------------- closed pipes


@pytest.mark.parametrize("command", [
    ["check"], ["explain", "--host", "h0.example.com", "--path", "/x"], ["convert"]])
def test_output_into_a_closed_pipe_exits_quietly(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "big.json"
    # Output far beyond a pipe buffer (64 KiB), so writes hit the closed pipe.
    path.write_text(_wire(*(_rule(f"/p{i}", host="h0.example.com") for i in range(3000))))
    producer = subprocess.Popen([sys.executable, "-m", "proxy", command[0], str(path),
                                 *command[1:]], cwd=ROOT, env=clean_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert producer.stdout is not None and producer.stderr is not None
    head = subprocess.run(["head", "-n", "1"], stdin=producer.stdout, capture_output=True,
                          timeout=60)
    producer.stdout.close()  # only head holds the read end now; it has exited
    stderr = producer.stderr.read().decode()
    assert producer.wait(timeout=60) == 141
    assert head.stdout
    assert stderr == ""


# --------------------------------------------------------------------------- make run


def test_demo_logs_the_build_and_advises_enough_tries_for_the_split() -> None:
    demo = subprocess.Popen([sys.executable, "-m", "proxy", "demo"], cwd=ROOT,
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert demo.stderr is not None and demo.stdout is not None
        first = demo.stderr.readline()
        assert "msg=starting" in first and " build=" in first, first
        banner = ""
        for _ in range(40):  # the banner ends with the Ctrl-C line
            banner += demo.stdout.readline()
            if "Ctrl-C" in banner:
                break
    finally:
        demo.kill()
        demo.wait(timeout=10)
    tries = int(re.search(r"seq (\d+)\)", banner).group(1))  # type: ignore[union-attr]
    assert 0.9 ** tries < 0.001  # all-blue for a 90/10 split must be rare
    assert "uniq -c" in banner
