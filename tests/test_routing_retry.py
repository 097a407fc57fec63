"""The pure side of retries, budgets and ejection (``routing.retry``,
``routing.ejection``), their wire form and validation, HTTPRoute YAML with ``retry`` and
``XBackendTrafficPolicy``, and how ``explain`` shows them: tables of cases."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from routing import retry
from routing.config import parse_config
from routing.decide import EntranceScope, explain
from routing.ejection import avoided
from routing.gateway_api import convert
from routing.model import ConfigError, Retry, RetryConstraint
from routing.table import Table
from routing.wire import to_wire


@pytest.mark.parametrize("nth, rand, low, high", [
    (1, 0.0, 0.1, 0.1), (1, 0.999, 0.1, 0.2), (2, 0.999, 0.1, 0.4),
    (3, 0.5, 0.1, 0.8), (10, 0.999, 0.1, 1.0),  # capped at 10x the minimum
])
def test_backoff_is_at_least_the_minimum_exponential_and_capped(nth, rand, low, high):
    wait = retry.backoff(Retry(backoff=0.1), nth, rand)
    assert low <= wait <= high + 1e-9
    assert wait <= 0.1 * retry.BACKOFF_CAP


@pytest.mark.parametrize("requests, retries, recent, allowed", [
    (100, 19, 10, True),  # 20 retries in 101 tries: within 20 %
    (100, 20, 10, False),
    (0, 0, 10, False),  # no traffic and the minimum rate spent
    (0, 0, 9, True),  # the minimum rate still has room
    (4, 0, 10, True),  # 1 retry in 5 tries
])
def test_the_budget_is_a_share_of_the_tries_with_a_minimum_rate(requests, retries, recent,
                                                                 allowed):
    constraint = RetryConstraint(percent=20, min_retries=10)
    assert retry.budget_allows(constraint, requests, retries, recent) is allowed


@pytest.mark.parametrize("ejected, share, failed, expected", [
    ({}, 0.5, [], [False, False, False]),
    ({"a": 1}, 0.1, [], [True, False, False]),  # at least one, whatever the share
    ({"a": 2, "b": 1}, 0.1, [], [False, True, False]),  # the earliest ejected first
    ({"a": 2, "b": 1}, 1.0, [], [True, True, False]),
    ({"a": 1, "b": 2, "c": 3}, 1.0, [], [False, False, False]),  # all ejected: use all
    ({}, 0.5, ["a"], [True, False, False]),  # a retry avoids the one that failed
    ({"b": 1}, 0.5, ["a"], [True, True, False]),
    ({"b": 1, "c": 2}, 1.0, ["a"], [True, False, False]),  # ...something must be left
    ({}, 0.5, ["a", "b"], [True, True, False]),  # every backend a try failed on
    ({}, 0.5, ["a", "b", "c"], [False, True, True]),  # ...the oldest forgiven first
])
def test_which_backends_a_pick_avoids(ejected, share, failed, expected):
    assert avoided(["a", "b", "c"], [1, 1, 1], ejected, share, failed or ()) == expected


def test_zero_weight_backends_are_never_counted_or_left():
    assert avoided(["a", "b"], [0, 1], {"b": 1}, 1.0) == [False, False]


def config(retry_field: Any = None, constraint: Any = None) -> dict[str, Any]:
    backend: dict[str, Any] = {"url": "http://b:80", "weight": 1}
    if constraint is not None:
        backend["retryConstraint"] = constraint
    rule: dict[str, Any] = {"backends": [backend]}
    if retry_field is not None:
        rule["retry"] = retry_field
    return {"version": 1, "rules": [rule]}


@pytest.mark.parametrize("field, path, message", [
    ({"codes": [500, 500]}, "rules[0].retry.codes[1]", "listed twice"),
    ({"codes": [399]}, "rules[0].retry.codes[0]", "out of range 400..599"),
    ({"codes": ["500"]}, "rules[0].retry.codes[0]", "expected an integer"),
    ({"attempts": 0}, "rules[0].retry.attempts", "out of range"),
    ({"attempts": 101}, "rules[0].retry.attempts", "out of range"),
    ({"backoff": "soon"}, "rules[0].retry.backoff", "invalid duration"),
    ({"tries": 1}, "rules[0].retry.tries", "unknown field"),
    ([], "rules[0].retry", "expected an object"),
])
def test_a_bad_retry_policy_is_rejected_with_its_field_path(field, path, message):
    with pytest.raises(ConfigError) as caught:
        parse_config(config(retry_field=field))
    assert caught.value.path == path
    assert message in caught.value.message


@pytest.mark.parametrize("field, path", [
    ({"budget": {"percent": 101}}, "rules[0].backends[0].retryConstraint.budget.percent"),
    ({"budget": {"interval": "500ms"}},
     "rules[0].backends[0].retryConstraint.budget.interval"),
    ({"minRetryRate": {"interval": "2h"}},
     "rules[0].backends[0].retryConstraint.minRetryRate.interval"),
    ({"minRetryRate": {"count": -1}},
     "rules[0].backends[0].retryConstraint.minRetryRate.count"),
    ({"budget": {"share": 1}}, "rules[0].backends[0].retryConstraint.budget.share"),
])
def test_a_bad_retry_constraint_is_rejected_with_its_field_path(field, path):
    with pytest.raises(ConfigError) as caught:
        parse_config(config(constraint=field))
    assert caught.value.path == path


def test_retry_and_constraint_defaults_and_round_trip():
    parsed = parse_config(config(retry_field={}, constraint={}))
    rule = parsed.rules[0]
    assert rule.retry == Retry(codes=(), attempts=1, backoff=0.025)
    assert rule.backends[0].retry_constraint == RetryConstraint(20, 10.0, 10, 1.0)
    wire = to_wire(parse_config(config(
        retry_field={"codes": [500, 502], "attempts": 2, "backoff": "100ms"},
        constraint={"budget": {"percent": 30, "interval": "5s"}})))
    assert wire["rules"][0]["retry"] == {"codes": [500, 502], "attempts": 2,
                                         "backoff": "100ms"}
    assert parse_config(wire) == parse_config(to_wire(parse_config(wire)))


YAML = textwrap.dedent("""\
    apiVersion: gateway.networking.k8s.io/v1
    kind: HTTPRoute
    metadata: {name: web, namespace: shop}
    spec:
      hostnames: [app.example]
      rules:
      - backendRefs: [{name: web, port: 80}, {name: other, port: 80}]
        retry: {codes: [500, 503], attempts: 3, backoff: 50ms}
    ---
    apiVersion: gateway.networking.x-k8s.io/v1alpha1
    kind: XBackendTrafficPolicy
    metadata: {name: budget, namespace: shop}
    spec:
      targetRefs: [{group: "", kind: Service, name: web}]
      retryConstraint:
        budget: {percent: 30, interval: 5s}
        minRetryRate: {count: 3, interval: 1s}
    """)


def test_httproute_retry_and_a_traffic_policy_become_wire_fields():
    conversion = convert(YAML)
    rule = conversion.config.rules[0]
    assert rule.retry == Retry(codes=(500, 503), attempts=3, backoff=0.05)
    web, other = rule.backends
    assert web.retry_constraint == RetryConstraint(30, 5.0, 3, 1.0)
    assert other.retry_constraint is None
    assert conversion.notes == ()


@pytest.mark.parametrize("old, new, path", [
    ("codes: [500, 503]", "codes: [500, 200]", "documents[0].spec.rules[0].retry.codes[1]"),
    ("backoff: 50ms", "backoff: 1.5s", "documents[0].spec.rules[0].retry.backoff"),
    ("percent: 30", "percent: 300",
     "documents[1].spec.retryConstraint.budget.percent"),
    ("targetRefs: [{group: \"\", kind: Service, name: web}]", "targetRefs: []",
     "documents[1].spec.targetRefs"),
])
def test_bad_retry_yaml_names_the_yaml_field(old, new, path):
    with pytest.raises(ConfigError) as caught:
        convert(YAML.replace(old, new))
    assert caught.value.path == path


def test_check_shows_the_retry_policy(tmp_path, capsys):
    from proxy.control.cli import main
    path = tmp_path / "routes.yaml"
    path.write_text(YAML)
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(1/2); retry status 500, 503 and connection errors up to 3 times" in out


def test_explain_shows_the_retry_policy_and_budgets():
    table = Table.compile(convert(YAML).config)
    _, lines = explain(table, EntranceScope(), "GET", "app.example", "/", "", [], "tunnel",
                       lambda: 0.5)
    text = "\n".join(lines)
    assert "retry status 500, 503 and connection errors up to 3 times, backoff 50ms" in text
    assert "retry budget 30% per 5s, at least 3 per 1s" in text
    assert "retry budget 20% per 10s, at least 10 per 1s (default)" in text

