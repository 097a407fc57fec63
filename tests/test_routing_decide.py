"""routing.decide: the one routing decision, as tables of cases (no sockets).

Every (cluster scope, entrance, request) row names the decision's kind, the rule that
won, whether it is a Knative probe and the status the proxy answers with itself; the
weighted pick's ``exclude`` is checked over the whole draw range.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from routing.config import parse_config
from routing.decide import (
    FORBIDDEN, NO_ROUTE, ROUTE, SERVER, UNAVAILABLE, Decision, EntranceScope, decide,
    explain)
from routing.model import CLUSTER, TUNNEL
from routing.table import Table

HASH = {"type": "Exact", "name": "K-Network-Hash", "value": "override"}
PROBE_MATCH = {"path": {"type": "PathPrefix", "value": "/"}, "headers": [HASH]}


def backend(port: int, weight: int = 1, **more: Any) -> dict[str, Any]:
    return {"url": f"http://10.0.0.1:{port}", "weight": weight, **more}


CONFIG = {"version": 1, "rules": [
    {"hostnames": ["app.test"], "matches": [PROBE_MATCH], "backends": [backend(1)]},
    {"hostnames": ["app.test"], "backends": [backend(1)]},
    {"hostnames": ["app.test"], "entrances": ["cluster"],
     "matches": [{"path": {"type": "PathPrefix", "value": "/internal"}}],
     "backends": [backend(2)]},
    {"hostnames": ["down.test"], "matches": [PROBE_MATCH], "unavailableStatus": 500,
     "backends": [backend(3)]},
    {"hostnames": ["down.test"], "unavailableStatus": 502, "backends": [backend(3)]},
    {"hostnames": ["empty.test"], "matches": [PROBE_MATCH]},
    {"hostnames": ["sick.test"], "matches": [PROBE_MATCH],
     "backends": [backend(4, unavailableStatus=503)]},
    {"hostnames": ["sick.test"], "backends": [backend(4, unavailableStatus=500)]},
]}
PROBE = [(b"K-Network-Probe", b"probe"), (b"K-Network-Hash", b"override")]
FORGED = [(b"k-network-probe", b"probe")]


def tables() -> dict[str, Table]:
    config = parse_config(CONFIG)
    return {scope: Table.compile(config, EntranceScope(scope).default_entrances)
            for scope in ("all", "probes", "scoped")}


TABLES = tables()


def run(scope: str, entrance: str, host: str, path: str = "/",
        headers: list[tuple[bytes, bytes]] | None = None,
        method: str = "GET") -> Decision:
    return decide(TABLES[scope], EntranceScope(scope), method, host, path, "",
                  headers or [], entrance, lambda: 0.5)


# scope, entrance, host, path, headers, method → kind, rule index, probe, status
CASES = [
    # The tunnel entrance serves every rule, whatever the cluster scope.
    ("probes", TUNNEL, "app.test", "/", [], "GET", ROUTE, 1, False, 0),
    ("scoped", TUNNEL, "app.test", "/internal", [], "GET", ROUTE, 1, False, 0),
    ("all", TUNNEL, "app.test", "/", PROBE, "GET", ROUTE, 0, True, 0),
    ("all", TUNNEL, "app.test", "/", FORGED, "GET", ROUTE, 1, False, 0),
    ("all", CLUSTER, "app.test", "/internal/x", [], "GET", ROUTE, 2, False, 0),
    # probes: refused without the header, and with it on a rule that is no probe match.
    ("probes", CLUSTER, "app.test", "/", [], "GET", FORBIDDEN, None, False, 403),
    ("probes", CLUSTER, "app.test", "/", PROBE, "GET", ROUTE, 0, True, 0),
    ("probes", CLUSTER, "app.test", "/", FORGED, "GET", FORBIDDEN, 1, False, 403),
    ("probes", CLUSTER, "app.test", "*", [], "OPTIONS", FORBIDDEN, None, False, 403),
    ("probes", CLUSTER, "app.test", "*", FORGED, "OPTIONS", SERVER, None, False, 200),
    ("probes", CLUSTER, "nowhere.test", "/", PROBE, "GET", NO_ROUTE, None, False, 404),
    # scoped: only rules naming the cluster, plus probe matches of the tunnel's rules.
    ("scoped", CLUSTER, "app.test", "/", [], "GET", NO_ROUTE, None, False, 404),
    ("scoped", CLUSTER, "app.test", "/internal", [], "GET", ROUTE, 2, False, 0),
    ("scoped", CLUSTER, "app.test", "/", PROBE, "GET", ROUTE, 0, True, 0),
    ("scoped", CLUSTER, "app.test", "/internal", PROBE, "GET", ROUTE, 0, True, 0),
    ("scoped", CLUSTER, "app.test", "/internal", FORGED, "GET", ROUTE, 2, False, 0),
    ("scoped", CLUSTER, "app.test", "/", FORGED, "GET", NO_ROUTE, None, False, 404),
    ("scoped", CLUSTER, "down.test", "/", PROBE, "GET", UNAVAILABLE, 3, True, 503),
    # OPTIONS * never reaches the table.
    ("all", TUNNEL, "nowhere.test", "*", [], "OPTIONS", SERVER, None, False, 200),
    # unavailableStatus of the rule, and of the drawn backend; no backend at all.
    ("all", TUNNEL, "down.test", "/", [], "GET", UNAVAILABLE, 4, False, 502),
    ("all", CLUSTER, "down.test", "/", PROBE, "GET", UNAVAILABLE, 3, True, 503),
    ("all", TUNNEL, "down.test", "/", [(b"k-network-hash", b"override")], "GET",
     UNAVAILABLE, 3, False, 500),
    ("all", TUNNEL, "empty.test", "/", PROBE, "GET", ROUTE, 5, True, 503),
    ("all", TUNNEL, "empty.test", "/", [(b"K-Network-Hash", b"override")], "GET",
     ROUTE, 5, False, 500),
    ("all", TUNNEL, "sick.test", "/", PROBE, "GET", ROUTE, 6, True, 503),
    ("all", TUNNEL, "sick.test", "/", [], "GET", ROUTE, 7, False, 500),
]


@pytest.mark.parametrize(("scope", "entrance", "host", "path", "headers", "method", "kind",
                          "rule", "probe", "status"), CASES)
def test_the_decision_for_each_scope_and_entrance(
        scope: str, entrance: str, host: str, path: str, headers: list, method: str,
        kind: str, rule: int | None, probe: bool, status: int) -> None:
    decision = run(scope, entrance, host, path, headers, method)
    assert decision.kind == kind
    assert (None if decision.hit is None else decision.hit.route.index) == rule
    assert decision.probe is probe
    assert decision.status == status
    # explain is the same decision, with its reasons.
    explained, lines = explain(TABLES[scope], EntranceScope(scope), method, host, path,
                               "", headers, entrance, lambda: 0.5)
    assert (explained.kind, explained.hit, explained.status) == (
        decision.kind, decision.hit, decision.status)
    assert lines[-1].startswith("result: ")
    if rule is not None and kind in (ROUTE, UNAVAILABLE):
        assert lines[-1].startswith(f"result: rules[{rule}]")


def test_the_scope_names_are_checked() -> None:
    with pytest.raises(ValueError, match="cluster scope must be one of"):
        EntranceScope("public")
    assert EntranceScope("scoped").default_entrances == frozenset({TUNNEL})
    assert EntranceScope("probes").default_entrances is None


def test_rand_is_drawn_only_for_a_rule_with_several_backends() -> None:
    def never() -> float:
        raise AssertionError("drawn")
    table = TABLES["all"]
    assert decide(table, EntranceScope(), "GET", "app.test", "/", "", [], TUNNEL,
                  never).kind == ROUTE


# ------------------------------------------------------------------ the weighted pick

SPLIT = parse_config({"version": 1, "rules": [
    {"backends": [backend(1, 60), backend(2, 30), backend(3, 10), backend(4, 0)]}]})


def shares(exclude: object = None) -> Counter[int]:
    """How 1000 evenly spread draws fall, by backend port."""
    route = Table.compile(SPLIT).rules[0]
    chosen = Counter()
    for draw in range(1000):
        picked = route.pick(draw / 1000, exclude)  # type: ignore[arg-type]
        assert picked is not None
        chosen[int(picked.backend.url.rsplit(":", 1)[1])] += 1
    return chosen


@pytest.mark.parametrize(("excluded", "expected"), [
    ((), {1: 600, 2: 300, 3: 100}),
    ((1,), {2: 750, 3: 250}),
    ((2, 3), {1: 1000}),
    ((4,), {1: 600, 2: 300, 3: 100}),
    # every backend of positive weight skipped: all of them serve again
    ((1, 2, 3), {1: 600, 2: 300, 3: 100}),
])
def test_excluded_backends_give_their_share_to_the_others(
        excluded: tuple[int, ...], expected: dict[int, int]) -> None:
    backends = SPLIT.rules[0].backends
    skip = {b for b in backends if int(b.url.rsplit(":", 1)[1]) in excluded}
    assert shares(skip) == expected
    assert shares(None) == shares(set()) == {1: 600, 2: 300, 3: 100}


def test_decide_passes_exclude_to_the_pick() -> None:
    table = Table.compile(SPLIT)
    first = SPLIT.rules[0].backends[0]
    for draw in (0.0, 0.3, 0.59, 0.99):
        decision = decide(table, EntranceScope(), "GET", "h", "/", "", [], TUNNEL,
                          lambda: draw, exclude={first})
        assert decision.backend is not None and decision.backend.backend is not first
