"""A backend's (or a mirror's) ``tls`` object: read from the wire and written back."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from routing.fields import bounded_string, bounded_strings
from routing.model import BackendTLS, ConfigError
from routing.node import Node

_KEYS = frozenset(("caBundle", "serverName", "subjectAltNames", "subjectAltNameUris",
                   "clientCertPem", "clientKeyPem"))


def read_tls(value: Any, path: str) -> BackendTLS:
    """The validated ``tls`` object ``value`` (decoded JSON) at ``path``."""
    node = Node(value, path, _KEYS)
    return BackendTLS(
        ca_bundle=node.string("caBundle"),
        server_name=bounded_string(node, "serverName", "hostname"),
        subject_alt_names=node.items("subjectAltNames", bounded_strings("hostname")),
        subject_alt_name_uris=node.items("subjectAltNameUris", bounded_strings("URI")),
        client_cert_pem=_base64(node, "clientCertPem"),
        client_key_pem=_base64(node, "clientKeyPem"),
    )


def _base64(node: Node, key: str) -> bytes:
    """Go ``[]byte`` fields travel as standard base64 (Go's JSON encoding)."""
    text = node.string(key)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(node.at(key), "expected standard base64") from None


def tls_wire(t: BackendTLS) -> dict:
    """``t`` in wire form (the inverse of :func:`read_tls`), empty fields left out."""
    out: dict[str, Any] = {}
    for key, value in (("caBundle", t.ca_bundle), ("serverName", t.server_name)):
        if value:
            out[key] = value
    for key, values in (("subjectAltNames", t.subject_alt_names),
                        ("subjectAltNameUris", t.subject_alt_name_uris)):
        if values:
            out[key] = list(values)
    for key, data in (("clientCertPem", t.client_cert_pem), ("clientKeyPem", t.client_key_pem)):
        if data:
            out[key] = base64.b64encode(data).decode("ascii")
    return out
