"""``XBackendTrafficPolicy`` documents (GEP-3388) → the retry budget of each Service.

A policy (``gateway.networking.x-k8s.io/v1alpha1``) names Services in its namespace
with ``spec.targetRefs`` and gives them ``spec.retryConstraint``; the HTTPRoute
conversion (:mod:`routing.gateway_api`) puts that constraint, in wire form, on every
backend made from a reference to one of them. Only ``retryConstraint`` is read
(``sessionPersistence`` is accepted and not acted on); a malformed one is an error
naming its field, as the wire format's is.
"""

from __future__ import annotations

from typing import Any, Iterator

from routing.model import ConfigError
from routing.validate import read_retry_constraint
from routing.wire import constraint_wire

KIND = "XBackendTrafficPolicy"
API_VERSION = "gateway.networking.x-k8s.io/v1alpha1"
_SPEC_KEYS = frozenset(("targetRefs", "retryConstraint", "sessionPersistence"))


def read_retry_constraints(docs: list[Any]) -> dict[str, dict]:
    """``"NAME.NAMESPACE"`` of each targeted Service → its wire ``retryConstraint``
    (a later policy for the same Service wins, as the last applied would)."""
    found: dict[str, dict] = {}
    for doc, path in _documents(docs, "documents"):
        if doc.get("kind") != KIND:
            continue
        if doc.get("apiVersion") != API_VERSION:
            raise ConfigError(f"{path}.apiVersion",
                              f"{KIND} must be {API_VERSION}, got {doc.get('apiVersion')!r}")
        metadata = doc.get("metadata")
        namespace = "default"
        if isinstance(metadata, dict) and metadata.get("namespace"):
            namespace = str(metadata["namespace"])
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}.spec", "expected a mapping")
        for key in spec:
            if key not in _SPEC_KEYS:
                raise ConfigError(f"{path}.spec.{key}", "unknown field")
        if spec.get("retryConstraint") is None:
            continue
        wire = constraint_wire(read_retry_constraint(spec["retryConstraint"],
                                                     f"{path}.spec.retryConstraint"))
        for name in _service_targets(spec.get("targetRefs"), f"{path}.spec.targetRefs"):
            found[f"{name}.{namespace}"] = wire
    return found


def _service_targets(refs: Any, path: str) -> Iterator[str]:
    if not isinstance(refs, list) or not refs:
        raise ConfigError(path, "at least one target reference is required")
    for i, ref in enumerate(refs):
        if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
            raise ConfigError(f"{path}[{i}]", "expected a reference with a name")
        if ref.get("group", "") in ("", "core") and ref.get("kind", "Service") == "Service":
            yield ref["name"]


def _documents(docs: list[Any], path: str) -> Iterator[tuple[dict, str]]:
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            yield from _documents(doc["items"], f"{path}[{i}].items")
        else:
            yield doc, f"{path}[{i}]"
