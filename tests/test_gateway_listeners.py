"""Gateway listeners in an HTTPRoute YAML file decide the entrances of its routes:
``HTTP`` → tunnel and cluster, ``HTTPS`` → cluster-tls (``routing.listeners``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from routing.gateway_api import convert
from routing.model import ConfigError
from tests.helpers import HOST, TLSFiles, TestBackend, make_tls
from tests.stack import running
from tests.test_tls import Conn, connect

GATEWAY = """\
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: infra}
spec:
  gatewayClassName: tunnelgate
  listeners:
  - {name: http, port: 80, protocol: HTTP}
  - {name: https, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: web-tls}]}}
  - {name: tls-passthrough, port: 8443, protocol: TLS}
"""


def route(name: str, parent_refs: Any, host: str | None = None) -> str:
    hostnames = f"\n  hostnames: [{host}]" if host else ""
    return f"""\
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: shop}}
spec:
  parentRefs: {parent_refs}{hostnames}
  rules: [{{backendRefs: [{{name: cart, port: 8080}}]}}]
"""


ATTACHMENTS = [  # (parentRefs, entrances on the wire; None = none listed: everywhere)
    ("[{name: gw, namespace: infra, sectionName: https}]", ["cluster-tls"]),
    ("[{name: gw, namespace: infra, port: 443}]", ["cluster-tls"]),
    ("[{name: gw, namespace: infra, sectionName: http}]", ["tunnel", "cluster"]),
    ("[{name: gw, namespace: infra, port: 80}]", ["tunnel", "cluster"]),
    ("[{name: gw, namespace: infra}]", None),
    ("[{name: gw, namespace: infra, sectionName: http}, "
     "{name: gw, namespace: infra, sectionName: https}]", None),
    ("[{name: gw, namespace: infra, sectionName: tls-passthrough}]", []),
    ("[{name: gw, namespace: infra, sectionName: nope}]", []),
    ("[{name: gw, namespace: infra, sectionName: https, port: 80}]", []),
    ("[{name: gw}]", None),  # Gateway default/gw: not in the file
    ("[{name: other, namespace: infra, sectionName: https}]", None),
    ("[{name: gw, namespace: infra, sectionName: https}, {name: elsewhere}]",
     ["cluster-tls"]),
]


@pytest.mark.parametrize(("parent_refs", "expected"), ATTACHMENTS)
def test_listeners_choose_the_entrances(parent_refs: str, expected: list[str] | None
                                        ) -> None:
    rule = convert(GATEWAY + route("r", parent_refs)).wire["rules"][0]
    assert rule.get("entrances") == expected


def test_without_gateway_documents_parent_refs_change_nothing() -> None:
    rule = convert(route("r", "[{name: gw, namespace: infra, sectionName: https}]")
                   ).wire["rules"][0]
    assert "entrances" not in rule


def test_a_reference_attaching_nowhere_is_noted_not_an_error() -> None:
    conversion = convert(GATEWAY + route("r", "[{name: gw, namespace: infra, "
                                              "sectionName: nope}]"))
    assert [note.path for note in conversion.notes] == ["documents[1].spec.parentRefs[0]"]


def test_a_malformed_parent_ref_names_its_field() -> None:
    with pytest.raises(ConfigError) as caught:
        convert(GATEWAY + route("r", "[{sectionName: https}]"))
    assert caught.value.path == "documents[1].spec.parentRefs[0]"


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return make_tls(str(tmp_path_factory.mktemp("gw")), "DNS:*.example.com", "gw")


async def test_an_https_listener_route_is_served_over_tls_only(cert: TLSFiles) -> None:
    text = (GATEWAY
            + route("secure", "[{name: gw, namespace: infra, sectionName: https}]",
                    "secure.example.com")
            + route("plain", "[{name: gw, namespace: infra, sectionName: http}]",
                    "plain.example.com"))
    async with TestBackend() as backend:
        wire = convert(text, {"cart.shop": backend.url}).wire
        async with running("--listen", f"{HOST}:0", "--listen-tls", f"{HOST}:0",
                           "--tls-cert", cert.cert, "--tls-key", cert.key,
                           config=wire) as stack:
            tls = await connect(stack.tls_port, "secure.example.com")
            over_tls = [(await tls.get(h)).status
                        for h in ("secure.example.com", "plain.example.com")]
            tls.close()
            plain = Conn(*await asyncio.open_connection(HOST, stack.cluster_port))
            in_clear = [(await plain.get(h)).status
                        for h in ("secure.example.com", "plain.example.com")]
            plain.close()
    assert over_tls == [200, 404]
    assert in_clear == [404, 200]
